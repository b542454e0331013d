// pipeline/stage_runtime.hpp: what one stage keeps and does under each training method.
//
// The same model serves every method; what differs is what a stage keeps between the forward and
// the backward of one mini-batch (DESIGN.md §1), which keeping() states as a table:
//
//   method               graph   input FIFO        parameter stash   backward of a reversible stage
//   backprop             yes     (in the graph)    no                back-propagate through the kept graph
//   revbackprop          no      buffered stages   no                rebuild x from y (no delay)
//   petra                no      buffered stages   no                rebuild x from y with the CURRENT parameters
//   delayed-reversible   no      buffered stages   yes               rebuild x from y with the STASHED parameters
//   dsp                  no      every stage       no                recompute from the stored x, current parameters
//   pipedream            no      every stage       yes               recompute from the stored x, stashed parameters
//
// Buffered stages (stem, transitions) keep their input and recompute from it (backprop: the graph
// holds it); the head runs forward, loss and backward in one step. Every backward sends the input
// gradient down, and with it the input (the exact one, or the rebuilt one for a reversible stage)
// where the stage below rebuilds its own input from it: PETRA and delayed-reversible below a
// reversible stage. Elsewhere the stage below keeps what it needs and the input is not sent.
//
// Updates: each stage counts the gradients it has received since its last update; update()
// averages them (1/count) and steps the stage's own optimizer with the learning rate of the
// mini-batch that closed the window. This is the one update path of every method.
//
// Allocation tags: a stage's output is "input_buffer" of the next stage when that stage keeps it,
// else "messages" of the sender; stashed parameters are "param_stash"; the forward's temporaries,
// a kept graph and a backward's recomputed graph are "activations" of the stage.
#pragma once

#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "petra/nn/layers.hpp"
#include "petra/nn/optimizer.hpp"
#include "petra/nn/schedule.hpp"
#include "petra/nn/stage.hpp"
#include "petra/pipeline/delay_mitigation.hpp"
#include "petra/pipeline/messages.hpp"
#include "petra/pipeline/schedule.hpp"

namespace petra::pipeline {

// What a stage keeps between the forward and the backward of one mini-batch.
struct Keeping {
  bool graph = false;       // the forward's whole autograd graph (exact backprop)
  bool input = false;       // a FIFO of inputs
  bool parameters = false;  // a stash of the parameters the forward used
};
Keeping keeping(PipelineMethod method, nn::StageKind kind);
// True when a stage of this kind rebuilds its input from its output in the backward (so the stage
// above must send that output back down with the gradient).
bool rebuilds_input(PipelineMethod method, nn::StageKind kind);

struct RuntimeOptions {
  PipelineMethod method = PipelineMethod::petra;
  std::int64_t accumulation = 1;  // k: backwards averaged per update, counted per stage
  std::string optimizer = "sgd";
  nn::OptimizerOptions optimizer_options;
  double weight_decay = 0;
  nn::ScheduleConfig schedule;  // per stage, indexed by the mini-batch of the update's backward
  std::int64_t iterations_per_epoch = 1;  // mini-batches per epoch, over all replicas
  // Data-parallel replicas (petra-train --replicas) that average their gradients at every update:
  // a replica's mini-batch m stands for R mini-batches of the epoch (replica_microbatch below).
  int replicas = 1;
  bool apply_updates = true;       // false: gradients only accumulate (tests)
  bool track_reconstruction = false;  // keep true inputs to measure the rebuilt ones (debug)
  // Which pass moves batch norm's running statistics: the forward (default, as the official code)
  // or the recomputation inside the backward (docs/petra.md, "Batch-norm statistics").
  nn::StatisticsPass statistics_pass = nn::StatisticsPass::forward;
  // Spike compensation of the delayed methods' momentum (not in the PETRA paper; docs/petra.md,
  // "Delay compensation"): stage j's SGD treats its gradients as 2(J-1-j)/k updates late.
  bool delay_compensation = false;
  // Linear weight prediction (pipeline/delay_mitigation.hpp; sgd with momentum only): stage j's
  // forward runs with its parameters extrapolated prediction_horizon * delay updates ahead along
  // the momentum buffer. No effect on a stage of delay 0.
  WeightPrediction weight_prediction = WeightPrediction::none;
  double prediction_horizon = 1;
  // PipeMare's learning-rate warm-up over this many mini-batches of the run (0: off): stage j's
  // rate is divided by its delay to a power falling from 1 to 0 (pipeline/delay_mitigation.hpp).
  std::int64_t delay_lr_warmup = 0;
  // The concurrent executor's deadline for a message (a stuck pipeline becomes PipelineStuckError
  // naming the stage, the action and the mini-batch); far above any stage's cost.
  double message_timeout_seconds = 600;
  // Data-parallel replicas (petra-train --replicas): called by every update after the stage's own
  // average, it replaces the stage's gradients by their average over the replicas of the stage.
  std::function<void(const std::vector<Variable>& parameters)> average_over_replicas;
};

// How many updates of stage `index` (of `stages`) separate the parameters a gradient was computed
// at from the update that applies it: 2(J-1-j) steps, in updates of k mini-batches; 0 for the
// synchronous methods and for the head.
double update_delay(PipelineMethod method, int index, int stages, std::int64_t accumulation);

// The mini-batch of the epoch's order whose learning rate an update of replica-local mini-batch m
// takes: of the R mini-batches averaged (i * R + r for r < R, where m is the i-th of its epoch), the
// last, as one process averaging them with accumulation R would. m itself when R = 1.
std::int64_t replica_microbatch(std::int64_t m, std::int64_t iterations_per_epoch, int replicas);

class StageRuntime {
 public:
  // next_keeps_input: the stage above keeps this stage's outputs (they are tagged its input_buffer).
  // previous_rebuilds_input: the stage below needs this stage's input back with each gradient.
  StageRuntime(nn::Stage& stage, int index, int stages, const RuntimeOptions& options, bool next_keeps_input,
               bool previous_rebuilds_input);

  ForwardMessage forward(ForwardMessage in);              // stages below the head
  BackwardMessage backward(BackwardMessage from_above);   // stages below the head
  BackwardMessage head_step(ForwardMessage in, HeadStats& stats);  // the head
  void update(std::int64_t microbatch);  // averages the gradients received and steps the optimizer

  int index() const { return index_; }
  // The learning rate of an update that mini-batch `microbatch` closes: the schedule's, times
  // PipeMare's warm-up factor for this stage's delay when delay_lr_warmup is on.
  double learning_rate(std::int64_t microbatch) const;
  std::size_t kept() const { return fifo_.size(); }  // mini-batches in flight at this stage
  std::vector<std::int64_t> in_flight() const;       // their ids, oldest first
  std::int64_t received() const { return received_; }  // gradients since the last update
  bool keeps_input() const { return keeping_.input; }
  // Relative error ||x_rebuilt - x|| / ||x|| of the last backward (track_reconstruction only).
  double last_reconstruction_error() const { return last_reconstruction_error_; }
  nn::Stage& stage() { return stage_; }
  nn::Optimizer& optimizer() { return *optimizer_; }

  // Gradient-quality tracking: while on, each backward also keeps its own contribution to the
  // stage's parameter gradients (that mini-batch's delayed gradient, as the difference of the
  // accumulated gradients after and before it, so the training itself is not perturbed).
  void set_capture_gradient(bool on) { capture_gradient_ = on; }
  const std::vector<Tensor>& captured_gradient() const { return captured_gradient_; }
  std::int64_t captured_microbatch() const { return captured_microbatch_; }

  // Checkpoints of a pipeline that is not flushed (pipeline/in_flight.cpp): what this stage holds
  // between two steps (its FIFO of inputs and stashed parameters, its count of gradients since the
  // last update), written as .npy files plus a state.txt index into `dir`, and read back into a
  // fresh stage runtime. A kept graph cannot be saved: between two steps of backprop there is none.
  void save_in_flight(const std::filesystem::path& dir) const;
  void load_in_flight(const std::filesystem::path& dir);

 private:
  struct Kept {
    std::int64_t microbatch;
    Tensor input;                    // if the method keeps inputs here (or tracks them)
    std::vector<Tensor> parameters;  // if the method stashes parameters
    Variable graph_input, graph_output;  // backprop: the recorded graph from input to output
  };
  void swap_parameters(std::vector<Tensor>& values);  // exchanges the stage's parameter data
  // Weight prediction: replaces each parameter that has a momentum buffer by its prediction for
  // mini-batch `microbatch`'s backward, and returns the parameters with their current data, for
  // the forward to put back. Empty when prediction is off or this stage has no delay.
  std::vector<std::pair<Variable, Tensor>> predict_parameters(std::int64_t microbatch);
  std::vector<Tensor> gradients_before() const;        // copies of the accumulated gradients (capture)
  void capture(const std::vector<Tensor>& before, std::int64_t microbatch);
  Kept pop(std::int64_t microbatch, const char* what);
  Tensor backward_through_graph(Kept& kept, const Tensor& dy);

  nn::Stage& stage_;
  int index_, stages_;
  RuntimeOptions options_;
  Keeping keeping_;
  bool next_keeps_input_, previous_rebuilds_input_;
  std::deque<Kept> fifo_;
  std::unique_ptr<nn::Optimizer> optimizer_;
  double delay_;  // update_delay of this stage: updates between a forward and its backward
  std::int64_t received_ = 0;  // backwards since the last update
  double last_reconstruction_error_ = 0;
  bool capture_gradient_ = false;
  std::vector<Tensor> captured_gradient_;
  std::int64_t captured_microbatch_ = -1;
};

}  // namespace petra::pipeline
