// pipeline/executor.hpp: the executors that run a schedule (pipeline/schedule.hpp) on a model's
// stages. An executor only interprets the grid: for each cell it calls the stage runtime
// (pipeline/stage_runtime.hpp) and moves messages through the channels between stages.
//
// Every training method runs here, synchronous ones included: a backprop or revbackprop grid has one
// step per mini-batch, whose forwards run bottom-up and backwards top-down in the same step; a
// delayed grid's messages are read one step after they are sent, so its cells can run in any order
// within a step, and at the same time on several workers.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "petra/nn/models.hpp"
#include "petra/pipeline/messages.hpp"
#include "petra/pipeline/schedule.hpp"
#include "petra/pipeline/stage_runtime.hpp"
#include "petra/stream.hpp"

namespace petra::pipeline {

// Runs schedules step by step on one thread: the oracle. Channels and FIFOs persist between run()
// calls, so one long schedule can be run epoch by epoch without flushing the pipeline.
class SequentialExecutor {
 public:
  SequentialExecutor(nn::Model& model, const RuntimeOptions& options);
  virtual ~SequentialExecutor() = default;

  // Executes steps [first, last) of `schedule`.
  virtual void run(const Schedule& schedule, std::int64_t first, std::int64_t last, const BatchSource& batches,
                   const HeadCallback& on_head);

  StageRuntime& stage(std::size_t j) { return *stages_.at(j); }
  std::size_t num_stages() const { return stages_.size(); }
  // Wall seconds of each step of the last run() call, in order (one clock read per step, always
  // on: benchmarks take medians of steady steps from them). A concurrent step ends when the last
  // worker has finished its cells of that step; the first step also holds the workers' start.
  const std::vector<double>& step_seconds() const { return step_seconds_; }

  // Everything in flight between two steps (run() calls): each stage's state in dir/stage-NN/ and
  // the messages in the channels in dir/channels.txt + .npy files (pipeline/in_flight.cpp).
  // load_in_flight replaces the executor's state with it and checks that it is the state the first
  // `step` steps of `schedule` leave (the mini-batches kept by each stage and in each channel, the
  // last backward and the gradients since the last update): CheckpointError if the files are
  // missing, malformed, or hold another state.
  void save_in_flight(const std::filesystem::path& dir) const;
  void load_in_flight(const std::filesystem::path& dir, const Schedule& schedule, std::int64_t step);

 protected:
  std::vector<double> step_seconds_;  // see step_seconds()
  // True when this executor runs stage j's cells (all of them here; an MPI process, its own group).
  virtual bool runs_stage(int j) const { return j >= 0; }
  void check_range(const Schedule& schedule, std::int64_t first, std::int64_t last) const;
  // Runs one cell: the actions of stage j at one step, in order. wait: block for messages.
  void execute_cell(const std::vector<Action>& cell, bool wait, const BatchSource& batches,
                    const HeadCallback& on_head);
  // The transport between neighbouring stages: stage j receives its input from j - 1 and sends its
  // output to j + 1; it receives (input, gradient) from j + 1 and sends its own down to j - 1. Here
  // the in-process channels; an executor whose stages live in several processes sends and receives
  // the messages of stages on other processes instead (pipeline/mpi_executor.hpp).
  virtual ForwardMessage receive_forward(int j, std::int64_t microbatch, bool wait);
  virtual void send_forward(int j, ForwardMessage message);
  virtual BackwardMessage receive_backward(int j, std::int64_t microbatch, bool wait);
  virtual void send_backward(int j, BackwardMessage message);
  std::chrono::milliseconds message_timeout() const { return message_timeout_; }
  // The in-process channels: from stage j to j + 1, and from j + 1 to j. An executor with another
  // transport parks there the messages that arrived before a checkpoint, so that save_in_flight
  // holds them.
  Channel<ForwardMessage>& channel_up(int j) { return to_next_[static_cast<std::size_t>(j)]; }
  Channel<BackwardMessage>& channel_down(int j) { return to_previous_[static_cast<std::size_t>(j)]; }
  // Wakes every waiting worker, which then raises (a worker failed); reopen before the next run.
  void abort_channels();
  void reopen_channels();

 private:
  void execute(const Action& action, bool wait, const BatchSource& batches, const HeadCallback& on_head);
  void check_in_flight(const std::filesystem::path& dir, const Schedule& schedule, std::int64_t step) const;

  std::vector<std::unique_ptr<StageRuntime>> stages_;
  std::vector<Channel<ForwardMessage>> to_next_;       // [j]: from stage j to j + 1 (the head's: to itself)
  std::vector<Channel<BackwardMessage>> to_previous_;  // [j]: from stage j + 1 to j
  std::vector<std::int64_t> last_backward_;            // [j]: mini-batch of j's latest backward
  std::chrono::milliseconds message_timeout_;          // the longest a worker waits for a message
};

// One worker thread per device; each stage is placed on one worker. A worker runs, step after step,
// the cells of its stages in increasing stage order (forward, backward, update within a cell), with
// no global barrier: it blocks only on the messages it needs, which were produced one step earlier.
// Each stage's local order is the sequential executor's and the channels are FIFO, so on the CPU the
// parameters are bit-identical to the sequential executor's (with the same threads per kernel).
// Delayed methods only: a synchronous step has nothing to overlap.
//
// GPU workers (all workers GPUs; one GPU may host several workers): the constructor moves each
// stage to its worker's device. A worker's thread runs all its stages' kernels on its own stream
// (a StreamGuard over the run) and has a copy stream on the same device. Every message it sends
// carries an event recorded on its stream after the kernels that wrote it (ForwardMessage::ready);
// the receiving worker's stream waits for that event (no host synchronisation per message), and
// the allocator learns that the receiver's stream reads the tensors (Storage::record_stream). A
// message from another GPU is copied first, on the receiver's copy stream (after the sender's
// event), into a tensor of the receiver's device, which the compute stream waits for in turn.
// Messages in a channel stay on their sender's device. run() returns once every worker's streams
// have finished (each stream is synchronised when its worker ends), so the caller may read the
// parameters. The same kernels in the same order on every stream: the parameters equal the
// sequential executor's bit for bit, on GPUs as on the CPU.
class ConcurrentExecutor : public SequentialExecutor {
 public:
  struct Worker {
    Device device = Device::cpu();
    int threads = 1;  // CPU workers: per kernel, on this worker's stream
  };
  // placement[j] = the worker of stage j.
  ConcurrentExecutor(nn::Model& model, const RuntimeOptions& options, std::vector<Worker> workers,
                     std::vector<int> placement);

  void run(const Schedule& schedule, std::int64_t first, std::int64_t last, const BatchSource& batches,
           const HeadCallback& on_head) override;
  const std::vector<int>& placement() const { return placement_; }

 protected:
  ForwardMessage receive_forward(int j, std::int64_t microbatch, bool wait) override;
  void send_forward(int j, ForwardMessage message) override;
  BackwardMessage receive_backward(int j, std::int64_t microbatch, bool wait) override;
  void send_backward(int j, BackwardMessage message) override;

 private:
  Device device_of(int stage) const { return workers_[static_cast<std::size_t>(placement_[stage])].device; }
  std::vector<Worker> workers_;
  std::vector<int> placement_;
  bool on_gpus_ = false;
  // GPU workers' compute and copy streams, made at the first run() and kept for every later one:
  // a tensor kept across run() calls (stage 0's images, a stage's kept input or graph) was last
  // recorded on a worker's stream, and a stream destroyed between calls would leave its later uses
  // on a new stream unrecorded (the allocator could hand its block to the upload's copy stream while
  // the new stream's kernels still read it: seen on an H200 as PETRA on two streams drifting from
  // the sequential executor, docs/results-gpu.md).
  std::vector<std::unique_ptr<Stream>> gpu_streams_, gpu_copy_streams_;
};

}  // namespace petra::pipeline
