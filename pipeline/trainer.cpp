// pipeline/trainer.cpp: data, model, the run's schedule and executor, epochs, evaluation and checkpoints.
#include "petra/pipeline/trainer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include <unistd.h>

#include "petra/checked.hpp"
#include "petra/functions.hpp"
#include "petra/stream.hpp"
#include "petra/pipeline/checkpoint.hpp"
#include "petra/pipeline/memory_report.hpp"
#include "petra/pipeline/placement.hpp"
#include "petra/pipeline/stage_layout.hpp"

namespace petra::pipeline {

namespace {
using Clock = std::chrono::steady_clock;

// "[60000, 1, 28, 28] uint8 crc32 0x1a2b3c4d": what training reads of a tensor (an empty set: "none").
std::string fingerprint(const Tensor& t) {
  if (!t.defined()) return "none";
  const Tensor packed = t.contiguous();
  const auto bytes = std::span(static_cast<const std::byte*>(packed.raw_data()), packed.nbytes());
  return fmt::format("{} {} crc32 {:#010x}", t.shape().str(), name_of(t.dtype()), crc32_of(bytes));
}
}  // namespace

CheckpointMeta dataset_identity(const data::Split& split) {
  return {{"data_train_images", fingerprint(split.train.images)},
          {"data_train_labels", fingerprint(split.train.labels)},
          {"data_test_images", fingerprint(split.test.images)},
          {"data_test_labels", fingerprint(split.test.labels)}};
}

std::string dataset_mismatch(const CheckpointMeta& meta, const CheckpointMeta& identity) {
  for (const auto& [key, mine] : identity) {
    const auto found = meta.find(key);
    if (found == meta.end()) continue;  // a checkpoint from before the key: unchecked
    if (found->second != mine) {
      const auto data_dir = meta.find("data_dir");
      return fmt::format("was written on other data: {} = {} there, {} here{}", key, found->second, mine,
                         data_dir == meta.end() ? "" : fmt::format(" (its --data-dir was '{}')", data_dir->second));
    }
  }
  return {};
}

Trainer::Trainer(const TrainConfig& config) : config_(config) {
  validate(config_);
  // --mpi: this process runs its group of stages of one replica, on its device (a GPU of --devices,
  // by local rank); messages to the others go over MPI or NCCL (--transport).
  if (config_.mpi) group_ = mpi_process_group(config_.replicas, config_.transport, config_.devices);
  if (config_.threads > 0) {
    set_default_cpu_threads(config_.threads);
    Stream::current().set_num_threads(config_.threads);
  }
  data::SyntheticSpec synthetic;
  synthetic.train_size = config_.synthetic_train_size;
  synthetic.test_size = std::max<std::int64_t>(config_.synthetic_train_size / 5, 1);
  synthetic.seed = config_.seed;
  check_at_most<ValueError>(config_.classes, data::kMaxClasses, "--classes");
  // The number of classes is the data set's (its format, or an npy directory's classes.txt);
  // --classes stands in for it where the files do not say, and may widen the head otherwise.
  split_ = data::load_dataset(config_.dataset, config_.data_dir, synthetic, config_.classes);
  // The readers refuse files with no images; only a synthetic set can still be empty.
  PETRA_CHECK(config_.dataset != "synthetic" || split_.train.size() > 0, ValueError,
              "--synthetic-size ", config_.synthetic_train_size, ": the training set is empty");
  PETRA_CHECK(split_.train.size() > 0, IOError, config_.dataset, " in '", config_.data_dir.string(),
              "': the training set is empty");
  if (config_.classes == 0) config_.classes = split_.train.classes;
  // Only runs that write or read checkpoints pay for the checksums (~30 ms for Fashion-MNIST).
  if (!config_.checkpoint_dir.empty()) data_identity_ = dataset_identity(split_);
  PETRA_CHECK(config_.classes >= split_.train.classes, ValueError, "--classes ", config_.classes, " but ",
              config_.dataset, " has ", split_.train.classes, " classes");

  nn::ModelConfig model;
  model.arch = config_.arch;
  model.width = config_.width;
  model.in_channels = split_.train.channels();
  model.classes = config_.classes;
  model.stem = config_.stem;
  model.seed = config_.seed;
  // --stages: resolved now that the images' shape and the pipeline's workers are known (the
  // processes of one replica under --mpi, else the devices).
  if (!config_.stages.empty()) {
    const Tensor& images = split_.train.images;
    const int workers = group_ ? group_->size() / group_->replicas()
                               : std::max(1, static_cast<int>(config_.devices.size()));
    block_profiles_ = profile_blocks(model, Shape{images.size(1), images.size(2), images.size(3)});
    config_.stage_sizes = resolve_stage_layout(config_.stages, model, block_profiles_, config_.method, workers);
  }
  model.stage_sizes = config_.stage_sizes;
  model_ = std::make_unique<nn::Model>(model);
  if (!config_.load_params.empty()) model_->load_state(config_.load_params);
  // A GPU run: the model goes there once, before the stages' optimizers are made. Under --mpi the
  // process group chose this process's GPU.
  if (group_)
    device_ = group_->device();
  else if (!config_.devices.empty() && config_.devices.front().is_cuda())
    device_ = config_.devices.front();
  if (device_.is_cuda()) model_->to(device_);
  memory_devices_ = {device_};

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

  build_schedule_and_executor();
  if (config_.resume && group_)
    resume_across_processes();
  else if (config_.resume)
    resume_from(latest_checkpoint(config_.checkpoint_dir));
}

// The whole run is one schedule: mini-batch m is batch m % S of epoch m / S. A synchronous grid has
// one step per mini-batch. A delayed pipeline is not flushed between epochs (as in the official
// code) unless --flush-each-epoch, and it is drained at the end of the run: an epoch is S steps of
// the grid, or S + 2(J-1) when each epoch is drained.
void Trainer::build_schedule_and_executor() {
  const std::int64_t S = steps_per_epoch();
  std::int64_t batches = config_.max_steps;
  if (config_.max_steps < 0 || config_.max_steps / S >= config_.epochs)  // --max-steps may bound --epochs
    batches = checked_mul(config_.epochs, S, [&] { return fmt::format("--epochs {} of {} mini-batches", config_.epochs, S); });
  // The whole run's grid is built in memory (pipeline/schedule.hpp): name the flag that makes it huge.
  const std::int64_t J64 = static_cast<std::int64_t>(model_->num_stages());
  PETRA_CHECK(batches <= kMaxScheduleCells / J64, ValueError, "--epochs ", config_.epochs, " of ", S,
              " mini-batches make ", batches, " mini-batches on ", J64, " stages: the run's schedule would be above ",
              "the limit of ", kMaxScheduleCells, " cells; train fewer epochs per run (resume from a checkpoint), ",
              "or set --max-steps");
  const int J = static_cast<int>(model_->num_stages());
  if (config_.flush_each_epoch && is_delayed(config_.method)) {
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
  options.iterations_per_epoch = train_loader_->batches_per_epoch();
  options.replicas = replicas();
  options.track_reconstruction = config_.track_reconstruction;
  options.statistics_pass = config_.bn_statistics;
  options.delay_compensation = config_.delay_compensation;
  options.weight_prediction = config_.weight_prediction;
  options.prediction_horizon = config_.prediction_horizon;
  options.delay_lr_warmup = config_.delay_lr_warmup;
  options.message_timeout_seconds = config_.message_timeout;
  // A GPU run's mini-batches go up to the device of the first stage (made below for several GPUs).
  const auto upload_batches = [this] {
    if (device_.is_cuda())
      device_batches_ = std::make_unique<DeviceBatches>(device_, [this](std::int64_t m) { return batch_of(m); },
                                                        grid_.batches);
  };
  if (group_) {
    if (group_->replicas() > 1)
      options.average_over_replicas = [this](const std::vector<Variable>& p) { group_->average_over_replicas(p); };
    executor_ = group_->make_executor(*model_, options);
    upload_batches();  // only the process of stage 0 asks for batches
    return;
  }
  // A synchronous step has nothing to overlap: it runs on the sequential executor whatever the devices
  // (on the first of them).
  if (config_.devices.size() <= 1 || !is_delayed(config_.method)) {
    executor_ = std::make_unique<SequentialExecutor>(*model_, options);
    upload_batches();
    return;
  }
  std::vector<ConcurrentExecutor::Worker> workers;
  for (const Device& d : config_.devices) workers.push_back({d, config_.threads_per_device});
  std::vector<int> placement = config_.placement;
  const auto workers_count = static_cast<int>(workers.size());
  PETRA_CHECK(placement.empty() || (static_cast<int>(placement.size()) == J &&
                                    std::all_of(placement.begin(), placement.end(),
                                                [&](int w) { return 0 <= w && w < workers_count; })),
              ValueError, "--placement gives ", placement.size(), " workers for the model's ", J,
              " stages, each from 0 to ", workers_count - 1, " (one per device of --devices)");
  if (placement.empty()) {
    MiniBatch probe = batch_of(0);
    if (device_.is_cuda()) probe = BatchUploader(device_).upload(probe);  // the model is there for now
    const std::vector<double> costs = measure_stage_costs(*model_, probe, config_.threads_per_device);
    placement = balanced_placement(costs, static_cast<int>(workers.size()));
  }
  executor_ = std::make_unique<ConcurrentExecutor>(*model_, options, std::move(workers), std::move(placement));
  // GPU workers: the executor moved each stage to its worker's device; memory is reported for all.
  if (device_.is_cuda()) {
    device_ = model_->stage(0).device();
    memory_devices_.clear();
    for (const Device& d : config_.devices)
      if (std::find(memory_devices_.begin(), memory_devices_.end(), d) == memory_devices_.end())
        memory_devices_.push_back(d);
  }
  upload_batches();
}

// Mini-batch i of an epoch is the loader's batch i; with R replicas, replica r's i-th is the
// loader's batch i * R + r.
MiniBatch Trainer::batch_of(std::int64_t microbatch) const {
  const std::int64_t S = steps_per_epoch(), R = replicas(), r = group_ ? group_->replica() : 0;
  data::Batch b = train_loader_->batch(microbatch / S, (microbatch % S) * R + r);
  return {std::move(b.images), std::move(b.labels)};
}

const std::vector<int>& Trainer::placement() const {
  static const std::vector<int> none;
  const auto* concurrent = dynamic_cast<const ConcurrentExecutor*>(executor_.get());
  return concurrent ? concurrent->placement() : none;
}

Trainer::~Trainer() = default;

// With R replicas each trains 1/R of the batches (the last batches_per_epoch % R are left out).
std::int64_t Trainer::steps_per_epoch() const { return train_loader_->batches_per_epoch() / replicas(); }

int Trainer::replicas() const { return group_ ? group_->replicas() : 1; }

double Trainer::learning_rate_at(std::int64_t microbatch) const {
  const std::int64_t S = train_loader_->batches_per_epoch();
  return nn::learning_rate(schedule_, replica_microbatch(microbatch, S, replicas()), S);
}

SteadyState steady_state(const std::vector<double>& step_seconds) {
  const auto n = static_cast<std::int64_t>(step_seconds.size());
  SteadyState s;
  if (n == 0) return s;
  s.first = n > 80 ? 40 : n / 2;
  s.last = n > 80 ? std::min<std::int64_t>(n, 160) : n;
  std::vector<double> window(step_seconds.begin() + s.first, step_seconds.begin() + s.last);
  const auto middle = window.begin() + static_cast<std::ptrdiff_t>(window.size() / 2);
  std::nth_element(window.begin(), middle, window.end());
  s.median_step_seconds = *middle;
  if (window.size() % 2 == 0) {  // the mean of the two middle values
    const double below = *std::max_element(window.begin(), middle);
    s.median_step_seconds = 0.5 * (s.median_step_seconds + below);
  }
  return s;
}

ProfileReport Trainer::profile_report() const {
  ProfileReport r;
  r.totals = profile::collect();
  r.wall_seconds = profiled_seconds_;
  r.steps = profiled_steps_;
  const auto* concurrent = dynamic_cast<const ConcurrentExecutor*>(executor_.get());
  r.workers = concurrent ? static_cast<int>(config_.devices.size()) : 1;
  return r;
}

void Trainer::run(const std::function<void(const StepProgress&)>& on_step,
                  const std::function<void(const EpochReport&)>& on_epoch) {
  auto& allocator = Allocator::instance();
  const std::int64_t S = steps_per_epoch(), L = grid_steps_per_epoch_;
  const BatchSource batches = [this](std::int64_t m) {
    return device_batches_ ? (*device_batches_)(m) : batch_of(m);
  };
  // --profile: switched on and zeroed while no worker runs, off again however run() ends.
  struct ProfilingOn {
    bool on;
    explicit ProfilingOn(bool o) : on(o) {
      if (!on) return;
      profile::reset();
      profile::set_enabled(true);
    }
    ~ProfilingOn() {
      if (on) profile::set_enabled(false);
    }
  } profiling(config_.profile);
  if (config_.profile) profiled_seconds_ = 0, profiled_steps_ = 0;
  while (epoch_ < config_.epochs && global_step_ < grid_.steps) {
    for (const Device& d : memory_devices_) allocator.reset_peaks(d);
    model_->train();
    // This epoch's steps; the last epoch also runs the drain steps that finish the pipeline.
    const std::int64_t first = global_step_;
    const bool last_epoch = epoch_ + 1 == config_.epochs || (epoch_ + 1) * S >= grid_.batches;
    // --max-steps ends the run in this epoch: its grid drains the pipeline and flushes the open
    // accumulation windows here, which the uninterrupted run does not do.
    const bool cut_here = last_epoch && epoch_ + 1 < config_.epochs;
    const std::int64_t last = last_epoch ? grid_.steps : std::min((epoch_ + 1) * L, grid_.steps);
    double loss_sum = 0;
    std::int64_t correct = 0, samples = 0, newest = 0;  // newest: the last mini-batch the head saw
    bool diverged = false;
    // The head's numbers are read once per chunk of steps, after the executor returns: reading
    // them at every step would make the host wait for a GPU at every step (nn::HeadNumbers).
    std::vector<HeadStats> unread;
    const HeadCallback head = [&](const HeadStats& s) { unread.push_back(s); };
    const auto read_head = [&] {
      for (const HeadStats& s : unread) {
        const nn::HeadNumbers::Values v = s.numbers.read();
        loss_sum += v.loss * double(s.samples);
        correct += v.correct;
        samples += s.samples;
        newest = std::max(newest, s.microbatch);
        diverged = diverged || !std::isfinite(v.loss);
      }
      unread.clear();
    };
    EpochReport report;
    const auto start = Clock::now();
    const std::int64_t chunk = std::max<std::int64_t>(1, S / 20);  // progress granularity
    const std::int64_t every = config_.track_gradient_quality;
    for (std::int64_t t = first, end = first; t < last; t = end) {
      end = std::min(t + chunk, last);
      if (every > 0 && t % every == 0) {  // a tracked step runs alone
        end = t + 1;
        report.gradient_quality.push_back(tracked_step(*model_, *executor_, grid_, t, batches, head));
      } else {
        if (every > 0) end = std::min(end, (t / every + 1) * every);
        executor_->run(grid_, t, end, batches, head);
      }
      const std::vector<double>& steps = executor_->step_seconds();
      report.step_seconds.insert(report.step_seconds.end(), steps.begin(), steps.end());
      for (double seconds : steps) profiled_seconds_ += seconds;
      profiled_steps_ += static_cast<std::int64_t>(steps.size());
      global_step_ = end;
      if (group_) {  // only the head's process sees the numbers: all stop together
        // A bad label raises on the head's process alone; the others would wait in the sum below
        // for ever (MPI collectives have no deadline), so the error goes to every process first.
        std::string error;
        try {
          read_head();
        } catch (const ValueError& e) {
          error = e.what();
        }
        if (const std::string first = group_->first_error(error); !first.empty()) throw ValueError(first);
        double flag[] = {diverged ? 1.0 : 0.0};
        group_->sum(flag);
        diverged = flag[0] > 0;
      } else {
        read_head();
      }
      if (diverged)
        throw DivergedError(fmt::format("the loss became non-finite at epoch {}, step {}; lower the learning rate. "
                                        "The last checkpoint written stays valid.",
                                        epoch_, global_step_));
      if (on_step && samples > 0) {
        const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        on_step({epoch_, end - first, last - first, global_step_, loss_sum / double(samples),
                 double(correct) / double(samples), double(samples) / std::max(seconds, 1e-9), seconds,
                 learning_rate_at(newest)});
      }
    }
    if (group_) {  // the head's numbers to every process, and every stage's parameters and buffers
      double totals[] = {loss_sum, double(correct), double(samples), double(newest)};
      group_->sum(totals);
      loss_sum = totals[0];
      correct = static_cast<std::int64_t>(totals[1]);
      samples = static_cast<std::int64_t>(totals[2]);
      newest = static_cast<std::int64_t>(totals[3]) / replicas();  // the head of each replica saw the same
      group_->share_model(*model_);
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    report.epoch = epoch_;
    report.train_loss = samples ? loss_sum / double(samples) : 0;
    report.train_accuracy = samples ? double(correct) / double(samples) : 0;
    report.images_per_second = double(samples) / std::max(seconds, 1e-9);
    report.seconds = seconds;
    report.lr = learning_rate_at(newest);
    MemoryReport memory = read_memory_report(memory_devices_, static_cast<int>(model_->num_stages()));
    report.peak_device_bytes = 0;
    for (const Device& d : memory_devices_) report.peak_device_bytes += allocator.stats(d).peak;
    report.peak_bytes = std::move(memory.peak_bytes);
    report.stage_peak_bytes = std::move(memory.stage_peak_bytes);
    if (config_.track_reconstruction) report.reconstruction_errors = reconstruction_errors();
    // A drained epoch (the run's last, or every one with --flush-each-epoch) ends with 2(J-1-j)
    // updates of stage j that no forward pass saw, so the running statistics describe an older
    // network (early in training, evaluation then fails outright: docs/petra.md §5). They are
    // recomputed over the epoch's last mini-batches, identically in every process.
    const bool drained = is_delayed(config_.method) && (last_epoch || config_.flush_each_epoch);
    if (drained && config_.bn_refresh_batches > 0) {
      const std::int64_t end = std::min((epoch_ + 1) * S, grid_.batches);
      recompute_batch_norm_statistics(std::max(epoch_ * S, end - config_.bn_refresh_batches), end);
    }
    const Evaluation test = evaluate();  // current parameters; mini-batches may still be in flight
    report.test_loss = test.loss;
    report.test_accuracy = test.accuracy;
    // Complete: all S mini-batches of the epoch entered the pipeline (--max-steps may cut the last).
    report.complete = (epoch_ + 1) * S <= grid_.batches;
    if (report.complete) {  // a partial epoch is reported but neither counted nor checkpointed
      ++epoch_;
      // The checkpoint holds the mini-batches in flight: a resumed run continues the same grid. An
      // epoch that --max-steps ends, even at its last mini-batch, is not checkpointed: its state is
      // drained, and no longer that of the run it would resume.
      if (!config_.checkpoint_dir.empty() && !cut_here) save_checkpoint();
    }
    if (on_epoch) on_epoch(report);
    if (!report.complete) break;
  }
}

std::vector<double> Trainer::reconstruction_errors() {
  std::vector<double> errors;
  for (std::size_t j = 0; j < executor_->num_stages(); ++j)
    errors.push_back(executor_->stage(j).last_reconstruction_error());
  return errors;
}

void Trainer::recompute_batch_norm_statistics(std::int64_t first, std::int64_t end) {
  NoGradGuard no_grad;
  nn::RunningStatsGuard update(true);
  model_->train();
  for (std::int64_t m = first; m < end; ++m) {
    nn::RunningStatsMomentumGuard cumulative(1.0 / static_cast<double>(m - first + 1));
    MiniBatch batch = batch_of(m);
    if (device_batches_) batch = device_batches_->uploader().upload(batch);
    model_->forward(Variable(batch.images));
  }
}

Evaluation Trainer::evaluate() {
  NoGradGuard no_grad;
  model_->eval();
  test_loader_->start_epoch(0);
  Evaluation e;
  // Each batch's numbers are read after the last batch, so that the GPU never waits for the host.
  std::vector<std::pair<nn::HeadNumbers, std::int64_t>> unread;  // numbers, samples
  while (auto host = test_loader_->next()) {
    MiniBatch batch{std::move(host->images), std::move(host->labels)};
    if (device_batches_) batch = device_batches_->uploader().upload(batch);
    const Variable logits = model_->forward(Variable(batch.images));
    nn::HeadNumbers numbers;
    numbers.labels = batch.labels.to(logits.data().device());  // the head may sit on another GPU
    numbers.classes = logits.data().size(1);
    numbers.loss = cross_entropy(logits, numbers.labels, &numbers.first_bad).data();
    numbers.correct = ops::correct_predictions(logits.data(), numbers.labels);
    unread.emplace_back(std::move(numbers), batch.labels.numel());
  }
  double loss_sum = 0;
  std::int64_t correct = 0;
  for (const auto& [numbers, samples] : unread) {
    const nn::HeadNumbers::Values v = numbers.read();
    loss_sum += v.loss * double(samples);
    correct += v.correct;
    e.samples += samples;
  }
  model_->train();
  e.loss = e.samples ? loss_sum / double(e.samples) : 0;
  e.accuracy = e.samples ? double(correct) / double(e.samples) : 0;
  return e;
}

// The optimizers a checkpoint holds: one per stage, each stage's runtime owns its own.
std::vector<CheckpointOptimizer> Trainer::checkpoint_optimizers() {
  std::vector<CheckpointOptimizer> per_stage;
  for (std::size_t j = 0; j < executor_->num_stages(); ++j)
    per_stage.push_back({fmt::format("stage-{:02d}", j), &executor_->stage(j).optimizer()});
  return per_stage;
}

void Trainer::save_checkpoint() {
  CheckpointMeta meta = describe(config_);
  meta.insert(data_identity_.begin(), data_identity_.end());
  meta["format"] = "2";  // 2: every method runs on the executor (one optimizer per stage)
  meta["next_epoch"] = std::to_string(epoch_);
  meta["global_step"] = std::to_string(global_step_);
  if (group_) return save_checkpoint_across_processes(meta);
  const auto write_pipeline = [this](const std::filesystem::path& dir) { executor_->save_in_flight(dir / "pipeline"); };
  // Any stage may hold an open accumulation window: its gradients are saved with the model.
  last_checkpoint_ = write_checkpoint(config_.checkpoint_dir, fmt::format("epoch-{:06d}", epoch_), *model_,
                                      checkpoint_optimizers(), meta, /*gradients=*/true, write_pipeline);
}

// A temporary directory of this process's own (several processes may share a machine).
std::filesystem::path Trainer::scratch_directory(const char* what) const {
  return std::filesystem::temp_directory_path() / fmt::format("petra-{}-{}-rank-{}", what, ::getpid(), rank());
}

// Each process writes its part: its stages' optimizer state and gradients in optimizer/ and grads/,
// as one process would, and its state in flight in pipeline/rank-R/ (the messages on the wire
// collected first). The first process receives every part and writes them, with the model (which
// every process holds whole at the end of an epoch), as one checkpoint with one MANIFEST.
void Trainer::save_checkpoint_across_processes(CheckpointMeta meta) {
  namespace fs = std::filesystem;
  meta["processes"] = std::to_string(group_->size());
  meta["replicas"] = std::to_string(group_->replicas());
  const fs::path part = scratch_directory("checkpoint-part");
  std::vector<FileBytes> files;
  std::string error;
  try {
    group_->collect_in_flight(*executor_, grid_, global_step_);
    fs::remove_all(part);
    const fs::path in_flight = part / "pipeline" / fmt::format("rank-{}", rank());
    for (std::size_t j = 0; j < executor_->num_stages(); ++j) {
      if (!group_->hosts(static_cast<int>(j))) continue;
      // The replicas' optimizers are equal (their updates are); their open windows' gradients are not.
      if (group_->replica() == 0)
        executor_->stage(j).optimizer().save_state(part / "optimizer" / fmt::format("stage-{:02d}", j));
      std::set<const void*> in_stage;  // the stage's parameters, by their storage
      for (const Variable& p : model_->stage(j).parameters()) in_stage.insert(p.data().raw_data());
      std::vector<std::pair<std::string, Variable>> parameters;
      for (const auto& [name, p] : model_->named_parameters())
        if (in_stage.count(p.data().raw_data())) parameters.emplace_back(name, p);
      save_gradients(in_flight / "grads", parameters);
    }
    executor_->save_in_flight(in_flight);
    files = read_tree(part);
  } catch (const std::exception& e) {
    error = e.what();
  }
  fs::remove_all(part);
  if (const std::string first = group_->first_error(error); !first.empty())
    throw CheckpointError("checkpoint: " + first);
  files = group_->gather_files(files);
  error.clear();
  if (rank() == 0) {
    try {
      last_checkpoint_ = write_checkpoint(config_.checkpoint_dir, fmt::format("epoch-{:06d}", epoch_), *model_, {},
                                          meta, /*gradients=*/false,
                                          [&](const fs::path& dir) { write_tree(dir, files); });
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (const std::string first = group_->first_error(error); !first.empty())
    throw CheckpointError("checkpoint: " + first);
}

// Refuses a checkpoint that this run cannot continue, saying why; returns its counters.
Trainer::Counters Trainer::check_resumable(const std::filesystem::path& dir, const CheckpointMeta& meta) {
  const auto mine = describe(config_);
  // Format 1 checkpoints of a synchronous method hold one optimizer for the whole model; those of a
  // delayed method are laid out as format 2 (one optimizer per stage, the pipeline in flight).
  const std::string format = meta.count("format") ? meta.at("format") : "?";
  PETRA_CHECK(format == "2" || (format == "1" && is_delayed(config_.method)), CheckpointError, "checkpoint ",
              dir.string(), " has format ", format, " of a ", name_of(config_.method),
              " run, written before every method ran on the executor; this petra cannot resume it");
  const std::string mismatch = resume_mismatch(meta, config_);
  PETRA_CHECK(mismatch.empty(), CheckpointError, "checkpoint ", dir.string(), " ", mismatch);
  if (data_identity_.empty()) data_identity_ = dataset_identity(split_);
  const std::string other_data = dataset_mismatch(meta, data_identity_);
  PETRA_CHECK(other_data.empty(), CheckpointError, "checkpoint ", dir.string(), " ", other_data,
              "; resume it on the data it was trained on");
  data_unchecked_ = !meta.count("data_train_images");
  // A delayed pipeline continues its grid, which the number of epochs shapes (mini-batch ids, drain).
  if (is_delayed(config_.method))
    PETRA_CHECK(meta.count("epochs") && meta.at("epochs") == mine.at("epochs"), CheckpointError, "checkpoint ",
                dir.string(), " belongs to a pipelined run of ", meta.count("epochs") ? meta.at("epochs") : "?",
                " epochs; resume it with the same --epochs (this run has ", mine.at("epochs"), ")");
  // The state in flight is kept per process: the same number of processes must continue it.
  const std::string theirs = meta.count("processes") ? meta.at("processes") : "1";
  const std::string ours = std::to_string(group_ ? group_->size() : 1);
  PETRA_CHECK(theirs == ours, CheckpointError, "checkpoint ", dir.string(), " was written by ", theirs,
              " process(es) (--mpi); resume it with ", theirs, ", not ", ours);
  const std::string their_replicas = meta.count("replicas") ? meta.at("replicas") : "1";
  PETRA_CHECK(their_replicas == std::to_string(replicas()), CheckpointError, "checkpoint ", dir.string(),
              " was written with --replicas ", their_replicas, "; resume it with the same, not ", replicas());
  // The counters: which epoch comes next, and the grid step it starts at. The directory's name says
  // the epoch too, and a delayed grid's step follows from it (the run's last epoch also ran the
  // drain steps): a checkpoint renamed, or with another's counters, is refused here.
  const std::int64_t L = grid_steps_per_epoch_;
  const std::int64_t next_epoch = checkpoint_integer(meta, "next_epoch", dir, 1, kMaxSize / L);
  const std::int64_t global_step = checkpoint_integer(meta, "global_step", dir, 0, kMaxSize);
  PETRA_CHECK(dir.filename() == fmt::format("epoch-{:06d}", next_epoch), CheckpointError, "checkpoint ", dir.string(),
              " holds the state after epoch ", next_epoch, " (next_epoch = ", next_epoch,
              " in its trainer.txt) but its directory is named otherwise: renamed, or not this run's");
  const bool drained_end = is_delayed(config_.method) && !config_.flush_each_epoch && next_epoch == config_.epochs;
  const std::int64_t expected_step =
      checked_add<CheckpointError>(next_epoch * L, drained_end ? 2 * (grid_.stages - 1) : 0, "the step of next_epoch");
  PETRA_CHECK(global_step == expected_step, CheckpointError, "checkpoint ", dir.string(), ": global_step = ",
              global_step, " in its trainer.txt, but epoch ", next_epoch, " of this run starts at step ", expected_step);
  PETRA_CHECK(config_.max_steps < 0 || config_.max_steps >= next_epoch * steps_per_epoch(), ValueError,
              "--max-steps ", config_.max_steps, " ends the run before the checkpoint's epoch ", next_epoch,
              " (mini-batch ", next_epoch * steps_per_epoch(), "); nothing would be left to train");
  return {next_epoch, global_step};
}

void Trainer::resume_from(const std::filesystem::path& dir) {
  const Counters counters = check_resumable(dir, read_checkpoint_meta(dir));
  load_checkpoint(dir, dir / "pipeline", counters);
  last_checkpoint_ = dir;
}

void Trainer::load_checkpoint(const std::filesystem::path& dir, const std::filesystem::path& in_flight,
                              const Counters& counters) {
  pipeline::restore_checkpoint(dir, *model_, checkpoint_optimizers());
  executor_->load_in_flight(in_flight, grid_, counters.global_step);
  epoch_ = counters.next_epoch;
  global_step_ = counters.global_step;
}

// The first process finds, verifies and checks the latest checkpoint and sends it to all; each
// loads the model, every stage's optimizer state (it uses its own stages') and its own state in
// flight, pipeline/rank-R/. A failure on any process stops all with its message.
void Trainer::resume_across_processes() {
  namespace fs = std::filesystem;
  fs::path dir;
  std::vector<FileBytes> files;
  std::string error;
  double counters[2] = {0, 0};  // next epoch, global step: checked on the first process, summed to all
  if (rank() == 0) {
    try {
      dir = latest_checkpoint(config_.checkpoint_dir);
      const Counters c = check_resumable(dir, read_checkpoint_meta(dir));
      counters[0] = static_cast<double>(c.next_epoch);
      counters[1] = static_cast<double>(c.global_step);
      files = read_tree(dir);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (const std::string first = group_->first_error(error); !first.empty()) throw CheckpointError(first);
  group_->sum(counters);
  files = group_->broadcast_files(files);
  const fs::path local = rank() == 0 ? dir : scratch_directory("resume");
  error.clear();
  try {
    if (rank() != 0) {
      fs::remove_all(local);
      write_tree(local, files);
    }
    const fs::path in_flight = local / "pipeline" / fmt::format("rank-{}", rank());
    load_checkpoint(local, in_flight, {static_cast<std::int64_t>(counters[0]), static_cast<std::int64_t>(counters[1])});
    load_gradients(in_flight / "grads", *model_);  // this process's open accumulation windows
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (rank() != 0) fs::remove_all(local);
  if (const std::string first = group_->first_error(error); !first.empty()) throw CheckpointError(first);
  last_checkpoint_ = rank() == 0 ? dir : config_.checkpoint_dir;  // only the first process reports it
}

}  // namespace petra::pipeline
