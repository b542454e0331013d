// pipeline/executor.cpp: the executors that interpret a schedule: the sequential one (the oracle)
// and the concurrent one (a worker thread per device, blocking only on the messages it needs).
#include "petra/pipeline/executor.hpp"

#include <algorithm>
#include <exception>
#include <optional>

#include <fmt/format.h>
#include <thread>

#include "petra/cuda_backend.hpp"
#include "petra/profile.hpp"
#include "petra/stream.hpp"

namespace petra::pipeline {

// ---------------------------------------------------------------- channels
template <class Message>
Message Channel<Message>::pop(bool wait, std::int64_t microbatch, int stage, const char* what,
                              std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (wait) {
    const auto ready = [&] { return !queue_.empty() || aborted_; };
    if (timeout == std::chrono::milliseconds::max())
      arrived_.wait(lock, ready);
    else if (!arrived_.wait_for(lock, timeout, ready))
      throw PipelineStuckError(fmt::format(
          "stage {}: {} of mini-batch {}: no message for {:.0f} s; the pipeline is stuck (the schedule and the "
          "state in flight disagree, or a worker stopped); --message-timeout sets this deadline",
          stage, what, microbatch, std::chrono::duration<double>(timeout).count()));
    if (queue_.empty())  // aborted
      throw PipelineStuckError(fmt::format("stage {}: {} of mini-batch {}: stopped because another worker failed",
                                           stage, what, microbatch));
  }
  PETRA_CHECK(!queue_.empty(), Error, "stage ", stage, ": ", what, " of mini-batch ", microbatch,
              " but no message has arrived (the schedule and the executor disagree)");
  PETRA_CHECK(queue_.front().microbatch == microbatch, Error, "stage ", stage, ": ", what, " of mini-batch ",
              microbatch, " received the message of mini-batch ", queue_.front().microbatch);
  Message m = std::move(queue_.front());
  queue_.pop_front();
  return m;
}

template <class Message>
void Channel<Message>::abort() {
  {
    std::lock_guard lock(mutex_);
    aborted_ = true;
  }
  arrived_.notify_all();
}

template <class Message>
void Channel<Message>::reopen() {
  std::lock_guard lock(mutex_);
  aborted_ = false;
}

template class Channel<ForwardMessage>;
template class Channel<BackwardMessage>;

// ---------------------------------------------------------------- sequential executor
namespace {
// The deadline in milliseconds, checked before the conversion (infinity or 1e300 s would overflow it).
std::chrono::milliseconds timeout_of(double seconds) {
  PETRA_CHECK(seconds > 0 && seconds <= 1e9, ValueError, "executor: the message timeout must be > 0 s and at most "
              "1e9 s, got ", seconds);
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}
}  // namespace

SequentialExecutor::SequentialExecutor(nn::Model& model, const RuntimeOptions& options)
    : to_next_(model.num_stages()),
      to_previous_(model.num_stages()),
      last_backward_(model.num_stages(), 0),
      message_timeout_(timeout_of(options.message_timeout_seconds)) {
  const int J = static_cast<int>(model.num_stages());
  for (int j = 0; j < J; ++j) {
    const bool next_keeps = j + 1 < J && keeping(options.method, model.stage(j + 1).kind()).input;
    const bool previous_rebuilds = j > 0 && rebuilds_input(options.method, model.stage(j - 1).kind());
    stages_.push_back(std::make_unique<StageRuntime>(model.stage(j), j, J, options, next_keeps, previous_rebuilds));
  }
}

// Each action is timed by phase for petra-train --profile (petra/profile.hpp; nothing when off):
// fetching the mini-batch (data), waiting for a neighbour's message (waiting), the stage's work
// (forward, backward; the head's forward, loss and backward count as its backward) and the update.
void SequentialExecutor::execute(const Action& action, bool wait, const BatchSource& batches,
                                 const HeadCallback& on_head) {
  using profile::Phase;
  using profile::PhaseTimer;
  const int j = action.stage, head = static_cast<int>(stages_.size()) - 1;
  const std::int64_t m = action.microbatch;
  switch (action.kind) {
    case Action::Kind::forward: {
      ForwardMessage in;
      if (j == 0) {
        PhaseTimer timer(Phase::data, j);
        MiniBatch b = batches(m);
        in = {m, std::move(b.images), std::move(b.labels), nullptr};
      } else {
        PhaseTimer timer(Phase::waiting, j);
        in = receive_forward(j, m, wait);
      }
      if (j == head) {
        to_next_[head].push(std::move(in));  // the head's backward, next in this cell, takes it
      } else {
        ForwardMessage out;
        {
          PhaseTimer timer(Phase::forward, j);
          out = stages_[j]->forward(std::move(in));
        }
        send_forward(j, std::move(out));
      }
      break;
    }
    case Action::Kind::backward: {
      BackwardMessage out;
      if (j == head) {
        HeadStats stats;
        {
          PhaseTimer timer(Phase::backward, j);
          out = stages_[j]->head_step(to_next_[head].pop(false, m, j, "head step"), stats);
        }
        if (on_head) on_head(stats);
      } else {
        BackwardMessage in;
        {
          PhaseTimer timer(Phase::waiting, j);
          in = receive_backward(j, m, wait);
        }
        PhaseTimer timer(Phase::backward, j);
        out = stages_[j]->backward(std::move(in));
      }
      if (j > 0) send_backward(j, std::move(out));
      last_backward_[j] = m;
      break;
    }
    case Action::Kind::update: {
      PhaseTimer timer(Phase::update, j);
      stages_[j]->update(last_backward_[j]);
      break;
    }
  }
}

ForwardMessage SequentialExecutor::receive_forward(int j, std::int64_t microbatch, bool wait) {
  return to_next_[j - 1].pop(wait, microbatch, j, "forward", message_timeout_);
}

void SequentialExecutor::send_forward(int j, ForwardMessage message) { to_next_[j].push(std::move(message)); }

BackwardMessage SequentialExecutor::receive_backward(int j, std::int64_t microbatch, bool wait) {
  return to_previous_[j].pop(wait, microbatch, j, "backward", message_timeout_);
}

void SequentialExecutor::send_backward(int j, BackwardMessage message) { to_previous_[j - 1].push(std::move(message)); }

void SequentialExecutor::abort_channels() {
  for (auto& c : to_next_) c.abort();
  for (auto& c : to_previous_) c.abort();
}

void SequentialExecutor::reopen_channels() {
  for (auto& c : to_next_) c.reopen();
  for (auto& c : to_previous_) c.reopen();
}

void SequentialExecutor::execute_cell(const std::vector<Action>& cell, bool wait, const BatchSource& batches,
                                      const HeadCallback& on_head) {
  for (const Action& a : cell) execute(a, wait, batches, on_head);
}

void SequentialExecutor::check_range(const Schedule& schedule, std::int64_t first, std::int64_t last) const {
  PETRA_CHECK(schedule.stages == static_cast<int>(stages_.size()), ValueError, "executor: schedule for ",
              schedule.stages, " stages, model has ", stages_.size());
  PETRA_CHECK(0 <= first && first <= last && last <= schedule.steps, ValueError, "executor: steps [", first, ", ", last,
              ") outside the schedule's ", schedule.steps);
}

void SequentialExecutor::run(const Schedule& schedule, std::int64_t first, std::int64_t last,
                             const BatchSource& batches, const HeadCallback& on_head) {
  check_range(schedule, first, last);
  const int J = schedule.stages;
  step_seconds_.clear();
  auto step_start = std::chrono::steady_clock::now();
  const auto step_done = [&] {
    const auto now = std::chrono::steady_clock::now();
    step_seconds_.push_back(std::chrono::duration<double>(now - step_start).count());
    step_start = now;
  };
  for (std::int64_t t = first; t < last; ++t) {
    const auto& row = schedule.cells[t];
    if (is_delayed(schedule.method)) {
      // Messages produced in step t are consumed in step t + 1, so the stages of one step could
      // run in any order (and do run at the same time in the concurrent executor).
      for (int j = 0; j < J; ++j) execute_cell(row[j], false, batches, on_head);
      step_done();
      continue;
    }
    // Synchronous: every forward, bottom-up; then every backward, top-down; then the updates.
    for (const Action::Kind kind : {Action::Kind::forward, Action::Kind::backward, Action::Kind::update}) {
      for (int i = 0; i < J; ++i) {
        const int j = kind == Action::Kind::backward ? J - 1 - i : i;
        for (const Action& a : row[j])
          if (a.kind == kind) execute(a, false, batches, on_head);
      }
    }
    step_done();
  }
}

// ---------------------------------------------------------------- concurrent executor
ConcurrentExecutor::ConcurrentExecutor(nn::Model& model, const RuntimeOptions& options, std::vector<Worker> workers,
                                       std::vector<int> placement)
    : SequentialExecutor(model, options), workers_(std::move(workers)), placement_(std::move(placement)) {
  PETRA_CHECK(!workers_.empty(), ValueError, "concurrent executor: no workers");
  PETRA_CHECK(placement_.size() == model.num_stages(), ValueError, "concurrent executor: placement of ",
              placement_.size(), " stages for a model of ", model.num_stages());
  for (int w : placement_)
    PETRA_CHECK(0 <= w && w < static_cast<int>(workers_.size()), ValueError, "concurrent executor: worker ", w,
                " does not exist (", workers_.size(), " workers)");
  on_gpus_ = workers_.front().device.is_cuda();
  for (const Worker& w : workers_) {
    PETRA_CHECK(w.threads >= 1, ValueError, "concurrent executor: a worker needs at least one thread");
    PETRA_CHECK(w.device.is_cuda() == on_gpus_, DeviceError, "concurrent executor: workers on ", w.device.str(),
                " and ", workers_.front().device.str(), ": the workers are all CPU workers or all GPUs");
  }
  if (on_gpus_)
    for (std::size_t j = 0; j < placement_.size(); ++j) model.stage(j).to(device_of(static_cast<int>(j)));
}

namespace {

// GPU workers: the calling worker's copy stream (set for the length of a run).
thread_local Stream* tls_copy_stream = nullptr;

// An event after the work the calling worker queued so far on its stream (on `device`).
std::shared_ptr<Event> recorded_now(Device device) {
  auto event = std::make_shared<Event>(device);
  event->record(Stream::for_device(device));
  return event;
}

// The tensors of a message that arrived at a worker on `device`, written by a sender whose stream
// recorded `ready` after writing them: made usable by the worker's stream, in place on the same
// device, through the worker's copy stream from another one. No host wait.
void arrive(std::initializer_list<Tensor*> tensors, const std::shared_ptr<Event>& ready, Device device) {
  Stream& compute = Stream::for_device(device);
  bool waited = false;
  for (Tensor* t : tensors) {
    if (!t->defined()) continue;
    if (t->device() == device) {
      if (ready && !waited) compute.wait(*ready);
      waited = true;
      t->storage()->record_stream(compute);
      continue;
    }
    Stream& copy = *tls_copy_stream;
    if (ready) copy.wait(*ready);
    PETRA_CHECK(t->is_contiguous(), ShapeError, "concurrent executor: a message ", t->str(), " is a strided view");
    Tensor moved;
    {
      StreamGuard on_copy_stream(copy);  // the new block is the copy stream's
      MemoryScope scope(t->storage()->tag(), t->storage()->owner());
      moved = Tensor::empty(t->shape(), t->dtype(), device);
    }
    cuda_backend::memcpy_async(moved.raw_data(), t->raw_data(), t->nbytes(), copy.handle().cuda_stream);
    t->storage()->record_stream(copy);  // the sender's block waits for the copy before any reuse
    Event copied(device);
    copied.record(copy);
    compute.wait(copied);
    moved.storage()->record_stream(compute);
    *t = std::move(moved);
  }
}

}  // namespace

ForwardMessage ConcurrentExecutor::receive_forward(int j, std::int64_t microbatch, bool wait) {
  ForwardMessage m = SequentialExecutor::receive_forward(j, microbatch, wait);
  if (on_gpus_) arrive({&m.activation, &m.labels}, m.ready, device_of(j));
  m.ready.reset();
  return m;
}

void ConcurrentExecutor::send_forward(int j, ForwardMessage message) {
  if (on_gpus_) message.ready = recorded_now(device_of(j));
  SequentialExecutor::send_forward(j, std::move(message));
}

BackwardMessage ConcurrentExecutor::receive_backward(int j, std::int64_t microbatch, bool wait) {
  BackwardMessage m = SequentialExecutor::receive_backward(j, microbatch, wait);
  if (on_gpus_) arrive({&m.input, &m.gradient}, m.ready, device_of(j));
  m.ready.reset();
  return m;
}

void ConcurrentExecutor::send_backward(int j, BackwardMessage message) {
  if (on_gpus_) message.ready = recorded_now(device_of(j));
  SequentialExecutor::send_backward(j, std::move(message));
}

void ConcurrentExecutor::run(const Schedule& schedule, std::int64_t first, std::int64_t last,
                             const BatchSource& batches, const HeadCallback& on_head) {
  check_range(schedule, first, last);
  PETRA_CHECK(is_delayed(schedule.method), ValueError, "concurrent executor: ", name_of(schedule.method),
              " is synchronous; run it with the sequential executor");
  reopen_channels();
  std::mutex head_mutex;
  const HeadCallback guarded_head = [&](const HeadStats& s) {
    std::lock_guard lock(head_mutex);
    if (on_head) on_head(s);
  };
  // The first failure is the cause; it aborts every channel so that the other workers, which may be
  // waiting for a message the failed one will never send, stop at once instead of at their deadline.
  std::mutex error_mutex;
  std::exception_ptr first_error;
  // When each worker finished its cells of each step: a step ends when its last worker does.
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  std::vector<std::vector<Clock::time_point>> finished(workers_.size(),
                                                       std::vector<Clock::time_point>(last - first, start));
  if (on_gpus_ && gpu_streams_.empty())
    for (const Worker& worker : workers_) {
      gpu_streams_.push_back(std::make_unique<Stream>(worker.device, worker.threads));
      gpu_copy_streams_.push_back(std::make_unique<Stream>(worker.device));  // messages from other GPUs
    }
  std::vector<std::thread> threads;
  for (std::size_t w = 0; w < workers_.size(); ++w) {
    threads.emplace_back([&, w] {
      try {
        // CPU workers: a stream per call (its thread count is all it holds). GPU workers: the
        // executor's, the same in every call (see gpu_streams_).
        std::optional<Stream> cpu_stream;
        if (!on_gpus_) cpu_stream.emplace(workers_[w].device, workers_[w].threads);
        Stream& stream = on_gpus_ ? *gpu_streams_[w] : *cpu_stream;
        StreamGuard guard(stream);
        tls_copy_stream = on_gpus_ ? gpu_copy_streams_[w].get() : nullptr;
        for (std::int64_t t = first; t < last; ++t) {
          for (int j = 0; j < schedule.stages; ++j)
            if (placement_[j] == static_cast<int>(w)) execute_cell(schedule.cells[t][j], true, batches, guarded_head);
          finished[w][t - first] = Clock::now();
        }
        tls_copy_stream = nullptr;
        if (on_gpus_) {  // when run() returns, the devices are done
          stream.synchronize();
          gpu_copy_streams_[w]->synchronize();
        }
      } catch (...) {
        tls_copy_stream = nullptr;
        {
          std::lock_guard lock(error_mutex);
          if (!first_error) first_error = std::current_exception();
        }
        abort_channels();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
  step_seconds_.clear();
  Clock::time_point previous = start;
  for (std::int64_t i = 0; i < last - first; ++i) {
    Clock::time_point end = previous;
    for (const auto& f : finished) end = std::max(end, f[i]);
    step_seconds_.push_back(std::chrono::duration<double>(end - previous).count());
    previous = end;
  }
}

}  // namespace petra::pipeline
