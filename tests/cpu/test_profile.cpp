// tests/cpu/test_profile.cpp: petra-train --profile and the per-step times. A tiny run with
// profiling on records every op family and phase it runs, with non-negative times whose sums agree
// with the steps' wall time (bounds, not timings: they hold under sanitizers too); profiling off
// records nothing; the steady-state median takes the steps it says.
#include <doctest/doctest.h>

#include <numeric>

#include "petra/pipeline/trainer.hpp"
#include "petra/profile.hpp"
#include "tests/support/testing.hpp"

using namespace petra;
using namespace petra::pipeline;
using petra::profile::Family;
using petra::profile::Phase;

namespace {

TrainConfig tiny_run(PipelineMethod method) {
  TrainConfig c;
  c.dataset = "synthetic";
  c.synthetic_train_size = 256;
  c.width = 4;
  c.batch_size = 32;  // 8 steps per epoch
  c.epochs = 1;
  c.method = method;
  c.seed = 5;
  c.threads = 1;
  c.profile = true;
  return c;
}

double ops_of(const profile::Totals& t, Family f) { return t.op_seconds[static_cast<int>(f)]; }
std::int64_t calls_of(const profile::Totals& t, Family f) { return t.op_calls[static_cast<int>(f)]; }
double phase_of(const profile::Totals& t, Phase p) { return t.phase_sums()[static_cast<int>(p)]; }

// What holds for every profiled run: each family and phase of a RevNet step was seen, no time is
// negative, kernels run inside phases (so they cannot take longer), and the phases of `workers`
// threads fit in workers x the steps' wall time.
void check_consistent(const ProfileReport& r, std::int64_t steps) {
  CHECK(r.steps == steps);
  CHECK(r.wall_seconds > 0);
  for (Family f : {Family::conv2d_forward, Family::conv2d_backward_data, Family::conv2d_backward_weight,
                   Family::batchnorm, Family::coupling, Family::elementwise, Family::pool, Family::linear,
                   Family::loss, Family::optimizer}) {
    INFO("family ", profile::name_of(f));
    CHECK(calls_of(r.totals, f) > 0);
    CHECK(ops_of(r.totals, f) >= 0);
  }
  for (Phase p : {Phase::forward, Phase::backward, Phase::update, Phase::data}) {
    INFO("phase ", profile::name_of(p));
    CHECK(phase_of(r.totals, p) > 0);
  }
  for (const auto& stage : r.totals.stage_phase_seconds)
    for (double seconds : stage) CHECK(seconds >= 0);
  const double ops = r.totals.op_total(), phases = r.totals.phase_total();
  CHECK(ops <= phases * 1.0001 + 1e-6);
  // every kernel ran inside one stage's busy phases (not while it waited), and is counted there once
  REQUIRE(r.totals.stage_op_seconds.size() <= r.totals.stage_phase_seconds.size());
  double stage_ops = 0;
  std::array<double, profile::kFamilies> family_sums{};
  for (std::size_t s = 0; s < r.totals.stage_op_seconds.size(); ++s) {
    const auto& phase = r.totals.stage_phase_seconds[s];
    const double busy = std::accumulate(phase.begin(), phase.end(), 0.0) - phase[static_cast<int>(Phase::waiting)];
    CHECK(r.totals.stage_op_total(s) <= busy * 1.0001 + 1e-6);
    stage_ops += r.totals.stage_op_total(s);
    for (int f = 0; f < profile::kFamilies; ++f) family_sums[f] += r.totals.stage_op_seconds[s][f];
  }
  CHECK(stage_ops == doctest::Approx(ops).epsilon(1e-9));
  // and the stages' split of each family adds up to the family
  for (int f = 0; f < profile::kFamilies; ++f)
    CHECK(family_sums[f] == doctest::Approx(r.totals.op_seconds[f]).epsilon(1e-9));
  CHECK(phases <= r.workers * r.wall_seconds * 1.0001 + 1e-6);
  if (petra::testing::kTimingIsMeaningful) {
    // One worker is inside a phase for nearly all of a step: the rest is the executor's loop.
    CHECK(phases >= 0.5 * r.wall_seconds);
  }
}

}  // namespace

TEST_CASE("family_of maps every dispatch family, and conv2d by pass") {
  static_assert(profile::family_of("CONV2D", "conv2d_forward") == Family::conv2d_forward);
  static_assert(profile::family_of("CONV2D", "conv2d_backward_weight") == Family::conv2d_backward_weight);
  static_assert(profile::family_of("OPTIM", "sgd_step") == Family::optimizer);
  static_assert(profile::family_of("COUPLING", "coupling_inverse") == Family::coupling);
  CHECK(profile::family_of("NOT_A_FAMILY", "x") == Family::other);
}

TEST_CASE("--profile on a synchronous run: every family and phase, times consistent with the steps") {
  TrainConfig c = tiny_run(PipelineMethod::revbackprop);
  Trainer trainer(c);
  std::vector<EpochReport> reports;
  trainer.run({}, [&](const EpochReport& r) { reports.push_back(r); });
  REQUIRE(reports.size() == 1);
  REQUIRE(reports[0].step_seconds.size() == 8);
  for (double s : reports[0].step_seconds) CHECK(s > 0);
  const ProfileReport r = trainer.profile_report();
  CHECK(r.workers == 1);
  check_consistent(r, 8);
  const double steps_sum = std::accumulate(reports[0].step_seconds.begin(), reports[0].step_seconds.end(), 0.0);
  CHECK(r.wall_seconds == doctest::Approx(steps_sum));
  // revbackprop rebuilds each reversible stage's input inside its backward
  CHECK(phase_of(r.totals, Phase::reconstruction) > 0);
  CHECK(phase_of(r.totals, Phase::waiting) >= 0);
  // RevNet18: a stem, 8 blocks and the head, one stage each
  CHECK(r.totals.stage_phase_seconds.size() == 10);
  // The convolutions by pass and shape: every call of the three conv families is in one row, each
  // row with its work, and a row's time includes its kernel's. The batch norms likewise, each row
  // with the bytes its passes move.
  std::int64_t detail_calls = 0, batchnorm_calls = 0;
  double detail_seconds = 0;
  for (const auto& [label, d] : r.totals.details) {
    INFO(label);
    CHECK(d.calls > 0);
    if (label.starts_with("bn")) {
      const bool pass_named = label.ends_with(" fwd") || label.ends_with(" bwd");
      CHECK(pass_named);
      CHECK(d.bytes > 0);
      CHECK(d.flops == 0);
      batchnorm_calls += d.calls;
      continue;
    }
    const bool pass_named = label.ends_with(" fwd") || label.ends_with(" bwd-data") || label.ends_with(" bwd-weight");
    CHECK(pass_named);
    CHECK(d.flops > 0);
    CHECK(d.bytes == 0);
    detail_calls += d.calls;
    detail_seconds += d.seconds;
  }
  // the first transition's projection, which reads its stream in place (a channel slice), and its
  // second convolution, which reads a tensor of its own
  CHECK(r.totals.details.contains("1x1 4->8 @32 s2 slice fwd"));
  CHECK(r.totals.details.contains("3x3 8->8 @16 fwd"));
  CHECK(r.totals.details.contains("bn+relu 4 @32 bwd"));     // the first block's F
  CHECK(detail_calls == calls_of(r.totals, Family::conv2d_forward) + calls_of(r.totals, Family::conv2d_backward_data) +
                            calls_of(r.totals, Family::conv2d_backward_weight));
  CHECK(detail_seconds >= ops_of(r.totals, Family::conv2d_forward) + ops_of(r.totals, Family::conv2d_backward_data) +
                              ops_of(r.totals, Family::conv2d_backward_weight));
  // every batch norm kernel call is in a row (the family also counts the parameter-free bn_gradient)
  CHECK(batchnorm_calls > 0);
  CHECK(batchnorm_calls <= calls_of(r.totals, Family::batchnorm));
  CHECK_FALSE(profile::enabled());  // switched off again when run() returns
}

TEST_CASE("--profile on two concurrent workers: the workers' accumulators are merged") {
  TrainConfig c = tiny_run(PipelineMethod::petra);
  c.devices = {Device::parse("cpu:0"), Device::parse("cpu:1")};
  c.placement = {0, 0, 0, 0, 0, 1, 1, 1, 1, 1};
  c.message_timeout = 60;
  Trainer trainer(c);
  std::vector<EpochReport> reports;
  trainer.run({}, [&](const EpochReport& r) { reports.push_back(r); });
  REQUIRE(reports.size() == 1);
  const std::int64_t steps = static_cast<std::int64_t>(reports[0].step_seconds.size());
  CHECK(steps == trainer.schedule().steps);  // 8 mini-batches plus the fill and drain steps
  const ProfileReport r = trainer.profile_report();
  CHECK(r.workers == 2);
  check_consistent(r, steps);
  CHECK(phase_of(r.totals, Phase::reconstruction) > 0);
  // both workers' stages are there: the lower ones (worker 0) and the head (worker 1)
  REQUIRE(r.totals.stage_phase_seconds.size() == 10);
  CHECK(r.totals.stage_phase_seconds[0][static_cast<int>(Phase::forward)] > 0);
  CHECK(r.totals.stage_phase_seconds[9][static_cast<int>(Phase::backward)] > 0);
}

TEST_CASE("profiling off records nothing, and the step times are still there") {
  profile::reset();
  TrainConfig c = tiny_run(PipelineMethod::backprop);
  c.profile = false;
  Trainer trainer(c);
  std::vector<EpochReport> reports;
  trainer.run({}, [&](const EpochReport& r) { reports.push_back(r); });
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].step_seconds.size() == 8);
  const profile::Totals t = profile::collect();
  CHECK(t.op_total() == 0);
  CHECK(t.phase_total() == 0);
  for (std::int64_t calls : t.op_calls) CHECK(calls == 0);
}

TEST_CASE("steady_state: the median of steps 40-159, or of the second half of a short run") {
  std::vector<double> steps(200, 1.0);
  for (int i = 0; i < 40; ++i) steps[i] = 100.0;   // warm-up, left out
  for (int i = 160; i < 200; ++i) steps[i] = 50.0;  // after the window, left out
  steps[41] = 7.0;                                   // one slow step inside: the median ignores it
  SteadyState s = steady_state(steps);
  CHECK(s.first == 40);
  CHECK(s.last == 160);
  CHECK(s.median_step_seconds == 1.0);

  const std::vector<double> short_run = {9, 9, 9, 1, 2, 3, 4};  // 7 steps: the last 4 (from 3)
  s = steady_state(short_run);
  CHECK(s.first == 3);
  CHECK(s.last == 7);
  CHECK(s.median_step_seconds == 2.5);  // even count: the mean of the two middle values
  CHECK(steady_state({}).median_step_seconds == 0);
}
