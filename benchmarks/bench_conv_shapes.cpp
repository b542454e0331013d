// benchmarks/bench_conv_shapes.cpp: bench-conv-shapes, the speed of petra's CPU convolutions on
// every distinct convolution of the benchmark network (RevNet18, width 16, 28x28 Fashion-MNIST,
// batch 64), pass by pass, so that a training step's convolution time can be read shape by shape.
//
// The shapes are those nn/models.cpp builds for `petra-train` (check with `petra-train
// --print-model`): the stem 3x3 1->32 (no backward-data: the stem's input needs no gradient), per
// group a stride-2 transition (3x3 C->2C, 3x3 2C->2C, 1x1 C->2C projection) and the reversible
// blocks' 3x3 2C->2C convolutions. `calls` is how many times a backprop step runs each pass of
// the shape, so sum(calls * seconds) is the convolution time of one step.
//
// Each case is checked first (cpu against ref on the batch-2 version of the shape; a relative
// error above 1e-4 stops the program), then timed: two warm-ups, then the median of --repeats runs
// (--json also gives the fastest run). --cold writes a 64 MB buffer before each timed run (not
// timed), so that every run starts as a training step's does: its tensors out of the caches (a
// step's working set is several times the L2 and the VM's share of L3), which costs the 28x28
// layers 20-40% (docs/profiling.md). --slice reads x as a channel slice of a tensor with twice the
// channels, as the first convolution of a reversible block's F reads its stream in place
// (petra-train --profile labels those rows "slice").
// Every buffer starts on a 64-byte boundary, as petra's allocator places tensors (until 2026-12-03
// they were std::vectors at malloc's 16 bytes, where a kernel's 64-byte loads from them split two
// lines; the step's convolution time at 1 thread, --cold, did not move: 56.6 / 59.0 / 58.1 ms
// before, 56.4 / 59.3 / 58.8 after, interleaved).
// GFLOP/s count 2 * multiply-adds of the direct convolution; "% peak" is against --peak-gflops per
// thread (220: the FP32 FMA peak of one core of this machine, docs/results-cpu.md). Passes run by
// Winograd (kernels/cpu/conv2d_winograd.cpp: 2.25x fewer multiply-adds) are counted the same, so
// they can exceed 100%: an effective rate, comparable across algorithms.
//
//   build/bench-conv-shapes --threads 1            # table
//   build/bench-conv-shapes --threads 2 --json     # one JSON object per line (benchmarks/
//                                                  #   bench_conv_torch.py reads them)
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "petra/kernels/conv2d.hpp"
#include "tests/support/testing.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace k = petra::kernels;

namespace {

using Clock = std::chrono::steady_clock;
using Buffer = petra::testing::AlignedVector<float>;  // as petra's tensors: on 64-byte boundaries

struct Layer {
  std::string name;
  k::Conv2dShape shape;  // at the benchmark batch
  int calls;             // per backprop step
  bool backward_data;    // false for the stem
};

// RevNet18 width 16 on 1x28x28 images, as nn/models.cpp builds it (build_revnet).
std::vector<Layer> revnet18_width16_layers(std::int64_t batch) {
  auto conv = [batch](std::int64_t cin, std::int64_t cout, std::int64_t pixels, std::int64_t kernel,
                      std::int64_t stride) {
    return k::conv2d_shape(batch, cin, pixels, pixels, cout, kernel, stride, kernel / 2);
  };
  return {
      {"stem 3x3 1->32 @28", conv(1, 32, 28, 3, 1), 1, false},
      {"3x3 16->16 @28", conv(16, 16, 28, 3, 1), 4, true},  // 2 reversible blocks x 2
      {"3x3 16->32 @28 s2", conv(16, 32, 28, 3, 2), 1, true},
      {"1x1 16->32 @28 s2", conv(16, 32, 28, 1, 2), 1, true},
      {"3x3 32->32 @14", conv(32, 32, 14, 3, 1), 3, true},  // transition conv2 + 1 block x 2
      {"3x3 32->64 @14 s2", conv(32, 64, 14, 3, 2), 1, true},
      {"1x1 32->64 @14 s2", conv(32, 64, 14, 1, 2), 1, true},
      {"3x3 64->64 @7", conv(64, 64, 7, 3, 1), 3, true},
      {"3x3 64->128 @7 s2", conv(64, 128, 7, 3, 2), 1, true},
      {"1x1 64->128 @7 s2", conv(64, 128, 7, 1, 2), 1, true},
      {"3x3 128->128 @4", conv(128, 128, 4, 3, 1), 3, true},
  };
}

// Reproducible inputs and the error measure of the tests (tests/support/testing.hpp).
Buffer random_buffer(std::size_t n, unsigned seed) {
  const std::vector<float> values = petra::testing::random_values<float>(n, seed);
  return Buffer(values.begin(), values.end());
}
using petra::testing::relative_error;

struct Timing {
  double median, fastest;  // seconds
};

// Two warm-up runs, then `repeats` timed runs: their median and their fastest. (On a machine
// shared with other jobs the fastest run is the one least disturbed; the median is what a step
// sees.)
// Evicts the caches by writing a buffer larger than they hold (each run a different value, so
// that the writes are not skipped).
void evict_caches() {
  static std::vector<float> sweep(std::size_t(16) << 20);
  static float value = 0;
  value += 1;
  std::fill(sweep.begin(), sweep.end(), value);
}

Timing time_runs(const std::function<void()>& run, int repeats, bool cold) {
  run();
  run();
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    if (cold) evict_caches();
    const auto t0 = Clock::now();
    run();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], times.front()};
}

struct Tensors {
  Buffer x, w, y, dy, dx, dw;
  explicit Tensors(const k::Conv2dShape& s)
      : x(random_buffer(s.batch * s.x_image_stride(), 1)), w(random_buffer(s.weight_size(), 2)), y(s.output_size()),
        dy(random_buffer(s.output_size(), 4)), dx(s.input_size()), dw(s.weight_size(), 0.0f) {}
};

enum class Pass { forward, data, weight };
const char* pass_name(Pass p) { return p == Pass::forward ? "fwd" : p == Pass::data ? "bwd-data" : "bwd-weight"; }

void run_cpu(const k::StreamHandle& st, const k::Conv2dShape& s, Tensors& t, Pass p) {
  if (p == Pass::forward) k::cpu::conv2d_forward(st, s, t.x.data(), t.w.data(), nullptr, t.y.data());
  if (p == Pass::data) k::cpu::conv2d_backward_data(st, s, t.dy.data(), t.w.data(), t.dx.data());
  if (p == Pass::weight) k::cpu::conv2d_backward_weight(st, s, t.x.data(), t.dy.data(), t.dw.data());
}

// cpu against ref on the batch-2 version of the shape.
double check_against_ref(const k::StreamHandle& st, k::Conv2dShape s, Pass p) {
  s.batch = 2;
  Tensors a(s), r(s);
  run_cpu(st, s, a, p);
  if (p == Pass::forward) {
    k::ref::conv2d_forward<float>(st, s, r.x.data(), r.w.data(), nullptr, r.y.data());
    return relative_error(a.y, r.y);
  }
  if (p == Pass::data) {
    k::ref::conv2d_backward_data<float>(st, s, r.dy.data(), r.w.data(), r.dx.data());
    return relative_error(a.dx, r.dx);
  }
  k::ref::conv2d_backward_weight<float>(st, s, r.x.data(), r.dy.data(), r.dw.data());
  return relative_error(a.dw, r.dw);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench-conv-shapes: petra's CPU convolutions on every conv shape of RevNet18 width 16 (28x28, batch 64)"};
  int threads = 1, repeats = 21;
  std::int64_t batch = 64;
  double peak_per_thread = 220.0;
  bool json = false, cold = false, slice = false;
  std::string filter;
  app.add_option("--threads", threads, "threads per kernel (the stream's thread count)")->check(CLI::Range(1, 256));
  app.add_option("--repeats", repeats, "timed runs per case (the median is reported)")->check(CLI::Range(1, 10000));
  app.add_option("--batch", batch, "batch size")->check(CLI::Range(1, 4096));
  app.add_option("--peak-gflops", peak_per_thread, "FP32 peak of one core, GFLOP/s, for the % column");
  app.add_option("--filter", filter, "only the layers whose name contains this");
  app.add_flag("--json", json, "one JSON object per case and line instead of the table");
  app.add_flag("--cold", cold, "evict the caches before each timed run, as in a training step");
  app.add_flag("--slice", slice,
               "read x as a channel slice of a tensor with twice the channels (images 2 x in x h x w floats apart), "
               "as a reversible block's F reads its stream");
  CLI11_PARSE(app, argc, argv);

#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
  k::HeapWorkspace workspace;
  k::StreamHandle stream;
  stream.num_threads = threads;
  stream.workspace = &workspace;
  const double peak = peak_per_thread * threads;

  if (!json)
    std::printf("bench-conv-shapes: %d thread(s), batch %lld, median of %d; peak %.0f GFLOP/s\n"
                "%-22s %-10s %5s %10s %9s %7s %9s %9s\n",
                threads, static_cast<long long>(batch), repeats, peak, "layer", "pass", "calls", "ms", "GFLOP/s",
                "% peak", "ms/step", "rel.err");
  double step_ms = 0;
  for (const Layer& layer : revnet18_width16_layers(batch)) {
    if (!filter.empty() && layer.name.find(filter) == std::string::npos) continue;
    k::Conv2dShape shape = layer.shape;
    if (slice) shape.in_image_stride = 2 * shape.in_channels * shape.in_h * shape.in_w;
    Tensors t(shape);
    for (Pass p : {Pass::forward, Pass::data, Pass::weight}) {
      if (p == Pass::data && !layer.backward_data) continue;
      const double err = check_against_ref(stream, shape, p);
      if (!(err <= 1e-4)) {
        std::fprintf(stderr, "bench-conv-shapes: %s %s: cpu differs from ref by %.3g (relative); not timed\n",
                     layer.name.c_str(), pass_name(p), err);
        return 1;
      }
      const Timing timing = time_runs([&] { run_cpu(stream, shape, t, p); }, repeats, cold);
      const double seconds = timing.median;
      const double gflops = double(layer.shape.flops()) / seconds / 1e9;
      step_ms += layer.calls * seconds * 1e3;
      if (json) {
        std::printf("%s\n", nlohmann::json{{"layer", layer.name},
                                           {"pass", pass_name(p)},
                                           {"calls", layer.calls},
                                           {"threads", threads},
                                           {"batch", batch},
                                           {"seconds", seconds},
                                           {"fastest_seconds", timing.fastest},
                                           {"gflops", gflops},
                                           {"flops", double(layer.shape.flops())},
                                           {"rel_err", err}}
                                .dump()
                                .c_str());
      } else {
        std::printf("%-22s %-10s %5d %10.3f %9.1f %6.1f%% %9.2f %9.1e\n", layer.name.c_str(), pass_name(p),
                    layer.calls, seconds * 1e3, gflops, 100.0 * gflops / peak, layer.calls * seconds * 1e3, err);
      }
    }
  }
  if (!json) std::printf("convolution time of one backprop step: %.1f ms\n", step_ms);
  return 0;
}
