// petra/profile.cpp: per-thread accumulators of op and phase times, merged when threads end, and
// the table petra-train --profile prints (see petra/profile.hpp).
#include "petra/profile.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <set>

namespace petra::profile {

namespace {

void add_into(Totals& into, const Totals& from) {
  for (int f = 0; f < kFamilies; ++f) {
    into.op_seconds[f] += from.op_seconds[f];
    into.op_calls[f] += from.op_calls[f];
  }
  if (into.stage_phase_seconds.size() < from.stage_phase_seconds.size())
    into.stage_phase_seconds.resize(from.stage_phase_seconds.size());
  for (std::size_t s = 0; s < from.stage_phase_seconds.size(); ++s)
    for (int p = 0; p < kPhases; ++p) into.stage_phase_seconds[s][p] += from.stage_phase_seconds[s][p];
  if (into.stage_op_seconds.size() < from.stage_op_seconds.size())
    into.stage_op_seconds.resize(from.stage_op_seconds.size());
  for (std::size_t s = 0; s < from.stage_op_seconds.size(); ++s)
    for (int f = 0; f < kFamilies; ++f) into.stage_op_seconds[s][f] += from.stage_op_seconds[s][f];
  for (const auto& [label, d] : from.details) {
    Detail& to = into.details[label];
    to.calls += d.calls;
    to.seconds += d.seconds;
    to.flops += d.flops;
    to.bytes += d.bytes;
  }
}

// The process-wide totals: what ended threads added, and the accumulators of the living ones.
struct Registry {
  std::mutex mutex;
  Totals retired;
  std::set<Totals*> alive;
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: threads may end after static destruction began
  return *r;
}

// The calling thread's accumulator; registered on first use, merged into the totals when the thread ends.
struct ThreadAccumulator {
  Totals totals;
  ThreadAccumulator() {
    std::lock_guard lock(registry().mutex);
    registry().alive.insert(&totals);
  }
  ~ThreadAccumulator() {
    std::lock_guard lock(registry().mutex);
    add_into(registry().retired, totals);
    registry().alive.erase(&totals);
  }
};
Totals& mine() {
  thread_local ThreadAccumulator accumulator;
  return accumulator.totals;
}

thread_local PhaseTimer* tls_current_phase = nullptr;
thread_local int tls_current_stage = 0;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

const char* name_of(Family f) {
  switch (f) {
    case Family::conv2d_forward: return "conv2d forward";
    case Family::conv2d_backward_data: return "conv2d backward data";
    case Family::conv2d_backward_weight: return "conv2d backward weight";
    case Family::conv2d_backward_bias: return "conv2d backward bias";
    case Family::batchnorm: return "batch norm";
    case Family::coupling: return "coupling";
    case Family::elementwise: return "element-wise";
    case Family::reduce: return "reduce";
    case Family::channel: return "channel slice/concat";
    case Family::pool: return "pool";
    case Family::linear: return "linear";
    case Family::loss: return "loss";
    case Family::optimizer: return "optimizer";
    case Family::other: return "other";
  }
  return "?";
}

const char* name_of(Phase p) {
  switch (p) {
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::reconstruction: return "reconstruction";
    case Phase::update: return "update";
    case Phase::data: return "data";
    case Phase::waiting: return "waiting";
  }
  return "?";
}

std::atomic<bool> detail::profiling{false};

void set_enabled(bool on) { detail::profiling.store(on, std::memory_order_relaxed); }

void OpTimer::begin() {
  active_ = tls_current_phase != nullptr;  // kernels outside a training step are not counted
  if (active_) start_ = Clock::now();
}

void OpTimer::end() {
  Totals& t = mine();
  const double seconds = seconds_since(start_);
  t.op_seconds[static_cast<int>(family_)] += seconds;
  ++t.op_calls[static_cast<int>(family_)];
  if (t.stage_op_seconds.size() <= static_cast<std::size_t>(tls_current_stage))
    t.stage_op_seconds.resize(tls_current_stage + 1);
  t.stage_op_seconds[tls_current_stage][static_cast<int>(family_)] += seconds;
}

bool DetailTimer::in_phase() { return tls_current_phase != nullptr; }

void DetailTimer::begin(DetailCost cost) {
  active_ = true;
  cost_ = std::move(cost);
  start_ = Clock::now();
}

void DetailTimer::end() {
  Detail& d = mine().details[cost_.label];
  d.seconds += seconds_since(start_);
  ++d.calls;
  d.flops += cost_.flops;
  d.bytes += cost_.bytes;
}

void PhaseTimer::begin() {
  active_ = true;
  if (stage_ < 0) stage_ = tls_current_phase ? tls_current_stage : 0;
  parent_ = tls_current_phase;
  tls_current_phase = this;
  tls_current_stage = stage_;
  start_ = Clock::now();
}

void PhaseTimer::end() {
  const double total = seconds_since(start_);
  Totals& t = mine();
  if (t.stage_phase_seconds.size() <= static_cast<std::size_t>(stage_)) t.stage_phase_seconds.resize(stage_ + 1);
  t.stage_phase_seconds[stage_][static_cast<int>(phase_)] += std::max(0.0, total - nested_seconds_);
  tls_current_phase = parent_;
  if (parent_) {
    parent_->nested_seconds_ += total;
    tls_current_stage = parent_->stage_;
  }
}

double Totals::op_total() const {
  double s = 0;
  for (double v : op_seconds) s += v;
  return s;
}

double Totals::stage_op_total(std::size_t stage) const {
  double s = 0;
  if (stage < stage_op_seconds.size())
    for (double v : stage_op_seconds[stage]) s += v;
  return s;
}

std::array<double, kPhases> Totals::phase_sums() const {
  std::array<double, kPhases> sums{};
  for (const auto& stage : stage_phase_seconds)
    for (int p = 0; p < kPhases; ++p) sums[p] += stage[p];
  return sums;
}

double Totals::phase_total() const {
  double s = 0;
  for (double v : phase_sums()) s += v;
  return s;
}

Totals collect() {
  std::lock_guard lock(registry().mutex);
  Totals all = registry().retired;
  for (const Totals* t : registry().alive) add_into(all, *t);
  return all;
}

void reset() {
  std::lock_guard lock(registry().mutex);
  registry().retired = Totals{};
  for (Totals* t : registry().alive) *t = Totals{};
}

namespace {
// printf into a std::string (petra-core does not link fmt).
template <class... Args>
std::string printed(const char* format, Args... args) {
  const int n = std::snprintf(nullptr, 0, format, args...);
  std::string out(static_cast<std::size_t>(std::max(n, 0)) + 1, '\0');
  std::snprintf(out.data(), out.size(), format, args...);
  out.pop_back();
  return out;
}
}  // namespace

std::string format_table(const Totals& totals, double wall_seconds, std::int64_t steps, int workers) {
  const double n = static_cast<double>(std::max<std::int64_t>(steps, 1));
  const double ms = 1e3 / n;  // seconds in total -> ms per step
  const double wall = std::max(wall_seconds, 1e-12);
  const auto share = [&](double seconds) { return 100.0 * seconds / wall; };
  std::string out = printed("profile: %lld steps, %.2f ms per step (wall)", static_cast<long long>(steps),
                            wall_seconds * ms);
  if (workers > 1)
    out += printed("; %d workers: their phases overlap, so the phase shares add up to at most %d00%%", workers, workers);
  out += printed("\n  %-26s %10s %8s %11s\n", "op family (kernels)", "ms/step", "% step", "calls/step");
  for (int f = 0; f < kFamilies; ++f) {
    if (totals.op_calls[f] == 0) continue;
    out += printed("  %-26s %10.3f %7.1f%% %11.1f\n", name_of(static_cast<Family>(f)), totals.op_seconds[f] * ms,
                   share(totals.op_seconds[f]), static_cast<double>(totals.op_calls[f]) / n);
  }
  const double phases = totals.phase_total(), ops = totals.op_total();
  const double busy = phases - totals.phase_sums()[static_cast<int>(Phase::waiting)];
  out += printed("  %-26s %10.3f %7.1f%%\n", "all kernels", ops * ms, share(ops));
  out += printed("  %-26s %10.3f %7.1f%%   (allocation, copies, zero-fill, autograd, messages)\n",
                 "busy, not in kernels", (busy - ops) * ms, share(busy - ops));
  out += printed("  %-26s %10s %8s\n", "phase", "ms/step", "% step");
  const auto sums = totals.phase_sums();
  for (int p = 0; p < kPhases; ++p)
    out += printed("  %-26s %10.3f %7.1f%%\n", name_of(static_cast<Phase>(p)), sums[p] * ms, share(sums[p]));
  const double outside = wall * workers - phases;
  out += printed("  %-26s %10.3f %7.1f%%   (wall x workers - phases: executor, thread start, idle)\n",
                 "outside phases", outside * ms, share(outside));
  // Per stage, its phases, then how much of its busy phases (all but waiting) its kernels took and
  // what the rest is: the autograd, allocation, copies and messages of that stage.
  out += printed("  %-26s", "per stage, ms/step:");
  for (int p = 0; p < kPhases; ++p) out += printed(" %14s", name_of(static_cast<Phase>(p)));
  out += printed(" %14s %14s\n", "kernels", "not kernels");
  for (std::size_t s = 0; s < totals.stage_phase_seconds.size(); ++s) {
    out += printed("  %-26s", printed("stage %zu", s).c_str());
    double busy = 0;
    for (int p = 0; p < kPhases; ++p) {
      out += printed(" %14.3f", totals.stage_phase_seconds[s][p] * ms);
      if (static_cast<Phase>(p) != Phase::waiting) busy += totals.stage_phase_seconds[s][p];
    }
    const double kernels = totals.stage_op_total(s);
    out += printed(" %14.3f %14.3f\n", kernels * ms, (busy - kernels) * ms);
  }
  // The kernels of each stage by family: which worker spends what where (one stage per worker).
  const std::size_t stages = totals.stage_op_seconds.size();
  if (stages > 1) {
    out += printed("  %-26s", "kernels by stage, ms/step:");
    for (std::size_t s = 0; s < stages; ++s) out += printed(" %8s", printed("stage %zu", s).c_str());
    out += "\n";
    for (int f = 0; f < kFamilies; ++f) {
      if (totals.op_calls[f] == 0) continue;
      out += printed("  %-26s", name_of(static_cast<Family>(f)));
      for (std::size_t s = 0; s < stages; ++s) out += printed(" %8.3f", totals.stage_op_seconds[s][f] * ms);
      out += "\n";
    }
  }
  // Two tables, costliest row first: the convolutions with their GFLOP/s, the batch norms with the
  // GB/s their passes move (a row is one or the other: DetailCost).
  std::vector<std::pair<std::string, Detail>> rows(totals.details.begin(), totals.details.end());
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  const auto table = [&](const char* title, const char* rate_name, bool memory_bound) {
    bool titled = false;
    for (const auto& [label, d] : rows) {
      if ((d.bytes > 0) != memory_bound) continue;
      if (!titled) out += printed("  %-34s %10s %10s %10s %9s\n", title, "calls/step", "ms/call", "ms/step", rate_name);
      titled = true;
      const double seconds = std::max(d.seconds, 1e-12);
      out += printed("  %-34s %10.1f %10.3f %10.3f %9.1f\n", label.c_str(), static_cast<double>(d.calls) / n,
                     1e3 * d.seconds / static_cast<double>(std::max<std::int64_t>(d.calls, 1)), d.seconds * ms,
                     (memory_bound ? d.bytes : d.flops) / seconds * 1e-9);
    }
  };
  table("convolutions, costliest first", "GFLOP/s", false);
  table("batch norms, costliest first", "GB/s", true);
  return out;
}

}  // namespace petra::profile
