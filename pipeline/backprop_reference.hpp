// pipeline/backprop_reference.hpp: exact backpropagation of one mini-batch in one graph, the
// textbook way: the reference that the executors' methods are compared against (tests, and
// --track-gradient-quality). Training itself runs every method, backprop included, as a schedule on
// an executor (pipeline/executor.hpp).
//
// The forward pass records the whole graph through every stage, then one backward pass from the
// loss accumulates (+=) every parameter's gradient. Allocations are tagged "activations" of the
// stage that made them.
#pragma once

#include <cstdint>

#include "petra/nn/models.hpp"

namespace petra::pipeline {

struct StepResult {
  double loss = 0;           // mean over the mini-batch
  std::int64_t correct = 0;  // argmax == label
  std::int64_t samples = 0;
};

// images float32 [B, C, H, W], labels int64 [B].
StepResult backprop_step(nn::Model& model, const Tensor& images, const Tensor& labels);

}  // namespace petra::pipeline
