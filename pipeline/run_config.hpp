// pipeline/run_config.hpp: everything a training run is configured with (petra-train's flags), its
// validation, its description as key/value text (for logs and checkpoints), and the rule that says
// whether a checkpoint may be resumed by a run of this configuration.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "petra/nn/layers.hpp"
#include "petra/nn/models.hpp"
#include "petra/device.hpp"
#include "petra/pipeline/checkpoint.hpp"
#include "petra/pipeline/delay_mitigation.hpp"
#include "petra/pipeline/transport.hpp"
#include "petra/pipeline/schedule.hpp"

namespace petra::pipeline {

// The longest --message-timeout, in seconds: a year (a deadline must fit the clock's arithmetic).
inline constexpr double kMaxMessageTimeout = 365.0 * 24 * 3600;

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
  // --stages as text ("auto", "blocks", "J", "a,b,c"; pipeline/stage_layout.hpp), resolved by the
  // Trainer into stage_sizes once it knows the data's shape and its workers; empty: stage_sizes as given.
  std::string stages;
  // method and optimization
  PipelineMethod method = PipelineMethod::backprop;
  // pipelined methods (petra, dsp, pipedream, delayed-reversible)
  // One worker per entry; empty: the sequential executor on the CPU. cuda:N alone: the sequential
  // executor on that GPU. Several GPUs (cuda:0,cuda:1), or one GPU named several times
  // (cuda:0,cuda:0: one stream each), run a pipelined method on the concurrent executor.
  std::vector<Device> devices;
  int threads_per_device = 1;
  std::vector<int> placement;   // stage -> worker; empty: balanced by measured stage costs
  bool track_reconstruction = false;
  std::int64_t track_gradient_quality = 0;  // every N steps of the grid (0: off); pipelined only
  bool flush_each_epoch = false;  // drain the pipeline at every epoch end (default: never flushed)
  nn::StatisticsPass bn_statistics = nn::StatisticsPass::forward;  // which pass moves BN running stats
  // After a drain, batch norm's running statistics are recomputed over the epoch's last this many
  // mini-batches (a cumulative average; 0: left as the forward passes moved them). docs/petra.md §5.
  std::int64_t bn_refresh_batches = 32;
  bool delay_compensation = false;  // spike compensation of the delayed stages' momentum (sgd only)
  // Linear weight prediction of the delayed stages' parameters over prediction_horizon times their
  // delay (sgd with momentum only), and PipeMare's learning-rate warm-up over delay_lr_warmup
  // mini-batches (0: off); pipeline/delay_mitigation.hpp, docs/petra.md §12. Both off by default.
  WeightPrediction weight_prediction = WeightPrediction::none;
  double prediction_horizon = 1;
  std::int64_t delay_lr_warmup = 0;
  double message_timeout = 600;  // seconds a worker waits for a message before the run fails
  bool mpi = false;  // the stages spread over the processes of mpirun (pipeline/process_group.hpp)
  int replicas = 1;  // --mpi: copies of the pipeline, their gradients averaged (data parallel)
  // --mpi: what carries the messages and replica sums (pipeline/transport.hpp): auto is NCCL on GPUs
  // where petra is built with NCCL, MPI otherwise. Under --mpi, --devices names GPUs only: the
  // process of local rank L (its rank among its host's processes) trains on entry L mod count.
  Transport transport = Transport::automatic;
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
  // petra-train --profile: time per op family and per stage and phase (petra/profile.hpp); a
  // measurement setting, not part of the run's identity (no resume key)
  bool profile = false;
  // state
  std::filesystem::path checkpoint_dir;  // empty: no checkpoints
  bool resume = false;
  std::filesystem::path load_params;  // a Module state directory to start from
};

// ValueError naming the first setting out of range or the first combination that makes no sense.
void validate(const TrainConfig& config);

// The configuration as key/value text pairs (for logs and checkpoints).
std::map<std::string, std::string> describe(const TrainConfig& config);

// Why a run of `config` may not resume a checkpoint written with `meta`: the first resume key
// (dataset, model, method, optimizer, batch, k, seed, ...) that differs or is missing; empty when
// none does. A key added after a checkpoint was written counts with the value runs had before it.
std::string resume_mismatch(const CheckpointMeta& meta, const TrainConfig& config);

}  // namespace petra::pipeline
