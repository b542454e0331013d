// benchmarks/bench-cuda: petra's CUDA kernels against the device's copy bandwidth and cuDNN.
//
// Three tables, each validated before it is timed:
//   1. Memory-bound kernels (element-wise ops, the fused reversible coupling) on tensors of
//      --elements floats: launched --repeats times on one stream after a warm-up, timed as a batch
//      on the host (launch, then stream_synchronize), reported as minimal traffic (bytes each element
//      must read and write) per second, against cudaMemcpy device-to-device of the same tensor timed
//      the same way (the practical ceiling). Each output is first compared with kernels::ref on the
//      host: a relative error above 1e-6 is reported as WRONG instead of its speed (exit code 1).
//   2. The convolution (kernels::cuda, petra's implicit GEMM) against cuDNN (kernels::cudnn, the
//      algorithm petra's glue picks: deterministic, by cuDNN's heuristics) on the ResNet-18 CIFAR
//      layer shapes at batch --conv-batch (128 by default): forward, backward data and backward
//      weight, each in FP32 and in TF32 (set_conv2d_math; cuDNN follows the same setting). TFLOP/s
//      of each and petra's throughput as a share of cuDNN's.
//      petra's kernel is also timed with each of its block tiles forced (set_conv2d_tile: 64x64,
//      64x128, 128x64, 128x128 ms, printed after cuDNN's algorithm; "petra ms" is the tile
//      conv2d_tiling::choose_tile picks; the weight pass's tiles as the direct product, also where
//      the automatic rule takes Winograd's), so that the rule can be checked against the GPU; in
//      TF32 two options more: the 128x128 tile at two blocks per multiprocessor (set_conv2d_tile(4):
//      128 registers; the channels-last forward and weight gradient and Winograd's GEMM have such
//      kernels, the other passes run the one-block kernel again) and with a K step of 32
//      (set_conv2d_tile(5): three stages in dynamic shared memory), and Winograd's weight gradient
//      with the 128x128 tile, the two-block one and the K step of 32. The forward and backward data
//      of the 3x3 stride-1 layers also in Winograd's domain (set_conv2d_forward_algorithm, an
//      option: petra_winograd_ms beside the direct petra_ms), checked against cuDNN too. The
//      forward and backward data of the layers whose 128 x 128 tiles are too few (the 4 x 4
//      planes) also with K cut into slices (set_conv2d_split_k, an option: petra_split_k_ms).
//      Before timing, petra's output is compared with cuDNN's (relative error above 1e-4 in FP32,
//      1e-2 in TF32: WRONG, exit code 1).
//   3. Batch norm (training forward, evaluation, backward), petra's and cuDNN's, on two ResNet-18
//      activation shapes, as bytes per second against a copy of the same tensor. petra's is also
//      timed with its one-pass kernels (set_batchnorm_one_pass(true): a
//      channel kept in a thread-block cluster's shared memory, one read of x instead of two), both
//      checked against cuDNN's output too.
// Without a GPU it says so and exits 0, so it can run anywhere.
//
//   build/bench-cuda                          # the three tables, 2^26 floats per tensor, batch 128
//   build/bench-cuda --elements 1048576 --conv-batch 32 --json out.json
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fmt/core.h>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "petra/kernels/batchnorm.hpp"
#include "petra/kernels/conv2d.hpp"
#include "petra/kernels/coupling.hpp"
#include "petra/kernels/cuda/conv2d_tiling.cuh"
#include "petra/kernels/cuda_libraries.hpp"
#include "petra/kernels/elementwise.hpp"
#include "petra/config.hpp"
#include "petra/cuda_backend.hpp"
#include "petra/device.hpp"
#include "petra/stream.hpp"
#include "petra/error.hpp"
#include "petra/files.hpp"
#include "petra/rng.hpp"
#include "tests/support/testing.hpp"  // relative_error, as the test suites compare

namespace cb = petra::cuda_backend;
namespace k = petra::kernels;

#if PETRA_HAVE_CUDA
namespace tiling = petra::kernels::cuda::conv2d_tiling;
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

#if PETRA_HAVE_CUDNN
// ---- the convolution against cuDNN

// One ResNet-18 layer of the CIFAR variant (3x3 stem, no max-pool), at batch `batch`.
struct Layer {
  std::string name;
  k::Conv2dShape shape;
};

std::vector<Layer> resnet18_cifar_layers(std::int64_t batch) {
  using k::conv2d_shape;
  return {
      {"stem 3->64 3x3 32x32", conv2d_shape(batch, 3, 32, 32, 64, 3, 1, 1)},
      {"layer1 64->64 3x3 32x32", conv2d_shape(batch, 64, 32, 32, 64, 3, 1, 1)},
      {"layer2 64->128 3x3 s2", conv2d_shape(batch, 64, 32, 32, 128, 3, 2, 1)},
      {"layer2 128->128 3x3 16x16", conv2d_shape(batch, 128, 16, 16, 128, 3, 1, 1)},
      {"layer2 shortcut 1x1 s2", conv2d_shape(batch, 64, 32, 32, 128, 1, 2, 0)},
      {"layer3 128->256 3x3 s2", conv2d_shape(batch, 128, 16, 16, 256, 3, 2, 1)},
      {"layer3 256->256 3x3 8x8", conv2d_shape(batch, 256, 8, 8, 256, 3, 1, 1)},
      {"layer3 shortcut 1x1 s2", conv2d_shape(batch, 128, 16, 16, 256, 1, 2, 0)},
      {"layer4 256->512 3x3 s2", conv2d_shape(batch, 256, 8, 8, 512, 3, 2, 1)},
      {"layer4 512->512 3x3 4x4", conv2d_shape(batch, 512, 4, 4, 512, 3, 1, 1)},
      {"layer4 shortcut 1x1 s2", conv2d_shape(batch, 256, 8, 8, 512, 1, 2, 0)},
  };
}

// One pass of one implementation: launches it on s with the buffers of the layer.
using ConvLaunch = std::function<void(const k::StreamHandle&)>;

struct ConvRow {
  const char* pass;
  const char* math;
  k::cuda::Conv2dMath setting;
  ConvLaunch petra, cudnn;
  const DeviceBuffer* output;  // where both write (zeroed before the validation runs)
  std::size_t output_floats;
};

// Times one row (validation first); prints it and returns its JSON, or sets `wrong`.
nlohmann::json time_conv_row(const Layer& layer, const ConvRow& row, const k::StreamHandle& s, int repeats,
                             bool* wrong) {
  void* stream = s.cuda_stream;
  k::cuda::set_conv2d_math(row.setting);
  auto run_once = [&](const ConvLaunch& launch) {
    cb::memset_async(row.output->get(), 0, row.output_floats * 4, stream);
    launch(s);
    return row.output->download(stream);
  };
  const Host petra_out = run_once(row.petra), cudnn_out = run_once(row.cudnn);
  const double difference = petra::testing::relative_error(petra_out, cudnn_out);
  const double bound = row.setting == k::cuda::Conv2dMath::tf32 ? 1e-2 : 1e-4;
  const double petra_s = seconds_per_launch([&] { row.petra(s); }, stream, repeats);
  const double cudnn_s = seconds_per_launch([&] { row.cudnn(s); }, stream, repeats);
  // petra's kernel with each block tile forced (64x64, 64x128, 128x64, 128x128, and in TF32 the
  // 128x128 at two blocks per multiprocessor and with a K step of 32; the same bits, checked by
  // test-cuda), beside the tile
  // choose_tile picks (petra_s). The implicit GEMM's tiles: a weight pass that the automatic rule
  // gives Winograd's is timed as the direct product here (Winograd's GEMM has tiles too; they are
  // not what choose_tile's rule for this pass is about).
  std::vector<double> tile_s;
  const bool tf32 = row.setting == k::cuda::Conv2dMath::tf32;
  k::cuda::set_conv2d_weight_algorithm(k::cuda::Conv2dWeightAlgorithm::direct);
  for (int tile = 0; tile < (tf32 ? 6 : 4); ++tile) {
    k::cuda::set_conv2d_tile(tile);
    tile_s.push_back(seconds_per_launch([&] { row.petra(s); }, stream, repeats));
  }
  k::cuda::set_conv2d_tile(-1);
  k::cuda::set_conv2d_weight_algorithm(k::cuda::Conv2dWeightAlgorithm::automatic);
  // The weight pass of a 3x3, stride-1, padding-1 layer also in Winograd's F(2x2, 3x3) domain
  // and as the direct product (set_conv2d_weight_algorithm; petra's default, automatic, takes
  // Winograd's where run 12 timed it faster): their times, and Winograd's difference from cuDNN,
  // checked against the same bound.
  const k::Conv2dShape& shape = layer.shape;
  const bool winograd_shape = shape.kernel_h == 3 && shape.kernel_w == 3 && shape.stride_h == 1 &&
                              shape.stride_w == 1 && shape.pad_h == 1 && shape.pad_w == 1;
  const bool winograd = std::string(row.pass) == "weight" && winograd_shape;
  double winograd_s = 0, winograd_difference = 0, direct_s = 0;
  std::vector<double> winograd_wide_s;  // TF32: Winograd's GEMM at 128x128: one block, two, the K step of 32
  if (winograd) {
    k::cuda::set_conv2d_weight_algorithm(k::cuda::Conv2dWeightAlgorithm::winograd);
    winograd_difference = petra::testing::relative_error(run_once(row.petra), cudnn_out);
    winograd_s = seconds_per_launch([&] { row.petra(s); }, stream, repeats);
    for (const int tile : tf32 ? std::vector<int>{3, 4, 5} : std::vector<int>{}) {
      k::cuda::set_conv2d_tile(tile);
      const double tile_difference = petra::testing::relative_error(run_once(row.petra), cudnn_out);
      if (tile_difference > bound) {
        *wrong = true;
        fmt::print("{:<28} {:<8} {:<5} WRONG: petra's Winograd with tile {} and cuDNN differ by {:.2e} (bound {:.0e})\n",
                   layer.name, row.pass, row.math, tile, tile_difference, bound);
      }
      winograd_wide_s.push_back(seconds_per_launch([&] { row.petra(s); }, stream, repeats));
    }
    k::cuda::set_conv2d_tile(-1);
    k::cuda::set_conv2d_weight_algorithm(k::cuda::Conv2dWeightAlgorithm::direct);
    direct_s = seconds_per_launch([&] { row.petra(s); }, stream, repeats);
    k::cuda::set_conv2d_weight_algorithm(k::cuda::Conv2dWeightAlgorithm::automatic);
  }
  // The forward and backward data of such a layer in Winograd's domain too
  // (set_conv2d_forward_algorithm, an option: petra_s is the direct product), checked the same way.
  const bool winograd_forward = std::string(row.pass) != "weight" && winograd_shape;
  if (winograd_forward) {
    k::cuda::set_conv2d_forward_algorithm(k::cuda::Conv2dForwardAlgorithm::winograd);
    winograd_difference = petra::testing::relative_error(run_once(row.petra), cudnn_out);
    winograd_s = seconds_per_launch([&] { row.petra(s); }, stream, repeats);
    k::cuda::set_conv2d_forward_algorithm(k::cuda::Conv2dForwardAlgorithm::direct);
  }
  // The forward, and backward data at stride 1, with K cut into slices where the 128 x 128 tile
  // leaves too few blocks (set_conv2d_split_k, an option; conv2d_tiling::output_split): the
  // layers at batch 128's 4 x 4 planes. Checked against cuDNN the same way.
  const tiling::SplitK split = std::string(row.pass) == "forward" ? tiling::forward_output_split(shape)
                               : std::string(row.pass) == "data" ? tiling::data_output_split(shape)
                                                                  : tiling::SplitK{1, 1, 1};
  double split_s = 0;
  if (split.slices > 1) {
    k::cuda::set_conv2d_split_k(true);
    const double split_difference = petra::testing::relative_error(run_once(row.petra), cudnn_out);
    split_s = seconds_per_launch([&] { row.petra(s); }, stream, repeats);
    k::cuda::set_conv2d_split_k(false);
    if (split_difference > bound) {
      *wrong = true;
      fmt::print("{:<28} {:<8} {:<5} WRONG: petra's split-K product and cuDNN differ by {:.2e} (bound {:.0e})\n",
                 layer.name, row.pass, row.math, split_difference, bound);
    }
  }
  if ((winograd || winograd_forward) && winograd_difference > bound) {
    *wrong = true;
    fmt::print("{:<28} {:<8} {:<5} WRONG: petra's Winograd and cuDNN differ by {:.2e} (bound {:.0e})\n", layer.name,
               row.pass, row.math, winograd_difference, bound);
  }
  // The TF32 forward of a stride-1 layer with in_channels % 4 == 0, backward data with
  // out_channels % 4 == 0 and the weight gradient with in_channels % 32 == 0 (and dy's plane a
  // multiple of 4) read channels-last copies (the default,
  // their copy launches in petra_s); the time reading x or dy itself, as before 2026-12-05, beside it.
  const std::string pass = row.pass;
  const bool channels_last = row.setting == k::cuda::Conv2dMath::tf32 &&
                             ((pass == "forward" && shape.in_channels % 4 == 0 && shape.stride_h == 1 &&
                               shape.stride_w == 1) ||
                              (pass == "data" && shape.out_channels % 4 == 0) ||
                              (pass == "weight" && shape.in_channels % 32 == 0 && shape.out_h() * shape.out_w() % 4 == 0));
  double nchw_s = 0;
  if (channels_last) {  // (the weight pass's as the direct product, which the copy is for)
    k::cuda::set_conv2d_channels_last(false);
    k::cuda::set_conv2d_weight_algorithm(k::cuda::Conv2dWeightAlgorithm::direct);
    nchw_s = seconds_per_launch([&] { row.petra(s); }, stream, repeats);
    k::cuda::set_conv2d_weight_algorithm(k::cuda::Conv2dWeightAlgorithm::automatic);
    k::cuda::set_conv2d_channels_last(true);
  }
  const int pass_index = std::string(row.pass) == "forward" ? 0 : std::string(row.pass) == "data" ? 1 : 2;
  const k::cudnn::Conv2dAlgorithm algorithm = k::cudnn::conv2d_algorithm(s, layer.shape, pass_index);
  k::cuda::set_conv2d_math(k::cuda::Conv2dMath::fp32);  // the default again
  const double flops = double(layer.shape.flops());
  if (difference > bound) {
    *wrong = true;
    fmt::print("{:<28} {:<8} {:<5} WRONG: petra and cuDNN differ by {:.2e} (bound {:.0e})\n", layer.name, row.pass,
               row.math, difference, bound);
  } else {
    std::string tiles;
    for (const double t : tile_s) tiles += fmt::format(" {:.3f}", t * 1e3);
    const std::string winograd_text =
        (winograd ? fmt::format("  winograd {:.3f} ms ({:.0f}% of cuDNN), direct {:.3f} ms", winograd_s * 1e3,
                                100.0 * cudnn_s / winograd_s, direct_s * 1e3)
                  : "") +
        (winograd_forward
             ? fmt::format("  winograd {:.3f} ms ({:.0f}% of cuDNN)", winograd_s * 1e3, 100.0 * cudnn_s / winograd_s)
             : "") +
        (winograd_wide_s.size() == 3
             ? fmt::format(" (winograd at 128x128, one block / two per SM / K step 32: {:.3f} / {:.3f} / {:.3f} ms)",
                           winograd_wide_s[0] * 1e3, winograd_wide_s[1] * 1e3, winograd_wide_s[2] * 1e3)
             : "") +
        (channels_last ? fmt::format("  without the channels-last copies {:.3f} ms ({:.0f}% of cuDNN)", nchw_s * 1e3,
                                     100.0 * cudnn_s / nchw_s)
                       : "") +
        (split.slices > 1 ? fmt::format("  split-K x{} {:.3f} ms ({:.0f}% of cuDNN)", split.slices, split_s * 1e3,
                                        100.0 * cudnn_s / split_s)
                          : "");
    fmt::print("{:<28} {:<8} {:<5} {:>9.3f} {:>9.3f} {:>8.1f} {:>8.1f} {:>6.0f}%  algo {}{}{}\n", layer.name, row.pass,
               row.math, petra_s * 1e3, cudnn_s * 1e3, flops / petra_s / 1e12, flops / cudnn_s / 1e12,
               100.0 * cudnn_s / petra_s, algorithm.algorithm, "  tiles ms" + tiles, winograd_text);
  }
  // (Until 2026-12-04's run 11 this field held seconds under its "ms" name; scripts/conv_tiles.py
  // reads both.)
  std::vector<double> tile_ms;
  for (const double t : tile_s) tile_ms.push_back(t * 1e3);
  const k::Conv2dShape& c = layer.shape;
  nlohmann::json result = {{"layer", layer.name},
          {"shape", {{"batch", c.batch}, {"in_channels", c.in_channels}, {"in_h", c.in_h}, {"in_w", c.in_w},
                     {"out_channels", c.out_channels}, {"kernel", c.kernel_h}, {"stride", c.stride_h},
                     {"padding", c.pad_h}}},
          {"pass", row.pass},
          {"math", row.math},
          {"petra_ms", petra_s * 1e3},
          {"cudnn_ms", cudnn_s * 1e3},
          {"petra_tflops", flops / petra_s / 1e12},
          {"cudnn_tflops", flops / cudnn_s / 1e12},
          {"petra_share_of_cudnn", cudnn_s / petra_s},
          {"petra_ms_by_tile", tile_ms},
          {"cudnn_algorithm", algorithm.algorithm},
          {"cudnn_workspace_bytes", algorithm.workspace_bytes},
          {"relative_difference", difference}};
  if (channels_last) result["petra_nchw_ms"] = nchw_s * 1e3;  // reading x or dy itself
  // Whether tile 4 (two blocks per multiprocessor) ran a kernel of its own in the direct product:
  // the channels-last forward and weight gradient (conv2d.cu, two_blocks_per_sm); elsewhere it
  // ran tile 3's kernel again.
  if (tf32) result["two_blocks_own_kernel"] = channels_last && pass != "data";
  if (winograd_wide_s.size() == 3)  // one block, two per multiprocessor, the K step of 32
    result["petra_winograd_128x128_ms"] = {winograd_wide_s[0] * 1e3, winograd_wide_s[1] * 1e3, winograd_wide_s[2] * 1e3};
  if (winograd || winograd_forward) {
    result["petra_winograd_ms"] = winograd_s * 1e3;
    result["petra_winograd_share_of_cudnn"] = cudnn_s / winograd_s;
    result["winograd_relative_difference"] = winograd_difference;
  }
  if (winograd) result["petra_direct_ms"] = direct_s * 1e3;  // (petra_ms: the default, automatic)
  if (split.slices > 1) {
    result["petra_split_k_ms"] = split_s * 1e3;
    result["split_k_slices"] = split.slices;
  }
  return result;
}

nlohmann::json bench_conv2d(std::int64_t batch, int repeats, const k::StreamHandle& s, bool* wrong) {
  nlohmann::json rows = nlohmann::json::array();
  void* stream = s.cuda_stream;
  fmt::print("\nconv2d, ResNet-18 CIFAR layers, batch {}: petra against cuDNN ({} launches each)\n", batch, repeats);
  fmt::print("{:<28} {:<8} {:<5} {:>9} {:>9} {:>8} {:>8} {:>7}\n", "layer", "pass", "math", "petra ms", "cuDNN ms",
             "petra TF", "cuDNN TF", "of cuDNN");
  for (const Layer& layer : resnet18_cifar_layers(batch)) {
    const k::Conv2dShape& c = layer.shape;
    const auto nx = std::size_t(c.input_size()), ny = std::size_t(c.output_size()), nw = std::size_t(c.weight_size());
    DeviceBuffer x(nx), w(nw), bias(std::size_t(c.out_channels)), y(ny), dy(ny), dx(nx), dw(nw);
    x.upload(random_host(nx, 11), stream);
    w.upload(random_host(nw, 12), stream);
    bias.upload(random_host(std::size_t(c.out_channels), 13), stream);
    dy.upload(random_host(ny, 14), stream);
    const ConvLaunch petra_forward = [&](const k::StreamHandle& h) {
      k::cuda::conv2d_forward(h, c, x.get(), w.get(), bias.get(), y.get());
    };
    const ConvLaunch cudnn_forward = [&](const k::StreamHandle& h) {
      k::cudnn::conv2d_forward(h, c, x.get(), w.get(), bias.get(), y.get());
    };
    const ConvLaunch petra_data = [&](const k::StreamHandle& h) {
      k::cuda::conv2d_backward_data(h, c, dy.get(), w.get(), dx.get());
    };
    const ConvLaunch cudnn_data = [&](const k::StreamHandle& h) {
      k::cudnn::conv2d_backward_data(h, c, dy.get(), w.get(), dx.get());
    };
    const ConvLaunch petra_weight = [&](const k::StreamHandle& h) {
      k::cuda::conv2d_backward_weight(h, c, x.get(), dy.get(), dw.get());
    };
    const ConvLaunch cudnn_weight = [&](const k::StreamHandle& h) {
      k::cudnn::conv2d_backward_weight(h, c, x.get(), dy.get(), dw.get());
    };
    const ConvRow table[] = {
        {"forward", "fp32", k::cuda::Conv2dMath::fp32, petra_forward, cudnn_forward, &y, ny},
        {"forward", "tf32", k::cuda::Conv2dMath::tf32, petra_forward, cudnn_forward, &y, ny},
        {"data", "fp32", k::cuda::Conv2dMath::fp32, petra_data, cudnn_data, &dx, nx},
        {"data", "tf32", k::cuda::Conv2dMath::tf32, petra_data, cudnn_data, &dx, nx},
        {"weight", "fp32", k::cuda::Conv2dMath::fp32, petra_weight, cudnn_weight, &dw, nw},
        {"weight", "tf32", k::cuda::Conv2dMath::tf32, petra_weight, cudnn_weight, &dw, nw},
    };
    for (const ConvRow& row : table) rows.push_back(time_conv_row(layer, row, s, repeats, wrong));
  }
  return rows;
}

// ---- batch norm against the copy bandwidth

nlohmann::json bench_batchnorm(std::int64_t batch, int repeats, const k::StreamHandle& s, bool* wrong) {
  nlohmann::json rows = nlohmann::json::array();
  void* stream = s.cuda_stream;
  fmt::print("\nbatch norm: petra and cuDNN against a copy of the same tensor ({} launches each)\n", repeats);
  fmt::print("{:<22} {:<10} {:>10} {:>10} {:>8}   {:>10} {:>10} {:>8}   {:>9}\n", "shape", "pass", "petra us",
             "GB/s", "of copy", "cuDNN us", "GB/s", "of copy", "one pass");
  for (const k::BatchNormShape shape : {k::BatchNormShape{batch, 64, 32, 32}, k::BatchNormShape{batch, 256, 8, 8}}) {
    const auto n = std::size_t(shape.size()), c = std::size_t(shape.channels);
    const double tensor = 4.0 * double(n);
    DeviceBuffer x(n), y(n), dy(n), dx(n), gamma(c), beta(c), mean(c), invstd(c), rm(c), rv(c), dgamma(c), dbeta(c);
    DeviceBuffer streams(2 * n), coupled(2 * n);  // the coupling's input and output (2C channels)
    const k::CouplingShape coupling{shape.batch, shape.channels, shape.height, shape.width};
    streams.upload(random_host(2 * n, 23), stream);
    x.upload(random_host(n, 21), stream);
    dy.upload(random_host(n, 22), stream);
    gamma.upload(Host(c, 1.0f), stream);
    beta.upload(Host(c, 0.0f), stream);
    rm.upload(Host(c, 0.0f), stream);
    rv.upload(Host(c, 1.0f), stream);
    const double copy_s = seconds_per_launch([&] { cb::memcpy_async(y.get(), x.get(), n * 4, stream); }, stream, repeats);
    const double ceiling = 2 * tensor / copy_s / 1e9;
    using Launch = std::function<void()>;
    struct Pass {
      const char* name;
      double bytes;  // the least traffic: each tensor read or written once
      Launch petra, cudnn;
      const DeviceBuffer* output;
    };
    const Pass passes[] = {
        {"train", 2 * tensor,
         [&] { k::cuda::batchnorm_forward_train(s, shape, 1e-5, 0.1, x.get(), gamma.get(), beta.get(), y.get(),
                                                mean.get(), invstd.get(), rm.get(), rv.get()); },
         [&] { k::cudnn::batchnorm_forward_train(s, shape, 1e-5, 0.1, x.get(), gamma.get(), beta.get(), y.get(),
                                                 mean.get(), invstd.get(), rm.get(), rv.get()); },
         &y},
        {"eval", 2 * tensor,
         [&] { k::cuda::batchnorm_forward_eval(s, shape, 1e-5, x.get(), gamma.get(), beta.get(), rm.get(), rv.get(),
                                               y.get()); },
         [&] { k::cudnn::batchnorm_forward_eval(s, shape, 1e-5, x.get(), gamma.get(), beta.get(), rm.get(), rv.get(),
                                                y.get()); },
         &y},
        {"backward", 3 * tensor,
         [&] { k::cuda::batchnorm_backward(s, shape, x.get(), dy.get(), gamma.get(), mean.get(), invstd.get(),
                                           dx.get(), dgamma.get(), dbeta.get()); },
         [&] { k::cudnn::batchnorm_backward(s, shape, x.get(), dy.get(), gamma.get(), mean.get(), invstd.get(),
                                            dx.get(), dgamma.get(), dbeta.get()); },
         &dx},
        // Batch norm + ReLU: petra's fused kernels; cuDNN's batch norm followed by petra's relu
        // kernels (kernels/cuda_libraries.hpp). The fused backward reads y (written just above).
        {"train+relu", 2 * tensor,
         [&] { k::cuda::batchnorm_relu_forward_train(s, shape, 1e-5, 0.1, x.get(), gamma.get(), beta.get(), y.get(),
                                                     mean.get(), invstd.get(), rm.get(), rv.get()); },
         [&] { k::cudnn::batchnorm_relu_forward_train(s, shape, 1e-5, 0.1, x.get(), gamma.get(), beta.get(), y.get(),
                                                      mean.get(), invstd.get(), rm.get(), rv.get()); },
         &y},
        {"backward+relu", 4 * tensor,
         [&] { k::cuda::batchnorm_relu_backward(s, shape, x.get(), y.get(), dy.get(), gamma.get(), mean.get(),
                                                invstd.get(), dx.get(), dgamma.get(), dbeta.get()); },
         [&] { k::cudnn::batchnorm_relu_backward(s, shape, x.get(), y.get(), dy.get(), gamma.get(), mean.get(),
                                                 invstd.get(), dx.get(), dgamma.get(), dbeta.get()); },
         &dx},
        // Batch norm + ReLU fused into the coupling (a pipelined forward of a reversible stage):
        // petra's one kernel; cuDNN's batch norm + petra's relu into y, then petra's coupling kernel
        // (what --conv-impl cudnn runs). Traffic: z, both streams in, both out.
        {"train+relu+coupling", 5 * tensor,
         [&] { k::cuda::batchnorm_relu_coupling_train(s, shape, 1e-5, 0.1, k::CouplingDirection::forward, x.get(),
                                                      gamma.get(), beta.get(), streams.get(), coupled.get(),
                                                      mean.get(), invstd.get(), rm.get(), rv.get()); },
         [&] {
           k::cudnn::batchnorm_relu_forward_train(s, shape, 1e-5, 0.1, x.get(), gamma.get(), beta.get(), y.get(),
                                                  mean.get(), invstd.get(), rm.get(), rv.get());
           k::cuda::coupling_forward(s, coupling, streams.get(), y.get(), coupled.get());
         },
         &coupled},
    };
    const std::string name = fmt::format("({}, {}, {}, {})", shape.batch, shape.channels, shape.height, shape.width);
    // The training forward first fills mean and invstd, which the backward then uses.
    for (const Pass& pass : passes) {
      pass.petra();
      const Host petra_out = pass.output->download(stream);
      pass.cudnn();
      const Host cudnn_out = pass.output->download(stream);
      const double difference = petra::testing::relative_error(petra_out, cudnn_out);
      const double petra_s = seconds_per_launch(pass.petra, stream, repeats);
      const double cudnn_s = seconds_per_launch(pass.cudnn, stream, repeats);
      // The one-pass kernels (a channel in a cluster's shared memory; the evaluation pass has none:
      // the same kernel), checked against cuDNN too.
      k::cuda::set_batchnorm_one_pass(true);
      pass.petra();
      const double one_pass_difference =
          petra::testing::relative_error(pass.output->download(stream), cudnn_out);
      const double one_pass_s = seconds_per_launch(pass.petra, stream, repeats);
      k::cuda::set_batchnorm_one_pass(false);
      const double petra_gbs = pass.bytes / petra_s / 1e9, cudnn_gbs = pass.bytes / cudnn_s / 1e9;
      const double one_pass_gbs = pass.bytes / one_pass_s / 1e9;
      if (difference > 1e-4 || one_pass_difference > 1e-4) {
        *wrong = true;
        fmt::print("{:<22} {:<10} WRONG: petra (two passes, one pass) and cuDNN differ by {:.2e}, {:.2e} (bound 1e-4)\n",
                   name, pass.name, difference, one_pass_difference);
      } else {
        fmt::print("{:<22} {:<10} {:>10.1f} {:>10.0f} {:>7.0f}%   {:>10.1f} {:>10.0f} {:>7.0f}%   {:>8.0f}%\n",
                   name, pass.name, petra_s * 1e6, petra_gbs, 100 * petra_gbs / ceiling, cudnn_s * 1e6, cudnn_gbs,
                   100 * cudnn_gbs / ceiling, 100 * one_pass_gbs / ceiling);
      }
      rows.push_back({{"shape", name}, {"pass", pass.name}, {"copy_gbytes_per_s", ceiling},
                      {"petra_us", petra_s * 1e6}, {"petra_gbytes_per_s", petra_gbs},
                      {"cudnn_us", cudnn_s * 1e6}, {"cudnn_gbytes_per_s", cudnn_gbs},
                      {"petra_one_pass_us", one_pass_s * 1e6},
                      {"relative_difference", difference}, {"one_pass_relative_difference", one_pass_difference}});
    }
  }
  return rows;
}

#endif

int run(std::int64_t n, int repeats, std::int64_t conv_batch, int conv_repeats, const std::string& json_path) {
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
  nlohmann::json result{{"elements", n}, {"repeats", repeats}, {"device", cb::describe()}, {"kernels", rows}};
#if PETRA_HAVE_CUDNN
  if (conv_batch > 0) {
    // petra's stream of cuda:0: its workspace (the caching allocator) serves both implementations.
    petra::Stream library_stream(petra::Device::cuda(0));
    result["conv_batch"] = conv_batch;
    result["conv2d"] = bench_conv2d(conv_batch, conv_repeats, library_stream.handle(), &any_wrong);
    result["batchnorm"] = bench_batchnorm(conv_batch, conv_repeats, library_stream.handle(), &any_wrong);
  }
#else
  (void)conv_batch;
  (void)conv_repeats;
  fmt::print("\nthis petra was built without cuDNN: no convolution or batch-norm comparison\n");
#endif
  if (!json_path.empty()) petra::write_file_atomically(json_path, result.dump(2) + "\n");
  return any_wrong ? 1 : 0;
}

}  // namespace
#endif

int main(int argc, char** argv) {
  CLI::App app{"bench-cuda: petra's CUDA kernels against a device-to-device copy and cuDNN"};
  std::int64_t elements = std::int64_t{1} << 26;
  int repeats = 50;
  std::string json_path;
  app.add_option("--elements", elements, "floats per tensor (even)")->capture_default_str();
  app.add_option("--repeats", repeats, "timed launches per kernel")->capture_default_str()
      ->check(CLI::PositiveNumber);
  std::int64_t conv_batch = 128;
  int conv_repeats = 10;
  app.add_option("--conv-batch", conv_batch, "batch of the convolution and batch-norm tables (0: skip them)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--conv-repeats", conv_repeats, "timed launches per convolution and batch-norm pass")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--json", json_path, "also write the results as JSON");
  CLI11_PARSE(app, argc, argv);
  try {
#if PETRA_HAVE_CUDA
    return run(elements, repeats, conv_batch, conv_repeats, json_path);
#else
    fmt::print("bench-cuda: petra was built without CUDA; nothing to time.\n");
    return 0;
#endif
  } catch (const petra::Error& e) {
    std::fprintf(stderr, "bench-cuda: %s\n", e.what());
    return 1;
  }
}
