// pipeline/trainer.hpp: the training loop behind petra-train.
//
// A Trainer owns the data (train and test loaders), the model, the optimizer and the schedule.
// run() trains epoch by epoch: every mini-batch goes through train_step() with the configured
// method; every k mini-batches (accumulation) the gradients are averaged and the optimizer steps
// with the learning rate of that iteration; after each epoch the test set is evaluated, the
// on_epoch callback receives the numbers, and a checkpoint is written (if a directory is set).
//
// Checkpoints (pipeline/checkpoint.hpp) are taken at epoch boundaries: the loader's order and
// augmentation are functions of (seed, epoch, sample), so a run resumed from a checkpoint reaches
// bit-identical parameters to an uninterrupted one on the CPU.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.hpp"
#include "data/loader.hpp"
#include "nn/models.hpp"
#include "nn/optimizer.hpp"
#include "nn/schedule.hpp"
#include "pipeline/checkpoint.hpp"
#include "pipeline/runtime.hpp"
#include "pipeline/synchronous.hpp"

namespace petra::pipeline {

// The loss became NaN or infinite: training stops; the last checkpoint written stays valid.
class DivergedError : public Error {
 public:
  using Error::Error;
};

struct TrainConfig {
  // data
  std::string dataset = "fashion-mnist";
  std::filesystem::path data_dir;  // empty: the dataset's default directory
  bool augment = true;
  bool shuffle = true;
  std::int64_t synthetic_train_size = 5000;  // --dataset synthetic only
  // model
  std::string arch = "revnet18";
  std::int64_t width = 16;
  std::string stem = "cifar";
  std::int64_t classes = 0;  // 0: the dataset's
  std::vector<std::int64_t> stage_sizes;  // blocks per pipeline stage; empty: one block per stage
  // method and optimization
  PipelineMethod method = PipelineMethod::backprop;
  // pipelined methods (petra, dsp, pipedream, delayed-reversible)
  std::vector<Device> devices;  // one worker per device; empty: the sequential executor
  int threads_per_device = 1;
  std::vector<int> placement;   // stage -> worker; empty: balanced by measured stage costs
  bool track_reconstruction = false;
  std::int64_t track_gradient_quality = 0;  // every N steps of the grid (0: off); pipelined only
  bool flush_each_epoch = false;  // drain the pipeline at every epoch end (default: never flushed)
  nn::StatisticsPass bn_statistics = nn::StatisticsPass::forward;  // which pass moves BN running stats
  bool delay_compensation = false;  // spike compensation of the delayed stages' momentum (sgd only)
  std::int64_t epochs = 10;
  std::int64_t max_steps = -1;  // stop after this many mini-batches in total (-1: no limit)
  std::int64_t batch_size = 64;
  std::int64_t accumulation = 1;  // k: mini-batches whose gradients are averaged per update
  std::string optimizer = "sgd";
  double lr = 0.05;
  double momentum = 0.9;
  bool nesterov = true;
  double weight_decay = 5e-4;
  bool goyal_scaling = false;  // lr x k x batch / 256
  double warmup_epochs = 1;  // capped at half the epochs for cosine and poly
  std::string schedule = "cosine";  // constant|step|cosine|poly
  std::vector<double> milestones;   // step schedule, absolute epochs
  std::uint64_t seed = 0;
  int threads = 0;  // 0: default_cpu_threads()
  // state
  std::filesystem::path checkpoint_dir;  // empty: no checkpoints
  bool resume = false;
  std::filesystem::path load_params;  // a Module state directory to start from
};

struct StepProgress {
  std::int64_t epoch = 0, step_in_epoch = 0, steps_per_epoch = 0, global_step = 0;
  double loss = 0, accuracy = 0;  // running means over this epoch so far
  double images_per_second = 0;   // this epoch so far
  double seconds = 0;             // since the epoch started
  double lr = 0;
};

// --track-gradient-quality: at one step of the grid, for each stage that ran a backward there, its
// delayed gradient (of that mini-batch, computed with stale activations and/or parameters) against
// the exact backprop gradient of the same mini-batch at the parameters of that moment.
struct StageGradientQuality {
  int stage = 0;
  std::int64_t microbatch = 0;
  double cosine = 0;          // <g_delayed, g_exact> / (|g_delayed| |g_exact|)
  double norm_ratio = 0;      // |g_delayed| / |g_exact|
  double relative_error = 0;  // |g_delayed - g_exact| / |g_exact|
};
struct GradientQuality {
  std::int64_t step = 0;  // of the grid
  std::vector<StageGradientQuality> stages;
};

struct EpochReport {
  std::int64_t epoch = 0;  // 0-based, the epoch just finished
  double train_loss = 0, train_accuracy = 0;
  double test_loss = 0, test_accuracy = 0;
  double images_per_second = 0;  // training only
  double seconds = 0;            // training only
  double lr = 0;                 // at the end of the epoch
  std::map<std::string, std::int64_t> peak_bytes;  // by allocator tag, during this epoch
  // Pipelined methods: per stage, peak bytes by tag during this epoch (tags with none are left out)
  // plus "total" (the peak of the stage's sum), and with --track-reconstruction the relative error
  // of each stage's last rebuilt input (0 where nothing is rebuilt).
  std::vector<std::map<std::string, std::int64_t>> stage_peak_bytes;
  std::vector<double> reconstruction_errors;
  std::vector<GradientQuality> gradient_quality;  // --track-gradient-quality, this epoch's steps
  bool complete = true;  // false: --max-steps ended it early (not checkpointed, not counted)
};

struct Evaluation {
  double loss = 0, accuracy = 0;
  std::int64_t samples = 0;
};

class Trainer {
 public:
  explicit Trainer(const TrainConfig& config);
  ~Trainer();

  // Trains from the current epoch to config.epochs (or max_steps). Throws DivergedError on a
  // non-finite loss.
  void run(const std::function<void(const StepProgress&)>& on_step,
           const std::function<void(const EpochReport&)>& on_epoch);
  Evaluation evaluate();  // the test set, current parameters, evaluation mode

  nn::Model& model() { return *model_; }
  const TrainConfig& config() const { return config_; }
  std::int64_t epoch() const { return epoch_; }  // the next epoch to train
  std::int64_t global_step() const { return global_step_; }
  std::int64_t steps_per_epoch() const;
  const data::Split& data() const { return split_; }
  std::optional<std::filesystem::path> last_checkpoint() const { return last_checkpoint_; }
  const Schedule& schedule() const { return grid_; }        // pipelined methods
  const std::vector<int>& placement() const;                // stage -> worker (concurrent executor)
  std::vector<double> reconstruction_errors();              // per stage, --track-reconstruction

 private:
  double learning_rate_at(std::int64_t iteration) const;
  void run_pipelined(const std::function<void(const StepProgress&)>& on_step,
                     const std::function<void(const EpochReport&)>& on_epoch);
  void start_pipeline();
  // Runs step t of the grid and compares each stage's delayed gradient there with backprop's.
  GradientQuality tracked_step(std::int64_t t, const SequentialExecutor::BatchSource& batches,
                               const SequentialExecutor::HeadCallback& on_head);
  void apply_update(std::int64_t iteration);
  std::vector<CheckpointOptimizer> checkpoint_optimizers();
  void save_checkpoint();
  void restore_checkpoint(const std::filesystem::path& dir);

  TrainConfig config_;
  data::Split split_;
  std::unique_ptr<nn::Model> model_;
  std::unique_ptr<nn::Optimizer> optimizer_;
  nn::ScheduleConfig schedule_;
  std::unique_ptr<data::Loader> train_loader_, test_loader_;
  std::int64_t epoch_ = 0, global_step_ = 0, accumulated_ = 0;
  // pipelined methods: the whole run's schedule, its steps per epoch, and the executor that runs it
  Schedule grid_;
  std::int64_t grid_steps_per_epoch_ = 0;
  std::unique_ptr<SequentialExecutor> executor_;
  std::optional<std::filesystem::path> last_checkpoint_;
};

// The configuration as key/value text pairs (for logs and checkpoints).
std::map<std::string, std::string> describe(const TrainConfig& config);

// Why a run of `config` may not resume a checkpoint written with `meta`: the first resume key
// (dataset, model, method, optimizer, batch, k, seed, ...) that differs or is missing; empty when
// none does. A key added after a checkpoint was written counts with the value runs had before it.
std::string resume_mismatch(const CheckpointMeta& meta, const TrainConfig& config);

}  // namespace petra::pipeline
