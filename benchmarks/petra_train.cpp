// benchmarks/petra_train.cpp: petra-train, the main job: train a RevNet or ResNet on real data.
//
//   build/petra-train                           # PETRA on two CPU workers: RevNet18 (width 16),
//                                               # Fashion-MNIST, 4 epochs
//   build/petra-train --model revnet18 --width 16 --epochs 10 --method revbackprop
//                     --log-json run.jsonl --plot run.svg --checkpoint-dir ckpt
//   build/petra-train --print-model --model revnet50 --stem imagenet --classes 1000
//   build/petra-train --help                    # every flag
//
// Exit codes (also in --help): 0 success, 1 internal error, 2 bad arguments, 3 bad data or input
// file, 4 training diverged (NaN/Inf loss), 5 checkpoint missing, damaged or mismatched,
// 6 device error or out of memory.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fstream>
#include <new>
#include <nlohmann/json.hpp>

#include "benchmarks/training_plot.hpp"
#include "petra/data/dataset.hpp"
#include "petra/cuda_backend.hpp"
#include "petra/files.hpp"
#include "petra/petra.hpp"
#include "petra/pipeline/checkpoint.hpp"
#include "petra/pipeline/memory_report.hpp"
#include "petra/pipeline/stage_layout.hpp"
#include "petra/pipeline/trainer.hpp"

namespace {

using petra::pipeline::EpochReport;
using petra::pipeline::StepProgress;
using petra::pipeline::TrainConfig;
using Clock = std::chrono::steady_clock;

enum ExitCode { kOk = 0, kInternal = 1, kBadArguments = 2, kBadData = 3, kDiverged = 4, kCheckpoint = 5, kDevice = 6 };

constexpr const char* kExitCodes =
    "Exit codes: 0 success, 1 internal error, 2 bad arguments, 3 bad data or input file, "
    "4 training diverged (NaN/Inf loss), 5 checkpoint missing, damaged or mismatched, 6 device error or out of "
    "memory.";

std::string duration(double seconds) {
  const auto s = static_cast<long long>(seconds + 0.5);
  return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
}

// Terminal: one line redrawn in place; otherwise a plain line every tenth of an epoch.
class Progress {
 public:
  Progress() : terminal_(::isatty(STDOUT_FILENO) == 1) {}

  void step(const StepProgress& p, std::int64_t epochs) {
    const auto now = Clock::now();
    const bool last = p.step_in_epoch == p.steps_per_epoch;
    if (terminal_) {
      if (!last && now - last_draw_ < std::chrono::milliseconds(200)) return;
      last_draw_ = now;
      const int width = 24;
      const int filled = static_cast<int>(width * p.step_in_epoch / std::max<std::int64_t>(p.steps_per_epoch, 1));
      const double eta = p.seconds * double(p.steps_per_epoch - p.step_in_epoch) / double(p.step_in_epoch);
      std::printf("\repoch %lld/%lld [%s%s] %lld/%lld loss %.4f acc %5.2f%% %6.0f img/s ETA %s ",
                  static_cast<long long>(p.epoch + 1), static_cast<long long>(epochs), std::string(filled, '=').c_str(),
                  std::string(width - filled, ' ').c_str(), static_cast<long long>(p.step_in_epoch),
                  static_cast<long long>(p.steps_per_epoch), p.loss, 100 * p.accuracy, p.images_per_second,
                  duration(eta).c_str());
      std::fflush(stdout);
    } else {
      // A line each time the epoch crosses another tenth (steps may arrive in chunks).
      const std::int64_t tenth = p.step_in_epoch * 10 / std::max<std::int64_t>(p.steps_per_epoch, 1);
      if (p.epoch != printed_epoch_) printed_epoch_ = p.epoch, printed_tenth_ = 0;
      if (tenth == printed_tenth_ && !last) return;
      printed_tenth_ = tenth;
      std::printf("epoch %lld/%lld step %lld/%lld loss %.4f acc %.2f%% %.0f img/s lr %.5f\n",
                  static_cast<long long>(p.epoch + 1), static_cast<long long>(epochs),
                  static_cast<long long>(p.step_in_epoch), static_cast<long long>(p.steps_per_epoch), p.loss,
                  100 * p.accuracy, p.images_per_second, p.lr);
      std::fflush(stdout);
    }
  }
  void end_line() {
    if (terminal_) std::printf("\n");
  }

 private:
  bool terminal_;
  Clock::time_point last_draw_{};
  std::int64_t printed_epoch_ = -1, printed_tenth_ = 0;
};

nlohmann::json epoch_json(const EpochReport& r) {
  return {{"epoch", r.epoch + 1},
          {"train_loss", r.train_loss},
          {"train_accuracy", r.train_accuracy},
          {"test_loss", r.test_loss},
          {"test_accuracy", r.test_accuracy},
          {"images_per_second", r.images_per_second},
          {"seconds", r.seconds},
          {"lr", r.lr},
          {"peak_bytes", r.peak_bytes},
          {"step_seconds", r.step_seconds}};
}

// Pipelined runs: per-stage peak bytes and reconstruction errors join the epoch's line.
nlohmann::json epoch_json_with_stages(const EpochReport& r) {
  nlohmann::json line = epoch_json(r);
  if (!r.stage_peak_bytes.empty()) line["stage_peak_bytes"] = r.stage_peak_bytes;
  if (!r.reconstruction_errors.empty()) line["reconstruction_errors"] = r.reconstruction_errors;
  if (!r.gradient_quality.empty()) {
    nlohmann::json steps = nlohmann::json::array();
    for (const auto& q : r.gradient_quality) {
      nlohmann::json stages = nlohmann::json::array();
      for (const auto& s : q.stages)
        stages.push_back({{"stage", s.stage}, {"microbatch", s.microbatch}, {"cosine", s.cosine},
                          {"norm_ratio", s.norm_ratio}, {"relative_error", s.relative_error}});
      steps.push_back({{"step", q.step}, {"stages", stages}});
    }
    line["gradient_quality"] = steps;
  }
  return line;
}

// Per stage, the mean cosine and norm ratio of this epoch's gradient-quality measurements.
void print_gradient_quality(const EpochReport& r, std::size_t stages) {
  if (r.gradient_quality.empty()) return;
  std::vector<double> cosine(stages, 0), ratio(stages, 0);
  std::vector<int> count(stages, 0);
  for (const auto& q : r.gradient_quality)
    for (const auto& s : q.stages) {
      cosine[s.stage] += s.cosine;
      ratio[s.stage] += s.norm_ratio;
      ++count[s.stage];
    }
  std::printf("gradient quality vs backprop (%zu measurements), per stage cosine / norm ratio:",
              r.gradient_quality.size());
  for (std::size_t j = 0; j < stages; ++j)
    if (count[j] > 0) std::printf(" %zu: %.3f/%.2f", j, cosine[j] / count[j], ratio[j] / count[j]);
  std::printf("\n");
}

void write_plot(const std::filesystem::path& path, const std::vector<EpochReport>& reports, const std::string& caption) {
  petra::tools::Curve train_loss{"train", "#1f77b4", {}}, test_loss{"test", "#d62728", {}};
  petra::tools::Curve train_acc{"train", "#1f77b4", {}}, test_acc{"test", "#d62728", {}};
  for (const EpochReport& r : reports) {
    train_loss.values.push_back(r.train_loss);
    test_loss.values.push_back(r.test_loss);
    train_acc.values.push_back(100 * r.train_accuracy);
    test_acc.values.push_back(100 * r.test_accuracy);
  }
  petra::write_file_atomically(
      path, petra::tools::render_svg({{"loss", {train_loss, test_loss}}, {"accuracy (%)", {train_acc, test_acc}}},
                                     caption));
}

bool report_memory_after = false;

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::string item;
  for (char ch : text + ",") {
    if (ch == ',') {
      if (!item.empty()) out.push_back(item);
      item.clear();
    } else if (ch != ' ') {
      item += ch;
    }
  }
  return out;
}

// The model and image shape that --print-model and --print-schedule describe: no data is loaded, so
// the dataset's usual shape (Fashion-MNIST's unless another dataset is named).
petra::nn::ModelConfig described_model(const petra::pipeline::TrainConfig& c) {
  petra::nn::ModelConfig m;
  m.arch = c.arch;
  m.width = c.width;
  m.stem = c.stem;
  const bool gray = c.dataset == "fashion-mnist" || c.dataset == "mnist";
  m.in_channels = gray ? 1 : 3;
  m.classes = c.classes > 0 ? c.classes : (c.dataset == "cifar100" ? 100 : c.dataset == "imagenet32" ? 1000 : 10);
  return m;
}

petra::Shape described_image(const petra::pipeline::TrainConfig& c) {
  const petra::nn::ModelConfig m = described_model(c);
  const std::int64_t side = c.stem == "imagenet" ? 224 : m.in_channels == 1 ? 28 : 32;
  return petra::Shape{m.in_channels, side, side};
}

// "1,4,5: 3 stages, modelled cost 6% 46% 48%" (empty sizes: one block per stage).
std::string layout_text(const std::vector<std::int64_t>& sizes, const std::vector<petra::pipeline::BlockProfile>& blocks) {
  std::string text = sizes.empty() ? fmt::format("one block per stage") : fmt::format("{}", fmt::join(sizes, ","));
  if (blocks.empty()) return text;  // a layout given as sizes: nothing was profiled
  const std::vector<double> shares = petra::pipeline::stage_cost_shares(blocks, sizes);
  text += fmt::format(": {} stages, modelled cost", shares.size());
  for (double share : shares) text += fmt::format(" {:.0f}%", 100 * share);
  return text;
}

// --placement "0,0,1,1": one worker index per stage; ValueError naming the flag and the item.
std::vector<int> parse_placement(const std::string& text) {
  std::vector<int> workers;
  for (const std::string& item : split_list(text)) {
    int worker = -1;
    const auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), worker);
    PETRA_CHECK(error == std::errc() && end == item.data() + item.size() && worker >= 0, petra::ValueError,
                "--placement '", text, "': '", item, "' is not a worker index (one per stage, e.g. 0,0,0,0,0,1,1,1,1,1)");
    workers.push_back(worker);
  }
  return workers;
}

// The most steps --print-schedule prints (a grid of J columns per step, built in memory first).
constexpr std::int64_t kMaxPrintedSteps = 100'000;

// The epoch records of an existing --log-json for epochs 1..completed_epochs, so that a resumed run
// keeps its history (its own records follow; a summary line of the earlier process is dropped).
std::vector<std::string> earlier_log_lines(const std::filesystem::path& log_json, std::int64_t completed_epochs) {
  std::vector<std::string> kept;
  std::ifstream in(log_json);
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_object() && record.contains("epoch") && record["epoch"].is_number_integer() &&
        record["epoch"].get<std::int64_t>() <= completed_epochs)
      kept.push_back(line);
  }
  return kept;
}

// --profile's numbers for --log-json: per op family and per phase, ms per step; per stage, its
// phases and its kernels' time.
nlohmann::json profile_json(const petra::pipeline::ProfileReport& r) {
  using namespace petra::profile;
  const double ms = 1e3 / static_cast<double>(std::max<std::int64_t>(r.steps, 1));
  nlohmann::json families = nlohmann::json::object(), calls = nlohmann::json::object();
  for (int f = 0; f < kFamilies; ++f) {
    if (r.totals.op_calls[f] == 0) continue;
    families[name_of(static_cast<Family>(f))] = r.totals.op_seconds[f] * ms;
    calls[name_of(static_cast<Family>(f))] = r.totals.op_calls[f];
  }
  nlohmann::json phases = nlohmann::json::object(), stages = nlohmann::json::array();
  const auto sums = r.totals.phase_sums();
  for (int p = 0; p < kPhases; ++p) phases[name_of(static_cast<Phase>(p))] = sums[p] * ms;
  for (std::size_t s = 0; s < r.totals.stage_phase_seconds.size(); ++s) {
    nlohmann::json line = nlohmann::json::object();
    for (int p = 0; p < kPhases; ++p) line[name_of(static_cast<Phase>(p))] = r.totals.stage_phase_seconds[s][p] * ms;
    line["kernels"] = r.totals.stage_op_total(s) * ms;
    stages.push_back(line);
  }
  return {{"steps", r.steps}, {"wall_seconds", r.wall_seconds}, {"workers", r.workers},
          {"step_ms", r.wall_seconds * ms}, {"op_ms_per_step", families}, {"op_calls", calls},
          {"phase_ms_per_step", phases}, {"stage_phase_ms_per_step", stages}};
}

// A process of an --mpi run other than the first: trains its stages and takes part in the epochs'
// exchanges, with no output.
int train_quietly(petra::pipeline::Trainer& trainer) {
  trainer.run({}, {});
  return kOk;
}

// How the banner names --conv-weight's choice.
const char* weight_algorithm_text(petra::ConvWeightAlgorithm algorithm) {
  switch (algorithm) {
    case petra::ConvWeightAlgorithm::winograd: return ", Winograd weight gradients on 3x3 stride-1 layers";
    case petra::ConvWeightAlgorithm::direct: return ", direct weight gradients";
    case petra::ConvWeightAlgorithm::automatic: break;
  }
  return ", Winograd weight gradients where measured faster (3x3 stride-1 layers of 64+ channels)";
}

// How the banner names --conv-forward's choice (nothing for the default, direct).
const char* forward_algorithm_text(petra::ConvForwardAlgorithm algorithm) {
  switch (algorithm) {
    case petra::ConvForwardAlgorithm::winograd: return ", Winograd forward and backward data on 3x3 stride-1 layers";
    case petra::ConvForwardAlgorithm::automatic:
      return ", Winograd forward and backward data where estimated faster (3x3 stride-1 layers of 64+ channels, "
             "planes up to 16x16, in TF32 8x8)";
    case petra::ConvForwardAlgorithm::direct: break;
  }
  return "";
}

int train(const TrainConfig& config, bool eval_only, const std::filesystem::path& save_params,
          const std::filesystem::path& log_json, const std::filesystem::path& plot) {
  const auto start = Clock::now();
  petra::pipeline::Trainer trainer(config);
  // Under --mpi every process trains its stages and ends each epoch with the whole model; the first
  // one reports and writes the files, the others stay silent.
  if (trainer.rank() != 0) {
    std::fflush(stdout);
    if (!std::freopen("/dev/null", "w", stdout)) return kInternal;
    return train_quietly(trainer);
  }
  const auto settings = petra::pipeline::describe(trainer.config());
  std::printf("petra-train %s: %s (width %lld) on %s, %lld train / %lld test images, method %s, %d thread(s)\n",
              PETRA_VERSION, config.arch.c_str(), static_cast<long long>(config.width), config.dataset.c_str(),
              static_cast<long long>(trainer.data().train.size()), static_cast<long long>(trainer.data().test.size()),
              settings.at("method").c_str(), trainer.config().threads > 0 ? trainer.config().threads
                                                                          : petra::default_cpu_threads());
  if (trainer.device().is_cuda())
    std::printf("training on %s: %s; convolutions and batch norms: %s, %s%s%s%s%s%s\n", trainer.device().str().c_str(),
                petra::cuda_backend::describe().c_str(), petra::name_of(petra::conv_impl()),
                petra::name_of(petra::conv_math()),
                petra::cudnn_algorithms() == petra::CudnnAlgorithms::fastest
                    ? ", cuDNN's fastest algorithms (timed; not bit-reproducible)"
                    : "",
                weight_algorithm_text(petra::conv_weight_algorithm()),
                forward_algorithm_text(petra::conv_forward_algorithm()),
                petra::batchnorm_one_pass() ? ", one-pass batch norm" : "",
                petra::conv_split_k() ? ", split-K forward and backward data" : "");
  if (!eval_only) {
    std::printf("stages (--stages %s): %s\n", config.stages.empty() ? "blocks" : config.stages.c_str(),
                layout_text(trainer.config().stage_sizes, trainer.block_profiles()).c_str());
  }
  if (const auto* group = trainer.process_group())
    std::printf("--mpi: %d processes, %d replica(s), messages over %s\n", group->size(), group->replicas(),
                std::string(petra::pipeline::name_of(group->transport())).c_str());
  if (trainer.last_checkpoint())
    std::printf("resumed from %s at epoch %lld\n", trainer.last_checkpoint()->c_str(),
                static_cast<long long>(trainer.epoch() + 1));
  if (trainer.resumed_data_unchecked())
    std::printf("note: the checkpoint predates petra's record of the data set's identity: the data was not "
                "compared with the checkpoint's (the next checkpoint records it)\n");

  if (eval_only) {
    if (trainer.data().test.size() == 0)  // only an npy directory may have no test set
      throw petra::IOError(fmt::format("{} in '{}' has no test set, nothing to evaluate{}", config.dataset,
                                       config.data_dir.string(),
                                       config.dataset == "npy" ? " (an npy directory's test set is test_images.npy "
                                                                 "and test_labels.npy)" : ""));
    const auto e = trainer.evaluate();
    std::printf("test loss %.4f accuracy %.2f%% (%lld images)\n", e.loss, 100 * e.accuracy,
                static_cast<long long>(e.samples));
    return kOk;
  }

  std::vector<EpochReport> reports;
  std::vector<std::string> log_lines;
  if (trainer.last_checkpoint() && !log_json.empty()) log_lines = earlier_log_lines(log_json, trainer.epoch());
  const auto append_to_log = [&](const std::string& line) {  // the whole log, rewritten atomically
    log_lines.push_back(line);
    std::string text;
    for (const auto& l : log_lines) text += l + "\n";
    petra::write_file_atomically(log_json, text);
  };
  Progress progress;
  auto on_step = [&](const StepProgress& p) { progress.step(p, config.epochs); };
  auto on_epoch = [&](const EpochReport& r) {
    progress.end_line();
    reports.push_back(r);
    if (r.images_per_second > 0)
      std::printf("epoch %lld/%lld: train loss %.4f acc %.2f%% | test loss %.4f acc %.2f%% | %.0f img/s | lr %.5f | %.1f s\n",
                  static_cast<long long>(r.epoch + 1), static_cast<long long>(config.epochs), r.train_loss,
                  100 * r.train_accuracy, r.test_loss, 100 * r.test_accuracy, r.images_per_second, r.lr, r.seconds);
    else  // a pipeline still filling: no mini-batch reached the head (and its loss) yet
      std::printf("epoch %lld/%lld: train (pipeline filling, no loss yet) | test loss %.4f acc %.2f%% | %.1f s\n",
                  static_cast<long long>(r.epoch + 1), static_cast<long long>(config.epochs), r.test_loss,
                  100 * r.test_accuracy, r.seconds);
    if (trainer.device().is_cuda()) {
      std::string gpus;
      for (const petra::Device& d : trainer.memory_devices()) gpus += (gpus.empty() ? "" : " + ") + d.str();
      std::printf("  peak memory on %s: %.1f MB (allocator, all tags%s)\n", gpus.c_str(),
                  double(r.peak_device_bytes) / 1e6,
                  trainer.memory_devices().size() > 1 ? ", each GPU's peak, summed" : "");
    }
    print_gradient_quality(r, trainer.model().num_stages());
    std::fflush(stdout);
    if (!log_json.empty()) append_to_log(epoch_json_with_stages(r).dump());
    if (!plot.empty()) write_plot(plot, reports, fmt::format("petra-train: {} width {} on {}, {}", config.arch,
                                                             config.width, config.dataset, settings.at("method")));
  };
  if (!trainer.placement().empty()) {
    std::printf("placement (stage -> worker):");
    for (int w : trainer.placement()) std::printf(" %d", w);
    std::printf("\n");
  }
  trainer.run(on_step, on_epoch);
  if (config.track_reconstruction) {
    std::printf("relative reconstruction error of each stage's last rebuilt input:");
    for (double e : trainer.reconstruction_errors()) std::printf(" %.2e", e);
    std::printf("\n");
  }
  if (report_memory_after)
    std::printf("%s", petra::pipeline::format_memory_report(petra::pipeline::read_memory_report(
                          trainer.memory_devices(), static_cast<int>(trainer.model().num_stages()))).c_str());

  // The steady state: the median step of steps 40-159 of the run (pipeline/trainer.hpp), what
  // benchmarks/compare_pytorch.py compares; the first steps fill the allocator's cache and the pipeline.
  std::vector<double> step_seconds;
  for (const auto& r : reports) step_seconds.insert(step_seconds.end(), r.step_seconds.begin(), r.step_seconds.end());
  const petra::pipeline::SteadyState steady = petra::pipeline::steady_state(step_seconds);
  const double steady_images_per_second =
      steady.median_step_seconds > 0 ? double(config.batch_size) / steady.median_step_seconds : 0;
  if (steady.median_step_seconds > 0) {
    // "timed steps": the steps this process ran, a pipelined run's fill and drain included.
    std::printf("steady state: median step %.2f ms over steps %lld-%lld of %zu timed steps (%.1f img/s)\n",
                1e3 * steady.median_step_seconds, static_cast<long long>(steady.first),
                static_cast<long long>(steady.last - 1), step_seconds.size(), steady_images_per_second);
    // On a GPU a step's time is the host's: it launches kernels and goes on. Once the device's queue
    // is full the host waits for it and the two rates agree; in a run too short to fill it the
    // median is only the launches' time (5 ms a step against the GPU's 27 in a 60-step run on an
    // H200). The epoch's images/s always ends with the device's work done.
    const double epoch_rate = reports.empty() ? 0 : reports.back().images_per_second;
    if (trainer.device().is_cuda() && epoch_rate > 0 && steady_images_per_second > 1.5 * epoch_rate)
      std::printf("  (host time: the host ran ahead of the GPU, whose rate is the epoch's %.1f img/s)\n", epoch_rate);
  }
  if (config.profile) {
    const auto profile = trainer.profile_report();
    std::printf("%s", petra::profile::format_table(profile.totals, profile.wall_seconds, profile.steps,
                                                   profile.workers).c_str());
  }

  const double total = std::chrono::duration<double>(Clock::now() - start).count();
  const auto final_eval = reports.empty() ? trainer.evaluate() : petra::pipeline::Evaluation{};
  const double final_accuracy = reports.empty() ? final_eval.accuracy : reports.back().test_accuracy;
  std::map<std::string, std::int64_t> peak;
  for (const auto& r : reports)
    for (const auto& [tag, bytes] : r.peak_bytes) peak[tag] = std::max(peak[tag], bytes);
  std::printf("final test accuracy %.2f%%, %s in total\n", 100 * final_accuracy, duration(total).c_str());
  if (!save_params.empty()) {
    trainer.model().save_state(save_params);
    std::printf("parameters saved to %s\n", save_params.c_str());
  }
  if (!log_json.empty()) {
    nlohmann::json summary = {{"configuration", settings},
                              {"conv_impl", petra::name_of(petra::conv_impl())},
                              {"conv_math", petra::name_of(petra::conv_math())},
                              {"conv_weight", petra::name_of(petra::conv_weight_algorithm())},
                              {"conv_forward", petra::name_of(petra::conv_forward_algorithm())},
                              {"cudnn_algorithms", petra::name_of(petra::cudnn_algorithms())},
                              {"batchnorm_one_pass", petra::batchnorm_one_pass()},
                              {"conv_split_k", petra::conv_split_k()},
                              {"final_test_accuracy", final_accuracy},
                              {"epochs_run", reports.size()},
                              {"total_seconds", total},
                              {"peak_bytes", peak},
                              {"steady_first_step", steady.first},
                              {"steady_last_step", steady.last - 1},
                              {"steady_median_step_seconds", steady.median_step_seconds},
                              {"steady_images_per_second", steady_images_per_second}};
    if (config.profile) summary["profile"] = profile_json(trainer.profile_report());
    append_to_log(nlohmann::json{{"summary", summary}}.dump());
  }
  return kOk;
}

// --conv-impl: cuDNN only where it can run. A build without cuDNN, or a run that would put any stage
// on the CPU (no --devices, --mpi, or a cpu:N entry), is refused as a bad argument naming the flag:
// cuDNN has no CPU path, and silently running petra's kernels instead would mislabel the run.
// A bad argument naming `setting` unless every --devices entry is a GPU (none given: the CPU).
void require_cuda_devices(const char* setting, const std::vector<petra::Device>& devices) {
  std::string listed;
  bool all_cuda = !devices.empty();
  for (const petra::Device& d : devices) {
    listed += (listed.empty() ? "" : ",") + d.str();
    all_cuda = all_cuda && d.is_cuda();
  }
  PETRA_CHECK(all_cuda, petra::ValueError, setting, " runs on CUDA devices only, but --devices is ",
              listed.empty() ? std::string("not given (the CPU)") : listed, ": give --devices cuda:N");
}

void use_conv_impl(petra::ConvImpl impl, const std::vector<petra::Device>& devices) {
  if (impl == petra::ConvImpl::cudnn) {
    PETRA_CHECK(petra::cudnn_compiled(), petra::ValueError,
                "--conv-impl cudnn: this petra was built without cuDNN (meson found no cudnn.h and libcudnn)");
    require_cuda_devices("--conv-impl cudnn", devices);
  }
  petra::set_conv_impl(impl);
}

// --conv-math tf32: the tensor cores' arithmetic, on CUDA devices only (the CPU kernels are FP32: a
// run that silently kept FP32 would mislabel its numbers).
void use_conv_math(petra::ConvMath math, const std::vector<petra::Device>& devices) {
  if (math == petra::ConvMath::tf32) require_cuda_devices("--conv-math tf32", devices);
  petra::set_conv_math(math);
}

// --conv-weight winograd: petra's CUDA weight gradient, on CUDA devices and petra's kernels only
// (set after --conv-impl): a run that silently kept the direct product, on the CPU or on cuDNN's
// convolutions, would mislabel its numbers.
void use_conv_weight_algorithm(petra::ConvWeightAlgorithm algorithm, const std::vector<petra::Device>& devices) {
  if (algorithm == petra::ConvWeightAlgorithm::winograd) {
    require_cuda_devices("--conv-weight winograd", devices);
    PETRA_CHECK(petra::conv_impl() == petra::ConvImpl::petra, petra::ValueError,
                "--conv-weight winograd: petra's convolution kernels only (not with --conv-impl cudnn, which "
                "chooses its own algorithms)");
  }
  petra::set_conv_weight_algorithm(algorithm);
}

// --conv-forward winograd or auto: petra's CUDA forward and backward data, on CUDA devices and
// petra's kernels only (set after --conv-impl), for the same reason.
void use_conv_forward_algorithm(petra::ConvForwardAlgorithm algorithm, const std::vector<petra::Device>& devices) {
  if (algorithm != petra::ConvForwardAlgorithm::direct) {
    const std::string flag = std::string("--conv-forward ") + petra::name_of(algorithm);
    require_cuda_devices(flag.c_str(), devices);
    PETRA_CHECK(petra::conv_impl() == petra::ConvImpl::petra, petra::ValueError, flag,
                ": petra's convolution kernels only (not with --conv-impl cudnn, which chooses its own algorithms)");
  }
  petra::set_conv_forward_algorithm(algorithm);
}

// --batchnorm-one-pass: petra's CUDA batch norm kernels, on CUDA devices and petra's kernels only
// (set after --conv-impl), for the same reason.
void use_batchnorm_one_pass(bool on, const std::vector<petra::Device>& devices) {
  if (on) {
    require_cuda_devices("--batchnorm-one-pass", devices);
    PETRA_CHECK(petra::conv_impl() == petra::ConvImpl::petra, petra::ValueError,
                "--batchnorm-one-pass: petra's batch norm kernels only (not with --conv-impl cudnn, which runs "
                "cuDNN's)");
  }
  petra::set_batchnorm_one_pass(on);
}

// --conv-split-k: petra's CUDA convolution kernels, on CUDA devices and petra's kernels only (set
// after --conv-impl), for the same reason.
void use_conv_split_k(bool on, const std::vector<petra::Device>& devices) {
  if (on) {
    require_cuda_devices("--conv-split-k", devices);
    PETRA_CHECK(petra::conv_impl() == petra::ConvImpl::petra, petra::ValueError,
                "--conv-split-k: petra's convolution kernels only (not with --conv-impl cudnn, which chooses its own "
                "algorithms)");
  }
  petra::set_conv_split_k(on);
}

// --cudnn-algorithms fastest: only cuDNN's convolutions have algorithms to time, so it needs
// --conv-impl cudnn (set first): with petra's kernels it would change nothing, silently.
void use_cudnn_algorithms(petra::CudnnAlgorithms choice) {
  PETRA_CHECK(choice == petra::CudnnAlgorithms::deterministic || petra::conv_impl() == petra::ConvImpl::cudnn,
              petra::ValueError, "--cudnn-algorithms fastest: needs --conv-impl cudnn (petra's kernels have no "
              "algorithms to time)");
  petra::set_cudnn_algorithms(choice);
}

}  // namespace

int main(int argc, char** argv) {
  TrainConfig c;
  c.epochs = 4;
  std::string method = "petra";
  std::string model_arch = c.arch;
  bool eval_only = false, no_augment = false, no_shuffle = false, print_model = false;
  std::filesystem::path save_params, log_json, plot;

  CLI::App app{"petra-train: train a RevNet or ResNet with PETRA, exact or reversible backpropagation, or a\n"
               "delayed-gradient baseline. With no arguments: PETRA on two CPU workers (cpu:0,cpu:1, one thread each),\n"
               "RevNet18 (width 16) on Fashion-MNIST from /usr/share/datasets/fashion-mnist, 4 epochs."};
  app.footer(kExitCodes);
  app.get_formatter()->column_width(34);
  auto* data = "Data";
  app.add_option("--dataset", c.dataset, "fashion-mnist, mnist, cifar10, cifar100, imagenet32, npy or synthetic")
      ->group(data)->capture_default_str();
  app.add_option("--data-dir", c.data_dir, "directory of the dataset (default: the dataset's usual place)")->group(data);
  app.add_flag("--no-augment", no_augment, "no random crop or flip")->group(data);
  app.add_flag("--no-shuffle", no_shuffle, "same order every epoch")->group(data);
  app.add_option("--synthetic-size", c.synthetic_train_size, "training images of --dataset synthetic")
      ->group(data)->capture_default_str()->check(CLI::Range(std::int64_t{1}, petra::data::kMaxSyntheticImages));
  auto* model = "Model";
  app.add_option("--model", model_arch, "revnet18, revnet34, revnet50, resnet18, resnet34 or resnet50")
      ->group(model)->capture_default_str()->check(CLI::IsMember(petra::nn::known_architectures()));
  app.add_option("--width", c.width, "channels of one stream in the first group (64 = the paper's models)")
      ->group(model)->capture_default_str()->check(CLI::Range(std::int64_t{1}, petra::nn::kMaxWidth));
  app.add_option("--stem", c.stem, "cifar (conv3x3) or imagenet (conv7x7 stride 2 + max-pool)")
      ->group(model)->capture_default_str()->check(CLI::IsMember({"cifar", "imagenet"}));
  app.add_option("--classes", c.classes, "output classes (default: the dataset's; needed for an npy directory without "
                 "classes.txt)")
      ->group(model)->check(CLI::Range(std::int64_t{1}, petra::data::kMaxClasses));
  std::string stages_text = "auto";
  app.add_option("--stages", stages_text, "pipeline stages: auto (a pipelined method: one stage per worker, cut where "
                 "the modelled costs balance; a synchronous one: one block per stage), blocks (one block per stage, "
                 "the paper's: J = 10 for revnet18), J (blocks split as evenly as possible) or blocks per stage, "
                 "e.g. 1,2,2,5")->group(model)->capture_default_str();
  app.add_flag("--print-model", print_model, "print each stage (kind, shapes, parameters) and exit")->group(model);
  auto* training = "Training";
  app.add_option("--method", method,
                 "backprop, revbackprop (synchronous), or the pipelined petra, delayed-reversible, dsp, pipedream")
      ->group(training)->capture_default_str()
      ->check(CLI::IsMember({"backprop", "revbackprop", "petra", "delayed-reversible", "dsp", "pipedream"}));
  auto* pipelining = "Pipelined methods";
  std::string devices_text, placement_text;
  std::int64_t print_schedule = 0;
  bool report_memory = false;
  app.add_option("--devices", devices_text, "one worker per device (default cpu:0,cpu:1: two CPU workers; cpu:0 alone "
                 "runs the sequential executor; cuda:0 trains on that GPU; cuda:0,cuda:1 one worker per GPU)")
      ->group(pipelining);
  std::string conv_impl_text = "petra";
  app.add_option("--conv-impl", conv_impl_text,
                 "convolutions and batch norms on GPUs: petra (its own CUDA kernels) or cudnn (cuDNN's; needs a "
                 "build with cuDNN and CUDA --devices)")
      ->group(pipelining)->capture_default_str()->check(CLI::IsMember({"petra", "cudnn"}));
  std::string conv_math_text = "fp32";
  app.add_option("--conv-math", conv_math_text,
                 "convolutions' arithmetic on GPUs, petra's kernels and cuDNN's alike: fp32 (FP32 multiply-adds) or "
                 "tf32 (the tensor cores, TF32 inputs, FP32 sums; PyTorch's default for convolutions)")
      ->group(pipelining)->capture_default_str()->check(CLI::IsMember({"fp32", "tf32"}));
  std::string conv_weight_text = "auto";
  app.add_option("--conv-weight", conv_weight_text,
                 "the weight gradient of petra's 3x3 stride-1 convolutions on GPUs: auto (Winograd where a GPU timed "
                 "it faster: 64+ channels, in TF32 planes up to 16x16), direct (the implicit GEMM) or winograd "
                 "(Winograd's F(2x2, 3x3) wherever it applies: 2.25x fewer multiply-adds)")
      ->group(pipelining)->capture_default_str()->check(CLI::IsMember({"auto", "direct", "winograd"}));
  std::string conv_forward_text = "direct";
  app.add_option("--conv-forward", conv_forward_text,
                 "the forward and backward data of petra's 3x3 stride-1 convolutions on GPUs: direct (the implicit "
                 "GEMM), winograd (Winograd's F(2x2, 3x3): 2.25x fewer multiply-adds) or auto (Winograd where "
                 "estimated faster: 64+ channels, planes up to 16x16, in TF32 8x8); the last two not yet timed on a GPU")
      ->group(pipelining)->capture_default_str()->check(CLI::IsMember({"direct", "winograd", "auto"}));
  bool batchnorm_one_pass = false;
  app.add_flag("--batchnorm-one-pass", batchnorm_one_pass,
               "petra's batch norm on GPUs in one pass where a channel fits in a thread-block cluster's shared memory "
               "(one read of x and dy instead of two; not yet timed on a GPU, so off by default)")
      ->group(pipelining);
  bool conv_split_k = false;
  app.add_flag("--conv-split-k", conv_split_k,
               "petra's forward and backward data on GPUs with K cut into slices where the 128x128 tile leaves too "
               "few blocks to fill the GPU (the 4x4 layers at batch 128; not yet timed on a GPU, so off by default)")
      ->group(pipelining);
  std::string cudnn_algorithms_text = "deterministic";
  app.add_option("--cudnn-algorithms", cudnn_algorithms_text,
                 "with --conv-impl cudnn: deterministic (cuDNN's heuristics, deterministic algorithms only, the same "
                 "bits every run) or fastest (every algorithm timed on a shape's first call, the fastest kept, "
                 "deterministic or not, as PyTorch's cudnn.benchmark)")
      ->group(pipelining)->capture_default_str()->check(CLI::IsMember({"deterministic", "fastest"}));
  app.add_flag("--mpi", c.mpi,
               "spread the stages over the processes of mpirun (contiguous groups; the first process reports): "
               "mpirun --allow-run-as-root --oversubscribe -np 2 build/petra-train --mpi --method petra (GPUs: add "
               "--devices cuda:0,cuda:1, one per process of a host)")
      ->group(pipelining);
  std::string transport = "auto";
  app.add_option("--transport", transport,
                 "with --mpi: what carries the messages and replica averages: nccl (device tensors; needs --devices "
                 "cuda:N and petra built with NCCL), mpi (host memory; device tensors through host copies), or auto "
                 "(nccl on GPUs where built, else mpi). Under --mpi, --devices names GPUs: the process of local rank "
                 "L trains on entry L mod count")
      ->group(pipelining)->capture_default_str()->check(CLI::IsMember({"auto", "mpi", "nccl"}));
  app.add_option("--replicas", c.replicas,
                 "with --mpi: copies of the pipeline, each on -np / R processes, training their share of every "
                 "epoch's mini-batches and averaging each stage's gradients before its update (data parallel; "
                 "a synchronous method needs R = -np)")
      ->group(pipelining);
  app.add_option("--message-timeout", c.message_timeout,
                 "seconds a worker waits for a message before the run fails as stuck (default 600)")
      ->group(pipelining);
  app.add_option("--threads-per-device", c.threads_per_device, "kernel threads of each worker")
      ->group(pipelining)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--placement", placement_text, "worker of each stage, e.g. 0,0,0,0,1,1,1,1,1,1 (default: balanced by "
                 "measured stage costs)")->group(pipelining);
  app.add_option("--print-schedule", print_schedule, "print the first N steps of the schedule grid and exit")
      ->group(pipelining)->check(CLI::Range(std::int64_t{1}, kMaxPrintedSteps));
  app.add_flag("--track-reconstruction", c.track_reconstruction,
               "keep the true inputs of reversible stages to report each stage's reconstruction error (debug)")
      ->group(pipelining);
  app.add_flag("--report-memory", report_memory, "print the peak bytes per stage and tag after training")->group(pipelining);
  app.add_option("--track-gradient-quality", c.track_gradient_quality,
                 "every N steps, per stage: cosine and norm ratio of the delayed gradient against backprop's at the "
                 "current parameters (costs one backprop per stage at those steps)")
      ->group(pipelining)->check(CLI::NonNegativeNumber);
  app.add_flag("--flush-each-epoch", c.flush_each_epoch,
               "drain the pipeline at every epoch end (default: never flushed, as in the paper's code)")->group(pipelining);
  app.add_flag("--delay-compensation", c.delay_compensation,
               "spike compensation (Kosson et al. 2020) of the momentum of delayed stages: not in the PETRA paper")
      ->group(pipelining);
  std::string weight_prediction = "none";
  app.add_option("--weight-prediction", weight_prediction,
                 "none, or linear: each delayed stage runs its forward with its parameters extrapolated along SGD's "
                 "momentum over its delay (Kosson et al. 2020; sgd only; not in the PETRA paper)")
      ->group(pipelining)->capture_default_str()->check(CLI::IsMember({"none", "linear"}));
  app.add_option("--prediction-horizon", c.prediction_horizon,
                 "with --weight-prediction linear: predict this fraction of the delay ahead (1: all of it; below 1: "
                 "a damped horizon)")
      ->group(pipelining)->capture_default_str()->check(CLI::Range(0.0, 10.0));
  app.add_option("--delay-lr-warmup", c.delay_lr_warmup,
                 "PipeMare (Yang et al. 2021): over the first N mini-batches divide each delayed stage's learning rate "
                 "by its delay to a power falling from 1 to 0 (0: off)")
      ->group(pipelining)->capture_default_str()->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  std::string bn_statistics = "forward";
  app.add_option("--bn-statistics", bn_statistics,
                 "which pass moves batch norm's running statistics: the forward, or the recomputation in the backward")
      ->group(pipelining)->capture_default_str()->check(CLI::IsMember({"forward", "backward"}));
  app.add_option("--bn-refresh-batches", c.bn_refresh_batches,
                 "after a pipelined method drains its pipeline (the run's end, or every epoch with --flush-each-epoch), "
                 "recompute batch norm's running statistics over the epoch's last N mini-batches (0: off)")
      ->group(pipelining)->capture_default_str()->check(CLI::Range(std::int64_t{0}, std::int64_t{100000}));
  app.add_option("--epochs", c.epochs, "epochs to train")->group(training)->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--max-steps", c.max_steps, "stop after this many mini-batches in total")->group(training);
  app.add_option("--batch-size", c.batch_size, "mini-batch size")->group(training)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--accumulation", c.accumulation, "k: average the gradients of k mini-batches per update")
      ->group(training)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--optimizer", c.optimizer, "sgd, adam or lars")
      ->group(training)->capture_default_str()->check(CLI::IsMember({"sgd", "adam", "lars"}));
  app.add_option("--lr", c.lr, "base learning rate")->group(training)->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--momentum", c.momentum, "momentum (sgd, lars)")->group(training)->capture_default_str();
  app.add_flag("--nesterov,!--no-nesterov", c.nesterov, "Nesterov momentum (sgd; default on)")->group(training);
  app.add_option("--weight-decay", c.weight_decay, "coupled L2, not on batch-norm parameters or biases")
      ->group(training)->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_flag("--goyal-scaling", c.goyal_scaling, "scale the learning rate by k x batch / 256 (Goyal et al.)")->group(training);
  app.add_option("--warmup-epochs", c.warmup_epochs, "linear warm-up, per iteration")
      ->group(training)->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--schedule", c.schedule, "constant, step, cosine or poly")
      ->group(training)->capture_default_str()->check(CLI::IsMember({"constant", "step", "cosine", "poly"}));
  app.add_option("--milestones", c.milestones, "epochs where the step schedule multiplies the rate by 0.1")
      ->group(training)->delimiter(',');
  app.add_option("--seed", c.seed, "seed of initialisation, shuffling and augmentation")->group(training)->capture_default_str();
  app.add_option("--threads", c.threads, "CPU threads (default: OMP_NUM_THREADS or all cores)")
      ->group(training)->check(CLI::NonNegativeNumber);
  auto* output = "Output and state";
  app.add_option("--log-json", log_json, "write one JSON object per epoch (with each step's seconds), then a summary line")->group(output);
  app.add_flag("--profile", c.profile,
               "time per op family and per stage (forward, backward, reconstruction, update, data, waiting), "
               "printed after training and in --log-json's summary (docs/profiling.md)")->group(output);
  app.add_option("--plot", plot, "write an SVG of loss and accuracy per epoch")->group(output);
  app.add_option("--checkpoint-dir", c.checkpoint_dir, "write an atomic, checksummed checkpoint after every epoch")->group(output);
  app.add_flag("--resume", c.resume, "continue from the latest checkpoint in --checkpoint-dir")->group(output);
  app.add_flag("--eval-only", eval_only, "evaluate the test set and exit")->group(output);
  app.add_option("--load-params", c.load_params, "start from a directory of .npy parameters")->group(output);
  app.add_option("--save-params", save_params, "save the final parameters as a directory of .npy files")->group(output);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kOk : kBadArguments;
  }
  c.arch = model_arch;
  c.augment = !no_augment;
  c.shuffle = !no_shuffle;

  try {
    c.method = petra::pipeline::parse_pipeline_method(method);
    c.bn_statistics = petra::nn::parse_statistics_pass(bn_statistics);
    c.weight_prediction = petra::pipeline::parse_weight_prediction(weight_prediction);
    c.transport = petra::pipeline::parse_transport(transport);
    PETRA_CHECK(!c.mpi || !eval_only, petra::ValueError, "--mpi trains; evaluate with one process (--eval-only)");
    if (devices_text.empty() && petra::pipeline::is_delayed(c.method) && !c.mpi) devices_text = "cpu:0,cpu:1";
    if (!devices_text.empty())
      for (const auto& d : split_list(devices_text)) c.devices.push_back(petra::Device::parse(d));
    use_conv_impl(petra::parse_conv_impl(conv_impl_text), c.devices);
    use_conv_math(petra::parse_conv_math(conv_math_text), c.devices);
    use_cudnn_algorithms(petra::parse_cudnn_algorithms(cudnn_algorithms_text));
    use_conv_weight_algorithm(petra::parse_conv_weight_algorithm(conv_weight_text), c.devices);
    use_conv_forward_algorithm(petra::parse_conv_forward_algorithm(conv_forward_text), c.devices);
    use_batchnorm_one_pass(batchnorm_one_pass, c.devices);
    use_conv_split_k(conv_split_k, c.devices);
    c.stages = stages_text;
    std::vector<petra::pipeline::BlockProfile> blocks;  // what the layout printed below is made of
    if (print_schedule > 0 || print_model) {  // no data is loaded: the dataset's usual shape
      const int workers = std::max(1, static_cast<int>(c.devices.size()));
      blocks = petra::pipeline::profile_blocks(described_model(c), described_image(c));
      c.stage_sizes = petra::pipeline::resolve_stage_layout(c.stages, described_model(c), blocks, c.method, workers);
    }
    if (!placement_text.empty())
      c.placement = parse_placement(placement_text);
    if (print_schedule > 0) {
      const int stages = c.stage_sizes.empty() ? static_cast<int>(petra::nn::block_count(c.arch))
                                               : static_cast<int>(c.stage_sizes.size());
      std::printf("# stages (--stages %s): %s\n", c.stages.c_str(),
                  layout_text(c.stage_sizes, blocks).c_str());
      std::printf("%s", petra::pipeline::to_text(petra::pipeline::make_schedule(c.method, stages, print_schedule,
                                                                               c.accumulation, false)).c_str());
      return kOk;
    }
    report_memory_after = report_memory;
    if (print_model) {
      petra::nn::ModelConfig m = described_model(c);
      m.stage_sizes = c.stage_sizes;
      petra::nn::Model net(m);
      const petra::Shape image = described_image(c);
      std::printf("stages (--stages %s): %s\n", c.stages.c_str(),
                  layout_text(c.stage_sizes, blocks).c_str());
      std::printf("%s", net.summary({1, image[0], image[1], image[2]}).c_str());
      return kOk;
    }
    return train(c, eval_only, save_params, log_json, plot);
  } catch (const petra::pipeline::DivergedError& e) {
    std::fprintf(stderr, "\npetra-train: diverged: %s\n", e.what());
    return kDiverged;
  } catch (const petra::pipeline::CheckpointError& e) {
    std::fprintf(stderr, "petra-train: checkpoint: %s\n", e.what());
    return kCheckpoint;
  } catch (const petra::IOError& e) {
    std::fprintf(stderr, "petra-train: bad data: %s\n", e.what());
    return kBadData;
  } catch (const petra::ValueError& e) {
    std::fprintf(stderr, "petra-train: bad argument: %s\n", e.what());
    return kBadArguments;
  } catch (const petra::DeviceError& e) {
    std::fprintf(stderr, "petra-train: device: %s\n", e.what());
    return kDevice;
  } catch (const petra::OutOfMemoryError& e) {  // the device is too small for this run: not a bug
    std::fprintf(stderr, "petra-train: device: out of memory: %s (a smaller --width or --batch-size may fit)\n",
                 e.what());
    return kDevice;
  } catch (const std::bad_alloc& e) {
    std::fprintf(stderr, "petra-train: device: out of memory (%s); a smaller --width or --batch-size may fit\n",
                 e.what());
    return kDevice;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "petra-train: internal error: %s\n", e.what());
    return kInternal;
  }
}
