// pipeline/runtime.hpp: what a stage keeps and does under each delayed-gradient method, and the
// sequential executor that runs a schedule (pipeline/schedule.hpp) step by step: the oracle.
//
// Per method (../shared/DESIGN.md, section 1):
//
//   method               input FIFO        parameter stash   backward of a reversible stage
//   petra                buffered stages   no                rebuild x from y with the CURRENT parameters
//   delayed-reversible   buffered stages   yes               rebuild x from y with the STASHED parameters
//   dsp                  every stage       no                recompute from the stored x, current parameters
//   pipedream            every stage       yes               recompute from the stored x, stashed parameters
//
// Buffered stages (stem, transitions) always keep their input and recompute from it; the head runs
// forward, loss and backward in one step. Every backward sends (input, input gradient) down: the
// exact input for buffered stages and the head, the rebuilt one for reversible stages.
//
// Messages carry their mini-batch id and the receiver checks it against the schedule. Allocation
// tags: a stage's output is "input_buffer" of the next stage when that stage keeps it, else
// "messages" of the sender; stashed parameters are "param_stash".
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "data/loader.hpp"
#include "nn/layers.hpp"
#include "nn/models.hpp"
#include "nn/optimizer.hpp"
#include "nn/schedule.hpp"
#include "pipeline/schedule.hpp"

namespace petra::pipeline {

struct ForwardMessage {
  std::int64_t microbatch = -1;
  Tensor activation;
  Tensor labels;  // travel with the activation to the head
};

struct BackwardMessage {
  std::int64_t microbatch = -1;
  Tensor input;     // the sender's input: exact (buffered, head) or rebuilt (reversible)
  Tensor gradient;  // of the loss with respect to that input
};

// What a stage keeps between the forward and the backward of one mini-batch.
struct Keeping {
  bool input = false;       // a FIFO of inputs
  bool parameters = false;  // a stash of the parameters the forward used
};
Keeping keeping(PipelineMethod method, nn::StageKind kind);

struct RuntimeOptions {
  PipelineMethod method = PipelineMethod::petra;
  std::int64_t accumulation = 1;  // k: backwards averaged per update, counted per stage
  std::string optimizer = "sgd";
  nn::OptimizerOptions optimizer_options;
  double weight_decay = 0;
  nn::ScheduleConfig schedule;  // per stage, indexed by the mini-batch of the update's backward
  std::int64_t iterations_per_epoch = 1;
  bool apply_updates = true;       // false: gradients only accumulate (tests)
  bool track_reconstruction = false;  // keep true inputs to measure the rebuilt ones (debug)
  // Which pass moves batch norm's running statistics: the forward (default, as the official code)
  // or the recomputation inside the backward (docs/petra.md, "Batch-norm statistics").
  nn::StatisticsPass statistics_pass = nn::StatisticsPass::forward;
  // Spike compensation of the delayed methods' momentum (not in the PETRA paper; docs/petra.md,
  // "Delay compensation"): stage j's SGD treats its gradients as 2(J-1-j)/k updates late.
  bool delay_compensation = false;
};

// How many updates of stage `index` (of `stages`) separate the parameters a gradient was computed
// at from the update that applies it: 2(J-1-j) steps, in updates of k mini-batches; 0 for the
// synchronous methods and for the head.
double update_delay(PipelineMethod method, int index, int stages, std::int64_t accumulation);

struct HeadStats {
  std::int64_t microbatch = -1;
  double loss = 0;
  std::int64_t correct = 0, samples = 0;
};

class StageRuntime {
 public:
  // next_keeps_input: the stage above keeps this stage's outputs (they are tagged its input_buffer).
  StageRuntime(nn::Stage& stage, int index, int stages, const RuntimeOptions& options, bool next_keeps_input);

  ForwardMessage forward(ForwardMessage in);              // stages below the head
  BackwardMessage backward(BackwardMessage from_above);   // stages below the head
  BackwardMessage head_step(ForwardMessage in, HeadStats& stats);  // the head
  void update(std::int64_t microbatch);  // averages the k gradients and steps the optimizer

  int index() const { return index_; }
  std::size_t kept() const { return fifo_.size(); }  // mini-batches in flight at this stage
  bool keeps_input() const { return keeping_.input; }
  // Relative error ||x_rebuilt - x|| / ||x|| of the last backward (track_reconstruction only).
  double last_reconstruction_error() const { return last_reconstruction_error_; }
  nn::Stage& stage() { return stage_; }

  // Gradient-quality tracking: while on, each backward also keeps its own contribution to the
  // stage's parameter gradients (that mini-batch's delayed gradient, as the difference of the
  // accumulated gradients after and before it, so the training itself is not perturbed).
  void set_capture_gradient(bool on) { capture_gradient_ = on; }

  // Checkpoints of a pipeline that is not flushed: what this stage holds between two steps (its
  // FIFO of inputs and stashed parameters, its count of gradients since the last update), written
  // as .npy files plus a state.txt index into `dir`, and read back into a fresh stage runtime.
  void save_in_flight(const std::filesystem::path& dir) const;
  void load_in_flight(const std::filesystem::path& dir);
  nn::Optimizer& optimizer() { return *optimizer_; }
  const std::vector<Tensor>& captured_gradient() const { return captured_gradient_; }
  std::int64_t captured_microbatch() const { return captured_microbatch_; }

 private:
  struct Kept {
    std::int64_t microbatch;
    Tensor input;                    // if the method keeps inputs here (or tracks them)
    std::vector<Tensor> parameters;  // if the method stashes parameters
  };
  void swap_parameters(std::vector<Tensor>& values);  // exchanges the stage's parameter data
  std::vector<Tensor> gradients_before() const;        // copies of the accumulated gradients (capture)
  void capture(const std::vector<Tensor>& before, std::int64_t microbatch);
  Kept pop(std::int64_t microbatch, const char* what);

  nn::Stage& stage_;
  int index_, stages_;
  RuntimeOptions options_;
  Keeping keeping_;
  bool next_keeps_input_;
  std::deque<Kept> fifo_;
  std::unique_ptr<nn::Optimizer> optimizer_;
  std::int64_t received_ = 0;  // backwards since the last update
  double last_reconstruction_error_ = 0;
  bool capture_gradient_ = false;
  std::vector<Tensor> captured_gradient_;
  std::int64_t captured_microbatch_ = -1;
};

// A FIFO of messages between two neighbouring stages. pop(wait = true) blocks until a message is
// there (concurrent executor); pop(wait = false) raises if none is (sequential executor: a missing
// message means the schedule and the executor disagree).
template <class Message>
class Channel {
 public:
  void push(Message m) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(m));
    }
    arrived_.notify_one();
  }
  Message pop(bool wait, std::int64_t microbatch, int stage, const char* what);
  // The messages waiting, oldest first (between runs only: no lock is taken).
  const std::deque<Message>& pending() const { return queue_; }

 private:
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<Message> queue_;
};

// Runs schedules step by step on one thread: the oracle. Channels and FIFOs persist between run()
// calls, so one long schedule can be run epoch by epoch without flushing the pipeline.
class SequentialExecutor {
 public:
  using BatchSource = std::function<data::Batch(std::int64_t microbatch)>;
  using HeadCallback = std::function<void(const HeadStats&)>;

  SequentialExecutor(nn::Model& model, const RuntimeOptions& options);
  virtual ~SequentialExecutor() = default;

  // Executes steps [first, last) of `schedule`.
  virtual void run(const Schedule& schedule, std::int64_t first, std::int64_t last, const BatchSource& batches,
                   const HeadCallback& on_head);

  StageRuntime& stage(std::size_t j) { return *stages_.at(j); }

  // Everything in flight between two steps (run() calls): each stage's state in dir/stage-NN/ and
  // the messages in the channels in dir/channels.txt + .npy files. load_in_flight restores it
  // into a fresh executor built for the same model, method and options (CheckpointError if the
  // files are missing or malformed).
  void save_in_flight(const std::filesystem::path& dir) const;
  void load_in_flight(const std::filesystem::path& dir);
  std::size_t num_stages() const { return stages_.size(); }

 protected:
  void check_range(const Schedule& schedule, std::int64_t first, std::int64_t last) const;
  // Runs one cell: the actions of stage j at one step, in order. wait: block for messages.
  void execute_cell(const std::vector<Action>& cell, bool wait, const BatchSource& batches,
                    const HeadCallback& on_head);

 private:
  void execute(const Action& action, bool wait, const BatchSource& batches, const HeadCallback& on_head);

  std::vector<std::unique_ptr<StageRuntime>> stages_;
  std::vector<Channel<ForwardMessage>> to_next_;       // [j]: from stage j to j + 1 (the head's: to itself)
  std::vector<Channel<BackwardMessage>> to_previous_;  // [j]: from stage j + 1 to j
  std::vector<std::int64_t> last_backward_;            // [j]: mini-batch of j's latest backward
};

// One worker thread per device; each stage is placed on one worker. A worker runs, step after step,
// the cells of its stages in increasing stage order (forward, backward, update within a cell), with
// no global barrier: it blocks only on the messages it needs, which were produced one step earlier.
// Each stage's local order is the sequential executor's and the channels are FIFO, so on the CPU the
// parameters are bit-identical to the sequential executor's (with the same threads per kernel).
class ConcurrentExecutor : public SequentialExecutor {
 public:
  struct Worker {
    Device device = Device::cpu();
    int threads = 1;  // per kernel, on this worker's stream
  };
  // placement[j] = the worker of stage j.
  ConcurrentExecutor(nn::Model& model, const RuntimeOptions& options, std::vector<Worker> workers,
                     std::vector<int> placement);

  void run(const Schedule& schedule, std::int64_t first, std::int64_t last, const BatchSource& batches,
           const HeadCallback& on_head) override;
  const std::vector<int>& placement() const { return placement_; }

 private:
  std::vector<Worker> workers_;
  std::vector<int> placement_;
};

// Seconds of one forward and one backward of each stage on `batch` with `threads` kernel threads
// (reversible stages: reconstruct_and_backward, what PETRA runs; best of 3; the parameters'
// gradients are cleared afterwards), for placing stages on workers.
std::vector<double> measure_stage_costs(nn::Model& model, const data::Batch& batch, int threads = 1);

// Contiguous stages per worker, balancing the sum of `costs` (the largest worker load is minimal).
std::vector<int> balanced_placement(const std::vector<double>& costs, int workers);

}  // namespace petra::pipeline
