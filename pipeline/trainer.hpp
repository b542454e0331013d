// pipeline/trainer.hpp: the training loop behind petra-train, one loop for every method.
//
// A Trainer owns the data (train and test loaders), the model and the run's schedule, and an
// executor (pipeline/executor.hpp) that runs it. Every method is a schedule: backprop and
// revbackprop are synchronous grids of one step per mini-batch; petra, delayed-reversible, dsp and
// pipedream are delayed grids. The whole run is one grid: mini-batch m is batch m % S of epoch m / S,
// and run() executes it epoch by epoch. Each stage's runtime counts the gradients it receives and,
// every k of them, averages them and steps its own optimizer (the one update path). After each epoch
// the test set is evaluated, on_epoch receives the numbers, and a checkpoint is written (if a
// directory is set).
//
// Checkpoints (pipeline/checkpoint.hpp) are taken at epoch boundaries and hold the mini-batches in
// flight: the loader's order and augmentation are functions of (seed, epoch, sample), so a run
// resumed from a checkpoint reaches bit-identical parameters to an uninterrupted one on the CPU.
//
// On a GPU (--devices cuda:N, one device: the sequential executor) the model is moved there once
// (nn::Module::to; each stage's optimizer state is made there), the mini-batches go up through
// pipeline/batch_upload.hpp (pinned buffers, a copy stream, the next one's copy overlapping the
// current step), the test set is evaluated there, and the memory reports are the device's.
// Checkpoints are the same files as on the CPU (written from the device tensors, read back onto
// the device), so a run may be resumed on another device. Several GPUs (or several streams of one)
// run the concurrent executor, each stage on its worker's device.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "petra/data/dataset.hpp"
#include "petra/profile.hpp"
#include "petra/data/loader.hpp"
#include "petra/nn/models.hpp"
#include "petra/nn/schedule.hpp"
#include "petra/pipeline/batch_upload.hpp"
#include "petra/pipeline/executor.hpp"
#include "petra/pipeline/gradient_quality.hpp"
#include "petra/pipeline/process_group.hpp"
#include "petra/pipeline/run_config.hpp"
#include "petra/pipeline/stage_layout.hpp"

namespace petra::pipeline {

// The loss became NaN or infinite: training stops; the last checkpoint written stays valid.
class DivergedError : public Error {
 public:
  using Error::Error;
};

struct StepProgress {
  std::int64_t epoch = 0, step_in_epoch = 0, steps_per_epoch = 0, global_step = 0;
  double loss = 0, accuracy = 0;  // running means over this epoch so far
  double images_per_second = 0;   // this epoch so far
  double seconds = 0;             // since the epoch started
  double lr = 0;
};

struct EpochReport {
  std::int64_t epoch = 0;  // 0-based, the epoch just finished
  double train_loss = 0, train_accuracy = 0;
  double test_loss = 0, test_accuracy = 0;
  double images_per_second = 0;  // training only
  double seconds = 0;            // training only
  double lr = 0;                 // at the end of the epoch
  std::map<std::string, std::int64_t> peak_bytes;  // by allocator tag, during this epoch (on Trainer::device())
  std::int64_t peak_device_bytes = 0;               // all tags together, the most live at once
  // Per stage, peak bytes by tag during this epoch (tags with none are left out)
  // plus "total" (the peak of the stage's sum), and with --track-reconstruction the relative error
  // of each stage's last rebuilt input (0 where nothing is rebuilt).
  std::vector<std::map<std::string, std::int64_t>> stage_peak_bytes;
  std::vector<double> reconstruction_errors;
  std::vector<GradientQuality> gradient_quality;  // --track-gradient-quality, this epoch's steps
  bool complete = true;  // false: --max-steps ended it early (not checkpointed, not counted)
  // Wall seconds of each training step of this epoch, in order (the executor's step times; the test
  // evaluation is not in them). Benchmarks take medians of steady steps from these.
  std::vector<double> step_seconds;
};

// The steady-state step time of a run: the median of its steps [40, 160) (steps 40 to 159, counted
// over the whole run from 0), or of its second half when it has 80 steps or fewer. The first steps
// fill the allocator's cache and the pipeline; they are not the speed of training.
struct SteadyState {
  std::int64_t first = 0, last = 0;  // the steps [first, last) the median is over
  double median_step_seconds = 0;    // 0 when there are no steps
};
SteadyState steady_state(const std::vector<double>& step_seconds);

// What --profile measured over all the training steps of a run (petra/profile.hpp).
struct ProfileReport {
  profile::Totals totals;
  double wall_seconds = 0;  // the sum of the step times
  std::int64_t steps = 0;
  int workers = 1;          // threads that ran the steps (phases of several workers overlap)
};

struct Evaluation {
  double loss = 0, accuracy = 0;
  std::int64_t samples = 0;
};

// The data set's identity, part of a checkpoint's resume keys: per split, the shape, dtype and a
// CRC-32 of the images and of the labels ("data_train_images" = "[60000, 1, 28, 28] uint8 crc32 0x...").
// The content, not the files: the same data moved or recompressed still resumes, other data does not.
CheckpointMeta dataset_identity(const data::Split& split);
// Why a checkpoint written with `meta` was trained on other data than `identity`: the first key that
// differs, both values and the checkpoint's --data-dir; empty when none does. A checkpoint without
// the keys (written before they existed) is not compared.
std::string dataset_mismatch(const CheckpointMeta& meta, const CheckpointMeta& identity);

class Trainer {
 public:
  explicit Trainer(const TrainConfig& config);
  ~Trainer();

  // Trains from the current epoch to config.epochs (or max_steps). Throws DivergedError on a
  // non-finite loss.
  void run(const std::function<void(const StepProgress&)>& on_step,
           const std::function<void(const EpochReport&)>& on_epoch);
  Evaluation evaluate();  // the test set, current parameters, evaluation mode
  // Batch norm's running statistics as the cumulative average over mini-batches [first, end) of the
  // grid, forward only, with the current parameters (run() does it after a drain: docs/petra.md §5).
  void recompute_batch_norm_statistics(std::int64_t first, std::int64_t end);
  // Continues from checkpoint directory `dir` (config.resume does this with the latest checkpoint,
  // verified against its MANIFEST first): its keys must match this run's (resume_mismatch, the data
  // set's identity), its counters its directory's name and this run's grid, and its state the
  // model, the optimizers and the pipeline in flight. CheckpointError naming what does not fit.
  void resume_from(const std::filesystem::path& dir);

  nn::Model& model() { return *model_; }
  // Where the first stage trains (cpu:0, or a GPU of --devices), and the devices whose memory the
  // epoch reports count (summed over them when there are several GPUs).
  Device device() const { return device_; }
  const std::vector<Device>& memory_devices() const { return memory_devices_; }
  const TrainConfig& config() const { return config_; }
  std::int64_t epoch() const { return epoch_; }  // the next epoch to train
  std::int64_t global_step() const { return global_step_; }  // steps of the grid done
  std::int64_t steps_per_epoch() const;  // mini-batches per epoch (of one replica)
  const data::Split& data() const { return split_; }
  std::optional<std::filesystem::path> last_checkpoint() const { return last_checkpoint_; }
  const Schedule& schedule() const { return grid_; }
  // config.profile: the op and phase times of every training step run() took so far.
  ProfileReport profile_report() const;
  const std::vector<int>& placement() const;                // stage -> worker (concurrent executor)
  std::vector<double> reconstruction_errors();              // per stage, --track-reconstruction
  int rank() const { return group_ ? group_->rank() : 0; }  // this process, under --mpi
  const ProcessGroup* process_group() const { return group_.get(); }  // null without --mpi
  // The model's blocks as --stages saw them (empty when the config gave stage_sizes directly).
  const std::vector<BlockProfile>& block_profiles() const { return block_profiles_; }
  int replicas() const;  // copies of the pipeline (--replicas), 1 without --mpi
  // Resumed from a checkpoint written before the data set's identity was recorded: the data could
  // not be compared with the checkpoint's.
  bool resumed_data_unchecked() const { return data_unchecked_; }

 private:
  double learning_rate_at(std::int64_t microbatch) const;
  void build_schedule_and_executor();
  MiniBatch batch_of(std::int64_t microbatch) const;
  std::vector<CheckpointOptimizer> checkpoint_optimizers();
  void save_checkpoint();
  void save_checkpoint_across_processes(CheckpointMeta meta);
  struct Counters {
    std::int64_t next_epoch = 0, global_step = 0;
  };
  Counters check_resumable(const std::filesystem::path& dir, const CheckpointMeta& meta);
  void resume_across_processes();
  // Model, optimizers and gradients from checkpoint `dir`, the state in flight from `in_flight`.
  void load_checkpoint(const std::filesystem::path& dir, const std::filesystem::path& in_flight,
                       const Counters& counters);
  std::filesystem::path scratch_directory(const char* what) const;

  TrainConfig config_;
  Device device_ = Device::cpu();
  std::vector<Device> memory_devices_;
  data::Split split_;
  std::vector<BlockProfile> block_profiles_;
  std::unique_ptr<nn::Model> model_;
  nn::ScheduleConfig schedule_;
  std::unique_ptr<data::Loader> train_loader_, test_loader_;
  std::int64_t epoch_ = 0, global_step_ = 0;
  // The whole run's schedule, its steps per epoch, and the executor that runs it.
  Schedule grid_;
  std::int64_t grid_steps_per_epoch_ = 0;
  std::unique_ptr<SequentialExecutor> executor_;
  double profiled_seconds_ = 0;  // config.profile: wall time and count of the steps run so far
  std::int64_t profiled_steps_ = 0;
  std::unique_ptr<DeviceBatches> device_batches_;  // a GPU run's mini-batches (uploaded, prefetched)
  std::unique_ptr<ProcessGroup> group_;  // --mpi: the processes sharing the stages
  std::optional<std::filesystem::path> last_checkpoint_;
  CheckpointMeta data_identity_;  // dataset_identity(split_), when checkpoints are written or read
  bool data_unchecked_ = false;
};

}  // namespace petra::pipeline
