// pipeline/trainer.cpp: data, model, optimizer, schedule, epochs, evaluation and checkpoints.
#include "pipeline/trainer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <algorithm>
#include <cmath>

#include "petra/ops.hpp"
#include "petra/stream.hpp"
#include "pipeline/checkpoint.hpp"

namespace petra::pipeline {

namespace {

using Clock = std::chrono::steady_clock;

void validate(const TrainConfig& c) {
  PETRA_CHECK(c.epochs >= 0, ValueError, "epochs must be >= 0, got ", c.epochs);
  PETRA_CHECK(c.batch_size >= 1, ValueError, "batch size must be >= 1, got ", c.batch_size);
  PETRA_CHECK(c.accumulation >= 1, ValueError, "accumulation must be >= 1, got ", c.accumulation);
  PETRA_CHECK(c.lr >= 0, ValueError, "learning rate must be >= 0, got ", c.lr);
  PETRA_CHECK(c.weight_decay >= 0, ValueError, "weight decay must be >= 0, got ", c.weight_decay);
  PETRA_CHECK(c.threads >= 0, ValueError, "threads must be >= 0, got ", c.threads);
  PETRA_CHECK(!c.resume || !c.checkpoint_dir.empty(), ValueError, "--resume needs --checkpoint-dir");
  PETRA_CHECK(c.threads_per_device >= 1, ValueError, "threads per device must be >= 1");
  PETRA_CHECK(c.track_gradient_quality >= 0, ValueError, "--track-gradient-quality must be >= 0");
  PETRA_CHECK(!c.track_reconstruction || is_delayed(c.method), ValueError,
              "--track-reconstruction measures the rebuilt inputs of the pipeline's stages: use a pipelined method");
  PETRA_CHECK(c.track_gradient_quality == 0 || is_delayed(c.method), ValueError,
              "--track-gradient-quality compares delayed gradients with backprop's: use a pipelined method");
  PETRA_CHECK(!c.delay_compensation || (is_delayed(c.method) && c.optimizer == "sgd" && c.momentum > 0 &&
                                        c.momentum < 1),
              ValueError, "--delay-compensation needs a pipelined method and sgd with 0 < momentum < 1");
}

// Keys whose values must agree between a checkpoint and the run resuming it.
const char* const kResumeKeys[] = {"dataset", "arch", "width", "stem", "classes", "method", "optimizer",
                                   "batch_size", "accumulation", "seed", "augment", "shuffle", "flush_each_epoch",
                                   "bn_statistics", "delay_compensation", "stage_sizes"};
// Resume keys that checkpoints written before they existed lack, with the value those runs had.
const std::map<std::string, std::string> kKeysAddedLater = {{"delay_compensation", "false"}, {"stage_sizes", ""}};

// "3,3,4"; "" for one block per stage (the default, however it was spelled).
std::string stage_sizes_text(const std::vector<std::int64_t>& sizes) {
  if (std::all_of(sizes.begin(), sizes.end(), [](std::int64_t s) { return s == 1; })) return "";
  return fmt::format("{}", fmt::join(sizes, ","));
}

std::string fmt_double(double v) { return fmt::format("{:.17g}", v); }

}  // namespace

std::map<std::string, std::string> describe(const TrainConfig& c) {
  std::string milestones;
  for (double m : c.milestones) milestones += (milestones.empty() ? "" : ",") + fmt_double(m);
  return {{"dataset", c.dataset},
          {"data_dir", c.data_dir.string()},
          {"augment", c.augment ? "true" : "false"},
          {"shuffle", c.shuffle ? "true" : "false"},
          {"arch", c.arch},
          {"width", std::to_string(c.width)},
          {"stem", c.stem},
          {"classes", std::to_string(c.classes)},
          {"stage_sizes", stage_sizes_text(c.stage_sizes)},
          {"method", std::string(name_of(c.method))},
          {"epochs", std::to_string(c.epochs)},
          {"max_steps", std::to_string(c.max_steps)},
          {"batch_size", std::to_string(c.batch_size)},
          {"accumulation", std::to_string(c.accumulation)},
          {"optimizer", c.optimizer},
          {"lr", fmt_double(c.lr)},
          {"momentum", fmt_double(c.momentum)},
          {"nesterov", c.nesterov ? "true" : "false"},
          {"weight_decay", fmt_double(c.weight_decay)},
          {"goyal_scaling", c.goyal_scaling ? "true" : "false"},
          {"warmup_epochs", fmt_double(c.warmup_epochs)},
          {"schedule", c.schedule},
          {"milestones", milestones},
          {"seed", std::to_string(c.seed)},
          {"threads", std::to_string(c.threads)},
          {"flush_each_epoch", c.flush_each_epoch ? "true" : "false"},
          {"bn_statistics", c.bn_statistics == nn::StatisticsPass::forward ? "forward" : "backward"},
          {"delay_compensation", c.delay_compensation ? "true" : "false"}};
}

std::string resume_mismatch(const CheckpointMeta& meta, const TrainConfig& config) {
  const auto mine = describe(config);
  for (const char* key : kResumeKeys) {
    const auto found = meta.find(key);
    const auto added_later = kKeysAddedLater.find(key);
    if (found == meta.end() && added_later == kKeysAddedLater.end()) return fmt::format("has no '{}'", key);
    const std::string& theirs = found != meta.end() ? found->second : added_later->second;
    if (theirs != mine.at(key))
      return fmt::format("was written with {} = {} but this run has {} = {}; refusing to resume", key, theirs, key,
                         mine.at(key));
  }
  return {};
}

Trainer::Trainer(const TrainConfig& config) : config_(config) {
  validate(config_);
  if (config_.threads > 0) {
    set_default_cpu_threads(config_.threads);
    Stream::current().set_num_threads(config_.threads);
  }
  data::SyntheticSpec synthetic;
  synthetic.train_size = config_.synthetic_train_size;
  synthetic.test_size = std::max<std::int64_t>(config_.synthetic_train_size / 5, 1);
  synthetic.seed = config_.seed;
  split_ = data::load_dataset(config_.dataset, config_.data_dir, synthetic);
  if (config_.classes == 0) config_.classes = split_.train.classes;
  PETRA_CHECK(config_.classes >= split_.train.classes, ValueError, "--classes ", config_.classes, " but ",
              config_.dataset, " has ", split_.train.classes, " classes");

  nn::ModelConfig model;
  model.arch = config_.arch;
  model.width = config_.width;
  model.in_channels = split_.train.channels();
  model.classes = config_.classes;
  model.stem = config_.stem;
  model.seed = config_.seed;
  model.stage_sizes = config_.stage_sizes;
  model_ = std::make_unique<nn::Model>(model);
  if (!config_.load_params.empty()) model_->load_state(config_.load_params);

  nn::OptimizerOptions options;
  options.momentum = config_.momentum;
  options.nesterov = config_.nesterov;
  optimizer_ = nn::make_optimizer(config_.optimizer, nn::decay_groups(model_->named_parameters(), config_.weight_decay),
                                  options);

  data::LoaderOptions train_options;
  train_options.batch_size = config_.batch_size;
  train_options.seed = config_.seed;
  train_options.shuffle = config_.shuffle;
  train_options.augment = config_.augment;
  train_loader_ = std::make_unique<data::Loader>(split_.train, train_options);
  data::LoaderOptions test_options = train_options;
  test_options.shuffle = false;
  test_options.augment = false;
  test_loader_ = std::make_unique<data::Loader>(split_.test, test_options);

  schedule_.kind = config_.epochs > 0 ? config_.schedule : "constant";  // --epochs 0: nothing to decay
  schedule_.base_lr = config_.goyal_scaling ? nn::goyal_lr(config_.lr, config_.accumulation, config_.batch_size)
                                            : config_.lr;
  // Cosine and polynomial decay need time after the warm-up: the warm-up is capped at half the run.
  schedule_.warmup_epochs = (config_.schedule == "cosine" || config_.schedule == "poly")
                                ? std::min(config_.warmup_epochs, 0.5 * static_cast<double>(config_.epochs))
                                : config_.warmup_epochs;
  schedule_.milestones = config_.milestones;
  schedule_.total_epochs = static_cast<double>(config_.epochs);
  nn::validate(schedule_);

  if (is_delayed(config_.method)) start_pipeline();
  if (config_.resume) restore_checkpoint(latest_checkpoint(config_.checkpoint_dir));
}

// The whole run is one schedule: mini-batch m is batch m % S of epoch m / S, the pipeline is not
// flushed between epochs (as in the official code) unless --flush-each-epoch, and it is drained at
// the end of the run. An epoch is S steps of the grid, or S + 2(J-1) when each epoch is drained.
void Trainer::start_pipeline() {
  const std::int64_t S = steps_per_epoch();
  std::int64_t batches = config_.epochs * S;
  if (config_.max_steps >= 0) batches = std::min(batches, config_.max_steps);
  const int J = static_cast<int>(model_->num_stages());
  if (config_.flush_each_epoch) {
    grid_ = make_flushed_schedule(config_.method, J, batches, config_.accumulation, S);
    grid_steps_per_epoch_ = S + 2 * (J - 1);
  } else {
    grid_ = make_schedule(config_.method, J, batches, config_.accumulation, /*drain=*/true);
    grid_steps_per_epoch_ = S;
  }
  RuntimeOptions options;
  options.method = config_.method;
  options.accumulation = config_.accumulation;
  options.optimizer = config_.optimizer;
  options.optimizer_options.momentum = config_.momentum;
  options.optimizer_options.nesterov = config_.nesterov;
  options.weight_decay = config_.weight_decay;
  options.schedule = schedule_;
  options.iterations_per_epoch = S;
  options.track_reconstruction = config_.track_reconstruction;
  options.statistics_pass = config_.bn_statistics;
  options.delay_compensation = config_.delay_compensation;
  optimizer_.reset();  // each stage owns an optimizer in the runtime
  if (config_.devices.size() <= 1) {
    executor_ = std::make_unique<SequentialExecutor>(*model_, options);
    return;
  }
  std::vector<ConcurrentExecutor::Worker> workers;
  for (const Device& d : config_.devices) workers.push_back({d, config_.threads_per_device});
  std::vector<int> placement = config_.placement;
  if (placement.empty()) {
    const std::vector<double> costs =
        measure_stage_costs(*model_, train_loader_->batch(0, 0), config_.threads_per_device);
    placement = balanced_placement(costs, static_cast<int>(workers.size()));
  }
  executor_ = std::make_unique<ConcurrentExecutor>(*model_, options, std::move(workers), std::move(placement));
}

const std::vector<int>& Trainer::placement() const {
  static const std::vector<int> none;
  const auto* concurrent = dynamic_cast<const ConcurrentExecutor*>(executor_.get());
  return concurrent ? concurrent->placement() : none;
}

Trainer::~Trainer() = default;

std::int64_t Trainer::steps_per_epoch() const { return train_loader_->batches_per_epoch(); }

double Trainer::learning_rate_at(std::int64_t iteration) const {
  return nn::learning_rate(schedule_, iteration, steps_per_epoch());
}

// Averages the k accumulated gradients (PETRA's 1/k), then one optimizer step.
void Trainer::apply_update(std::int64_t iteration) {
  if (config_.accumulation > 1) {
    const double inverse_k = 1.0 / static_cast<double>(config_.accumulation);
    for (const auto& p : model_->parameters()) {
      if (!p.grad().defined()) continue;
      MemoryScope scope(MemoryTag::gradients, p.grad().storage()->owner());
      p.set_grad(ops::scale(p.grad(), inverse_k));
    }
  }
  optimizer_->step(learning_rate_at(iteration));
  optimizer_->zero_grad();
}

void Trainer::run(const std::function<void(const StepProgress&)>& on_step,
                  const std::function<void(const EpochReport&)>& on_epoch) {
  if (executor_) {
    run_pipelined(on_step, on_epoch);
    return;
  }
  auto& allocator = Allocator::instance();
  while (epoch_ < config_.epochs && (config_.max_steps < 0 || global_step_ < config_.max_steps)) {
    allocator.reset_peaks(Device::cpu());
    model_->train();
    train_loader_->start_epoch(epoch_);
    double loss_sum = 0;
    std::int64_t correct = 0, samples = 0, step = 0;
    const auto start = Clock::now();
    bool complete = true;  // false when --max-steps stops the epoch early
    while (auto batch = train_loader_->next()) {
      if (config_.max_steps >= 0 && global_step_ >= config_.max_steps) {
        complete = false;
        break;
      }
      const StepResult r = train_step(*model_, config_.method, batch->images, batch->labels);
      if (!std::isfinite(r.loss))
        throw DivergedError(fmt::format("the loss became {} at epoch {}, step {} (global step {}); lower the learning "
                                        "rate. The last checkpoint written stays valid.",
                                        r.loss, epoch_, step, global_step_));
      loss_sum += r.loss * static_cast<double>(r.samples);
      correct += r.correct;
      samples += r.samples;
      if (++accumulated_ == config_.accumulation) {
        apply_update(global_step_);
        accumulated_ = 0;
      }
      ++global_step_;
      ++step;
      if (on_step) {
        const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        on_step({epoch_, step, steps_per_epoch(), global_step_, loss_sum / double(samples),
                 double(correct) / double(samples), double(samples) / std::max(seconds, 1e-9), seconds,
                 learning_rate_at(global_step_ - 1)});
      }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    EpochReport report;
    report.epoch = epoch_;
    report.train_loss = samples ? loss_sum / double(samples) : 0;
    report.train_accuracy = samples ? double(correct) / double(samples) : 0;
    report.images_per_second = double(samples) / std::max(seconds, 1e-9);
    report.seconds = seconds;
    report.lr = learning_rate_at(std::max<std::int64_t>(global_step_ - 1, 0));
    for (int t = 0; t < kNumMemoryTags; ++t) {
      const auto tag = static_cast<MemoryTag>(t);
      report.peak_bytes[std::string(name_of(tag))] = allocator.stats(Device::cpu(), tag).peak;
    }
    const Evaluation test = evaluate();
    report.test_loss = test.loss;
    report.test_accuracy = test.accuracy;
    report.complete = complete;
    if (complete) {  // a partial epoch is reported but neither counted nor checkpointed
      ++epoch_;
      if (!config_.checkpoint_dir.empty()) save_checkpoint();
    }
    if (on_epoch) on_epoch(report);
    if (!complete) break;
  }
}

void Trainer::run_pipelined(const std::function<void(const StepProgress&)>& on_step,
                            const std::function<void(const EpochReport&)>& on_epoch) {
  auto& allocator = Allocator::instance();
  const std::int64_t S = steps_per_epoch(), L = grid_steps_per_epoch_;
  const auto batch_of = [this, S](std::int64_t m) { return train_loader_->batch(m / S, m % S); };
  while (epoch_ < config_.epochs && global_step_ < grid_.steps) {
    allocator.reset_peaks(Device::cpu());
    model_->train();
    // This epoch's steps; the last epoch also runs the drain steps that finish the pipeline.
    const std::int64_t first = global_step_;
    const bool last_epoch = epoch_ + 1 == config_.epochs || (epoch_ + 1) * S >= grid_.batches;
    const std::int64_t last = last_epoch ? grid_.steps : std::min((epoch_ + 1) * L, grid_.steps);
    double loss_sum = 0;
    std::int64_t correct = 0, samples = 0, newest = 0;  // newest: the last mini-batch the head saw
    bool diverged = false;
    const auto head = [&](const HeadStats& s) {
      loss_sum += s.loss * double(s.samples);
      correct += s.correct;
      samples += s.samples;
      newest = std::max(newest, s.microbatch);
      diverged = diverged || !std::isfinite(s.loss);
    };
    EpochReport report;
    const auto start = Clock::now();
    const std::int64_t chunk = std::max<std::int64_t>(1, S / 20);  // progress granularity
    const std::int64_t every = config_.track_gradient_quality;
    for (std::int64_t t = first, end = first; t < last; t = end) {
      end = std::min(t + chunk, last);
      if (every > 0 && t % every == 0) {  // a tracked step runs alone
        end = t + 1;
        report.gradient_quality.push_back(tracked_step(t, batch_of, head));
      } else {
        if (every > 0) end = std::min(end, (t / every + 1) * every);
        executor_->run(grid_, t, end, batch_of, head);
      }
      global_step_ = end;
      if (diverged)
        throw DivergedError(fmt::format("the loss became non-finite at epoch {}, step {}; lower the learning rate",
                                        epoch_, global_step_));
      if (on_step && samples > 0) {
        const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        on_step({epoch_, end - first, last - first, global_step_, loss_sum / double(samples),
                 double(correct) / double(samples), double(samples) / std::max(seconds, 1e-9), seconds,
                 learning_rate_at(newest)});
      }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    report.epoch = epoch_;
    report.train_loss = samples ? loss_sum / double(samples) : 0;
    report.train_accuracy = samples ? double(correct) / double(samples) : 0;
    report.images_per_second = double(samples) / std::max(seconds, 1e-9);
    report.seconds = seconds;
    report.lr = learning_rate_at(newest);
    for (int t = 0; t < kNumMemoryTags; ++t) {
      const auto tag = static_cast<MemoryTag>(t);
      report.peak_bytes[std::string(name_of(tag))] = allocator.stats(Device::cpu(), tag).peak;
    }
    for (int j = 0; j < static_cast<int>(model_->num_stages()); ++j) {
      std::map<std::string, std::int64_t> stage;
      for (int t = 0; t < kNumMemoryTags; ++t) {
        const auto tag = static_cast<MemoryTag>(t);
        const std::int64_t peak = allocator.stats(Device::cpu(), tag, j).peak;
        if (peak > 0) stage[std::string(name_of(tag))] = peak;
      }
      stage["total"] = allocator.stats_of_owner(Device::cpu(), j).peak;
      report.stage_peak_bytes.push_back(std::move(stage));
    }
    if (config_.track_reconstruction) report.reconstruction_errors = reconstruction_errors();
    const Evaluation test = evaluate();  // current parameters; mini-batches may still be in flight
    report.test_loss = test.loss;
    report.test_accuracy = test.accuracy;
    report.complete = last - first >= std::min(L, grid_.steps - first);
    ++epoch_;
    // The checkpoint holds the mini-batches in flight: a resumed run continues the same grid.
    if (report.complete && !config_.checkpoint_dir.empty()) save_checkpoint();
    if (on_epoch) on_epoch(report);
  }
}

namespace {
// All gradients of one stage's parameters, flattened (zeros where a parameter has none).
std::vector<double> flat_gradients(const std::vector<Tensor>& grads) {
  std::vector<double> flat;
  for (const Tensor& g : grads) {
    const auto v = g.to_vector<float>();
    flat.insert(flat.end(), v.begin(), v.end());
  }
  return flat;
}

StageGradientQuality compare_gradients(const std::vector<double>& delayed, const std::vector<double>& exact) {
  double dot = 0, dd = 0, ee = 0, diff = 0;
  for (std::size_t i = 0; i < delayed.size(); ++i) {
    dot += delayed[i] * exact[i];
    dd += delayed[i] * delayed[i];
    ee += exact[i] * exact[i];
    diff += (delayed[i] - exact[i]) * (delayed[i] - exact[i]);
  }
  StageGradientQuality q;
  q.cosine = dot / std::max(std::sqrt(dd * ee), 1e-300);
  q.norm_ratio = std::sqrt(dd / std::max(ee, 1e-300));
  q.relative_error = std::sqrt(diff / std::max(ee, 1e-300));
  return q;
}
}  // namespace

GradientQuality Trainer::tracked_step(std::int64_t t, const SequentialExecutor::BatchSource& batches,
                                      const SequentialExecutor::HeadCallback& on_head) {
  const int J = static_cast<int>(model_->num_stages());
  // Which mini-batch each stage runs backward at step t (one full backprop per mini-batch).
  std::map<std::int64_t, std::vector<int>> stages_of;
  for (int j = 0; j < J; ++j)
    for (const Action& a : grid_.cells[t][j])
      if (a.kind == Action::Kind::backward) stages_of[a.microbatch].push_back(j);
  // 1. Exact gradients at the current parameters; the accumulated delayed gradients are set aside
  //    and batch norm's running statistics are left alone, so training is not disturbed.
  const auto params = model_->parameters();
  std::vector<Tensor> accumulated;
  for (const auto& p : params) {
    accumulated.push_back(p.grad());
    p.zero_grad();
  }
  std::vector<std::vector<double>> exact(J);
  for (const auto& [m, stages] : stages_of) {
    const data::Batch b = batches(m);
    {
      nn::RunningStatsGuard frozen;
      backprop_step(*model_, b.images, b.labels);
    }
    for (int j : stages) {
      std::vector<Tensor> grads;
      for (const auto& p : model_->stage(j).parameters())
        grads.push_back(p.grad().defined() ? p.grad() : Tensor::zeros(p.shape(), p.data().dtype()));
      exact[j] = flat_gradients(grads);
    }
    model_->zero_grad();
  }
  for (std::size_t i = 0; i < params.size(); ++i)
    if (accumulated[i].defined()) params[i].set_grad(accumulated[i]);
  // 2. The step itself, each stage keeping the contribution of its backward.
  for (int j = 0; j < J; ++j) executor_->stage(j).set_capture_gradient(true);
  executor_->run(grid_, t, t + 1, batches, on_head);
  for (int j = 0; j < J; ++j) executor_->stage(j).set_capture_gradient(false);
  // 3. Compare.
  GradientQuality quality{t, {}};
  for (const auto& [m, stages] : stages_of)
    for (int j : stages) {
      StageGradientQuality q = compare_gradients(flat_gradients(executor_->stage(j).captured_gradient()), exact[j]);
      q.stage = j;
      q.microbatch = m;
      quality.stages.push_back(q);
    }
  std::sort(quality.stages.begin(), quality.stages.end(),
            [](const auto& a, const auto& b) { return a.stage < b.stage; });
  return quality;
}

std::vector<double> Trainer::reconstruction_errors() {
  std::vector<double> errors;
  if (!executor_) return errors;
  for (std::size_t j = 0; j < executor_->num_stages(); ++j) errors.push_back(executor_->stage(j).last_reconstruction_error());
  return errors;
}

Evaluation Trainer::evaluate() {
  NoGradGuard no_grad;
  model_->eval();
  test_loader_->start_epoch(0);
  Evaluation e;
  double loss_sum = 0;
  std::int64_t correct = 0;
  while (auto batch = test_loader_->next()) {
    const Variable logits = model_->forward(Variable(batch->images));
    const Variable loss = cross_entropy(logits, batch->labels);
    loss_sum += loss.data().item() * double(batch->labels.numel());
    correct += ops::count_correct(logits.data(), batch->labels);
    e.samples += batch->labels.numel();
  }
  model_->train();
  e.loss = e.samples ? loss_sum / double(e.samples) : 0;
  e.accuracy = e.samples ? double(correct) / double(e.samples) : 0;
  return e;
}

// The optimizers a checkpoint holds: the trainer's, or one per stage for a pipelined method.
std::vector<CheckpointOptimizer> Trainer::checkpoint_optimizers() {
  if (!executor_) return {{"", optimizer_.get()}};
  std::vector<CheckpointOptimizer> per_stage;
  for (std::size_t j = 0; j < executor_->num_stages(); ++j)
    per_stage.push_back({fmt::format("stage-{:02d}", j), &executor_->stage(j).optimizer()});
  return per_stage;
}

void Trainer::save_checkpoint() {
  CheckpointMeta meta = describe(config_);
  meta["format"] = "1";
  meta["next_epoch"] = std::to_string(epoch_);
  meta["global_step"] = std::to_string(global_step_);
  meta["accumulated"] = std::to_string(accumulated_);
  std::function<void(const std::filesystem::path&)> write_pipeline;
  if (executor_) write_pipeline = [this](const std::filesystem::path& dir) { executor_->save_in_flight(dir); };
  // A pipelined run has gradients in flight at any epoch end (each stage's window is its own).
  const bool gradients = accumulated_ > 0 || executor_ != nullptr;
  last_checkpoint_ = write_checkpoint(config_.checkpoint_dir, fmt::format("epoch-{:06d}", epoch_), *model_,
                                      checkpoint_optimizers(), meta, gradients, write_pipeline);
}

void Trainer::restore_checkpoint(const std::filesystem::path& dir) {
  const CheckpointMeta meta = read_checkpoint_meta(dir);
  const auto mine = describe(config_);
  const std::string mismatch = resume_mismatch(meta, config_);
  PETRA_CHECK(mismatch.empty(), CheckpointError, "checkpoint ", dir.string(), " ", mismatch);
  // A pipelined run continues its grid, which the number of epochs shapes (mini-batch ids, drain).
  if (executor_)
    PETRA_CHECK(meta.count("epochs") && meta.at("epochs") == mine.at("epochs"), CheckpointError, "checkpoint ",
                dir.string(), " belongs to a pipelined run of ", meta.count("epochs") ? meta.at("epochs") : "?",
                " epochs; resume it with the same --epochs (this run has ", mine.at("epochs"), ")");
  pipeline::restore_checkpoint(dir, *model_, checkpoint_optimizers());
  if (executor_) executor_->load_in_flight(dir / "pipeline");
  epoch_ = std::stoll(meta.at("next_epoch"));
  global_step_ = std::stoll(meta.at("global_step"));
  accumulated_ = std::stoll(meta.at("accumulated"));
  last_checkpoint_ = dir;
}

}  // namespace petra::pipeline
