// pipeline/run_config.cpp: validation, description and resume keys of a run's configuration.
#include "petra/pipeline/run_config.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "petra/config.hpp"
#include "petra/cuda_backend.hpp"

namespace petra::pipeline {

namespace {

// Training runs where it was asked to or not at all: a device that does not exist is a DeviceError
// (petra-train: exit 6) naming it and what the machine has; nothing falls back to the CPU.
void validate_devices(const std::vector<Device>& devices) {
  std::set<std::string> seen;
  for (const Device& d : devices) {
    // A GPU named twice is two workers on it, each with its own stream; a CPU device is one worker.
    PETRA_CHECK(seen.insert(d.str()).second || d.is_cuda(), ValueError, "--devices names ", d.str(),
                " twice: each CPU device is one pipeline worker (a GPU may be named more than once: one "
                "worker, one stream each)");
    PETRA_CHECK(d.is_cuda() == devices.front().is_cuda(), ValueError, "--devices ", d.str(), " beside ",
                devices.front().str(), ": the workers are all CPU workers or all GPUs");
    if (!d.is_cuda()) continue;
    const int found = cuda_backend::device_count();
    PETRA_CHECK(d.index < found, DeviceError, "--devices ", d.str(), ": no such GPU; this machine has ", found,
                " CUDA device", found == 1 ? "" : "s", " (", cuda_backend::describe(), ")");
  }
}

}  // namespace

void validate(const TrainConfig& c) {
  validate_devices(c.devices);
  PETRA_CHECK(c.epochs >= 0, ValueError, "epochs must be >= 0, got ", c.epochs);
  PETRA_CHECK(c.batch_size >= 1, ValueError, "batch size must be >= 1, got ", c.batch_size);
  PETRA_CHECK(c.accumulation >= 1, ValueError, "accumulation must be >= 1, got ", c.accumulation);
  PETRA_CHECK(c.bn_refresh_batches >= 0, ValueError, "--bn-refresh-batches must be >= 0, got ", c.bn_refresh_batches);
  PETRA_CHECK(c.lr >= 0, ValueError, "learning rate must be >= 0, got ", c.lr);
  PETRA_CHECK(c.weight_decay >= 0, ValueError, "weight decay must be >= 0, got ", c.weight_decay);
  PETRA_CHECK(c.threads >= 0, ValueError, "threads must be >= 0, got ", c.threads);
  // More threads than a few per core is a typo, not a setting: OpenMP would oversubscribe the machine.
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  PETRA_CHECK(c.threads <= 4 * cores, ValueError, "--threads ", c.threads, " but this machine has ", cores,
              " cores (at most ", 4 * cores, ")");
  PETRA_CHECK(c.threads_per_device <= 4 * cores, ValueError, "--threads-per-device ", c.threads_per_device,
              " but this machine has ", cores, " cores (at most ", 4 * cores, ")");
  PETRA_CHECK(c.max_steps >= -1, ValueError, "--max-steps must be >= 0 (or -1: no limit), got ", c.max_steps);
  PETRA_CHECK(c.replicas >= 1, ValueError, "--replicas must be >= 1, got ", c.replicas);
  PETRA_CHECK(c.replicas == 1 || c.mpi, ValueError, "--replicas ", c.replicas, " needs --mpi (one process per stage "
              "group and replica)");
  // Under --mpi a process trains on one device: a GPU of --devices (entry local rank mod count),
  // or the CPU as one worker when --devices is left out.
  for (const Device& d : c.devices)
    PETRA_CHECK(!c.mpi || d.is_cuda(), ValueError, "--mpi --devices ", d.str(), ": under --mpi each process is one CPU "
                "worker; leave out --devices, or name GPUs (the process of local rank L trains on entry L mod count)");
  PETRA_CHECK(c.transport == Transport::automatic || c.mpi, ValueError, "--transport ", name_of(c.transport),
              " carries the messages between the processes of --mpi; add --mpi or leave it out");
  if (c.mpi) resolve_transport(c.transport, c.devices.empty() ? Device::cpu() : c.devices.front(), PETRA_HAVE_NCCL);
  PETRA_CHECK(!c.mpi || c.track_gradient_quality == 0, ValueError,
              "--mpi with --track-gradient-quality is not supported yet");
  PETRA_CHECK(c.message_timeout > 0 && c.message_timeout <= kMaxMessageTimeout, ValueError,
              "--message-timeout must be > 0 seconds and at most ", kMaxMessageTimeout, " (a year), got ",
              c.message_timeout);
  PETRA_CHECK(c.width >= 1 && c.width <= nn::kMaxWidth, ValueError, "--width must be from 1 to ", nn::kMaxWidth,
              ", got ", c.width);
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
  // Weight prediction extrapolates along SGD's momentum buffer: adam's moments and LARS's
  // trust-scaled buffer are other quantities, so they are refused rather than guessed at.
  PETRA_CHECK(c.weight_prediction == WeightPrediction::none ||
                  (is_delayed(c.method) && c.optimizer == "sgd" && c.momentum > 0 && c.momentum < 1),
              ValueError, "--weight-prediction linear needs a pipelined method and sgd with 0 < momentum < 1 (it "
              "extrapolates along SGD's momentum buffer; adam and lars are not supported), got --method ",
              name_of(c.method), " --optimizer ", c.optimizer, " --momentum ", c.momentum);
  PETRA_CHECK(std::isfinite(c.prediction_horizon) && c.prediction_horizon >= 0 && c.prediction_horizon <= 10,
              ValueError, "--prediction-horizon must be from 0 to 10 (a fraction of the delay), got ",
              c.prediction_horizon);
  PETRA_CHECK(c.prediction_horizon == 1 || c.weight_prediction != WeightPrediction::none, ValueError,
              "--prediction-horizon ", c.prediction_horizon, " scales the prediction of --weight-prediction linear; "
              "add it or leave the horizon out");
  PETRA_CHECK(c.delay_lr_warmup >= 0, ValueError, "--delay-lr-warmup must be >= 0 mini-batches, got ",
              c.delay_lr_warmup);
  PETRA_CHECK(c.delay_lr_warmup == 0 || is_delayed(c.method), ValueError,
              "--delay-lr-warmup scales the learning rates of delayed stages: use a pipelined method");
  PETRA_CHECK(c.method != PipelineMethod::backprop || c.bn_statistics == nn::StatisticsPass::forward, ValueError,
              "--bn-statistics backward moves batch norm's statistics in a backward's recomputation, and backprop "
              "recomputes nothing: use it with revbackprop or a pipelined method");
}

namespace {

// Keys whose values must agree between a checkpoint and the run resuming it.
const char* const kResumeKeys[] = {"dataset", "arch", "width", "stem", "classes", "method", "optimizer",
                                   "batch_size", "accumulation", "seed", "augment", "shuffle", "flush_each_epoch",
                                   "bn_statistics", "delay_compensation", "stage_sizes",
                                   "bn_refresh_batches", "weight_prediction", "prediction_horizon",
                                   "delay_lr_warmup"};
// Resume keys that checkpoints written before they existed lack, with the value those runs had.
const std::map<std::string, std::string> kKeysAddedLater = {
    {"delay_compensation", "false"}, {"stage_sizes", ""}, {"bn_refresh_batches", "0"},
    {"weight_prediction", "none"}, {"prediction_horizon", "1"}, {"delay_lr_warmup", "0"}};

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
          {"bn_refresh_batches", std::to_string(c.bn_refresh_batches)},
          {"delay_compensation", c.delay_compensation ? "true" : "false"},
          {"weight_prediction", std::string(name_of(c.weight_prediction))},
          {"prediction_horizon", fmt_double(c.prediction_horizon)},
          {"delay_lr_warmup", std::to_string(c.delay_lr_warmup)}};
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

}  // namespace petra::pipeline
