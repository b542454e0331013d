// benchmarks/bench-cuda: the memory bandwidth of petra's CUDA kernels, against a device copy.
//
// The CUDA kernels petra has so far (kernels/cuda/: element-wise ops and the fused reversible
// coupling) are all memory-bound, so the one number that matters is how close each comes to the
// device's bandwidth. For each kernel, on tensors of --elements floats in device memory:
//   1. launch it --repeats times on one stream after a warm-up, time the batch on the host
//      (launch, then stream_synchronize), and report the minimal traffic (bytes each element must
//      read and write) divided by the time per launch;
//   2. compare it with cudaMemcpy device-to-device of the same tensor, timed the same way in the
//      same run (the practical ceiling: 2 bytes moved per byte copied);
//   3. download the output once and compare it with kernels::ref on the host: a kernel whose
//      relative error exceeds 1e-6 is reported as WRONG instead of its speed, and the exit code
//      is then 1.
// Without a GPU it says so and exits 0, so it can run anywhere.
//
//   build/bench-cuda                          # table, 2^26 floats (256 MiB) per tensor
//   build/bench-cuda --elements 1048576 --json out.json
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fmt/core.h>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "petra/kernels/coupling.hpp"
#include "petra/kernels/elementwise.hpp"
#include "petra/config.hpp"
#include "petra/cuda_backend.hpp"
#include "petra/error.hpp"
#include "petra/files.hpp"
#include "petra/rng.hpp"
#include "tests/support/testing.hpp"  // relative_error, as the test suites compare

namespace cb = petra::cuda_backend;
namespace k = petra::kernels;

#if PETRA_HAVE_CUDA
namespace {

using Clock = std::chrono::steady_clock;
using Host = std::vector<float>;

// n floats of device memory on device 0, freed at scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t n) : n_(n), p_(static_cast<float*>(cb::malloc_device(n * 4, 0))) {}
  ~DeviceBuffer() { cb::free_device(p_, 0); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* get() const { return p_; }
  void upload(const Host& h, void* stream) const { cb::memcpy_async(p_, h.data(), n_ * 4, stream); }
  Host download(void* stream) const {
    Host h(n_);
    cb::memcpy_async(h.data(), p_, n_ * 4, stream);
    cb::stream_synchronize(stream);
    return h;
  }

 private:
  std::size_t n_;
  float* p_;
};

Host random_host(std::size_t n, std::uint64_t seed) {
  petra::Philox rng(seed);
  Host h(n);
  rng.fill_uniform(h.data(), n, -1.0f, 1.0f);
  return h;
}

// One kernel under test: inputs a and b (b unused by unary ops), output out, all n floats, except
// for the couplings, whose x/y/dy are 2h and f/g are h = n/2 (so every tensor fits in n).
struct Case {
  std::string name;
  double bytes_per_launch;
  std::function<void(const k::StreamHandle&, const float* a, const float* b, float* out)> cuda;
  std::function<void(const k::StreamHandle&, const float* a, const float* b, float* out)> ref;
};

// Seconds per launch of `launch`: a warm-up of 3, then `repeats` launches timed as one batch.
double seconds_per_launch(const std::function<void()>& launch, void* stream, int repeats) {
  for (int i = 0; i < 3; ++i) launch();
  cb::stream_synchronize(stream);
  const auto start = Clock::now();
  for (int i = 0; i < repeats; ++i) launch();
  cb::stream_synchronize(stream);
  return std::chrono::duration<double>(Clock::now() - start).count() / repeats;
}

std::vector<Case> make_cases(std::int64_t n) {
  const double f = 4.0 * static_cast<double>(n);  // bytes of one n-float tensor
  // Couplings: x (2h) + f (h) read, y (2h) written, with 2h = n: 2.5 tensors of n floats.
  const k::CouplingShape shape{1, n / 2, 1, 1};
  using S = const k::StreamHandle&;
  using P = const float*;
  return {
      {"copy", 2 * f, [n](S s, P a, P, float* o) { k::cuda::copy(s, n, a, o); },
       [n](S s, P a, P, float* o) { k::ref::copy<float>(s, n, a, o); }},
      {"fill", 1 * f, [n](S s, P, P, float* o) { k::cuda::fill(s, n, 0.5, o); },
       [n](S s, P, P, float* o) { k::ref::fill<float>(s, n, 0.5, o); }},
      {"scale", 2 * f, [n](S s, P a, P, float* o) { k::cuda::scale(s, n, 1.5, a, o); },
       [n](S s, P a, P, float* o) { k::ref::scale<float>(s, n, 1.5, a, o); }},
      {"add", 3 * f, [n](S s, P a, P b, float* o) { k::cuda::add(s, n, a, b, o); },
       [n](S s, P a, P b, float* o) { k::ref::add<float>(s, n, a, b, o); }},
      {"relu", 2 * f, [n](S s, P a, P, float* o) { k::cuda::relu(s, n, a, o); },
       [n](S s, P a, P, float* o) { k::ref::relu<float>(s, n, a, o); }},
      {"relu_backward", 3 * f, [n](S s, P a, P b, float* o) { k::cuda::relu_backward(s, n, a, b, o); },
       [n](S s, P a, P b, float* o) { k::ref::relu_backward<float>(s, n, a, b, o); }},
      {"coupling_forward", 2.5 * f,
       [shape](S s, P a, P b, float* o) { k::cuda::coupling_forward(s, shape, a, b, o); },
       [shape](S s, P a, P b, float* o) { k::ref::coupling_forward<float>(s, shape, a, b, o); }},
      {"coupling_inverse", 2.5 * f,
       [shape](S s, P a, P b, float* o) { k::cuda::coupling_inverse(s, shape, a, b, o); },
       [shape](S s, P a, P b, float* o) { k::ref::coupling_inverse<float>(s, shape, a, b, o); }},
      {"coupling_backward", 2.5 * f,
       [shape](S s, P a, P b, float* o) { k::cuda::coupling_backward(s, shape, a, b, o); },
       [shape](S s, P a, P b, float* o) { k::ref::coupling_backward<float>(s, shape, a, b, o); }},
  };
}

int run(std::int64_t n, int repeats, const std::string& json_path) {
  if (n < 2 || n % 2 != 0) throw petra::ValueError("bench-cuda: --elements must be even and >= 2");
  fmt::print("{}\n", cb::describe());
  if (!cb::available()) {
    fmt::print("bench-cuda: no GPU on this machine; nothing to time.\n");
    return 0;
  }
  void* stream = cb::stream_create(0);
  k::StreamHandle handle;
  handle.cuda_stream = stream;
  handle.device_index = 0;
  const auto size = static_cast<std::size_t>(n);
  const Host a = random_host(size, 1), b = random_host(size, 2);
  DeviceBuffer da(size), db(size), dout(size);
  da.upload(a, stream);
  db.upload(b, stream);

  const double copy_bytes = 8.0 * static_cast<double>(n);
  const double copy_s = seconds_per_launch(
      [&] { cb::memcpy_async(dout.get(), da.get(), size * 4, stream); }, stream, repeats);
  const double ceiling = copy_bytes / copy_s / 1e9;
  fmt::print("{} floats per tensor ({:.0f} MiB), {} launches each\n", n, n * 4.0 / (1 << 20), repeats);
  fmt::print("{:<20} {:>10} {:>10} {:>8}\n", "kernel", "us/launch", "GB/s", "of copy");
  fmt::print("{:<20} {:>10.1f} {:>10.0f} {:>7.0f}%\n", "cudaMemcpy D2D", copy_s * 1e6, ceiling, 100.0);

  nlohmann::json rows = nlohmann::json::array();
  rows.push_back({{"name", "cudaMemcpy D2D"}, {"us_per_launch", copy_s * 1e6}, {"gbytes_per_s", ceiling}});
  const k::StreamHandle host_handle{};
  bool any_wrong = false;
  for (const Case& c : make_cases(n)) {
    const double s = seconds_per_launch([&] { c.cuda(handle, da.get(), db.get(), dout.get()); },
                                        stream, repeats);
    const Host got = dout.download(stream);
    Host expected(size);
    c.ref(host_handle, a.data(), b.data(), expected.data());
    const double error = petra::testing::relative_error(got, expected);
    const double gbs = c.bytes_per_launch / s / 1e9;
    if (error > 1e-6) {
      any_wrong = true;
      fmt::print("{:<20} WRONG: relative error {:.2e} against ref\n", c.name, error);
    } else {
      fmt::print("{:<20} {:>10.1f} {:>10.0f} {:>7.0f}%\n", c.name, s * 1e6, gbs, 100.0 * gbs / ceiling);
    }
    rows.push_back({{"name", c.name}, {"us_per_launch", s * 1e6}, {"gbytes_per_s", gbs},
                    {"relative_error", error}});
  }
  cb::stream_destroy(stream);
  if (!json_path.empty())
    petra::write_file_atomically(json_path, nlohmann::json{{"elements", n}, {"repeats", repeats},
                                                           {"device", cb::describe()}, {"kernels", rows}}
                                                .dump(2) + "\n");
  return any_wrong ? 1 : 0;
}

}  // namespace
#endif

int main(int argc, char** argv) {
  CLI::App app{"bench-cuda: bandwidth of petra's CUDA kernels against a device-to-device copy"};
  std::int64_t elements = std::int64_t{1} << 26;
  int repeats = 50;
  std::string json_path;
  app.add_option("--elements", elements, "floats per tensor (even)")->capture_default_str();
  app.add_option("--repeats", repeats, "timed launches per kernel")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--json", json_path, "also write the results as JSON");
  CLI11_PARSE(app, argc, argv);
  try {
#if PETRA_HAVE_CUDA
    return run(elements, repeats, json_path);
#else
    fmt::print("bench-cuda: petra was built without CUDA; nothing to time.\n");
    return 0;
#endif
  } catch (const petra::Error& e) {
    std::fprintf(stderr, "bench-cuda: %s\n", e.what());
    return 1;
  }
}
