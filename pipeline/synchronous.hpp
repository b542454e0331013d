// pipeline/synchronous.hpp: the two synchronous training methods, on the same stages PETRA uses.
//
//   backprop     exact backpropagation: the forward pass records the whole graph (every stage's
//                activations are kept until the backward pass), then one backward pass.
//   revbackprop  reversible backpropagation (Gomez et al. 2017): the forward pass records nothing;
//                buffered stages keep their input, reversible stages keep nothing; the backward pass
//                walks down the stages, each reversible stage rebuilding its input from its output
//                (reconstruct_and_backward) and each buffered stage recomputing from its input.
//
// Both accumulate (+=) the parameter gradients of one mini-batch; the trainer averages k of them
// before an optimizer step. Allocations are tagged per stage: a stage's output is "activations"
// of that stage, or "input_buffer" of the next stage when the next stage keeps it.
#pragma once

#include <string_view>

#include "nn/models.hpp"
#include "pipeline/schedule.hpp"

namespace petra::pipeline {


struct StepResult {
  double loss = 0;           // mean over the mini-batch
  std::int64_t correct = 0;  // argmax == label
  std::int64_t samples = 0;
};

// One forward and backward pass of one mini-batch (images float32 [B, C, H, W], labels int64 [B]).
// method: backprop or revbackprop (ValueError for a delayed method: those run on a schedule).
StepResult train_step(nn::Model& model, PipelineMethod method, const Tensor& images, const Tensor& labels);

StepResult backprop_step(nn::Model& model, const Tensor& images, const Tensor& labels);
StepResult revbackprop_step(nn::Model& model, const Tensor& images, const Tensor& labels);

}  // namespace petra::pipeline
