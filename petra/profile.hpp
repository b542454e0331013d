// petra/profile.hpp: where a training step's time goes (petra-train --profile).
//
// Two kinds of timers, both RAII and both doing nothing but one relaxed atomic load while profiling
// is off (profile::set_enabled(false), the default):
//   - OpTimer, placed once at the single dispatch point of every op (PETRA_CALL in petra/ops.cpp),
//     adds the kernel's wall time to its op family (conv2d forward, batch norm, coupling, ...).
//     Only kernels run inside a phase (below) are counted: the test-set evaluation and the
//     executor's set-up run ops too, but they are not part of a training step.
//   - PhaseTimer, placed by the executor around each action of a stage, adds wall time to (stage,
//     phase): forward, backward, reconstruction (a reversible stage rebuilding its input inside its
//     backward), update, data (fetching the mini-batch) and waiting (for a message from a
//     neighbouring worker). Phases nest: a nested phase's time is taken out of its parent's, so
//     every second is counted once, in the innermost phase.
//
// On the CPU a kernel runs inline in the calling thread (petra/stream.hpp), so a kernel's wall time
// is its compute time. On a GPU the timers measure the launches, not the kernels (the work is
// asynchronous): the table then says where the host's time goes, not the device's.
//
// Thread safety: each thread adds to its own accumulator (no lock, no atomic in the timers). A
// thread's accumulator is merged into the process-wide totals when the thread ends (the concurrent
// executor's workers end with each run()), under a mutex. collect() and reset() read and zero the
// totals and the accumulators of threads still alive: call them while no worker is running (between
// two executor runs), as the trainer does.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace petra::profile {

// Op families of the table. conv2d is split by pass: it is where most of a step goes.
enum class Family : int {
  conv2d_forward,
  conv2d_backward_data,
  conv2d_backward_weight,
  conv2d_backward_bias,
  batchnorm,
  coupling,
  elementwise,
  reduce,
  channel,
  pool,
  linear,
  loss,
  optimizer,
  other,
};
inline constexpr int kFamilies = static_cast<int>(Family::other) + 1;
const char* name_of(Family f);

// The family of kernel `kernel` of dispatch family `dispatch_family` (the FAMILY token of
// PETRA_CALL: "CONV2D", "OPTIM", ...). constexpr, so the dispatch point pays nothing for it.
constexpr Family family_of(std::string_view dispatch_family, std::string_view kernel) {
  if (dispatch_family == "CONV2D") {
    if (kernel == "conv2d_forward") return Family::conv2d_forward;
    if (kernel == "conv2d_backward_data") return Family::conv2d_backward_data;
    if (kernel == "conv2d_backward_weight") return Family::conv2d_backward_weight;
    return Family::conv2d_backward_bias;
  }
  if (dispatch_family == "BATCHNORM") return Family::batchnorm;
  if (dispatch_family == "COUPLING") return Family::coupling;
  if (dispatch_family == "ELEMENTWISE") return Family::elementwise;
  if (dispatch_family == "REDUCE") return Family::reduce;
  if (dispatch_family == "CHANNEL") return Family::channel;
  if (dispatch_family == "POOL") return Family::pool;
  if (dispatch_family == "LINEAR") return Family::linear;
  if (dispatch_family == "LOSS") return Family::loss;
  if (dispatch_family == "OPTIM") return Family::optimizer;
  return Family::other;
}

enum class Phase : int { forward, backward, reconstruction, update, data, waiting };
inline constexpr int kPhases = static_cast<int>(Phase::waiting) + 1;
const char* name_of(Phase p);

// Profiling on or off for the whole process (off by default). Switch it while no worker runs.
namespace detail {
extern std::atomic<bool> profiling;
}
void set_enabled(bool on);
inline bool enabled() { return detail::profiling.load(std::memory_order_relaxed); }

using Clock = std::chrono::steady_clock;

// Adds the wall time of its scope to `family`, when profiling is on and the thread is in a phase.
class OpTimer {
 public:
  explicit OpTimer(Family family) : family_(family) {
    if (enabled()) begin();
  }
  ~OpTimer() {
    if (active_) end();
  }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  void begin();
  void end();
  Family family_;
  bool active_ = false;
  Clock::time_point start_;
};

// Adds the wall time of its scope, less that of the phases nested in it, to (stage, phase).
// stage < 0: the enclosing phase's stage (a block inside a stage does not know its index).
class PhaseTimer {
 public:
  explicit PhaseTimer(Phase phase, int stage = -1) : phase_(phase), stage_(stage) {
    if (enabled()) begin();
  }
  ~PhaseTimer() {
    if (active_) end();
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  void begin();
  void end();
  Phase phase_;
  int stage_;
  bool active_ = false;
  PhaseTimer* parent_ = nullptr;
  double nested_seconds_ = 0;  // time of the phases nested in this one
  Clock::time_point start_;
};

// The calls of one kind timed apart (DetailTimer): their count, time and floating-point work.
struct Detail {
  std::int64_t calls = 0;
  double seconds = 0;
  double flops = 0;  // compute-bound rows (convolutions): the work of the calls
  double bytes = 0;  // memory-bound rows (batch norms): the bytes their kernels' passes move
};

// What DetailTimer's describe() returns: a row's label and one call's work.
struct DetailCost {
  std::string label;
  double flops = 0;
  double bytes = 0;
};

// Adds the wall time of its scope to the detail row named by describe(), which returns a
// DetailCost: the row's label and the call's flops (convolutions) or bytes (batch norms). Used
// around each convolution pass and batch norm, labelled by its shape, so that a step's layers can
// be read one by one and set against their time in isolation (bench-conv-shapes prints the same
// labels for the convolutions). describe() runs only while profiling is on and the thread is in a
// phase: nothing is built otherwise.
class DetailTimer {
 public:
  template <class Describe>
  explicit DetailTimer(Describe&& describe) {
    if (enabled() && in_phase()) {
      begin(describe());
    }
  }
  ~DetailTimer() {
    if (active_) end();
  }
  DetailTimer(const DetailTimer&) = delete;
  DetailTimer& operator=(const DetailTimer&) = delete;

 private:
  static bool in_phase();
  void begin(DetailCost cost);
  void end();
  bool active_ = false;
  DetailCost cost_;
  Clock::time_point start_;
};

struct Totals {
  std::array<double, kFamilies> op_seconds{};
  std::array<std::int64_t, kFamilies> op_calls{};
  std::vector<std::array<double, kPhases>> stage_phase_seconds;  // [stage][phase], exclusive
  std::vector<std::array<double, kFamilies>> stage_op_seconds;  // [stage][family]: its phases' kernels
  std::map<std::string, Detail> details;                         // by label (DetailTimer)
  double op_total() const;
  double stage_op_total(std::size_t stage) const;  // 0 for a stage that ran no kernel
  double phase_total() const;
  std::array<double, kPhases> phase_sums() const;  // over the stages
};

// The totals of every thread since the last reset() (see the thread-safety note above).
Totals collect();
void reset();

// A readable table: per op family and per phase, ms per step and share of the step's wall time,
// then per stage the ms per step of each phase with its kernels' share, and each stage's kernels by
// family, then the detail rows (the convolutions by pass and
// shape) from the costliest down, with their rate in GFLOP/s. `wall_seconds` is the wall time of `steps` steps;
// `workers` threads ran them (phases of several workers overlap: their sum may reach workers x wall).
std::string format_table(const Totals& totals, double wall_seconds, std::int64_t steps, int workers);

}  // namespace petra::profile
