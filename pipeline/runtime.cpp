// pipeline/runtime.cpp: the per-method stage runtime and the sequential executor.
#include "pipeline/runtime.hpp"

#include <chrono>
#include <cmath>
#include <exception>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "nn/layers.hpp"
#include "petra/stream.hpp"

#include "petra/files.hpp"
#include "petra/npy.hpp"
#include "petra/ops.hpp"
#include "pipeline/checkpoint.hpp"

namespace petra::pipeline {

Keeping keeping(PipelineMethod method, nn::StageKind kind) {
  if (kind == nn::StageKind::head) return {};  // forward and backward in the same step
  const bool reversible = kind == nn::StageKind::reversible;
  switch (method) {
    case PipelineMethod::petra: return {!reversible, false};
    case PipelineMethod::delayed_reversible: return {!reversible, true};
    case PipelineMethod::dsp: return {true, false};
    case PipelineMethod::pipedream: return {true, true};
    case PipelineMethod::revbackprop: return {!reversible, false};
    case PipelineMethod::backprop: return {true, false};  // recomputes from the stored input: same numbers
  }
  return {};
}

namespace {

// Runs with the stashed parameters for its lifetime, then puts the current ones back.
template <class Swap>
struct StashedParameters {
  Swap swap;
  bool active;
  StashedParameters(Swap s, bool on) : swap(s), active(on) {
    if (active) swap();
  }
  ~StashedParameters() {
    if (active) swap();
  }
};

}  // namespace

double update_delay(PipelineMethod method, int index, int stages, std::int64_t accumulation) {
  if (!is_delayed(method)) return 0;
  return 2.0 * (stages - 1 - index) / static_cast<double>(accumulation);
}

StageRuntime::StageRuntime(nn::Stage& stage, int index, int stages, const RuntimeOptions& options,
                           bool next_keeps_input)
    : stage_(stage), index_(index), stages_(stages), options_(options), keeping_(keeping(options.method, stage.kind())),
      next_keeps_input_(next_keeps_input) {
  nn::OptimizerOptions optimizer_options = options.optimizer_options;
  if (options.delay_compensation) optimizer_options.delay = update_delay(options.method, index, stages, options.accumulation);
  optimizer_ = nn::make_optimizer(options.optimizer, nn::decay_groups(stage.named_parameters(), options.weight_decay),
                                  optimizer_options);
}

void StageRuntime::swap_parameters(std::vector<Tensor>& values) {
  const auto params = stage_.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    Tensor current = params[i].data();
    params[i].set_data(values[i]);
    values[i] = std::move(current);
  }
}

std::vector<Tensor> StageRuntime::gradients_before() const {
  std::vector<Tensor> copies;
  if (!capture_gradient_) return copies;
  for (const auto& p : stage_.parameters()) copies.push_back(p.grad().defined() ? p.grad().clone() : Tensor());
  return copies;
}

void StageRuntime::capture(const std::vector<Tensor>& before, std::int64_t microbatch) {
  if (!capture_gradient_) return;
  captured_gradient_.clear();
  const auto params = stage_.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& after = params[i].grad();
    if (!after.defined()) {
      captured_gradient_.push_back(Tensor::zeros(params[i].shape(), params[i].data().dtype()));
      continue;
    }
    captured_gradient_.push_back(before[i].defined() ? ops::sub(after, before[i]) : after.clone());
  }
  captured_microbatch_ = microbatch;
}

StageRuntime::Kept StageRuntime::pop(std::int64_t microbatch, const char* what) {
  PETRA_CHECK(!fifo_.empty(), Error, "stage ", index_, ": ", what, " of mini-batch ", microbatch,
              " but no mini-batch is in flight here");
  PETRA_CHECK(fifo_.front().microbatch == microbatch, Error, "stage ", index_, ": ", what, " of mini-batch ", microbatch,
              " but the oldest in flight is ", fifo_.front().microbatch, " (messages out of order)");
  Kept kept = std::move(fifo_.front());
  fifo_.pop_front();
  return kept;
}

ForwardMessage StageRuntime::forward(ForwardMessage in) {
  Kept kept{in.microbatch, {}, {}};
  if (keeping_.input || options_.track_reconstruction) kept.input = in.activation;
  if (keeping_.parameters) {
    MemoryScope scope(MemoryTag::param_stash, index_);
    for (const auto& p : stage_.parameters()) kept.parameters.push_back(p.data().clone());
  }
  ForwardMessage out{in.microbatch, {}, std::move(in.labels)};
  {
    NoGradGuard no_grad;
    nn::RunningStatsGuard statistics(options_.statistics_pass == nn::StatisticsPass::forward);
    MemoryScope scope(MemoryTag::activations, index_);  // the forward's temporaries, freed at its end
    out.activation = stage_.forward(Variable(in.activation)).data();
    out.activation.storage()->retag(next_keeps_input_ ? MemoryTag::input_buffer : MemoryTag::messages,
                                    next_keeps_input_ ? index_ + 1 : index_);
  }
  fifo_.push_back(std::move(kept));
  return out;
}

BackwardMessage StageRuntime::backward(BackwardMessage from_above) {
  Kept kept = pop(from_above.microbatch, "backward");
  BackwardMessage out{from_above.microbatch, {}, {}};
  MemoryScope scope(MemoryTag::activations, index_);  // the recomputed graph, freed at the end
  const std::vector<Tensor> before = gradients_before();
  nn::StatisticsPassScope statistics(options_.statistics_pass);
  StashedParameters stash([&] { swap_parameters(kept.parameters); }, keeping_.parameters);
  const bool rebuilds_input = stage_.kind() == nn::StageKind::reversible && !keeping_.input;
  if (rebuilds_input) {
    // PETRA (current parameters) or delayed-reversible (stashed ones): rebuild the input from the
    // output received from above, reusing F's graph for the backward.
    std::tie(out.input, out.gradient) = stage_.reconstruct_and_backward(from_above.input, from_above.gradient);
    if (options_.track_reconstruction) last_reconstruction_error_ = ops::relative_error(out.input, kept.input);
  } else {
    out.gradient = nn::backward_from_input(stage_, kept.input, from_above.gradient, /*input_gradient=*/index_ > 0);
    out.input = std::move(kept.input);
  }
  if (out.gradient.defined()) out.gradient.storage()->retag(MemoryTag::messages, index_);
  if (rebuilds_input) out.input.storage()->retag(MemoryTag::messages, index_);  // the rebuilt input travels down
  ++received_;
  capture(before, from_above.microbatch);
  return out;
}

BackwardMessage StageRuntime::head_step(ForwardMessage in, HeadStats& stats) {
  MemoryScope scope(MemoryTag::activations, index_);
  const std::vector<Tensor> before = gradients_before();
  const nn::HeadResult r = stage_.loss_and_backward(in.activation, in.labels);
  r.dx.storage()->retag(MemoryTag::messages, index_);
  stats = {in.microbatch, r.loss, r.correct, in.labels.numel()};
  ++received_;
  capture(before, in.microbatch);
  return {in.microbatch, std::move(in.activation), r.dx};
}

void StageRuntime::update(std::int64_t microbatch) {
  if (received_ == 0) return;
  if (options_.apply_updates) {
    if (received_ > 1) {
      MemoryScope scope(MemoryTag::gradients, index_);
      const double inverse = 1.0 / static_cast<double>(received_);
      for (const auto& p : stage_.parameters())
        if (p.grad().defined()) p.set_grad(ops::scale(p.grad(), inverse));
    }
    optimizer_->step(nn::learning_rate(options_.schedule, microbatch, options_.iterations_per_epoch));
    optimizer_->zero_grad();
  }
  received_ = 0;
}

// ---------------------------------------------------------------- in-flight state (checkpoints)
namespace {
namespace fs = std::filesystem;

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  PETRA_CHECK(in.is_open(), CheckpointError, "checkpoint: cannot read ", path.string());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

Tensor load_tensor(const fs::path& path, MemoryTag tag, int owner) {
  PETRA_CHECK(fs::exists(path), CheckpointError, "checkpoint: ", path.string(), " is missing");
  MemoryScope scope(tag, owner);
  return load_npy(path);
}

std::string stage_dir(int j) { return fmt::format("stage-{:02d}", j); }
}  // namespace

void StageRuntime::save_in_flight(const fs::path& dir) const {
  fs::create_directories(dir);
  std::string index = fmt::format("received {}\n", received_);
  for (const Kept& k : fifo_) {
    index += fmt::format("kept {} {} {}\n", k.microbatch, k.input.defined() ? 1 : 0, k.parameters.size());
    if (k.input.defined()) save_npy(dir / fmt::format("kept-{}-input.npy", k.microbatch), k.input);
    for (std::size_t i = 0; i < k.parameters.size(); ++i)
      save_npy(dir / fmt::format("kept-{}-param-{}.npy", k.microbatch, i), k.parameters[i]);
  }
  write_file_atomically(dir / "state.txt", index);
}

void StageRuntime::load_in_flight(const fs::path& dir) {
  fifo_.clear();
  received_ = 0;
  for (const std::string& line : read_lines(dir / "state.txt")) {
    std::istringstream fields(line);
    std::string what;
    fields >> what;
    if (what == "received") {
      fields >> received_;
    } else if (what == "kept") {
      Kept k{-1, {}, {}};
      int has_input = 0;
      std::size_t parameters = 0;
      fields >> k.microbatch >> has_input >> parameters;
      PETRA_CHECK(!fields.fail() && parameters <= stage_.parameters().size(), CheckpointError, "checkpoint: ",
                  (dir / "state.txt").string(), ": malformed line '", line, "'");
      if (has_input) k.input = load_tensor(dir / fmt::format("kept-{}-input.npy", k.microbatch), MemoryTag::input_buffer, index_);
      for (std::size_t i = 0; i < parameters; ++i)
        k.parameters.push_back(load_tensor(dir / fmt::format("kept-{}-param-{}.npy", k.microbatch, i),
                                           MemoryTag::param_stash, index_));
      fifo_.push_back(std::move(k));
    }
    PETRA_CHECK(!fields.fail(), CheckpointError, "checkpoint: ", (dir / "state.txt").string(), ": malformed line '",
                line, "'");
  }
}

void SequentialExecutor::save_in_flight(const fs::path& dir) const {
  fs::create_directories(dir);
  std::string index;
  for (std::size_t j = 0; j < stages_.size(); ++j) {
    stages_[j]->save_in_flight(dir / stage_dir(static_cast<int>(j)));
    index += fmt::format("last_backward {} {}\n", j, last_backward_[j]);
    for (const ForwardMessage& m : to_next_[j].pending()) {
      index += fmt::format("forward {} {}\n", j, m.microbatch);
      save_npy(dir / fmt::format("forward-{}-{}-activation.npy", j, m.microbatch), m.activation);
      save_npy(dir / fmt::format("forward-{}-{}-labels.npy", j, m.microbatch), m.labels);
    }
    for (const BackwardMessage& m : to_previous_[j].pending()) {
      index += fmt::format("backward {} {}\n", j, m.microbatch);
      save_npy(dir / fmt::format("backward-{}-{}-input.npy", j, m.microbatch), m.input);
      save_npy(dir / fmt::format("backward-{}-{}-gradient.npy", j, m.microbatch), m.gradient);
    }
  }
  write_file_atomically(dir / "channels.txt", index);
}

void SequentialExecutor::load_in_flight(const fs::path& dir) {
  const int J = static_cast<int>(stages_.size());
  for (int j = 0; j < J; ++j) stages_[j]->load_in_flight(dir / stage_dir(j));
  for (const std::string& line : read_lines(dir / "channels.txt")) {
    std::istringstream fields(line);
    std::string what;
    int j = -1;
    std::int64_t m = -1;
    fields >> what >> j >> m;
    PETRA_CHECK(!fields.fail() && 0 <= j && j < J, CheckpointError, "checkpoint: ", (dir / "channels.txt").string(),
                ": malformed line '", line, "'");
    if (what == "last_backward") {
      last_backward_[j] = m;
    } else if (what == "forward") {  // from stage j to j + 1: tagged as the sender's forward tags it
      const bool kept_above = j + 1 < J && stages_[j + 1]->keeps_input();
      const MemoryTag tag = kept_above ? MemoryTag::input_buffer : MemoryTag::messages;
      const int owner = kept_above ? j + 1 : j;
      to_next_[j].push({m, load_tensor(dir / fmt::format("forward-{}-{}-activation.npy", j, m), tag, owner),
                        load_tensor(dir / fmt::format("forward-{}-{}-labels.npy", j, m), MemoryTag::messages, j)});
    } else if (what == "backward") {  // from stage j + 1 to j
      to_previous_[j].push({m, load_tensor(dir / fmt::format("backward-{}-{}-input.npy", j, m), MemoryTag::messages, j + 1),
                            load_tensor(dir / fmt::format("backward-{}-{}-gradient.npy", j, m), MemoryTag::messages, j + 1)});
    } else {
      throw CheckpointError(fmt::format("checkpoint: {}: unknown line '{}'", (dir / "channels.txt").string(), line));
    }
  }
}

// ---------------------------------------------------------------- channels
template <class Message>
Message Channel<Message>::pop(bool wait, std::int64_t microbatch, int stage, const char* what) {
  std::unique_lock lock(mutex_);
  if (wait) arrived_.wait(lock, [&] { return !queue_.empty(); });
  PETRA_CHECK(!queue_.empty(), Error, "stage ", stage, ": ", what, " of mini-batch ", microbatch,
              " but no message has arrived (the schedule and the executor disagree)");
  PETRA_CHECK(queue_.front().microbatch == microbatch, Error, "stage ", stage, ": ", what, " of mini-batch ",
              microbatch, " received the message of mini-batch ", queue_.front().microbatch);
  Message m = std::move(queue_.front());
  queue_.pop_front();
  return m;
}

// ---------------------------------------------------------------- sequential executor
SequentialExecutor::SequentialExecutor(nn::Model& model, const RuntimeOptions& options)
    : to_next_(model.num_stages()), to_previous_(model.num_stages()), last_backward_(model.num_stages(), 0) {
  const int J = static_cast<int>(model.num_stages());
  for (int j = 0; j < J; ++j) {
    const bool next_keeps = j + 1 < J && keeping(options.method, model.stage(j + 1).kind()).input;
    stages_.push_back(std::make_unique<StageRuntime>(model.stage(j), j, J, options, next_keeps));
  }
}

void SequentialExecutor::execute(const Action& action, bool wait, const BatchSource& batches,
                                 const HeadCallback& on_head) {
  const int j = action.stage, head = static_cast<int>(stages_.size()) - 1;
  const std::int64_t m = action.microbatch;
  switch (action.kind) {
    case Action::Kind::forward: {
      ForwardMessage in;
      if (j == 0) {
        data::Batch b = batches(m);
        in = {m, std::move(b.images), std::move(b.labels)};
      } else {
        in = to_next_[j - 1].pop(wait, m, j, "forward");
      }
      if (j == head)
        to_next_[head].push(std::move(in));  // the head's backward, next in this cell, takes it
      else
        to_next_[j].push(stages_[j]->forward(std::move(in)));
      break;
    }
    case Action::Kind::backward: {
      BackwardMessage out;
      if (j == head) {
        HeadStats stats;
        out = stages_[j]->head_step(to_next_[head].pop(false, m, j, "head step"), stats);
        if (on_head) on_head(stats);
      } else {
        out = stages_[j]->backward(to_previous_[j].pop(wait, m, j, "backward"));
      }
      if (j > 0) to_previous_[j - 1].push(std::move(out));
      last_backward_[j] = m;
      break;
    }
    case Action::Kind::update: stages_[j]->update(last_backward_[j]); break;
  }
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
  for (std::int64_t t = first; t < last; ++t) {
    const auto& row = schedule.cells[t];
    if (is_delayed(schedule.method)) {
      // Messages produced in step t are consumed in step t + 1, so the stages of one step could
      // run in any order (and do run at the same time in the concurrent executor).
      for (int j = 0; j < J; ++j) execute_cell(row[j], false, batches, on_head);
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
  for (const Worker& w : workers_) {
    PETRA_CHECK(w.threads >= 1, ValueError, "concurrent executor: a worker needs at least one thread");
    PETRA_CHECK(w.device.is_cpu(), DeviceError, "concurrent executor: ", w.device.str(),
                " workers come with the CUDA issue; use cpu:N devices");
  }
}

void ConcurrentExecutor::run(const Schedule& schedule, std::int64_t first, std::int64_t last,
                             const BatchSource& batches, const HeadCallback& on_head) {
  check_range(schedule, first, last);
  PETRA_CHECK(is_delayed(schedule.method), ValueError, "concurrent executor: ", name_of(schedule.method),
              " is synchronous; run it with the sequential executor");
  std::mutex head_mutex;
  const HeadCallback guarded_head = [&](const HeadStats& s) {
    std::lock_guard lock(head_mutex);
    if (on_head) on_head(s);
  };
  std::vector<std::exception_ptr> errors(workers_.size());
  std::vector<std::thread> threads;
  for (std::size_t w = 0; w < workers_.size(); ++w) {
    threads.emplace_back([&, w] {
      try {
        Stream stream(workers_[w].device, workers_[w].threads);
        StreamGuard guard(stream);
        for (std::int64_t t = first; t < last; ++t)
          for (int j = 0; j < schedule.stages; ++j)
            if (placement_[j] == static_cast<int>(w)) execute_cell(schedule.cells[t][j], true, batches, guarded_head);
      } catch (...) {
        errors[w] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

std::vector<double> measure_stage_costs(nn::Model& model, const data::Batch& batch, int threads) {
  using Clock = std::chrono::steady_clock;
  Stream stream(Device::cpu(), threads);  // as a worker will run them
  StreamGuard guard(stream);
  const std::size_t J = model.num_stages();
  std::vector<double> costs(J, 0.0);
  Tensor x = batch.images;
  for (std::size_t j = 0; j < J; ++j) {
    nn::Stage& stage = model.stage(j);
    double best = 1e300;
    Tensor y;
    for (int repeat = 0; repeat < 3; ++repeat) {  // the best of 3: the first warms caches and allocator
      const auto start = Clock::now();
      if (stage.kind() == nn::StageKind::head) {
        stage.loss_and_backward(x, batch.labels);
      } else {
        {
          NoGradGuard no_grad;
          nn::RunningStatsGuard keep_statistics;
          y = stage.forward(Variable(x)).data();
        }
        const Tensor dy = Tensor::full(y.shape(), 1e-3);
        if (stage.kind() == nn::StageKind::reversible)
          stage.reconstruct_and_backward(y, dy);  // what PETRA's backward runs
        else
          nn::backward_from_input(stage, x, dy, j > 0);
      }
      best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
    }
    costs[j] = best;
    stage.zero_grad();
    if (y.defined()) x = y;
  }
  return costs;
}

std::vector<int> balanced_placement(const std::vector<double>& costs, int workers) {
  PETRA_CHECK(workers >= 1, ValueError, "balanced_placement: need at least one worker");
  const int n = static_cast<int>(costs.size());
  // best[w][i]: the smallest possible largest load when stages [0, i) go to w workers.
  std::vector<std::vector<double>> best(workers + 1, std::vector<double>(n + 1, 1e300));
  std::vector<std::vector<int>> cut(workers + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int w = 1; w <= workers; ++w)
    for (int i = 0; i <= n; ++i) {
      double load = 0;
      for (int start = i; start >= 0; --start) {  // worker w takes stages [start, i)
        if (start < i) load += costs[start];
        const double candidate = std::max(best[w - 1][start], load);
        if (candidate < best[w][i]) {
          best[w][i] = candidate;
          cut[w][i] = start;
        }
      }
    }
  std::vector<int> placement(n, 0);
  for (int w = workers, i = n; w >= 1; --w) {
    for (int j = cut[w][i]; j < i; ++j) placement[j] = w - 1;
    i = cut[w][i];
  }
  return placement;
}

}  // namespace petra::pipeline
