// benchmarks/bench_memory.cpp: bench-memory, the memory each training method needs, measured by the
// allocator: the structure of the PETRA paper's Table 3 (input buffer yes/no x parameter stash
// yes/no), with backprop and revbackprop for reference.
//
// What runs. For every model and method, a fresh model (same seed) trains on synthetic images
// with SGD (momentum 0.9, Nesterov, weight decay 5e-4, constant learning rate 0.01, k = 1):
//   - delayed methods (pipedream, dsp, delayed-reversible, petra) on the sequential executor
//     (pipeline/executor.hpp): 2(J-1) steps fill the pipeline, then the allocator's peaks are reset
//     and --steps more steps run in the steady state, every stage busy with a forward, a backward
//     and an update at every step;
//   - backprop and revbackprop: their synchronous schedules on the same executor, one warm-up step,
//     then --steps steps.
// The peaks are those of the measured window. Every number is a count of the allocator (bytes
// requested by live tensors, petra/allocator.hpp), per tag and per owner (owner = stage index);
// nothing measured is estimated.
//
// How to read the output.
//   - per-stage table (--per-stage): for each stage, the peak bytes of each tag that stage owns,
//     its owner peak ("peak": the most bytes of that stage live at once, which is what a device
//     holding only that stage needs), and the analytic estimate of its kept state.
//   - total table, one row per method: each tag's per-stage peaks summed over the stages;
//     "nostage" = the peak of memory owned by no stage (the optimizer's temporaries, the labels);
//     "total" = the sum over stages of the stage's owner peak, plus "nostage": the memory J
//     devices, one stage each, need together. "kept" = the measured sum of the five tags a method
//     keeps between steps (parameters, gradients, optimizer_state, input_buffer, param_stash) and
//     "analytic" the estimate of those five from sizes alone (analytic_stage below says exactly
//     what it counts). "1 device" = the process-wide peak (all stages on one device). "/pipedr" =
//     total / pipedream's total.
//   - the last lines: PETRA's measured total as a fraction of pipedream's, per model, next to the
//     analytic fraction; the target is <= 0.5 for RevNet50 (the paper's analytic saving: 54.3%).
//
// Where the bytes are (tags, from the runtime): a stage's output is input_buffer of the next
// stage when that stage keeps its inputs, else messages of the sender; the temporaries of a
// forward are tagged like its output; a backward runs under messages of its stage (its
// recomputed graph and the (input, gradient) pair it sends); stashed parameters are param_stash;
// the stream's grow-only kernel scratch is workspace of the stage that first made it grow. The
// mini-batch images enter as input_buffer of stage 0 (the stem keeps its input in every method).
//
//   build/bench-memory                          # RevNet18/34/50, 32x32x3, batch 8, width 32
//   build/bench-memory --models revnet50 --per-stage --json memory.json
//   build/bench-memory --quick                  # tiny sizes, a few seconds
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "petra/data/dataset.hpp"
#include "petra/data/loader.hpp"
#include "petra/nn/models.hpp"
#include "petra/nn/optimizer.hpp"
#include "benchmarks/synthetic_setup.hpp"
#include "petra/petra.hpp"
#include "petra/pipeline/executor.hpp"
#include "petra/pipeline/memory_report.hpp"
#include "petra/pipeline/schedule.hpp"

namespace {

using petra::MemoryTag;
using petra::Tensor;
using petra::pipeline::PipelineMethod;
using Clock = std::chrono::steady_clock;
using TagBytes = std::array<std::int64_t, petra::kNumMemoryTags>;

constexpr double kLearningRate = 0.01;
constexpr double kWeightDecay = 5e-4;
constexpr double kTargetFraction = 0.5;        // the target for RevNet50: petra <= 0.5 x pipedream
constexpr double kPaperAnalyticSaving = 54.3;  // [P Table 3], RevNet50 on ImageNet, batch 64

// Table 3's rows in the paper's order, then the synchronous references.
const std::vector<std::string> kDefaultMethods{"pipedream", "dsp", "delayed-reversible", "petra", "backprop",
                                               "revbackprop"};

struct Options {
  std::vector<std::string> models{"revnet18", "revnet34", "revnet50"};
  std::vector<std::string> methods = kDefaultMethods;
  std::int64_t batch = 8, size = 32, channels = 3, width = 32, steps = 3;
  int threads = 2;
  bool per_stage = false, quick = false;
  std::string json_path;
};

void validate(const Options& o) {
  PETRA_CHECK(!o.models.empty(), petra::ValueError, "--models is empty");
  PETRA_CHECK(!o.methods.empty(), petra::ValueError, "--methods is empty");
  for (const std::string& m : o.methods) petra::pipeline::parse_pipeline_method(m);  // ValueError if unknown
  const auto& known = petra::nn::known_architectures();
  for (const std::string& m : o.models)
    PETRA_CHECK(m.rfind("revnet", 0) == 0 && std::find(known.begin(), known.end(), m) != known.end(), petra::ValueError, "model '", m,
                "' is not a RevNet (revnet18, revnet34, revnet50): PETRA's memory claim is about reversible stages");
  PETRA_CHECK(o.batch >= 2, petra::ValueError, "--batch must be >= 2 (batch norm), got ", o.batch);
  PETRA_CHECK(o.size >= 8, petra::ValueError, "--size must be >= 8 (three stride-2 groups), got ", o.size);
  PETRA_CHECK(o.width >= 1, petra::ValueError, "--width must be >= 1, got ", o.width);
  PETRA_CHECK(o.steps >= 1, petra::ValueError, "--steps must be >= 1, got ", o.steps);
  PETRA_CHECK(o.threads >= 1, petra::ValueError, "--threads must be >= 1, got ", o.threads);
}

petra::nn::ModelConfig model_config(const Options& o, const std::string& arch) {
  return petra::bench::synthetic_model(arch, o.width, o.channels);
}

// A few synthetic mini-batches, made once (tagged "other", no owner) and reused in turn.
std::vector<petra::pipeline::MiniBatch> make_batches(const Options& o, int count) {
  return petra::bench::synthetic_batches(o.batch, o.channels, o.size, count, MemoryTag::other);
}

// Mini-batch m, its images copied as stage 0's input buffer, so the stem's FIFO is counted.
petra::pipeline::MiniBatch batch_for_stage0(const std::vector<petra::pipeline::MiniBatch>& batches, std::int64_t m) {
  const petra::pipeline::MiniBatch& b = batches[static_cast<std::size_t>(m) % batches.size()];
  petra::MemoryScope scope(MemoryTag::input_buffer, 0);
  return {b.images.clone(), b.labels};
}

// ---------------------------------------------------------------- sizes and the analytic estimate

struct StageSizes {
  petra::nn::StageKind kind;
  std::int64_t parameter_bytes = 0;  // parameters and buffers (batch norm's running statistics)
  std::int64_t gradient_bytes = 0;   // parameters only: what gets a gradient and a momentum buffer
  std::int64_t input_bytes = 0;      // one mini-batch of this stage's input
};

std::vector<StageSizes> stage_sizes(petra::nn::Model& model, const Tensor& images) {
  std::vector<StageSizes> sizes;
  petra::NoGradGuard no_grad;
  model.eval();  // shapes only: leave the running statistics alone
  Tensor h = images;
  for (std::size_t j = 0; j < model.num_stages(); ++j) {
    petra::nn::Stage& stage = model.stage(j);
    StageSizes s{stage.kind()};
    for (const auto& [name, p] : stage.named_parameters()) s.gradient_bytes += std::int64_t(p.data().nbytes());
    s.parameter_bytes = s.gradient_bytes;
    for (const auto& [name, b] : stage.named_buffers()) s.parameter_bytes += std::int64_t(b.nbytes());
    s.input_bytes = std::int64_t(h.nbytes());
    if (j + 1 < model.num_stages()) h = stage.forward(petra::Variable(h)).data();
    sizes.push_back(s);
  }
  model.train();
  return sizes;
}

std::size_t tag_index(MemoryTag tag) { return static_cast<std::size_t>(tag); }

// The analytic peak of what stage j of J keeps under `method`, per tag, from sizes alone:
//   parameters       its parameters and batch-norm buffers, once;
//   gradients        one gradient per parameter (accumulated in place, dropped after the update);
//   optimizer_state  one SGD momentum buffer per parameter;
//   param_stash      delayed methods that stash: (d + 1) copies of the parameters, d = 2(J-1-j)
//                    held between steps plus the one this step's forward takes before its
//                    backward releases the oldest (the head, d = 0, stashes nothing);
//   input_buffer     delayed methods, stages that keep inputs: (d + 1) inputs for the same reason,
//                    plus, for j > 0, the next input already waiting in the channel (the
//                    sequential executor runs stage j-1 before stage j within a step) and, where
//                    stage j-1 rebuilds its input from it (PETRA below a buffered stage), the
//                    input j sent down with its gradient the step before, which stage j-1 reads
//                    this step (both share those bytes' tag); synchronous methods: one input for each stage that
//                    keeps it (revbackprop: the buffered stages; backprop: the images of stage 0,
//                    its graph being activations).
// It does not count activations, messages, workspace or other: transient, or (backprop's graph)
// not estimated here.
TagBytes analytic_stage(PipelineMethod method, const std::vector<StageSizes>& sizes, int j, int J) {
  const StageSizes& s = sizes[std::size_t(j)];
  const bool previous_rebuilds = j > 0 && petra::pipeline::rebuilds_input(method, sizes[std::size_t(j - 1)].kind);
  TagBytes a{};
  a[tag_index(MemoryTag::parameters)] = s.parameter_bytes;
  a[tag_index(MemoryTag::gradients)] = s.gradient_bytes;
  a[tag_index(MemoryTag::optimizer_state)] = s.gradient_bytes;
  const petra::pipeline::Keeping keep = petra::pipeline::keeping(method, s.kind);
  if (petra::pipeline::is_delayed(method)) {
    const std::int64_t d = petra::pipeline::fifo_depth(j, J);
    if (keep.parameters) a[tag_index(MemoryTag::param_stash)] = (d + 1) * s.gradient_bytes;
    if (keep.input)
      a[tag_index(MemoryTag::input_buffer)] = (d + 1 + (j > 0 ? 1 : 0) + (previous_rebuilds ? 1 : 0)) * s.input_bytes;
  } else if (method == PipelineMethod::revbackprop ? keep.input : j == 0) {
    a[tag_index(MemoryTag::input_buffer)] = s.input_bytes;
  }
  return a;
}

// ---------------------------------------------------------------- measuring

struct StageMemory {
  TagBytes peak{};      // per tag, owner = this stage
  std::int64_t owner_peak = 0;
  TagBytes analytic{};
};

struct MethodMemory {
  PipelineMethod method;
  std::vector<StageMemory> stages;
  std::int64_t unowned_peak = 0;  // owner kNoOwner, less the synthetic data set's batches
  std::int64_t device_peak = 0;   // process-wide, less the same
  std::int64_t steps = 0, measured_steps = 0;
  double seconds = 0;

  TagBytes sum_of_peaks() const {
    TagBytes t{};
    for (const StageMemory& s : stages)
      for (std::size_t i = 0; i < t.size(); ++i) t[i] += s.peak[i];
    return t;
  }
  TagBytes analytic() const {
    TagBytes t{};
    for (const StageMemory& s : stages)
      for (std::size_t i = 0; i < t.size(); ++i) t[i] += s.analytic[i];
    return t;
  }
  std::int64_t total() const {
    std::int64_t t = unowned_peak;
    for (const StageMemory& s : stages) t += s.owner_peak;
    return t;
  }
};

// The five tags a method keeps between steps; the analytic estimate covers exactly these.
constexpr MemoryTag kKeptTags[] = {MemoryTag::parameters, MemoryTag::gradients, MemoryTag::optimizer_state,
                                   MemoryTag::input_buffer, MemoryTag::param_stash};

std::int64_t kept_bytes(const TagBytes& t) {
  std::int64_t total = 0;
  for (MemoryTag tag : kKeptTags) total += t[tag_index(tag)];
  return total;
}

// Starts the measured window: every peak becomes the current value. Returns the bytes owned by no
// stage that are live now (the synthetic data set's batches), which the window's peaks subtract.
std::int64_t start_window() {
  auto& allocator = petra::Allocator::instance();
  allocator.reset_peaks(petra::Device::cpu());
  return allocator.stats_of_owner(petra::Device::cpu(), petra::kNoOwner).current;
}

MethodMemory read_peaks(PipelineMethod method, const std::vector<StageSizes>& sizes, std::int64_t unowned_baseline) {
  const auto& allocator = petra::Allocator::instance();
  const auto cpu = petra::Device::cpu();
  const int J = static_cast<int>(sizes.size());
  MethodMemory r{method, {}, allocator.stats_of_owner(cpu, petra::kNoOwner).peak - unowned_baseline,
                 allocator.stats(cpu).peak - unowned_baseline};
  const petra::pipeline::MemoryReport report = petra::pipeline::read_memory_report(cpu, J);
  for (int j = 0; j < J; ++j) {
    const auto& stage = report.stage_peak_bytes[std::size_t(j)];
    StageMemory s;
    for (int t = 0; t < petra::kNumMemoryTags; ++t) {
      const auto found = stage.find(std::string(petra::name_of(MemoryTag(t))));
      s.peak[std::size_t(t)] = found == stage.end() ? 0 : found->second;
    }
    s.owner_peak = stage.at("total");
    s.analytic = analytic_stage(method, sizes, j, J);
    r.stages.push_back(s);
  }
  return r;
}

petra::pipeline::RuntimeOptions runtime_options(PipelineMethod method) {
  petra::pipeline::RuntimeOptions options;
  options.method = method;
  options.optimizer_options.momentum = 0.9;
  options.optimizer_options.nesterov = true;
  options.weight_decay = kWeightDecay;
  options.schedule.base_lr = kLearningRate;
  return options;
}

// A delayed method on the sequential executor: fill the pipeline, reset the peaks, run `steps`.
MethodMemory measure_delayed(PipelineMethod method, petra::nn::Model& model, const std::vector<StageSizes>& sizes,
                             const std::vector<petra::pipeline::MiniBatch>& batches, std::int64_t steps) {
  const int J = static_cast<int>(model.num_stages());
  const std::int64_t fill = 2 * (J - 1);
  petra::pipeline::SequentialExecutor executor(model, runtime_options(method));
  const auto grid = petra::pipeline::make_schedule(method, J, fill + steps, 1, /*drain=*/false);
  const auto source = [&](std::int64_t m) { return batch_for_stage0(batches, m); };
  executor.run(grid, 0, fill, source, {});
  const std::int64_t baseline = start_window();
  executor.run(grid, fill, grid.steps, source, {});
  MethodMemory r = read_peaks(method, sizes, baseline);
  r.steps = grid.steps;
  r.measured_steps = steps;
  return r;
}

// backprop or revbackprop: their synchronous schedule (one step per mini-batch, with its update) on
// the executor, as the trainer runs them; one warm-up step.
MethodMemory measure_synchronous(PipelineMethod method, petra::nn::Model& model, const std::vector<StageSizes>& sizes,
                                 const std::vector<petra::pipeline::MiniBatch>& batches, std::int64_t steps) {
  petra::pipeline::SequentialExecutor executor(model, runtime_options(method));
  const auto grid = petra::pipeline::make_schedule(method, static_cast<int>(model.num_stages()), steps + 1, 1,
                                                   /*drain=*/false);
  const auto source = [&](std::int64_t m) { return batch_for_stage0(batches, m); };
  executor.run(grid, 0, 1, source, {});
  const std::int64_t baseline = start_window();
  executor.run(grid, 1, grid.steps, source, {});
  MethodMemory r = read_peaks(method, sizes, baseline);
  r.steps = steps + 1;
  r.measured_steps = steps;
  return r;
}

MethodMemory measure(PipelineMethod method, const Options& o, const std::string& arch,
                     const std::vector<petra::pipeline::MiniBatch>& batches) {
  const auto start = Clock::now();
  petra::nn::Model model(model_config(o, arch));
  const std::vector<StageSizes> sizes = stage_sizes(model, batches.front().images);
  MethodMemory r = petra::pipeline::is_delayed(method) ? measure_delayed(method, model, sizes, batches, o.steps)
                                                       : measure_synchronous(method, model, sizes, batches, o.steps);
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

// ---------------------------------------------------------------- printing

struct Unit {
  const char* name;
  double bytes;
};
Unit unit_for(std::int64_t largest) { return largest >= (std::int64_t{64} << 20) ? Unit{"MiB", 1 << 20} : Unit{"KiB", 1 << 10}; }

std::string amount(std::int64_t bytes, Unit u) { return fmt::format("{:.1f}", double(bytes) / u.bytes); }

// Table 3's columns for a method: does it keep inputs / stash parameters (in reversible stages)?
std::pair<std::string, std::string> buffers_of(PipelineMethod method) {
  if (method == PipelineMethod::backprop) return {"graph", "-"};
  if (!petra::pipeline::is_delayed(method)) return {"buffered", "-"};
  const auto keep = petra::pipeline::keeping(method, petra::nn::StageKind::reversible);
  return {keep.input ? "yes" : "no", keep.parameters ? "yes" : "no"};
}

constexpr MemoryTag kShownTags[] = {MemoryTag::parameters,   MemoryTag::gradients,   MemoryTag::optimizer_state,
                                    MemoryTag::activations,  MemoryTag::input_buffer, MemoryTag::param_stash,
                                    MemoryTag::messages,     MemoryTag::workspace,    MemoryTag::other};
constexpr const char* kShortTagNames[] = {"param", "grad", "optim", "activ", "inbuf", "stash", "msgs", "wksp", "other"};

std::string tag_header() {
  std::string h;
  for (const char* name : kShortTagNames) h += fmt::format(" {:>8}", name);
  return h;
}
std::string tag_cells(const TagBytes& t, Unit u) {
  std::string row;
  for (MemoryTag tag : kShownTags) row += fmt::format(" {:>8}", amount(t[tag_index(tag)], u));
  return row;
}

void print_per_stage(const MethodMemory& m, const std::vector<StageSizes>& sizes, Unit u) {
  fmt::print("\n  {} per stage ({}; peak = the stage's owner peak, analytic = its kept state):\n",
             petra::pipeline::name_of(m.method), u.name);
  fmt::print("  {:>5} {:<10}{} {:>9} {:>9} {:>9}\n", "stage", "kind", tag_header(), "peak", "kept", "analytic");
  for (std::size_t j = 0; j < m.stages.size(); ++j) {
    const StageMemory& s = m.stages[j];
    fmt::print("  {:>5} {:<10}{} {:>9} {:>9} {:>9}\n", j, petra::nn::name_of(sizes[j].kind), tag_cells(s.peak, u),
               amount(s.owner_peak, u), amount(kept_bytes(s.peak), u), amount(kept_bytes(s.analytic), u));
  }
}

const MethodMemory* find(const std::vector<MethodMemory>& results, PipelineMethod method) {
  for (const MethodMemory& m : results)
    if (m.method == method) return &m;
  return nullptr;
}

void print_totals(const std::string& arch, const std::vector<MethodMemory>& results, Unit u) {
  const MethodMemory* pipedream = find(results, PipelineMethod::pipedream);
  fmt::print("\n{} totals ({}; tags = per-stage peaks summed over the stages):\n", arch, u.name);
  fmt::print("{:<19} {:>8} {:>6}{} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6}\n", "method", "inputs", "stash",
             tag_header(), "nostage", "total", "kept", "analytic", "1 device", "/pipedr", "time");
  for (const MethodMemory& m : results) {
    const auto [inputs, stash] = buffers_of(m.method);
    const std::string fraction =
        pipedream ? fmt::format("{:.3f}", double(m.total()) / double(pipedream->total())) : std::string("-");
    fmt::print("{:<19} {:>8} {:>6}{} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>5.1f}s\n",
               petra::pipeline::name_of(m.method), inputs, stash, tag_cells(m.sum_of_peaks(), u),
               amount(m.unowned_peak, u), amount(m.total(), u), amount(kept_bytes(m.sum_of_peaks()), u),
               amount(kept_bytes(m.analytic()), u), amount(m.device_peak, u), fraction, m.seconds);
  }
}

// ---------------------------------------------------------------- JSON

nlohmann::json tags_json(const TagBytes& t) {
  nlohmann::json j;
  for (int i = 0; i < petra::kNumMemoryTags; ++i) j[std::string(petra::name_of(MemoryTag(i)))] = t[std::size_t(i)];
  return j;
}

nlohmann::json method_json(const MethodMemory& m) {
  const auto [inputs, stash] = buffers_of(m.method);
  nlohmann::json stages = nlohmann::json::array();
  for (const StageMemory& s : m.stages)
    stages.push_back({{"peak_by_tag", tags_json(s.peak)},
                      {"owner_peak", s.owner_peak},
                      {"kept", kept_bytes(s.peak)},
                      {"analytic_by_tag", tags_json(s.analytic)},
                      {"analytic_kept", kept_bytes(s.analytic)}});
  return {{"method", petra::pipeline::name_of(m.method)},
          {"input_buffer", inputs},
          {"param_stash", stash},
          {"steps", m.steps},
          {"measured_steps", m.measured_steps},
          {"seconds", m.seconds},
          {"per_stage", stages},
          {"sum_of_peaks_by_tag", tags_json(m.sum_of_peaks())},
          {"unowned_peak", m.unowned_peak},
          {"total", m.total()},
          {"kept", kept_bytes(m.sum_of_peaks())},
          {"analytic_by_tag", tags_json(m.analytic())},
          {"analytic_kept", kept_bytes(m.analytic())},
          {"one_device_peak", m.device_peak}};
}

nlohmann::json sizes_json(const std::vector<StageSizes>& sizes) {
  nlohmann::json a = nlohmann::json::array();
  for (std::size_t j = 0; j < sizes.size(); ++j)
    a.push_back({{"kind", petra::nn::name_of(sizes[j].kind)},
                 {"parameter_bytes", sizes[j].parameter_bytes},
                 {"gradient_bytes", sizes[j].gradient_bytes},
                 {"input_bytes", sizes[j].input_bytes},
                 {"fifo_depth", petra::pipeline::fifo_depth(int(j), int(sizes.size()))}});
  return a;
}

// ---------------------------------------------------------------- one model, the run

struct ModelResult {
  std::string arch;
  std::vector<StageSizes> sizes;
  std::vector<MethodMemory> methods;
  double fraction = -1, analytic_fraction = -1;  // petra / pipedream (-1: one of them not run)
};

ModelResult run_model(const Options& o, const std::string& arch, const std::vector<petra::pipeline::MiniBatch>& batches) {
  ModelResult r{arch, {}, {}};
  {
    petra::nn::Model model(model_config(o, arch));
    r.sizes = stage_sizes(model, batches.front().images);
  }
  for (const std::string& name : o.methods) {
    r.methods.push_back(measure(petra::pipeline::parse_pipeline_method(name), o, arch, batches));
    std::fflush(stdout);
  }
  const MethodMemory *petra_run = find(r.methods, PipelineMethod::petra), *pipedream = find(r.methods, PipelineMethod::pipedream);
  if (petra_run && pipedream) {
    r.fraction = double(petra_run->total()) / double(pipedream->total());
    r.analytic_fraction = double(kept_bytes(petra_run->analytic())) / double(kept_bytes(pipedream->analytic()));
  }
  return r;
}

void print_model(const Options& o, const ModelResult& r) {
  std::int64_t largest = 0;
  for (const MethodMemory& m : r.methods) largest = std::max(largest, m.total());
  const Unit u = unit_for(largest);
  std::int64_t params = 0;
  for (const StageSizes& s : r.sizes) params += s.gradient_bytes / 4;
  fmt::print("\n=== {}: J = {} stages, {:.2f}M parameters\n", r.arch, r.sizes.size(), double(params) / 1e6);
  if (o.per_stage)
    for (const MethodMemory& m : r.methods) print_per_stage(m, r.sizes, u);
  print_totals(r.arch, r.methods, u);
}

void print_verdicts(const std::vector<ModelResult>& results) {
  fmt::print("\nPETRA / pipedream, measured total (sum of the stages' peaks) and analytic kept state:\n");
  for (const ModelResult& r : results) {
    if (r.fraction < 0) {
      fmt::print("  {:<9} not measured (needs petra and pipedream in --methods)\n", r.arch);
      continue;
    }
    const bool targeted = r.arch == "revnet50";
    fmt::print("  {:<9} measured {:.3f} (saving {:.1f}%), analytic {:.3f} (saving {:.1f}%){}\n", r.arch, r.fraction,
               100 * (1 - r.fraction), r.analytic_fraction, 100 * (1 - r.analytic_fraction),
               targeted ? fmt::format("  target <= {:.2f}: {}", kTargetFraction,
                                      r.fraction <= kTargetFraction ? "MET" : "MISSED")
                        : std::string());
  }
  fmt::print("  paper (RevNet50, ImageNet 224, batch 64, analytic): saving {:.1f}%, fraction {:.3f}\n",
             kPaperAnalyticSaving, 1 - kPaperAnalyticSaving / 100);
}

nlohmann::json document(const Options& o, const std::vector<ModelResult>& results) {
  nlohmann::json models = nlohmann::json::array();
  for (const ModelResult& r : results) {
    nlohmann::json methods = nlohmann::json::array();
    for (const MethodMemory& m : r.methods) methods.push_back(method_json(m));
    models.push_back({{"model", r.arch},
                      {"stages", r.sizes.size()},
                      {"stage_sizes", sizes_json(r.sizes)},
                      {"methods", methods},
                      {"petra_over_pipedream", r.fraction},
                      {"analytic_petra_over_pipedream", r.analytic_fraction},
                      {"target_met", r.arch == "revnet50" ? nlohmann::json(r.fraction >= 0 && r.fraction <= kTargetFraction)
                                                          : nlohmann::json(nullptr)}});
  }
  return {{"benchmark", "bench-memory"},
          {"config",
           {{"batch", o.batch},
            {"size", o.size},
            {"channels", o.channels},
            {"width", o.width},
            {"stem", "cifar"},
            {"steady_steps", o.steps},
            {"threads", o.threads},
            {"optimizer", "sgd momentum 0.9 nesterov"},
            {"accumulation", 1}}},
          {"target", {{"model", "revnet50"}, {"petra_over_pipedream_at_most", kTargetFraction}}},
          {"paper_analytic_saving_percent", kPaperAnalyticSaving},
          {"models", models}};
}

void apply_quick(Options& o) {
  o.batch = 2;
  o.size = 8;
  o.width = 2;
  o.steps = 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench-memory: peak memory per stage and tag of every training method (PETRA's Table 3), measured "
               "by the allocator, next to an analytic estimate. Advice on a shared machine: OMP_WAIT_POLICY=passive."};
  Options o;
  app.add_option("--models", o.models, "RevNets to measure")->delimiter(',')->capture_default_str();
  app.add_option("--methods", o.methods, "methods (Table 3's rows, then the references)")->delimiter(',')->capture_default_str();
  app.add_option("--batch", o.batch, "mini-batch size")->capture_default_str();
  app.add_option("--size", o.size, "image height and width (synthetic images, CIFAR stem)")->capture_default_str();
  app.add_option("--width", o.width, "model width w (streams of w, 2w, 4w, 8w channels; 64 = the paper)")->capture_default_str();
  app.add_option("--steps", o.steps, "steady-state steps measured after the 2(J-1) filling steps")->capture_default_str();
  app.add_option("--threads", o.threads, "threads per kernel")->capture_default_str();
  app.add_flag("--per-stage", o.per_stage, "print a per-stage table for every method");
  app.add_option("--json", o.json_path, "write one JSON document with every number to this file");
  app.add_flag("--quick", o.quick, "tiny sizes (batch 2, 8x8, width 2, 1 step): a smoke test of a few seconds");
  CLI11_PARSE(app, argc, argv);
  try {
    if (o.quick) apply_quick(o);
    validate(o);
    if (!o.json_path.empty()) petra::bench::check_output_directory(o.json_path);  // before the run, not after
    petra::set_default_cpu_threads(o.threads);
    petra::Stream::current().set_num_threads(o.threads);
    fmt::print("bench-memory: synthetic {}x{}x{} images, batch {}, width {}, CIFAR stem, SGD (momentum), k = 1, {} "
               "thread(s); delayed methods: 2(J-1) filling steps + {} measured steps\n",
               o.size, o.size, o.channels, o.batch, o.width, o.threads, o.steps);
    const std::vector<petra::pipeline::MiniBatch> batches = make_batches(o, 4);
    std::vector<ModelResult> results;
    for (const std::string& arch : o.models) {
      results.push_back(run_model(o, arch, batches));
      print_model(o, results.back());
    }
    print_verdicts(results);
    if (!o.json_path.empty()) {
      petra::write_file_atomically(o.json_path, document(o, results).dump(1) + "\n");
      fmt::print("wrote {}\n", o.json_path);
    }
  } catch (const petra::Error& e) {
    std::fprintf(stderr, "bench-memory: %s\n", e.what());
    return 2;
  }
  return 0;
}
