// benchmarks/bench_pipeline.cpp: bench-pipeline, the training throughput of PETRA's pipeline on CPU
// workers, against the synchronous methods, the bound its stage costs set, and a replay of its
// schedule on more devices than this machine has.
//
// What is measured (synthetic images, SGD with momentum, k = 1). A throughput is images trained
// per second of wall time after --warmup untimed steps; the --steps timed steps are split into
// --windows windows and the best window is reported (the least disturbed by other processes on a
// shared machine), the median beside it.
//   (a) backprop and revbackprop: their synchronous schedules on the sequential executor, as the trainer runs them,
//       on one worker with 1 thread and with 2 threads (threads per kernel).
//   (b) PETRA on the ConcurrentExecutor with D = 1 and D = 2 workers (cpu:0, cpu:1), 1 thread
//       each; the stages are placed as the trainer places them (balanced_placement of
//       measure_stage_costs). Timed from step 2(J-1) + warmup, when every stage is busy.
//   (c) stage costs: the PETRA schedule runs on the sequential executor on 1 thread and every
//       action (forward F, backward B, update U) is timed in the steady state, in CPU time of the
//       thread (the work itself: time stolen by other processes on a shared machine is not
//       counted); a stage's step cost is the median F + B + U. The bound of a placement is
//       batch / (max over workers of the sum of its stages' step costs): the throughput if each
//       worker had a core of its own and never waited for a message.
//   (d) replay: a discrete-event simulation of the PETRA schedule in which every action takes its
//       measured cost and starts when its worker is free and its input message has arrived
//       (messages cost nothing). On J devices (one stage each) for the replay models (RevNet18,
//       J = 10; RevNet34, J = 18), and on D = 2 devices with the placement of (b). The speedup is
//       over revbackprop on one device, taken as the sum of all stages' step costs per mini-batch.
//       Every message is produced one step before it is read, so in the steady state no worker
//       waits and the replayed period equals the largest worker load: the replay confirms the
//       bound of (c) rather than lowering it (it would not if messages had a cost).
//
// How to read the output: the stage-cost table shows where the time goes and which worker holds
// each stage; then (a); (b) with the cores the run got (process CPU time / wall time), images per
// CPU-second, context switches per step (voluntary: a thread blocked, e.g. a worker waiting for a
// message; involuntary: preempted by another process), measured/bound and the replay's prediction
// for the same placement; (d) the replay on J devices; the three targets, MET or MISSED.
// A 2-worker run that got clearly fewer than 2 cores says more about the machine's load than
// about the executor: the program prints a note then.
//
//   OMP_WAIT_POLICY=passive build/bench-pipeline      # RevNet18 width 16, 28x28x1, batch 64
//   build/bench-pipeline --steps 60 --json pipeline.json
//   build/bench-pipeline --quick                      # tiny sizes, a few seconds
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <fmt/format.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "petra/data/dataset.hpp"
#include "petra/data/loader.hpp"
#include "petra/nn/models.hpp"
#include "petra/nn/optimizer.hpp"
#include "benchmarks/synthetic_setup.hpp"
#include "petra/petra.hpp"
#include "petra/pipeline/executor.hpp"
#include "petra/pipeline/placement.hpp"
#include "petra/pipeline/schedule.hpp"

namespace {

namespace pl = petra::pipeline;
using pl::Action;
using pl::PipelineMethod;
using Clock = std::chrono::steady_clock;

constexpr double kLearningRate = 0.01;
constexpr double kWeightDecay = 5e-4;
// The targets for PETRA on 2 workers x 1 thread.
constexpr double kTargetOfBound = 0.9;
constexpr double kTargetOverRevbackprop1 = 1.4;  // revbackprop, 1 worker, 1 thread
constexpr double kTargetOverRevbackprop2 = 1.0;  // revbackprop, 1 worker, 2 threads

struct Options {
  std::string model = "revnet18";
  std::int64_t width = 16, batch = 64, size = 28, channels = 1;
  std::int64_t steps = 40, warmup = 5;
  std::int64_t windows = 4;      // the timed steps are split into windows; the best one counts
  std::int64_t cost_steps = 12;  // steady-state steps of the timed sequential run
  std::vector<std::string> replay_models{"revnet18", "revnet34"};
  std::int64_t replay_batches = 400;
  bool quick = false;
  std::string json_path;
};

void validate(const Options& o) {
  const auto is_revnet = [](const std::string& m) {
    const auto& known = petra::nn::known_architectures();
    return m.rfind("revnet", 0) == 0 && std::find(known.begin(), known.end(), m) != known.end();
  };
  PETRA_CHECK(is_revnet(o.model), petra::ValueError, "--model '", o.model,
              "' is not a RevNet (revnet18, revnet34, revnet50): PETRA needs reversible stages");
  for (const std::string& m : o.replay_models)
    PETRA_CHECK(is_revnet(m), petra::ValueError, "--replay-models: '", m, "' is not a RevNet");
  PETRA_CHECK(o.width >= 1, petra::ValueError, "--width must be >= 1, got ", o.width);
  PETRA_CHECK(o.batch >= 2, petra::ValueError, "--batch must be >= 2 (batch norm), got ", o.batch);
  PETRA_CHECK(o.size >= 8, petra::ValueError, "--size must be >= 8 (three stride-2 groups), got ",
              o.size);
  PETRA_CHECK(o.channels >= 1, petra::ValueError, "--channels must be >= 1, got ", o.channels);
  PETRA_CHECK(o.steps >= 1, petra::ValueError, "--steps must be >= 1, got ", o.steps);
  PETRA_CHECK(o.windows >= 1, petra::ValueError, "--windows must be >= 1, got ", o.windows);
  PETRA_CHECK(o.warmup >= 0, petra::ValueError, "--warmup must be >= 0, got ", o.warmup);
  PETRA_CHECK(o.cost_steps >= 1, petra::ValueError, "--cost-steps must be >= 1, got ", o.cost_steps);
  PETRA_CHECK(o.replay_batches >= 4, petra::ValueError, "--replay-batches must be >= 4, got ",
              o.replay_batches);
}

petra::nn::ModelConfig model_config(const Options& o, const std::string& arch) {
  return petra::bench::synthetic_model(arch, o.width, o.channels);
}

// A few synthetic mini-batches, made once and reused in turn.
std::vector<pl::MiniBatch> make_batches(const Options& o, int count) {
  return petra::bench::synthetic_batches(o.batch, o.channels, o.size, count);
}

pl::BatchSource source_of(const std::vector<pl::MiniBatch>& batches) {
  return [&batches](std::int64_t m) { return batches[static_cast<std::size_t>(m) % batches.size()]; };
}

pl::RuntimeOptions petra_options() {
  pl::RuntimeOptions options;
  options.method = PipelineMethod::petra;
  options.optimizer_options.momentum = 0.9;
  options.optimizer_options.nesterov = true;
  options.weight_decay = kWeightDecay;
  options.schedule.base_lr = kLearningRate;
  return options;
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The process's context switches so far (getrusage): voluntary ones are a thread blocking (a
// worker waiting for a message, a join), involuntary ones a thread preempted by another process.
std::pair<long, long> context_switches() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return {u.ru_nvcsw, u.ru_nivcsw};
}

// Wall and process CPU time of a stretch of work: cores = CPU seconds / wall seconds shows how
// much of the machine the run got (2 workers busy all the time: 2.0).
struct Stopwatch {
  Clock::time_point wall = Clock::now();
  std::clock_t cpu = std::clock();
  std::pair<long, long> switches = context_switches();
  double seconds() const { return seconds_since(wall); }
  double cores() const { return double(std::clock() - cpu) / CLOCKS_PER_SEC / std::max(seconds(), 1e-9); }
};

// A throughput measured over `windows` windows of steps: the best window (least disturbed by other
// processes on a shared machine) is the result; the median is kept for the JSON. For the best
// window: the cores it got, and its voluntary (waits) and involuntary (preemptions) context
// switches per step.
struct Rate {
  double best = 0, median = 0, cores = 0;  // images/s, images/s, cores
  double waits = 0, preemptions = 0;       // per step
};

// run_window(first, count) runs `count` steps starting at step `first` (after the warm-up).
Rate time_windows(const Options& o, const std::function<void(std::int64_t, std::int64_t)>& run_window) {
  const std::int64_t windows = std::min(o.windows, o.steps);
  std::vector<double> rates;
  Rate r;
  for (std::int64_t w = 0, first = 0; w < windows; ++w) {
    const std::int64_t count = o.steps / windows + (w < o.steps % windows ? 1 : 0);
    const Stopwatch watch;
    run_window(first, count);
    const double rate = double(count * o.batch) / watch.seconds();
    const auto [voluntary, involuntary] = context_switches();
    if (rate > r.best)
      r = {rate, 0, watch.cores(), double(voluntary - watch.switches.first) / double(count),
           double(involuntary - watch.switches.second) / double(count)};
    rates.push_back(rate);
    first += count;
  }
  r.median = median(rates);
  return r;
}

// ---------------------------------------------------------------- (a) synchronous methods

struct Throughput {
  std::string what;
  int threads = 1;
  Rate rate;
};

Throughput measure_synchronous(PipelineMethod method, int threads, const Options& o,
                               const std::vector<pl::MiniBatch>& batches) {
  petra::Stream::current().set_num_threads(threads);
  petra::nn::Model model(model_config(o, o.model));
  pl::RuntimeOptions options = petra_options();
  options.method = method;
  pl::SequentialExecutor executor(model, options);  // one step per mini-batch, with its update
  const auto grid = pl::make_schedule(method, static_cast<int>(model.num_stages()),
                                      o.warmup + o.steps, 1, /*drain=*/false);
  executor.run(grid, 0, o.warmup, source_of(batches), {});
  const Rate rate = time_windows(o, [&](std::int64_t first, std::int64_t count) {
    executor.run(grid, o.warmup + first, o.warmup + first + count, source_of(batches), {});
  });
  return {std::string(pl::name_of(method)), threads, rate};
}

// ---------------------------------------------------------------- (c) stage costs

struct StageCosts {
  std::vector<petra::nn::StageKind> kinds;
  std::vector<double> forward, backward, update;  // seconds, median per stage
  std::size_t size() const { return kinds.size(); }
  double step(std::size_t j) const { return forward[j] + backward[j] + update[j]; }  // one stage, one step
  double total() const {
    double t = 0;
    for (std::size_t j = 0; j < size(); ++j) t += step(j);
    return t;
  }
};

// CPU time of the calling thread: what an action costs, whatever else the machine is running.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// The sequential executor, timing each action of the cells it runs (delayed schedules only), in
// CPU time of the calling thread (the executor and its 1-thread kernels run on it).
class TimedExecutor : public pl::SequentialExecutor {
 public:
  using Samples = std::vector<std::array<std::vector<double>, 3>>;  // [stage][F, B, U] -> seconds

  TimedExecutor(petra::nn::Model& model, const pl::RuntimeOptions& options)
      : SequentialExecutor(model, options), samples_(model.num_stages()) {}

  // Runs steps [first, last) in the executor's order; records the actions' times when `record`.
  void run_timed(const pl::Schedule& schedule, std::int64_t first, std::int64_t last, const pl::BatchSource& batches,
                 bool record) {
    check_range(schedule, first, last);
    for (std::int64_t t = first; t < last; ++t)
      for (int j = 0; j < schedule.stages; ++j)
        for (const Action& a : schedule.cells[static_cast<std::size_t>(t)][static_cast<std::size_t>(j)]) {
          const double start = thread_cpu_seconds();
          execute_cell({a}, false, batches, {});
          if (record) samples_[std::size_t(j)][kind_index(a.kind)].push_back(thread_cpu_seconds() - start);
        }
  }
  const Samples& samples() const { return samples_; }

 private:
  static std::size_t kind_index(Action::Kind k) {
    return k == Action::Kind::forward ? 0 : k == Action::Kind::backward ? 1 : 2;
  }
  Samples samples_;
};

// PETRA on the sequential executor, 1 thread: 2(J-1) + warmup steps, then cost_steps timed steps
// in which every stage runs F, B and U. Also returns the images/s of those steps.
StageCosts measure_stage_costs_steady(const Options& o, const std::string& arch,
                                      const std::vector<pl::MiniBatch>& batches, double* images_per_second) {
  petra::Stream::current().set_num_threads(1);
  petra::nn::Model model(model_config(o, arch));
  TimedExecutor executor(model, petra_options());
  const int J = static_cast<int>(model.num_stages());
  const std::int64_t fill = 2 * (J - 1) + o.warmup;
  const auto grid = pl::make_schedule(PipelineMethod::petra, J, fill + o.cost_steps, 1, /*drain=*/false);
  executor.run_timed(grid, 0, fill, source_of(batches), false);
  const auto start = Clock::now();
  executor.run_timed(grid, fill, grid.steps, source_of(batches), true);
  if (images_per_second) *images_per_second = double(o.cost_steps * o.batch) / seconds_since(start);
  StageCosts c;
  for (int j = 0; j < J; ++j) {
    const auto& s = executor.samples()[std::size_t(j)];
    c.kinds.push_back(model.stage(std::size_t(j)).kind());
    c.forward.push_back(median(s[0]));
    c.backward.push_back(median(s[1]));
    c.update.push_back(median(s[2]));
  }
  return c;
}

// batch / the largest worker load: the throughput if no worker ever waited.
double bound_images_per_second(const StageCosts& c, const std::vector<int>& placement, int workers, std::int64_t batch) {
  std::vector<double> load(std::size_t(workers), 0.0);
  for (std::size_t j = 0; j < c.size(); ++j) load[std::size_t(placement[j])] += c.step(j);
  return double(batch) / *std::max_element(load.begin(), load.end());
}

// ---------------------------------------------------------------- (d) replay

// Discrete-event replay of the PETRA schedule of `batches` mini-batches: each worker runs its
// stages' cells in the schedule's order (as the ConcurrentExecutor does); an action starts when its
// worker is free and its input has arrived: F at stage j > 0 needs F of j-1, B below the head needs
// B of j+1, the head's B needs its own F. Every action's input comes from an earlier step or an
// earlier action of the same cell, so one pass in (step, stage) order computes every time.
// Returns the steady-state seconds per mini-batch: the spacing of stage 0's backwards over the
// second half of those that run while the pipeline is full (before the last 2(J-1) steps).
double replay_period(const StageCosts& c, const std::vector<int>& placement, int workers, std::int64_t batches) {
  const int J = static_cast<int>(c.size());
  const auto grid = pl::make_schedule(PipelineMethod::petra, J, batches, 1, /*drain=*/false);
  const auto N = static_cast<std::size_t>(batches);
  std::vector<std::vector<double>> forward_done(std::size_t(J), std::vector<double>(N, 0.0)),
      backward_done(std::size_t(J), std::vector<double>(N, 0.0));
  std::vector<double> worker_free(std::size_t(workers), 0.0);
  for (const auto& row : grid.cells)
    for (int j = 0; j < J; ++j) {
      const auto sj = std::size_t(j);
      double& free = worker_free[std::size_t(placement[sj])];
      for (const Action& a : row[sj]) {
        const auto m = static_cast<std::size_t>(a.microbatch);
        double ready = 0, cost = c.update[sj];
        if (a.kind == Action::Kind::forward) {
          ready = j > 0 ? forward_done[sj - 1][m] : 0.0;
          cost = c.forward[sj];
        } else if (a.kind == Action::Kind::backward) {
          ready = j == J - 1 ? forward_done[sj][m] : backward_done[sj + 1][m];
          cost = c.backward[sj];
        }
        free = std::max(free, ready) + cost;
        if (a.kind == Action::Kind::forward) forward_done[sj][m] = free;
        if (a.kind == Action::Kind::backward) backward_done[sj][m] = free;
      }
    }
  const std::size_t last = N - 2 * std::size_t(J), first = last / 2;  // stage 0's backward of `last`: step N-2
  return (backward_done[0][last] - backward_done[0][first]) / double(last - first);
}

// Enough mini-batches for a steady-state window of at least 2J (see replay_period).
std::int64_t replay_length(std::int64_t requested, std::size_t J) {
  return std::max<std::int64_t>(requested, 6 * std::int64_t(J));
}

std::vector<int> one_stage_per_device(std::size_t J) {
  std::vector<int> p(J);
  for (std::size_t j = 0; j < J; ++j) p[j] = int(j);
  return p;
}

struct Replay {
  std::string model;
  int stages = 0, devices = 0;
  double sum_of_costs = 0, largest_stage = 0, period = 0;
  double speedup() const { return sum_of_costs / period; }
  double ideal() const { return sum_of_costs / largest_stage; }  // a period of the largest stage cost
};

Replay replay(const std::string& model, const StageCosts& c, const std::vector<int>& placement, int devices,
              std::int64_t batches) {
  Replay r{model, int(c.size()), devices, c.total(), 0,
           replay_period(c, placement, devices, replay_length(batches, c.size()))};
  std::vector<double> load(std::size_t(devices), 0.0);
  for (std::size_t j = 0; j < c.size(); ++j) load[std::size_t(placement[j])] += c.step(j);
  r.largest_stage = *std::max_element(load.begin(), load.end());
  return r;
}

// ---------------------------------------------------------------- (b) PETRA on the concurrent executor

struct PipelineRun {
  int workers = 1;
  std::vector<int> placement;
  Rate rate;
  double bound = 0, replay_images_per_second = 0;
};

std::vector<int> trainer_placement(const Options& o, const std::vector<pl::MiniBatch>& batches, int workers) {
  petra::Stream::current().set_num_threads(1);
  petra::nn::Model model(model_config(o, o.model));
  return pl::balanced_placement(pl::measure_stage_costs(model, batches.front()), workers);
}

Rate measure_concurrent(const Options& o, const std::vector<pl::MiniBatch>& batches, const std::vector<int>& placement,
                        int workers) {
  petra::nn::Model model(model_config(o, o.model));
  std::vector<pl::ConcurrentExecutor::Worker> ws;
  for (int w = 0; w < workers; ++w) ws.push_back({petra::Device::cpu(w), 1});
  pl::ConcurrentExecutor executor(model, petra_options(), ws, placement);
  const int J = static_cast<int>(model.num_stages());
  const std::int64_t fill = 2 * (J - 1) + o.warmup;
  const auto grid = pl::make_schedule(PipelineMethod::petra, J, fill + o.steps, 1, /*drain=*/false);
  executor.run(grid, 0, fill, source_of(batches), {});
  return time_windows(o, [&](std::int64_t first, std::int64_t count) {
    executor.run(grid, fill + first, fill + first + count, source_of(batches), {});
  });
}

// ---------------------------------------------------------------- printing and JSON

std::string placement_text(const std::vector<int>& placement) {
  std::string s;
  for (std::size_t j = 0; j < placement.size(); ++j) s += fmt::format("{}{}", j ? "," : "", placement[j]);
  return s;
}

void print_costs(const std::string& model, const StageCosts& c, const std::vector<int>& placement) {
  fmt::print("\n(c) {} stage costs, PETRA steady state, sequential executor, 1 thread (median CPU ms per step):\n",
             model);
  fmt::print("  {:>5} {:<10} {:>8} {:>8} {:>8} {:>8} {:>7}\n", "stage", "kind", "F", "B", "U", "F+B+U", "worker");
  for (std::size_t j = 0; j < c.size(); ++j)
    fmt::print("  {:>5} {:<10} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>7}\n", j, petra::nn::name_of(c.kinds[j]),
               1e3 * c.forward[j], 1e3 * c.backward[j], 1e3 * c.update[j], 1e3 * c.step(j), placement[j]);
  fmt::print("  {:>5} {:<10} {:>8} {:>8} {:>8} {:>8.3f}\n", "sum", "", "", "", "", 1e3 * c.total());
}

// The machine's load average (Linux), to judge how disturbed a run was; empty if unreadable.
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  double one = 0, five = 0;
  if (!(in >> one >> five)) return "";
  return fmt::format("load average {:.2f} (1 min), {:.2f} (5 min)", one, five);
}

std::string verdict(bool met) { return met ? "MET" : "MISSED"; }

nlohmann::json costs_json(const StageCosts& c) {
  nlohmann::json a = nlohmann::json::array();
  for (std::size_t j = 0; j < c.size(); ++j)
    a.push_back({{"kind", petra::nn::name_of(c.kinds[j])},
                 {"forward_s", c.forward[j]},
                 {"backward_s", c.backward[j]},
                 {"update_s", c.update[j]},
                 {"step_s", c.step(j)}});
  return a;
}

nlohmann::json replay_json(const Replay& r, std::int64_t batch) {
  return {{"model", r.model},
          {"stages", r.stages},
          {"devices", r.devices},
          {"sum_of_step_costs_s", r.sum_of_costs},
          {"largest_device_load_s", r.largest_stage},
          {"period_s", r.period},
          {"images_per_second", double(batch) / r.period},
          {"speedup_over_revbackprop_one_device", r.speedup()},
          {"ideal_speedup", r.ideal()}};
}

void apply_quick(Options& o) {
  o.width = 2;
  o.batch = 4;
  o.size = 8;
  o.steps = 3;
  o.warmup = 1;
  o.cost_steps = 2;
  o.replay_batches = 40;
}

struct Report {
  std::vector<Throughput> synchronous;
  double sequential_petra = 0;  // images/s of the timed sequential run, 1 thread
  StageCosts costs;
  std::vector<PipelineRun> pipelines;  // D = 1, 2
  std::vector<Replay> replays;
};

double images_per_second_of(const Report& r, const std::string& what, int threads) {
  for (const Throughput& t : r.synchronous)
    if (t.what == what && t.threads == threads) return t.rate.best;
  return 0;
}

void print_report(const Options& o, const Report& r) {
  fmt::print("\n(a) synchronous methods, one worker:\n");
  fmt::print("  {:<12} {:>8} {:>10} {:>9} {:>9} {:>6} {:>10}\n", "method", "threads", "images/s", "median", "ms/step",
             "cores", "img/CPU-s");
  for (const Throughput& t : r.synchronous)
    fmt::print("  {:<12} {:>8} {:>10.1f} {:>9.1f} {:>9.1f} {:>6.2f} {:>10.1f}\n", t.what, t.threads, t.rate.best,
               t.rate.median, 1e3 * double(o.batch) / t.rate.best, t.rate.cores, t.rate.best / t.rate.cores);
  fmt::print("\n(b) PETRA, ConcurrentExecutor, 1 thread per worker (bound and replay from the costs of (c)):\n");
  fmt::print("  {:<7} {:<20} {:>8} {:>8} {:>5} {:>9} {:>6} {:>7} {:>8} {:>8} {:>7}\n", "workers", "placement",
             "images/s", "median", "cores", "img/CPU-s", "waits", "preempt", "bound", "of bound", "replay");
  for (const PipelineRun& p : r.pipelines)
    fmt::print("  {:<7} {:<20} {:>8.1f} {:>8.1f} {:>5.2f} {:>9.1f} {:>6.1f} {:>7.1f} {:>8.1f} {:>7.1f}% {:>7.1f}\n",
               p.workers, placement_text(p.placement), p.rate.best, p.rate.median, p.rate.cores,
               p.rate.best / p.rate.cores, p.rate.waits, p.rate.preemptions, p.bound, 100 * p.rate.best / p.bound,
               p.replay_images_per_second);
  fmt::print("  placement: stage -> worker (the trainer's: balanced_placement of measure_stage_costs); replay: the\n"
             "  replay's images/s for that placement; waits / preempt: voluntary / involuntary context switches\n"
             "  per step (a worker blocking for a message / preempted by another process). img/CPU-s =\n"
             "  images/s / cores: near batch / (sum of the step costs) = {:.1f} when every CPU second does useful\n"
             "  work, so a shortfall with fewer cores than workers means the run did not get the cores.\n",
             double(o.batch) / r.costs.total());
  fmt::print("  (sequential executor, 1 thread, timed run of (c): {:.1f} images/s)\n", r.sequential_petra);
  fmt::print("\n(d) replay of the PETRA schedule, one stage per device (speedup over revbackprop on one device = "
             "sum of step costs / replayed period):\n");
  fmt::print("  {:<10} {:>3} {:>8} {:>11} {:>11} {:>11} {:>9} {:>7}\n", "model", "J", "devices", "sum ms/mb",
             "largest ms", "period ms", "speedup", "ideal");
  for (const Replay& p : r.replays)
    fmt::print("  {:<10} {:>3} {:>8} {:>11.2f} {:>11.2f} {:>11.2f} {:>8.2f}x {:>6.2f}x\n", p.model, p.stages, p.devices,
               1e3 * p.sum_of_costs, 1e3 * p.largest_stage, 1e3 * p.period, p.speedup(), p.ideal());
}

struct Target {
  std::string what;
  double value, threshold;
  bool met() const { return value >= threshold; }
};

std::vector<Target> targets(const Report& r) {
  const PipelineRun& two = r.pipelines.back();
  const double petra = two.rate.best;
  return {{"PETRA 2x1 / its bound", petra / two.bound, kTargetOfBound},
          {"PETRA 2x1 / revbackprop 1 worker 1 thread", petra / images_per_second_of(r, "revbackprop", 1),
           kTargetOverRevbackprop1},
          {"PETRA 2x1 / revbackprop 1 worker 2 threads", petra / images_per_second_of(r, "revbackprop", 2),
           kTargetOverRevbackprop2}};
}

// The 2-core targets judge the executor only if the 2-worker run had the 2 cores. When it did not,
// its images per CPU-second times 2 is what it would do with them if nothing else changed (no
// memory-bandwidth contention between the cores, no more waiting): an extrapolation, so labelled.
void print_contention_warning(const Report& r) {
  const Rate& two = r.pipelines.back().rate;
  if (two.cores >= 1.8) return;
  const double per_cpu = two.best / two.cores;
  fmt::print("  note: the 2-worker run got {:.2f} of 2 cores (other processes were running), so these verdicts\n"
             "  measure the machine's load as much as the executor; rerun on an idle machine to judge it.\n"
             "  Extrapolation: {:.1f} images per CPU-second x 2 cores = {:.1f} images/s = {:.0f}% of the bound.\n",
             two.cores, per_cpu, 2 * per_cpu, 100 * 2 * per_cpu / r.pipelines.back().bound);
}

nlohmann::json document(const Options& o, const Report& r) {
  nlohmann::json sync = nlohmann::json::array(), pipelines = nlohmann::json::array(), replays = nlohmann::json::array(),
                 goals = nlohmann::json::array();
  for (const Throughput& t : r.synchronous)
    sync.push_back({{"method", t.what},
                    {"workers", 1},
                    {"threads", t.threads},
                    {"images_per_second", t.rate.best},
                    {"median_images_per_second", t.rate.median},
                    {"cores_used", t.rate.cores}});
  for (const PipelineRun& p : r.pipelines)
    pipelines.push_back({{"workers", p.workers},
                         {"threads_per_worker", 1},
                         {"placement", p.placement},
                         {"images_per_second", p.rate.best},
                         {"median_images_per_second", p.rate.median},
                         {"cores_used", p.rate.cores},
                         {"voluntary_switches_per_step", p.rate.waits},
                         {"involuntary_switches_per_step", p.rate.preemptions},
                         {"bound_images_per_second", p.bound},
                         {"fraction_of_bound", p.rate.best / p.bound},
                         {"replay_images_per_second", p.replay_images_per_second}});
  for (const Replay& p : r.replays) replays.push_back(replay_json(p, o.batch));
  for (const Target& t : targets(r))
    goals.push_back({{"what", t.what}, {"value", t.value}, {"at_least", t.threshold}, {"met", t.met()}});
  return {{"benchmark", "bench-pipeline"},
          {"config",
           {{"model", o.model},
            {"width", o.width},
            {"batch", o.batch},
            {"size", o.size},
            {"channels", o.channels},
            {"stem", "cifar"},
            {"steps", o.steps},
            {"warmup", o.warmup},
            {"windows", o.windows},
            {"cost_steps", o.cost_steps},
            {"replay_batches", o.replay_batches}}},
          {"synchronous", sync},
          {"petra_sequential_images_per_second", r.sequential_petra},
          {"stage_costs", costs_json(r.costs)},
          {"petra_concurrent", pipelines},
          {"replays", replays},
          {"targets", goals}};
}

Report run(const Options& o, const std::vector<pl::MiniBatch>& batches) {
  Report r;
  r.costs = measure_stage_costs_steady(o, o.model, batches, &r.sequential_petra);
  for (PipelineMethod m : {PipelineMethod::backprop, PipelineMethod::revbackprop})
    for (int threads : {1, 2}) r.synchronous.push_back(measure_synchronous(m, threads, o, batches));
  for (int workers : {1, 2}) {
    PipelineRun p;
    p.workers = workers;
    p.placement = trainer_placement(o, batches, workers);
    p.rate = measure_concurrent(o, batches, p.placement, workers);
    p.bound = bound_images_per_second(r.costs, p.placement, workers, o.batch);
    p.replay_images_per_second =
        double(o.batch) / replay_period(r.costs, p.placement, workers, replay_length(o.replay_batches, r.costs.size()));
    r.pipelines.push_back(p);
  }
  for (const std::string& arch : o.replay_models) {
    const StageCosts c = arch == o.model ? r.costs : measure_stage_costs_steady(o, arch, batches, nullptr);
    r.replays.push_back(replay(arch, c, one_stage_per_device(c.size()), int(c.size()), o.replay_batches));
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench-pipeline: images/s of PETRA on CPU workers against backprop and revbackprop, the bound set by "
               "the measured stage costs, and a replay of the schedule on J devices. The machine is shared: run it "
               "with OMP_WAIT_POLICY=passive so idle OpenMP threads sleep instead of spinning."};
  Options o;
  app.add_option("--model", o.model, "the RevNet of (a)-(c)")->capture_default_str();
  app.add_option("--width", o.width, "model width w")->capture_default_str();
  app.add_option("--batch", o.batch, "mini-batch size")->capture_default_str();
  app.add_option("--size", o.size, "image height and width (synthetic images, CIFAR stem)")->capture_default_str();
  app.add_option("--channels", o.channels, "image channels")->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps per throughput measurement")->capture_default_str();
  app.add_option("--windows", o.windows, "timing windows the steps are split into (the best one is reported)")
      ->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps first (after the 2(J-1) filling steps of a pipeline)")
      ->capture_default_str();
  app.add_option("--cost-steps", o.cost_steps, "steady-state steps whose actions are timed for the stage costs")
      ->capture_default_str();
  app.add_option("--replay-models", o.replay_models, "RevNets replayed on J devices (their costs are measured)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--replay-batches", o.replay_batches, "mini-batches in a replay")->capture_default_str();
  app.add_option("--json", o.json_path, "write one JSON document with every number to this file");
  app.add_flag("--quick", o.quick, "tiny sizes (width 2, batch 4, 8x8, 3 steps): a smoke test of a few seconds");
  CLI11_PARSE(app, argc, argv);
  try {
    if (o.quick) apply_quick(o);
    validate(o);
    if (!o.json_path.empty()) petra::bench::check_output_directory(o.json_path);  // before the run, not after
    fmt::print("bench-pipeline: {} width {}, synthetic {}x{}x{} images, batch {}, CIFAR stem, SGD (momentum), k = 1; "
               "{} warm-up + {} timed steps\n",
               o.model, o.width, o.size, o.size, o.channels, o.batch, o.warmup, o.steps);
    fmt::print("machine: {} cores, {}\n", std::thread::hardware_concurrency(), load_average());
    std::fflush(stdout);
    const std::vector<pl::MiniBatch> batches = make_batches(o, 4);
    const Report r = run(o, batches);
    print_costs(o.model, r.costs, r.pipelines.back().placement);
    print_report(o, r);
    fmt::print("\nmachine at the end: {}\n", load_average());
    fmt::print("\ntargets (PETRA on 2 workers x 1 thread; best windows):\n");
    for (const Target& t : targets(r))
      fmt::print("  {:<44} {:>6.2f} (>= {:.2f}) {}\n", t.what, t.value, t.threshold, verdict(t.met()));
    print_contention_warning(r);
    if (!o.json_path.empty()) {
      petra::write_file_atomically(o.json_path, document(o, r).dump(1) + "\n");
      fmt::print("wrote {}\n", o.json_path);
    }
  } catch (const petra::Error& e) {
    std::fprintf(stderr, "bench-pipeline: %s\n", e.what());
    return 2;
  }
  return 0;
}
