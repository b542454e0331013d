// tests/emulation/test_emulated_conv2d.cpp: the kernels of kernels/cuda/conv2d.cu (forward with
// and without bias, FP32 and TF32, backward data, backward weight +=, with and without the split-K,
// backward bias +=), run on the CPU by the CUDA emulation (emulated_conv2d.cpp), against kernels::ref.
//
// Shapes: kernels 1x1, 3x3, 7x7 (stride 2, padding 3) and non-square ones (1x3, 3x1, 2x5), strides
// 1, 2, 3 and mixed, paddings 0, 1, 2 and mixed, channels 1, 3, 17, 33 and 65 (two tiles of M),
// batch 1 and 3, odd spatial sizes (5, 7, 9, 11), a kernel as large as the padded input, a stride
// larger than the kernel (input pixels that no output reads), an empty batch. Every tensor is
// pre-filled and followed by guard elements: y and dx must be assigned, dw and db accumulated onto
// non-zero values, the guards untouched. Pointers are 64-byte aligned for even-numbered shapes and
// one float off for odd ones (the kernels load scalars, so nothing may depend on alignment).
//
// Tolerance: each output is compared with ref:: (double, rounded once) within
// (terms + 3) * 2^-24 * (the sum of |terms|), the bound of a float sum of `terms` products in any
// order, so an error far below one term's size shows while no rounding can fail the test.
//
// Determinism: two runs give the same bits (forward; backward data and backward weight with 1 and
// 3 slices on alternate shapes); the bias gradient gives the same bits with grid caps of 8192, 1 and 3 blocks (the caps
// make the block-per-channel loop go round). The split-K runs with 3 slices (and 2 and 5 on every
// third shape) through conv2d_backward_weight_split and, on one shape, through
// conv2d_backward_weight itself.
// The TF32 forward (set_conv2d_math(tf32)) runs the mma twin: bit for bit against a host model of
// its arithmetic (fmaf of TF32-rounded inputs, k in order), within 2^-10 * sum |terms| of ref::,
// different bits from the FP32 path, the same bits twice.
// The larger tiles (set_conv2d_tile: 64 x 128, 128 x 64, 128 x 128) give the 64 x 64 tile's bits
// in all three passes, FP32 and TF32, on shapes with tails past 64 and 128.
// A batch over the 32-bit index limit (lowered for the test) runs in parts with the same results.
// The emulation runs each block's 256 threads on the CPU, so the shapes stay small (a few blocks).
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "petra/error.hpp"
#include "petra/kernels/common.hpp"
#include "petra/kernels/conv2d.hpp"
#include "petra/kernels/cuda/conv2d_tiling.cuh"
#include "tests/emulation/kernel_checks.hpp"

namespace {

using namespace petra::emulation_testing::vocabulary;
using petra::kernels::Conv2dShape;
namespace tiling = petra::kernels::cuda::conv2d_tiling;

// {batch, in_channels, in_h, in_w, out_channels, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w}
const std::vector<Conv2dShape> kShapes = {
    {3, 17, 5, 7, 33, 1, 1, 1, 1, 0, 0},   // 1x1
    {1, 3, 9, 9, 17, 1, 1, 2, 2, 0, 0},    // 1x1 stride 2
    {3, 17, 9, 9, 33, 3, 3, 1, 1, 1, 1},   // 3x3 stride 1 padding 1: 4 tiles of N, 10 steps of K
    {3, 3, 9, 7, 17, 3, 3, 2, 2, 1, 1},    // 3x3 stride 2 padding 1
    {1, 33, 7, 5, 3, 3, 3, 1, 1, 0, 0},    // 3x3 padding 0, K = 297
    {3, 1, 9, 9, 1, 3, 3, 2, 2, 0, 0},     // one channel in and out
    {3, 3, 11, 9, 5, 7, 7, 2, 2, 3, 3},    // 7x7 stride 2 padding 3
    {1, 3, 7, 9, 5, 1, 3, 1, 1, 0, 1},     // 1x3
    {3, 17, 5, 9, 3, 3, 1, 2, 1, 1, 0},    // 3x1, stride (2, 1), padding (1, 0)
    {1, 2, 7, 11, 3, 2, 5, 1, 2, 1, 2},    // 2x5
    {1, 3, 5, 5, 65, 3, 3, 1, 1, 1, 1},    // 65 out-channels: two tiles of M (forward, weight)
    {1, 65, 3, 3, 2, 3, 3, 1, 1, 1, 1},    // 65 in-channels: two tiles of M (backward data)
    {1, 2, 8, 8, 3, 2, 2, 3, 3, 0, 0},     // stride 3 > kernel 2: rows and columns no output reads
    {1, 2, 3, 3, 3, 5, 5, 1, 1, 1, 1},     // the kernel covers the whole padded input: 1x1 output
    {2, 2, 2, 37, 3, 1, 32, 1, 1, 0, 3},   // 1x32, the widest kernel: tap bit 31 (tiling::bits_meet)
    {1, 2, 3, 37, 3, 2, 32, 1, 2, 1, 31},  // 2x32 stride (1, 2): stride classes of 16 taps, padding 31
    {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},     // one of everything
    {0, 3, 5, 5, 4, 3, 3, 1, 1, 1, 1},     // empty batch
};

std::string describe(const Conv2dShape& s) {
  return "batch " + std::to_string(s.batch) + ", " + std::to_string(s.in_channels) + "x" +
         std::to_string(s.in_h) + "x" + std::to_string(s.in_w) + " -> " + std::to_string(s.out_channels) +
         ", kernel " + std::to_string(s.kernel_h) + "x" + std::to_string(s.kernel_w) + ", stride " +
         std::to_string(s.stride_h) + "," + std::to_string(s.stride_w) + ", padding " +
         std::to_string(s.pad_h) + "," + std::to_string(s.pad_w);
}

// An array of n values that starts `offset` floats into a 64-byte aligned buffer, followed by
// kGuard guard values.
class Buffer {
 public:
  Buffer(std::int64_t n, std::uint64_t seed, std::size_t offset, double lo = -1, double hi = 1)
      : n_(std::size_t(n)), offset_(offset),
        data_(random_values(offset + n_ + kGuard, seed, lo, hi)), before_(data_.values()) {}
  float* data() const { return data_.data() + offset_; }
  std::vector<float> values() const {  // the n values
    const std::vector<float> all = data_.values();
    return std::vector<float>(all.begin() + long(offset_), all.begin() + long(offset_ + n_));
  }
  std::vector<float> initial() const {
    return std::vector<float>(before_.begin() + long(offset_), before_.begin() + long(offset_ + n_));
  }
  // Nothing before or after the n values changed.
  bool guards_kept() const {
    const std::vector<float> all = data_.values();
    for (std::size_t i = 0; i < all.size(); ++i)
      if ((i < offset_ || i >= offset_ + n_) && all[i] != before_[i]) return false;
    return true;
  }
  // Resets the n values to what they were.
  void reset() const { std::copy(before_.begin() + long(offset_), before_.begin() + long(offset_ + n_), data()); }

 private:
  std::size_t n_, offset_;
  AlignedFloats data_;
  std::vector<float> before_;
};

std::vector<double> absolute(const std::vector<float>& v) {
  std::vector<double> a(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) a[i] = std::abs(double(v[i]));
  return a;
}

// ref::'s weight gradient of (x, dy) added to dw's initial values, and each element's sum of
// |terms| (|initial dw| included): what the weight-gradient tests compare with.
struct WeightExpected {
  std::vector<float> values;
  std::vector<double> magnitude;
};
WeightExpected expected_weight_gradient(const StreamHandle& s, const Conv2dShape& sh, const Buffer& x,
                                        const Buffer& dy, const Buffer& dw) {
  WeightExpected e{dw.initial(), absolute(dw.initial())};
  ref::conv2d_backward_weight<float>(s, sh, x.data(), dy.data(), e.values.data());
  const std::vector<double> ax = absolute(x.values()), ady = absolute(dy.values());
  ref::conv2d_backward_weight<double>(s, sh, ax.data(), ady.data(), e.magnitude.data());
  return e;
}

// The largest |got - want| / ((terms + 3) * 2^-24 * magnitude) over the elements (<= 1 passes).
double error_in_bounds(const std::vector<float>& got, const std::vector<float>& want,
                       const std::vector<double>& magnitude, std::int64_t terms) {
  const double unit = std::ldexp(1.0, -24) * double(terms + 3);
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(double(got[i]) - double(want[i]));
    if (d == 0) continue;
    worst = std::max(worst, d / (unit * magnitude[i] + 1e-300));
  }
  return worst;
}

unsigned tiles(std::int64_t n) { return unsigned(tiling::ceil_div(n, 64)); }

struct Stream {
  HeapWorkspace workspace;
  StreamHandle s;
  Stream() { s.workspace = &workspace; }
};

}  // namespace

TEST_CASE("emulated conv2d: forward with and without bias matches ref, deterministic") {
  Stream stream;
  const StreamHandle& s = stream.s;
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t seed = 100;
  std::size_t index = 0;
  for (const Conv2dShape& sh : kShapes) {
    seed += 10;
    const std::size_t offset = index++ % 2;
    INFO(describe(sh), ", offset ", offset);
    const Buffer x(sh.input_size(), seed, offset), w(sh.weight_size(), seed + 1, offset),
        bias(sh.out_channels, seed + 2, offset), y(sh.output_size(), seed + 3, offset, 5, 6);
    for (const bool with_bias : {true, false}) {
      if (!with_bias && offset == 0) continue;  // without bias on every other shape (emulation time)
      CAPTURE(with_bias);
      y.reset();
      const float* b = with_bias ? bias.data() : nullptr;
      std::vector<float> want = y.initial();
      ref::conv2d_forward<float>(s, sh, x.data(), w.data(), b, want.data());
      // the sum of |terms|: the same convolution of |x|, |w|, |bias| in double
      std::vector<double> magnitude(std::size_t(sh.output_size()));
      const std::vector<double> ax = absolute(x.values()), aw = absolute(w.values()), ab = absolute(bias.values());
      ref::conv2d_forward<double>(s, sh, ax.data(), aw.data(), with_bias ? ab.data() : nullptr, magnitude.data());
      const std::size_t before = emu::launches();
      cu::conv2d_forward(s, sh, x.data(), w.data(), b, y.data());
      CHECK(y.guards_kept());
      if (sh.output_size() == 0) {
        CHECK(emu::launches() == before);  // nothing to do, no launch (an empty grid is an error)
        continue;
      }
      CHECK(emu::last_launch().kernel == std::string("conv2d_forward"));
      CHECK(emu::last_launch().grid.x == tiles(sh.batch * sh.out_h() * sh.out_w()));
      CHECK(emu::last_launch().grid.y == tiles(sh.out_channels));
      CHECK(emu::last_launch().grid.z == 1);
      CHECK(emu::last_launch().block.x == 256);
      const std::vector<float> got = y.values();
      CHECK(error_in_bounds(got, want, magnitude, sh.in_channels * sh.kernel_h * sh.kernel_w + 1) <= 1.0);
      if (with_bias) {  // a second run gives the same bits
        cu::conv2d_forward(s, sh, x.data(), w.data(), b, y.data());
        CHECK(bit_differences(y.values(), got) == "");
      }
    }
  }
  MESSAGE("forward: ", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), " s");
}

TEST_CASE("emulated conv2d: backward data matches ref (the gather form by stride class), deterministic") {
  Stream stream;
  const StreamHandle& s = stream.s;
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t seed = 500;
  std::size_t index = 0;
  for (const Conv2dShape& sh : kShapes) {
    seed += 10;
    const std::size_t offset = (index++ + 1) % 2;
    INFO(describe(sh), ", offset ", offset);
    const Buffer dy(sh.output_size(), seed, offset), w(sh.weight_size(), seed + 1, offset),
        dx(sh.input_size(), seed + 2, offset, 5, 6);
    std::vector<float> want = dx.initial();
    ref::conv2d_backward_data<float>(s, sh, dy.data(), w.data(), want.data());
    std::vector<double> magnitude(std::size_t(sh.input_size()));
    const std::vector<double> ady = absolute(dy.values()), aw = absolute(w.values());
    ref::conv2d_backward_data<double>(s, sh, ady.data(), aw.data(), magnitude.data());
    cu::conv2d_backward_data(s, sh, dy.data(), w.data(), dx.data());
    CHECK(dx.guards_kept());
    if (sh.input_size() == 0) continue;
    CHECK(emu::last_launch().kernel == std::string("conv2d_backward_data"));
    // One grid layer per stride class, as wide as the widest class.
    const auto classes_tall = (sh.in_h + sh.stride_h - 1) / sh.stride_h, classes_wide = (sh.in_w + sh.stride_w - 1) / sh.stride_w;
    CHECK(emu::last_launch().grid.x == tiles(sh.batch * classes_tall * classes_wide));
    CHECK(emu::last_launch().grid.y == tiles(sh.in_channels));
    CHECK(emu::last_launch().grid.z == unsigned(sh.stride_h * sh.stride_w));
    const std::vector<float> got = dx.values();
    CHECK(error_in_bounds(got, want, magnitude, sh.out_channels * sh.kernel_h * sh.kernel_w) <= 1.0);
    if (offset == 0) continue;  // the determinism check on every other shape (emulation time)
    cu::conv2d_backward_data(s, sh, dy.data(), w.data(), dx.data());
    CHECK(bit_differences(dx.values(), got) == "");
  }
  MESSAGE("backward data: ", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), " s");
}

TEST_CASE("emulated conv2d: backward weight accumulates, matching ref, with 1, 2, 3 and 5 slices") {
  Stream stream;
  const StreamHandle& s = stream.s;
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t seed = 900;
  std::size_t index = 0;
  for (const Conv2dShape& sh : kShapes) {
    seed += 10;
    const std::size_t offset = index++ % 2;
    INFO(describe(sh), ", offset ", offset);
    const std::int64_t depth = sh.batch * sh.out_h() * sh.out_w();
    const Buffer x(sh.input_size(), seed, offset), dy(sh.output_size(), seed + 1, offset),
        dw(sh.weight_size(), seed + 2, offset);
    // ref::'s dw and each element's sum of |terms|, including the initial |dw|
    const auto [want, magnitude] = expected_weight_gradient(s, sh, x, dy, dw);
    // slices as asked, the first time through the public function (one slice for these shapes)
    for (const std::int64_t asked : {std::int64_t(0), std::int64_t(2), std::int64_t(3), std::int64_t(5)}) {
      if ((asked == 2 || asked == 5) && index % 3 != 0) continue;  // every third shape (emulation time)
      CAPTURE(asked);
      dw.reset();
      const std::size_t before = emu::launches();
      if (asked == 0)
        cu::conv2d_backward_weight(s, sh, x.data(), dy.data(), dw.data());
      else
        cu::conv2d_backward_weight_split(s, sh, x.data(), dy.data(), dw.data(), asked);
      CHECK(dw.guards_kept());
      if (depth == 0) {
        CHECK(emu::launches() == before);
        CHECK(bit_differences(dw.values(), dw.initial()) == "");  // dw += 0
        continue;
      }
      const std::int64_t slices = asked == 0 ? tiling::weight_split_slices(sh) : tiling::split_k(depth, asked).slices;
      CAPTURE(slices);
      CHECK(emu::launches() - before == (slices > 1 ? 2u : 1u));
      CHECK(emu::last_launch().kernel ==
            std::string(slices > 1 ? "conv2d_backward_weight_sum" : "conv2d_backward_weight"));
      if (slices == 1) {
        CHECK(emu::last_launch().grid.x == tiles(sh.in_channels * sh.kernel_h * sh.kernel_w));
        CHECK(emu::last_launch().grid.y == tiles(sh.out_channels));
      }
      if (asked > 1 && depth > tiling::kTileK) CHECK(slices > 1);  // the split path ran
      const std::vector<float> got = dw.values();
      CHECK(error_in_bounds(got, want, magnitude, depth + 1) <= 1.0);
      if ((asked == 0 && offset == 0) || (asked == 3 && offset == 1)) {  // the same bits again
        dw.reset();
        if (asked == 0)
          cu::conv2d_backward_weight(s, sh, x.data(), dy.data(), dw.data());
        else
          cu::conv2d_backward_weight_split(s, sh, x.data(), dy.data(), dw.data(), asked);
        CHECK(bit_differences(dw.values(), got) == "");
      }
    }
  }
  MESSAGE("backward weight: ", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), " s");
}

TEST_CASE("emulated conv2d: backward weight splits a long sum by itself, deterministically") {
  Stream stream;
  const StreamHandle& s = stream.s;
  // K = 3 * 27 * 27 = 2187 >= 2 * kWeightSliceMinK: two slices of 1104 and 1083 terms.
  const Conv2dShape sh{3, 2, 27, 27, 3, 1, 1, 1, 1, 0, 0};
  REQUIRE(tiling::weight_split_slices(sh) == 2);
  const Buffer x(sh.input_size(), 7, 1), dy(sh.output_size(), 8, 1), dw(sh.weight_size(), 9, 1);
  // ref::'s dw and each element's sum of |terms|, including the initial |dw|
  const auto [want, magnitude] = expected_weight_gradient(s, sh, x, dy, dw);
  const std::size_t before = emu::launches();
  cu::conv2d_backward_weight(s, sh, x.data(), dy.data(), dw.data());
  CHECK(emu::launches() - before == 2);
  CHECK(emu::last_launch().kernel == std::string("conv2d_backward_weight_sum"));
  CHECK(stream.workspace.capacity() >= 2 * std::size_t(sh.weight_size()) * sizeof(float));
  const std::vector<float> got = dw.values();
  CHECK(error_in_bounds(got, want, magnitude, 2187 + 1) <= 1.0);
  CHECK(dw.guards_kept());
  dw.reset();
  cu::conv2d_backward_weight(s, sh, x.data(), dy.data(), dw.data());
  CHECK(bit_differences(dw.values(), got) == "");
}

// The kernels index in 32 bits; a batch whose tensors would reach 2^31 elements runs in launches
// of fewer samples. With the limit lowered to 1.5 samples' worth, a batch of 3 runs as 3 launches
// of one sample: the forward and backward data give the bits of one launch (the samples are
// independent), the weight gradient adds the parts into dw in batch order (within the bound of
// ref::, and the same bits twice); a sample over the limit is a ShapeError, before any launch.
TEST_CASE("emulated conv2d: a batch over the 32-bit limit runs in parts, with the same results") {
  Stream stream;
  const StreamHandle& s = stream.s;
  const Conv2dShape sh{3, 5, 9, 9, 6, 3, 3, 1, 1, 1, 1};
  const std::int64_t sample = std::max(sh.in_channels * sh.in_h * sh.in_w, sh.out_channels * sh.out_h() * sh.out_w());
  const Buffer x(sh.input_size(), 31, 1), w(sh.weight_size(), 32, 0), bias(sh.out_channels, 33, 0),
      y(sh.output_size(), 34, 1, 5, 6), dy(sh.output_size(), 35, 0), dx(sh.input_size(), 36, 1, 5, 6),
      dw(sh.weight_size(), 37, 0);
  cu::conv2d_forward(s, sh, x.data(), w.data(), bias.data(), y.data());
  cu::conv2d_backward_data(s, sh, dy.data(), w.data(), dx.data());
  const std::vector<float> y_whole = y.values(), dx_whole = dx.values();
  y.reset(), dx.reset();

  cu::set_conv2d_launch_elements(sample + sample / 2);
  struct Restore {
    ~Restore() { cu::set_conv2d_launch_elements(0); }
  } restore;
  std::size_t before = emu::launches();
  cu::conv2d_forward(s, sh, x.data(), w.data(), bias.data(), y.data());
  CHECK(emu::launches() - before == 3);
  CHECK(emu::last_launch().grid.x == tiles(sh.out_h() * sh.out_w()));  // one sample's columns
  CHECK(bit_differences(y.values(), y_whole) == "");
  before = emu::launches();
  cu::conv2d_backward_data(s, sh, dy.data(), w.data(), dx.data());
  CHECK(emu::launches() - before == 3);
  CHECK(bit_differences(dx.values(), dx_whole) == "");
  CHECK(y.guards_kept());
  CHECK(dx.guards_kept());

  // ref::'s dw and each element's sum of |terms|, including the initial |dw|
  const auto [want, magnitude] = expected_weight_gradient(s, sh, x, dy, dw);
  before = emu::launches();
  cu::conv2d_backward_weight(s, sh, x.data(), dy.data(), dw.data());
  CHECK(emu::launches() - before == 3);
  const std::vector<float> got = dw.values();
  CHECK(error_in_bounds(got, want, magnitude, sh.batch * sh.out_h() * sh.out_w() + 3) <= 1.0);
  dw.reset();
  cu::conv2d_backward_weight(s, sh, x.data(), dy.data(), dw.data());
  CHECK(bit_differences(dw.values(), got) == "");
  CHECK(dw.guards_kept());

  cu::set_conv2d_launch_elements(sample - 1);
  before = emu::launches();
  CHECK_THROWS_AS(cu::conv2d_forward(s, sh, x.data(), w.data(), bias.data(), y.data()), petra::ShapeError);
  CHECK_THROWS_AS(cu::conv2d_backward_weight(s, sh, x.data(), dy.data(), dw.data()), petra::ShapeError);
  CHECK(emu::launches() == before);
}

namespace {

// Every pass refuses `sh` with a ShapeError before any launch.
void check_refused_by_every_pass(const Conv2dShape& sh) {
  Stream stream;
  const StreamHandle& s = stream.s;
  const Buffer x(sh.input_size(), 1, 1), w(sh.weight_size(), 2, 0), y(sh.output_size(), 3, 1),
      dx(sh.input_size(), 4, 1), dw(sh.weight_size(), 5, 0);
  const std::size_t before = emu::launches();
  CHECK_THROWS_AS(cu::conv2d_forward(s, sh, x.data(), w.data(), nullptr, y.data()), petra::ShapeError);
  CHECK_THROWS_AS(cu::conv2d_backward_data(s, sh, y.data(), w.data(), dx.data()), petra::ShapeError);
  CHECK_THROWS_AS(cu::conv2d_backward_weight(s, sh, x.data(), y.data(), dw.data()), petra::ShapeError);
  CHECK(emu::launches() == before);
}

}  // namespace

// The kernels' bounds checks are 32-bit masks of taps (tiling::bits_meet): a kernel of 33 taps a
// side is a ShapeError in every pass, before any launch (the 32-tap one is in kShapes).
TEST_CASE("emulated conv2d: a kernel over 32 taps a side is a ShapeError") {
  check_refused_by_every_pass({1, 1, 3, 40, 1, 1, 33, 1, 1, 0, 0});
  check_refused_by_every_pass({1, 1, 40, 3, 1, 33, 1, 1, 1, 0, 0});
}

// The gathers' offsets reach past a plane by the padding: a padding of 2^20 rows around a
// 1 x 4096 plane puts a corner at -2^32 (tiling::offsets_fit), though every tensor is small: a
// ShapeError in every pass, before any launch, not offsets wrapped around.
TEST_CASE("emulated conv2d: a padding that puts offsets past 2^31 is a ShapeError") {
  const Conv2dShape sh{1, 1, 1, 4096, 1, 1, 1, 1024, 32, std::int64_t(1) << 20, 0};
  REQUIRE(sh.output_size() == 2049 * 128);
  check_refused_by_every_pass(sh);
}

TEST_CASE("emulated conv2d: backward bias accumulates, matching ref, the same bits whatever the grid") {
  Stream stream;
  const StreamHandle& s = stream.s;
  std::uint64_t seed = 1300;
  std::size_t index = 0;
  // The bias gradient reads only (batch, out_channels, out_h, out_w). Each block iteration costs
  // the emulation a few barriers over 256 threads, so few channels: 23 in all.
  const std::vector<Conv2dShape> shapes = {
      {3, 3, 9, 7, 7, 3, 3, 2, 2, 1, 1},    // 7 channels of 5x4 (caps 1 and 3 loop, with a rest)
      {3, 1, 17, 19, 5, 1, 1, 1, 1, 0, 0},  // planes of 323 > 256 threads
      {2, 1, 1, 1, 3, 1, 1, 1, 1, 0, 0},    // planes of 1
      {1, 2, 7, 11, 3, 2, 5, 1, 2, 1, 2},   // batch 1, 7x5
      {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},    // one of everything
      {0, 3, 5, 5, 4, 3, 3, 1, 1, 1, 1},    // empty batch: db += 0
      {3, 1, 60, 50, 2, 1, 1, 1, 1, 0, 0},  // 9000 values per channel: two slices (channel_slices)
  };
  for (const Conv2dShape& sh : shapes) {
    seed += 10;
    const std::size_t offset = index++ % 2;
    INFO(describe(sh), ", offset ", offset);
    const Buffer dy(sh.output_size(), seed, offset), db(sh.out_channels, seed + 1, offset);
    std::vector<float> want = db.initial();
    ref::conv2d_backward_bias<float>(s, sh, dy.data(), want.data());
    std::vector<double> magnitude = absolute(db.initial());
    const std::vector<double> ady = absolute(dy.values());
    ref::conv2d_backward_bias<double>(s, sh, ady.data(), magnitude.data());
    std::vector<float> first;
    for (const std::size_t cap : kGridCaps) {
      const emu::GridStrideCap capped(cap);
      CAPTURE(cap);
      db.reset();
      cu::conv2d_backward_bias(s, sh, dy.data(), db.data());
      // the partial sums' launch (a block per channel and slice), then the sum of each channel's
      // partials (a grid-stride loop over the channels)
      CHECK(emu::last_launch().kernel == std::string("conv2d_backward_bias_sum"));
      CHECK(emu::last_launch().grid.x ==
            unsigned(std::min<std::int64_t>(tiling::ceil_div(sh.out_channels, 256), std::int64_t(cap))));
      CHECK(db.guards_kept());
      const std::vector<float> got = db.values();
      // double sums, rounded twice at most: far inside the float-sum bound
      CHECK(error_in_bounds(got, want, magnitude, 1) <= 1.0);
      if (first.empty())
        first = got;
      else
        CHECK(bit_differences(got, first) == "");
    }
  }
}

namespace {

// The TF32 tests' shapes, for the three passes: tails of M, N and K (the forward's K = 27, 153, 297
// and 585, not multiples of 8 or 16), two tiles of M and of N in each pass (65 out-channels for
// the forward, 65 in-channels for backward data), padding, stride 2 (four stride classes for
// backward data, one of them with no tap of a 1-wide kernel), a non-square kernel and stride.
const std::vector<Conv2dShape> kTf32Shapes = {
    {3, 17, 9, 9, 33, 3, 3, 1, 1, 1, 1}, {1, 3, 5, 5, 65, 3, 3, 1, 1, 1, 1}, {1, 65, 5, 5, 3, 3, 3, 1, 1, 1, 1},
    {1, 33, 7, 5, 3, 3, 3, 1, 1, 0, 0},  {3, 3, 9, 7, 17, 3, 3, 2, 2, 1, 1}, {2, 5, 8, 8, 7, 1, 1, 2, 2, 0, 0},
    {1, 2, 7, 11, 3, 2, 5, 1, 2, 1, 2},
};

// Sets cu::conv2d_math() for a scope.
class MathGuard {
 public:
  explicit MathGuard(cu::Conv2dMath math) : saved_(cu::conv2d_math()) { cu::set_conv2d_math(math); }
  ~MathGuard() { cu::set_conv2d_math(saved_); }
  MathGuard(const MathGuard&) = delete;
  MathGuard& operator=(const MathGuard&) = delete;

 private:
  cu::Conv2dMath saved_;
};

// The order of a forward's K: (c, i, j), as ForwardProblem sums it, or (i, j, c), as
// ChannelsLastForwardProblem does (the TF32 forward from channels-last copies).
enum class ForwardOrder { channel_first, tap_first };

// What the emulated TF32 path computes: per output, k in `order`, acc = fmaf(tf32(w), tf32(x or
// 0 in the padding), acc), then + bias.
std::vector<float> tf32_model(const Conv2dShape& sh, const float* x, const float* w, const float* bias,
                              ForwardOrder order = ForwardOrder::channel_first) {
  std::vector<float> y(std::size_t(sh.output_size()));
  const std::int64_t oh_n = sh.out_h(), ow_n = sh.out_w(), taps = sh.kernel_h * sh.kernel_w;
  for (std::int64_t b = 0; b < sh.batch; ++b)
    for (std::int64_t o = 0; o < sh.out_channels; ++o)
      for (std::int64_t oh = 0; oh < oh_n; ++oh)
        for (std::int64_t ow = 0; ow < ow_n; ++ow) {
          float acc = 0.0f;
          for (std::int64_t k = 0; k < sh.in_channels * taps; ++k) {
            const bool channel_first = order == ForwardOrder::channel_first;
            const std::int64_t c = channel_first ? k / taps : k % sh.in_channels;
            const std::int64_t tap = channel_first ? k % taps : k / sh.in_channels;
            const std::int64_t i = tap / sh.kernel_w, j = tap % sh.kernel_w;
            const std::int64_t h = oh * sh.stride_h - sh.pad_h + i, v = ow * sh.stride_w - sh.pad_w + j;
            const float xv =
                h >= 0 && h < sh.in_h && v >= 0 && v < sh.in_w ? x[((b * sh.in_channels + c) * sh.in_h + h) * sh.in_w + v] : 0.0f;
            acc = std::fmaf(tiling::tf32_round(w[(o * sh.in_channels + c) * taps + tap]), tiling::tf32_round(xv), acc);
          }
          y[std::size_t(((b * sh.out_channels + o) * oh_n + oh) * ow_n + ow)] = bias != nullptr ? acc + bias[o] : acc;
        }
  return y;
}

// The largest |got - want| over TF32's bound, (2^-10 + (terms + 3) 2^-24) * magnitude (<= 1 passes):
// each product's inputs rounded to TF32 (2^-11 relative each), then an FP32 sum.
double tf32_error_in_bounds(const std::vector<float>& got, const std::vector<float>& want,
                            const std::vector<double>& magnitude, std::int64_t terms) {
  const double unit = std::ldexp(1.0, -10) + double(terms + 3) * std::ldexp(1.0, -24);
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - double(want[i])) / (unit * magnitude[i] + 1e-300));
  return worst;
}

// A TF32 forward's `got` (y from `initial`) against ref::'s, in tf32_error_in_bounds's units.
double tf32_forward_error(const StreamHandle& s, const Conv2dShape& sh, const Buffer& x, const Buffer& w,
                          const float* bias, const std::vector<float>& initial, const std::vector<float>& got) {
  std::vector<float> want = initial;
  ref::conv2d_forward<float>(s, sh, x.data(), w.data(), bias, want.data());
  std::vector<double> magnitude(std::size_t(sh.output_size()));
  const std::vector<double> ax = absolute(x.values()), aw = absolute(w.values());
  std::vector<double> ab;
  if (bias != nullptr)
    for (std::int64_t o = 0; o < sh.out_channels; ++o) ab.push_back(std::abs(double(bias[o])));
  ref::conv2d_forward<double>(s, sh, ax.data(), aw.data(), bias != nullptr ? ab.data() : nullptr, magnitude.data());
  return tf32_error_in_bounds(got, want, magnitude, sh.in_channels * sh.kernel_h * sh.kernel_w + 1);
}

}  // namespace

TEST_CASE("emulated conv2d: TF32 forward (the mma twin) matches its model bit for bit and ref within TF32") {
  Stream stream;
  const StreamHandle& s = stream.s;
  const MathGuard tf32(cu::Conv2dMath::tf32);
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t seed = 2000;
  std::size_t index = 0;
  for (const Conv2dShape& sh : kTf32Shapes) {
    seed += 10;
    const std::size_t offset = index++ % 2;
    const bool with_bias = offset == 0;
    INFO(describe(sh), ", offset ", offset, ", bias ", with_bias);
    const Buffer x(sh.input_size(), seed, offset), w(sh.weight_size(), seed + 1, offset),
        bias(sh.out_channels, seed + 2, offset), y(sh.output_size(), seed + 3, offset, 5, 6);
    const float* b = with_bias ? bias.data() : nullptr;
    cu::conv2d_forward(s, sh, x.data(), w.data(), b, y.data());
    CHECK(emu::last_launch().kernel == std::string("conv2d_forward_tf32"));
    CHECK(emu::last_launch().grid.x == tiles(sh.batch * sh.out_h() * sh.out_w()));
    CHECK(emu::last_launch().grid.y == tiles(sh.out_channels));
    CHECK(y.guards_kept());
    const std::vector<float> got = y.values();
    CHECK(bit_differences(got, tf32_model(sh, x.data(), w.data(), b)) == "");
    // against ref: each product's inputs rounded by up to 2^-11 relative (2^-10 for the product)
    CHECK(tf32_forward_error(s, sh, x, w, b, y.initial(), got) <= 1.0);
    // the rounding is real: the FP32 path gives other bits
    {
      const MathGuard fp32(cu::Conv2dMath::fp32);
      cu::conv2d_forward(s, sh, x.data(), w.data(), b, y.data());
      CHECK(emu::last_launch().kernel == std::string("conv2d_forward"));
      CHECK(bit_differences(y.values(), got) != "");
    }
    // and the same bits again
    cu::conv2d_forward(s, sh, x.data(), w.data(), b, y.data());
    CHECK(bit_differences(y.values(), got) == "");
  }
  CHECK(cu::conv2d_math() == cu::Conv2dMath::tf32);
  MESSAGE("TF32 forward: ", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), " s");
}

namespace {

// The order of backward data's K within a stride class: (o, v_i, v_j), as DataProblem sums it, or
// (v_i, v_j, o), as ChannelsLastDataProblem does.
enum class DataOrder { channel_first, tap_first };

// What the emulated TF32 backward data computes: per input pixel, its class's (o, tap) in `order`
// (a tap is the class's when h + pad - i is a multiple of the stride, likewise for j), acc =
// fmaf(tf32(w), tf32(dy or 0 outside), acc).
std::vector<float> tf32_data_model(const Conv2dShape& sh, const float* dy, const float* w,
                                   DataOrder order = DataOrder::channel_first) {
  std::vector<float> dx(std::size_t(sh.input_size()));
  const std::int64_t oh_n = sh.out_h(), ow_n = sh.out_w(), taps = sh.kernel_h * sh.kernel_w;
  for (std::int64_t b = 0; b < sh.batch; ++b)
    for (std::int64_t c = 0; c < sh.in_channels; ++c)
      for (std::int64_t h = 0; h < sh.in_h; ++h)
        for (std::int64_t v = 0; v < sh.in_w; ++v) {
          float acc = 0.0f;
          for (std::int64_t k = 0; k < sh.out_channels * taps; ++k) {
            const bool channel_first = order == DataOrder::channel_first;
            const std::int64_t o = channel_first ? k / taps : k % sh.out_channels;
            const std::int64_t tap = channel_first ? k % taps : k / sh.out_channels;
            const std::int64_t i = tap / sh.kernel_w, j = tap % sh.kernel_w;
            if ((h + sh.pad_h - i) % sh.stride_h != 0 || (v + sh.pad_w - j) % sh.stride_w != 0) continue;
            const std::int64_t oh = (h + sh.pad_h - i) / sh.stride_h, ow = (v + sh.pad_w - j) / sh.stride_w;
            const bool inside = h + sh.pad_h - i >= 0 && oh < oh_n && v + sh.pad_w - j >= 0 && ow < ow_n;
            const float g = inside ? dy[((b * sh.out_channels + o) * oh_n + oh) * ow_n + ow] : 0.0f;
            acc = std::fmaf(tiling::tf32_round(w[(o * sh.in_channels + c) * taps + tap]), tiling::tf32_round(g), acc);
          }
          dx[std::size_t(((b * sh.in_channels + c) * sh.in_h + h) * sh.in_w + v)] = acc;
        }
  return dx;
}

// What the emulated TF32 backward weight computes with `slices` K slices: per slice, the output
// pixels k in order, acc = fmaf(tf32(dy), tf32(x or 0 in the padding), acc); one slice adds acc to
// dw in float, several add dw and the partials in double and round once (sum_weight_partials).
std::vector<float> tf32_weight_model(const Conv2dShape& sh, const float* x, const float* dy, std::vector<float> dw,
                                     std::int64_t slices) {
  const std::int64_t oh_n = sh.out_h(), ow_n = sh.out_w(), plane = oh_n * ow_n;
  const tiling::SplitK split = tiling::split_k(sh.batch * plane, slices);
  for (std::int64_t o = 0; o < sh.out_channels; ++o)
    for (std::int64_t c = 0; c < sh.in_channels; ++c)
      for (std::int64_t i = 0; i < sh.kernel_h; ++i)
        for (std::int64_t j = 0; j < sh.kernel_w; ++j) {
          double partial_sum = 0;
          float single = 0.0f;
          for (std::int64_t slice = 0; slice < split.slices; ++slice) {
            float acc = 0.0f;
            for (std::int64_t k = split.begin(slice); k < split.end(slice); ++k) {
              const std::int64_t b = k / plane, oh = k / ow_n % oh_n, ow = k % ow_n;
              const std::int64_t h = oh * sh.stride_h - sh.pad_h + i, v = ow * sh.stride_w - sh.pad_w + j;
              const float xv = h >= 0 && h < sh.in_h && v >= 0 && v < sh.in_w
                                   ? x[((b * sh.in_channels + c) * sh.in_h + h) * sh.in_w + v]
                                   : 0.0f;
              acc = std::fmaf(tiling::tf32_round(dy[((b * sh.out_channels + o) * oh_n + oh) * ow_n + ow]),
                              tiling::tf32_round(xv), acc);
            }
            partial_sum += double(acc);
            single = acc;
          }
          float& out = dw[std::size_t(((o * sh.in_channels + c) * sh.kernel_h + i) * sh.kernel_w + j)];
          out = split.slices == 1 ? out + single : float(double(out) + partial_sum);
        }
  return dw;
}

}  // namespace

TEST_CASE("emulated conv2d: TF32 backward data and weight match their models bit for bit and ref within TF32") {
  Stream stream;
  const StreamHandle& s = stream.s;
  const MathGuard tf32(cu::Conv2dMath::tf32);
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t seed = 3000;
  std::size_t index = 0;
  for (const Conv2dShape& sh : kTf32Shapes) {
    seed += 10;
    const std::size_t offset = index++ % 2;
    INFO(describe(sh), ", offset ", offset);
    const Buffer x(sh.input_size(), seed, offset), w(sh.weight_size(), seed + 1, offset),
        dy(sh.output_size(), seed + 2, offset), dx(sh.input_size(), seed + 3, offset, 5, 6),
        dw(sh.weight_size(), seed + 4, offset);
    const std::vector<double> ax = absolute(x.values()), aw = absolute(w.values()), ady = absolute(dy.values());

    cu::conv2d_backward_data(s, sh, dy.data(), w.data(), dx.data());
    CHECK(emu::last_launch().kernel == std::string("conv2d_backward_data_tf32"));
    CHECK(dx.guards_kept());
    const std::vector<float> dx_got = dx.values();
    CHECK(bit_differences(dx_got, tf32_data_model(sh, dy.data(), w.data())) == "");
    std::vector<float> dx_want(std::size_t(sh.input_size()));
    ref::conv2d_backward_data<float>(s, sh, dy.data(), w.data(), dx_want.data());
    std::vector<double> dx_magnitude(std::size_t(sh.input_size()));
    ref::conv2d_backward_data<double>(s, sh, ady.data(), aw.data(), dx_magnitude.data());
    CHECK(tf32_error_in_bounds(dx_got, dx_want, dx_magnitude, sh.out_channels * sh.kernel_h * sh.kernel_w) <= 1.0);

    // the public function's slices, and 3 asked for (several partials summed in double)
    for (const std::int64_t asked : {std::int64_t(0), std::int64_t(3)}) {
      CAPTURE(asked);
      dw.reset();
      if (asked == 0)
        cu::conv2d_backward_weight(s, sh, x.data(), dy.data(), dw.data());
      else
        cu::conv2d_backward_weight_split(s, sh, x.data(), dy.data(), dw.data(), asked);
      CHECK(dw.guards_kept());
      const std::int64_t depth = sh.batch * sh.out_h() * sh.out_w();
      const std::int64_t slices = tiling::split_k(depth, asked == 0 ? tiling::weight_split_slices(sh) : asked).slices;
      CAPTURE(slices);
      CHECK(emu::last_launch().kernel ==
            std::string(slices > 1 ? "conv2d_backward_weight_sum" : "conv2d_backward_weight_tf32"));
      const std::vector<float> dw_got = dw.values();
      CHECK(bit_differences(dw_got, tf32_weight_model(sh, x.data(), dy.data(), dw.initial(), slices)) == "");
      std::vector<float> dw_want = dw.initial();
      ref::conv2d_backward_weight<float>(s, sh, x.data(), dy.data(), dw_want.data());
      std::vector<double> dw_magnitude = absolute(dw.initial());
      ref::conv2d_backward_weight<double>(s, sh, ax.data(), ady.data(), dw_magnitude.data());
      CHECK(tf32_error_in_bounds(dw_got, dw_want, dw_magnitude, depth + 1) <= 1.0);
    }
    // the rounding is real: FP32 gives other bits
    const MathGuard fp32(cu::Conv2dMath::fp32);
    cu::conv2d_backward_data(s, sh, dy.data(), w.data(), dx.data());
    CHECK(emu::last_launch().kernel == std::string("conv2d_backward_data"));
    CHECK(bit_differences(dx.values(), dx_got) != "");
  }
  MESSAGE("TF32 backward: ", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), " s");
}

TEST_CASE("emulated conv2d: FP32 is the default math") { CHECK(cu::conv2d_math() == cu::Conv2dMath::fp32); }

namespace {

// Forces the block tile for a scope (set_conv2d_tile), then gives the choice back.
class TileGuard {
 public:
  explicit TileGuard(int tile) { cu::set_conv2d_tile(tile); }
  ~TileGuard() { cu::set_conv2d_tile(-1); }
  TileGuard(const TileGuard&) = delete;
  TileGuard& operator=(const TileGuard&) = delete;
};

// Sets cu::set_conv2d_channels_last for a scope (the default, on, after it).
class ChannelsLastGuard {
 public:
  explicit ChannelsLastGuard(bool enabled) { cu::set_conv2d_channels_last(enabled); }
  ~ChannelsLastGuard() { cu::set_conv2d_channels_last(true); }
  ChannelsLastGuard(const ChannelsLastGuard&) = delete;
  ChannelsLastGuard& operator=(const ChannelsLastGuard&) = delete;
};

// Sets the weight gradient's algorithm for a scope (set_conv2d_weight_algorithm), then gives the
// default back.
class WeightAlgorithmGuard {
 public:
  explicit WeightAlgorithmGuard(cu::Conv2dWeightAlgorithm algorithm) { cu::set_conv2d_weight_algorithm(algorithm); }
  ~WeightAlgorithmGuard() { cu::set_conv2d_weight_algorithm(cu::Conv2dWeightAlgorithm::automatic); }
  WeightAlgorithmGuard(const WeightAlgorithmGuard&) = delete;
  WeightAlgorithmGuard& operator=(const WeightAlgorithmGuard&) = delete;
};

}  // namespace

// The 64 x 64 tile is checked against ref:: above and below (choose_tile keeps it for shapes this
// small); the larger tiles must give its results bit for bit (each output is one thread's, or one
// accumulator element's, sum over k in the same order, whatever the tile), on shapes with tails
// past 64 and 128 in M and N. In TF32 the twin of the tensor-core path runs: on a GPU, test-cuda
// checks the same with the real mma.sync.
TEST_CASE("emulated conv2d: the 64 x 128, 128 x 64 and 128 x 128 tiles give the 64 x 64 tile's bits, FP32 and TF32") {
  Stream stream;
  const StreamHandle& s = stream.s;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Conv2dShape> shapes = {
      {2, 5, 9, 11, 130, 3, 3, 1, 1, 1, 1},  // forward M = 130, N = 198; weight M = 130, N = 45
      {2, 70, 7, 9, 6, 3, 3, 2, 2, 1, 1},    // backward data M = 70, four stride classes; weight N = 630
  };
  std::uint64_t seed = 2100;
  for (const Conv2dShape& sh : shapes) {
    seed += 10;
    INFO(describe(sh));
    const Buffer x(sh.input_size(), seed, 1), w(sh.weight_size(), seed + 1, 0), bias(sh.out_channels, seed + 2, 1),
        dy(sh.output_size(), seed + 3, 0), y(sh.output_size(), seed + 4, 1), dx(sh.input_size(), seed + 5, 0),
        dw(sh.weight_size(), seed + 6, 1);
    for (const cu::Conv2dMath math : {cu::Conv2dMath::fp32, cu::Conv2dMath::tf32}) {
      CAPTURE(int(math));
      const MathGuard chosen(math);
      std::vector<float> y_small, dx_small, dw_small;
      for (const int tile : {0, 1, 2, 3}) {
        CAPTURE(tile);
        const TileGuard forced(tile);
        const int tile_m = tile >= 2 ? 128 : 64, tile_n = tile % 2 == 1 ? 128 : 64;
        y.reset();
        dx.reset();
        dw.reset();
        cu::conv2d_forward(s, sh, x.data(), w.data(), bias.data(), y.data());
        CHECK(emu::last_launch().grid.x == unsigned(tiling::ceil_div(sh.batch * sh.out_h() * sh.out_w(), tile_n)));
        CHECK(emu::last_launch().grid.y == unsigned(tiling::ceil_div(sh.out_channels, tile_m)));
        cu::conv2d_backward_data(s, sh, dy.data(), w.data(), dx.data());
        CHECK(emu::last_launch().grid.y == unsigned(tiling::ceil_div(sh.in_channels, tile_m)));
        cu::conv2d_backward_weight_split(s, sh, x.data(), dy.data(), dw.data(), 2);
        CHECK(y.guards_kept());
        CHECK(dx.guards_kept());
        CHECK(dw.guards_kept());
        if (tile == 0) {
          y_small = y.values(), dx_small = dx.values(), dw_small = dw.values();
          continue;
        }
        CHECK(bit_differences(y.values(), y_small) == "");
        CHECK(bit_differences(dx.values(), dx_small) == "");
        CHECK(bit_differences(dw.values(), dw_small) == "");
      }
    }
  }
  MESSAGE("tiles: ", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), " s");
}

// The TF32 path's two 128 x 128 options, which bench-cuda times beside the tiles: set_conv2d_tile(4),
// compiled for two blocks per multiprocessor (128 registers), with kernels of its own where they
// fit without spilling (the channels-last forward and weight gradient, Winograd's GEMM) and tile
// 3's elsewhere; set_conv2d_tile(5), a K step of 32 in dynamic shared memory, its own kernels in
// every TF32 pass. Both give tile 3's bits (the k8 products are taken in the same order), on K
// with tails in either half of a 32-step (the first shape's weight K = 36, the second's forward K =
// 180 and weight K = 70; the weight gradient in one K slice and in three); the FP32 path runs tile
// 3's kernels, and so does tile 5 on a GPU whose blocks cannot hold its 99.4 KiB of shared memory
// (sm_86, sm_89: 99 KiB). (The emulation runs the mma's twin; on a GPU, test-cuda's every-tile
// case compares the real instructions the same way.)
TEST_CASE("emulated conv2d: the TF32 128 x 128 options (two blocks per multiprocessor, K step 32) give tile 3's bits") {
  Stream stream;
  const StreamHandle& s = stream.s;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Conv2dShape> shapes = {
      {1, 32, 6, 6, 132, 3, 3, 1, 1, 1, 1},  // channels-last in every pass; 132 rows: past 128
      {2, 20, 5, 7, 36, 3, 3, 1, 1, 1, 1},   // the weight gradient from x itself (20 channels)
  };
  std::uint64_t seed = 3100;
  for (const Conv2dShape& sh : shapes) {
    seed += 10;
    const bool first = seed == 3110;  // (FP32 and the small GPU on the first shape only: the suite's time)
    INFO(describe(sh));
    const Buffer x(sh.input_size(), seed, 0), w(sh.weight_size(), seed + 1, 0), dy(sh.output_size(), seed + 2, 0),
        y(sh.output_size(), seed + 3, 0), dx(sh.input_size(), seed + 4, 0), dw(sh.weight_size(), seed + 5, 0),
        dw_winograd(sh.weight_size(), seed + 5, 0), dw_sliced(sh.weight_size(), seed + 5, 0);
    // Each pass's product kernel (the launched function) and its results, under a tile: forward,
    // backward data, weight (the direct product), Winograd's weight gradient, the direct weight
    // gradient in three K slices.
    struct Run {
      std::vector<const void*> kernels;
      std::vector<std::vector<float>> values;
    };
    const auto run = [&](int tile) {
      const TileGuard forced(tile);
      for (const Buffer* b : {&y, &dx, &dw, &dw_winograd, &dw_sliced}) b->reset();
      Run r;
      cu::conv2d_forward(s, sh, x.data(), w.data(), nullptr, y.data());
      r.kernels.push_back(emu::last_launch().function);
      cu::conv2d_backward_data(s, sh, dy.data(), w.data(), dx.data());
      r.kernels.push_back(emu::last_launch().function);
      cu::conv2d_backward_weight_split(s, sh, x.data(), dy.data(), dw.data(), 1);
      r.kernels.push_back(emu::last_launch().function);
      {
        const WeightAlgorithmGuard winograd(cu::Conv2dWeightAlgorithm::winograd);
        cu::conv2d_backward_weight(s, sh, x.data(), dy.data(), dw_winograd.data());
        CHECK(emu::last_launch().kernel == std::string("conv2d_backward_weight_winograd_output"));
        r.kernels.push_back(emu::recent_launches(2).at(0).function);  // the GEMM, before the output transform
      }
      cu::conv2d_backward_weight_split(s, sh, x.data(), dy.data(), dw_sliced.data(), 3);
      CHECK(emu::last_launch().kernel == std::string("conv2d_backward_weight_sum"));
      r.kernels.push_back(emu::recent_launches(2).at(0).function);  // the product, before the slices' sum
      for (const Buffer* b : {&y, &dx, &dw, &dw_winograd, &dw_sliced}) {
        CHECK(b->guards_kept());
        r.values.push_back(b->values());
      }
      return r;
    };
    for (const cu::Conv2dMath math : {cu::Conv2dMath::fp32, cu::Conv2dMath::tf32}) {
      CAPTURE(int(math));
      const MathGuard chosen(math);
      const bool tf32 = math == cu::Conv2dMath::tf32;
      if (!tf32 && !first) continue;
      const Run one_block = run(3);
      for (const int tile : {4, 5}) {
        CAPTURE(tile);
        const Run option = run(tile);
        // which passes have a kernel of their own under the option
        const bool channels_last_weight = sh.in_channels % 32 == 0;
        const bool weight_own = tf32 && (tile == 5 || channels_last_weight);
        const std::vector<bool> own = {tf32, tf32 && tile == 5, weight_own, tf32, weight_own};
        for (std::size_t pass = 0; pass < own.size(); ++pass) {
          CAPTURE(pass);
          CHECK((option.kernels[pass] != one_block.kernels[pass]) == own[pass]);
          CHECK(bit_differences(option.values[pass], one_block.values[pass]) == "");
        }
      }
      if (tf32 && first) {  // blocks of at most 99 KiB: tile 5 launches tile 3's kernels
        struct SharedLimit {
          std::size_t saved = emu::settings().opt_in_shared_bytes;
          SharedLimit() { emu::settings().opt_in_shared_bytes = 99 * 1024; }
          ~SharedLimit() { emu::settings().opt_in_shared_bytes = saved; }
        } small;
        const Run fallback = run(5);
        for (std::size_t pass = 0; pass < fallback.kernels.size(); ++pass) {
          CAPTURE(pass);
          CHECK(fallback.kernels[pass] == one_block.kernels[pass]);
          CHECK(bit_differences(fallback.values[pass], one_block.values[pass]) == "");
        }
      }
    }
  }
  MESSAGE("128 x 128 options: ", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), " s");
}

// The TF32 path's 16-byte A copies (where A's rows allow them: the forward's weight rows when
// in_channels x taps is a multiple of 4, the weight gradient's dy rows when the output plane is,
// each 16-byte aligned) against the scalar copies the same values take one float off alignment:
// two kernels (the launches' functions differ), the same bits, on every tile, with M past 64 and
// 128 and the weight gradient in one and three K slices; and the model's bits.
TEST_CASE("emulated conv2d: TF32's 16-byte A copies give the scalar copies' bits, forward and weight") {
  Stream stream;
  const StreamHandle& s = stream.s;
  const MathGuard tf32(cu::Conv2dMath::tf32);
  const auto start = std::chrono::steady_clock::now();
  // (in_channels not a multiple of 4: with one, the forward reads x channels-last, below)
  const std::vector<Conv2dShape> shapes = {
      {2, 5, 7, 7, 70, 2, 2, 1, 1, 1, 1},    // forward K = 20, M = 70; weight K = 128 (plane 64)
      {1, 7, 7, 11, 130, 2, 2, 1, 1, 0, 0},  // forward K = 28, M = 130; weight K = 60 (plane 60)
  };
  std::uint64_t seed = 2300;
  for (const Conv2dShape& sh : shapes) {
    seed += 10;
    INFO(describe(sh));
    // the aligned buffers, and one float off them the same values
    const Buffer x(sh.input_size(), seed, 0), w(sh.weight_size(), seed + 1, 0), dy(sh.output_size(), seed + 2, 0),
        y(sh.output_size(), seed + 3, 0), dw(sh.weight_size(), seed + 4, 0);
    const Buffer x1(sh.input_size(), seed, 1), w1(sh.weight_size(), seed + 1, 1), dy1(sh.output_size(), seed + 2, 1),
        y1(sh.output_size(), seed + 3, 1), dw1(sh.weight_size(), seed + 4, 1);
    for (const auto& [from, to] : {std::pair{&x, &x1}, {&w, &w1}, {&dy, &dy1}}) {
      const std::vector<float> values = from->values();
      std::copy(values.begin(), values.end(), to->data());
    }
    const std::vector<float> dw0 = dw.initial();
    for (const int tile : {0, 1, 2, 3}) {
      CAPTURE(tile);
      const TileGuard forced(tile);
      for (const std::int64_t slices : {std::int64_t(1), std::int64_t(3)}) {
        CAPTURE(slices);
        // aligned: the 16-byte copies, the model's bits
        cu::conv2d_forward(s, sh, x.data(), w.data(), nullptr, y.data());
        CHECK(emu::last_launch().kernel == std::string("conv2d_forward_tf32"));
        const void* forward_vector = emu::last_launch().function;
        dw.reset();
        cu::conv2d_backward_weight_split(s, sh, x.data(), dy.data(), dw.data(), slices);
        CHECK(emu::last_launch().kernel ==
              std::string(slices == 1 ? "conv2d_backward_weight_tf32" : "conv2d_backward_weight_sum"));
        const void* weight_vector = emu::last_launch().function;
        CHECK(bit_differences(y.values(), tf32_model(sh, x.data(), w.data(), nullptr)) == "");
        CHECK(bit_differences(dw.values(), tf32_weight_model(sh, x.data(), dy.data(), dw0, slices)) == "");
        // one float off: the scalar copies, another kernel, the same bits
        cu::conv2d_forward(s, sh, x1.data(), w1.data(), nullptr, y1.data());
        CHECK(emu::last_launch().function != forward_vector);
        std::copy(dw0.begin(), dw0.end(), dw1.data());
        cu::conv2d_backward_weight_split(s, sh, x1.data(), dy1.data(), dw1.data(), slices);
        if (slices == 1) CHECK(emu::last_launch().function != weight_vector);
        CHECK(bit_differences(y1.values(), y.values()) == "");
        CHECK(bit_differences(dw1.values(), dw.values()) == "");
        for (const Buffer* b : {&y, &dw, &y1, &dw1}) CHECK(b->guards_kept());
      }
    }
  }
  MESSAGE("TF32 16-byte A copies: ", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), " s");
}

// The TF32 forward where in_channels % 4 == 0, from channels-last copies (ChannelsLastForwardProblem:
// x transposed and the weights laid out by tap, two launches before the product, whose A and B
// then take 16-byte copies): the model's bits with k in (i, j, c) order, on every tile (M the
// pixels, N the out-channels), ref::'s within TF32, and other bits than the (c, i, j) order's.
// Shapes (stride 1 only: strided layers keep the NCHW path, checked at the end): padding, a
// non-square kernel and padding, 1x1, a channel count over one transpose tile with a K tail
// (K = 324), the 32-tap kernel, M and N tails.
TEST_CASE("emulated conv2d: TF32 forward from channels-last copies (in_channels % 4 == 0) gives its model's bits") {
  Stream stream;
  const StreamHandle& s = stream.s;
  const MathGuard tf32(cu::Conv2dMath::tf32);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Conv2dShape> shapes = {
      {3, 16, 9, 9, 33, 3, 3, 1, 1, 1, 1},  {1, 4, 5, 5, 65, 3, 3, 1, 1, 1, 1},  {2, 8, 9, 7, 17, 3, 3, 1, 1, 1, 1},
      {1, 4, 7, 11, 3, 2, 5, 1, 1, 1, 2},   {2, 8, 8, 8, 7, 1, 1, 1, 1, 0, 0},   {1, 36, 7, 5, 3, 3, 3, 1, 1, 0, 0},
      {1, 4, 3, 37, 2, 1, 32, 1, 1, 0, 3},  {1, 0, 3, 3, 5, 3, 3, 1, 1, 1, 1},  // no channel: y = the bias
  };
  std::uint64_t seed = 2700;
  std::size_t index = 0;
  for (const Conv2dShape& sh : shapes) {
    seed += 10;
    const std::size_t offset = index++ % 2;
    const bool with_bias = offset == 0;
    INFO(describe(sh), ", offset ", offset, ", bias ", with_bias);
    const Buffer x(sh.input_size(), seed, offset), w(sh.weight_size(), seed + 1, offset),
        bias(sh.out_channels, seed + 2, offset), y(sh.output_size(), seed + 3, offset, 5, 6);
    const float* b = with_bias ? bias.data() : nullptr;
    const std::vector<float> model = tf32_model(sh, x.data(), w.data(), b, ForwardOrder::tap_first);
    const std::int64_t pixels = sh.batch * sh.out_h() * sh.out_w();
    for (const int tile : {-1, 0, 1, 2, 3}) {
      CAPTURE(tile);
      const TileGuard forced(tile);
      y.reset();
      const std::size_t before = emu::launches();
      cu::conv2d_forward(s, sh, x.data(), w.data(), b, y.data());
      CHECK(emu::launches() - before == (sh.in_channels > 0 ? 3 : 1));  // the two copies (if any), the product
      CHECK(emu::last_launch().kernel == std::string("conv2d_forward_tf32_channels_last"));
      if (tile >= 0) {
        CHECK(emu::last_launch().grid.y == unsigned(tiling::ceil_div(pixels, tile >= 2 ? 128 : 64)));
        CHECK(emu::last_launch().grid.x == unsigned(tiling::ceil_div(sh.out_channels, tile % 2 == 1 ? 128 : 64)));
      }
      CHECK(y.guards_kept());
      CHECK(bit_differences(y.values(), model) == "");
    }
    // against ref: each product's inputs rounded by up to 2^-11 relative (2^-10 for the product)
    const std::vector<float> got = y.values();
    CHECK(tf32_forward_error(s, sh, x, w, b, y.initial(), got) <= 1.0);
    // the order is real: (c, i, j) gives other bits wherever K has more than one tap and channel;
    // with set_conv2d_channels_last(false) the forward reads x itself, in that order
    if (sh.kernel_h * sh.kernel_w > 1 && sh.in_channels > 0)
      CHECK(bit_differences(got, tf32_model(sh, x.data(), w.data(), b)) != "");
    {
      const ChannelsLastGuard off(false);
      const std::size_t before = emu::launches();
      cu::conv2d_forward(s, sh, x.data(), w.data(), b, y.data());
      CHECK(emu::launches() - before == 1);
      CHECK(emu::last_launch().kernel == std::string("conv2d_forward_tf32"));
      CHECK(bit_differences(y.values(), tf32_model(sh, x.data(), w.data(), b)) == "");
    }
    CHECK(cu::conv2d_channels_last());
  }
  // at a stride over 1 (either axis) the forward reads x itself (run 12 timed it faster there)
  for (const Conv2dShape& sh : {Conv2dShape{2, 8, 9, 7, 17, 3, 3, 2, 2, 1, 1}, Conv2dShape{2, 8, 8, 8, 7, 1, 1, 2, 2, 0, 0},
                                Conv2dShape{1, 4, 7, 11, 3, 2, 5, 1, 2, 1, 2}}) {
    INFO(describe(sh));
    const Buffer x(sh.input_size(), 2790, 0), w(sh.weight_size(), 2791, 0), y(sh.output_size(), 2792, 0, 5, 6);
    const std::size_t before = emu::launches();
    cu::conv2d_forward(s, sh, x.data(), w.data(), nullptr, y.data());
    CHECK(emu::launches() - before == 1);
    CHECK(emu::last_launch().kernel == std::string("conv2d_forward_tf32"));
    CHECK(bit_differences(y.values(), tf32_model(sh, x.data(), w.data(), nullptr)) == "");
  }
  MESSAGE("TF32 channels-last forward: ", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
          " s");
}

// TF32 backward data from the weights laid out by k (data_weight_transpose: a second launch
// before the product, whose A rows then take 16-byte copies): the model's bits on every tile, at
// stride 1, at stride 2 (classes of 4, 2, 2 and 1 taps, the last one's K of 2 a partial 16-byte
// copy), at a 1x1 stride 2 (three classes without taps) and with rows padded to a multiple of 4;
// the FP32 path reads w itself.
TEST_CASE("emulated conv2d: TF32 backward data from the weights laid out by k gives the model's bits") {
  Stream stream;
  const StreamHandle& s = stream.s;
  const ChannelsLastGuard off(false);  // (out_channels 4 and 12 would read dy channels-last, below)
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Conv2dShape> shapes = {
      {2, 70, 8, 8, 4, 3, 3, 1, 1, 1, 1},   // M = 70, K = 36
      {2, 130, 9, 7, 2, 3, 3, 2, 2, 1, 1},  // M = 130, classes' K 8, 4, 4, 2
      {1, 8, 7, 9, 12, 1, 1, 2, 2, 0, 0},   // K = 12 in one class, 0 in three
      {2, 9, 7, 7, 3, 3, 3, 1, 1, 1, 1},    // K = 27 in rows of 28: the last copy of a row partial
  };
  std::uint64_t seed = 2400;
  for (const Conv2dShape& sh : shapes) {
    seed += 10;
    INFO(describe(sh));
    const Buffer w(sh.weight_size(), seed, 0), dy(sh.output_size(), seed + 1, 0), dx(sh.input_size(), seed + 2, 0, 5, 6);
    const std::vector<float> model = tf32_data_model(sh, dy.data(), w.data());
    for (const int tile : {0, 1, 2, 3}) {
      CAPTURE(tile);
      const TileGuard forced(tile);
      {
        const MathGuard tf32(cu::Conv2dMath::tf32);
        const std::size_t before = emu::launches();
        cu::conv2d_backward_data(s, sh, dy.data(), w.data(), dx.data());
        CHECK(emu::launches() - before == 2);  // the copy by k, then the product
        CHECK(emu::last_launch().kernel == std::string("conv2d_backward_data_tf32"));
        CHECK(bit_differences(dx.values(), model) == "");
        CHECK(dx.guards_kept());
      }
      const std::size_t before = emu::launches();
      cu::conv2d_backward_data(s, sh, dy.data(), w.data(), dx.data());
      CHECK(emu::launches() - before == 1);
      CHECK(bit_differences(dx.values(), model) != "");  // FP32: other bits
    }
  }
  MESSAGE("TF32 backward data by k: ", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), " s");
}

// Backward data under TF32 where out_channels % 4 == 0, from channels-last copies
// (ChannelsLastDataProblem: the weights per stride class laid out by tap, dy transposed, then the
// product, one grid layer per class): the model's bits with k in (v_i, v_j, o) order on every
// tile, ref::'s within TF32. Shapes: stride 1 with padding, stride 2 (classes of 4, 2, 2 and 1
// taps), a 1x1 stride 2 (three classes without taps: zeros), stride 3 over a kernel of 2 (rows no
// output reads), a non-square kernel and stride, 36 out-channels (a K tail), M and N tails, a
// class without pixels (one input row at stride 2: its blocks return), no out-channel (zeros).
TEST_CASE("emulated conv2d: TF32 backward data from channels-last copies (out_channels % 4 == 0) gives its model's bits") {
  Stream stream;
  const StreamHandle& s = stream.s;
  const MathGuard tf32(cu::Conv2dMath::tf32);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Conv2dShape> shapes = {
      {3, 17, 9, 9, 16, 3, 3, 1, 1, 1, 1}, {2, 70, 9, 7, 8, 3, 3, 2, 2, 1, 1}, {1, 8, 7, 9, 12, 1, 1, 2, 2, 0, 0},
      {1, 2, 8, 8, 4, 2, 2, 3, 3, 0, 0},   {1, 3, 7, 11, 4, 2, 5, 1, 2, 1, 2}, {1, 130, 5, 5, 36, 3, 3, 1, 1, 1, 1},
      {1, 4, 1, 5, 4, 1, 1, 2, 2, 0, 0},   {1, 3, 3, 3, 0, 3, 3, 1, 1, 1, 1},
  };
  std::uint64_t seed = 2800;
  std::size_t index = 0;
  for (const Conv2dShape& sh : shapes) {
    seed += 10;
    const std::size_t offset = index++ % 2;
    INFO(describe(sh), ", offset ", offset);
    const Buffer w(sh.weight_size(), seed, offset), dy(sh.output_size(), seed + 1, offset),
        dx(sh.input_size(), seed + 2, offset, 5, 6);
    const std::vector<float> model = tf32_data_model(sh, dy.data(), w.data(), DataOrder::tap_first);
    const std::int64_t widest = sh.batch * tiling::ceil_div(sh.in_h, sh.stride_h) * tiling::ceil_div(sh.in_w, sh.stride_w);
    for (const int tile : {-1, 0, 1, 2, 3}) {
      CAPTURE(tile);
      const TileGuard forced(tile);
      dx.reset();
      const std::size_t before = emu::launches();
      cu::conv2d_backward_data(s, sh, dy.data(), w.data(), dx.data());
      CHECK(emu::launches() - before == (sh.out_channels > 0 ? 3 : 1));  // the weights, dy (if any), the product
      CHECK(emu::last_launch().kernel == std::string("conv2d_backward_data_tf32_channels_last"));
      CHECK(emu::last_launch().grid.z == unsigned(sh.stride_h * sh.stride_w));
      if (tile >= 0) {
        CHECK(emu::last_launch().grid.y == unsigned(tiling::ceil_div(widest, tile >= 2 ? 128 : 64)));
        CHECK(emu::last_launch().grid.x == unsigned(tiling::ceil_div(sh.in_channels, tile % 2 == 1 ? 128 : 64)));
      }
      CHECK(dx.guards_kept());
      CHECK(bit_differences(dx.values(), model) == "");
    }
    // against ref: each product's inputs rounded by up to 2^-11 relative (2^-10 for the product)
    const std::vector<float> got = dx.values();
    std::vector<float> want = dx.initial();
    ref::conv2d_backward_data<float>(s, sh, dy.data(), w.data(), want.data());
    std::vector<double> magnitude(std::size_t(sh.input_size()));
    const std::vector<double> ady = absolute(dy.values()), aw = absolute(w.values());
    ref::conv2d_backward_data<double>(s, sh, ady.data(), aw.data(), magnitude.data());
    CHECK(tf32_error_in_bounds(got, want, magnitude, sh.out_channels * sh.kernel_h * sh.kernel_w) <= 1.0);
    // with set_conv2d_channels_last(false): the weights by k and dy itself, in (o, v_i, v_j) order
    const ChannelsLastGuard off(false);
    cu::conv2d_backward_data(s, sh, dy.data(), w.data(), dx.data());
    CHECK(emu::last_launch().kernel == std::string("conv2d_backward_data_tf32"));
    CHECK(bit_differences(dx.values(), tf32_data_model(sh, dy.data(), w.data())) == "");
  }
  MESSAGE("TF32 channels-last backward data: ",
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), " s");
}

// The TF32 weight gradient where in_channels % 32 == 0, from a channels-last copy of x
// (ChannelsLastWeightProblem: x transposed, each 32 channels in the B tile's slot order and
// rounded, one launch before the product, whose B then takes 16-byte copies with one bounds check
// each): every sum is the NCHW path's, in the same order, so the same bits as the model and as
// set_conv2d_channels_last(false), on every tile with one K slice, and with three and the public
// function's slices. Shapes: padding, stride 2 (M and N tails: N = 9 x 64 over 128-column tiles), 1x1, a
// non-square kernel and stride, the 32-tap kernel, three groups of 32 channels, the batch split
// into K slices inside a sample. Where in_channels % 32 != 0 or dy's plane is not a multiple of 4
// (no 16-byte A copies) the NCHW path runs.
TEST_CASE("emulated conv2d: TF32 weight gradient from a channels-last copy (in_channels % 32 == 0) keeps the bits") {
  Stream stream;
  const StreamHandle& s = stream.s;
  const MathGuard tf32(cu::Conv2dMath::tf32);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Conv2dShape> shapes = {
      {2, 32, 6, 6, 20, 3, 3, 1, 1, 1, 1},  {1, 64, 5, 7, 3, 3, 3, 2, 2, 1, 1}, {2, 32, 4, 4, 70, 1, 1, 1, 1, 0, 0},
      {1, 32, 7, 9, 5, 2, 5, 1, 2, 1, 2},   {1, 32, 3, 37, 2, 1, 32, 1, 1, 0, 3}, {3, 96, 4, 4, 8, 3, 3, 1, 1, 1, 1},
  };
  std::uint64_t seed = 2900;
  std::size_t index = 0;
  for (const Conv2dShape& sh : shapes) {
    seed += 10;
    const std::size_t offset = 4 * (index++ % 2);  // (dy's 16-byte copies need it aligned)
    INFO(describe(sh), ", offset ", offset);
    const Buffer x(sh.input_size(), seed, offset), dy(sh.output_size(), seed + 1, offset),
        dw(sh.weight_size(), seed + 2, offset);
    const std::int64_t depth = sh.batch * sh.out_h() * sh.out_w();
    const std::int64_t columns = sh.in_channels * sh.kernel_h * sh.kernel_w;
    for (const std::int64_t asked : {std::int64_t(0), std::int64_t(1), std::int64_t(3)}) {
      const std::int64_t slices = tiling::split_k(depth, asked == 0 ? tiling::weight_split_slices(sh) : asked).slices;
      const std::vector<float> model = tf32_weight_model(sh, x.data(), dy.data(), dw.initial(), slices);
      // every tile with one slice; the tile the rule picks with several
      for (const int tile : asked == 1 ? std::vector<int>{-1, 0, 1, 2, 3} : std::vector<int>{-1}) {
        CAPTURE(asked);
        CAPTURE(slices);
        CAPTURE(tile);
        const TileGuard forced(tile);
        dw.reset();
        const std::size_t before = emu::launches();
        if (asked == 0)
          cu::conv2d_backward_weight(s, sh, x.data(), dy.data(), dw.data());
        else
          cu::conv2d_backward_weight_split(s, sh, x.data(), dy.data(), dw.data(), asked);
        // the copy of x, the product, the partials' sum (several slices)
        CHECK(emu::launches() - before == (slices > 1 ? 3u : 2u));
        if (slices == 1) {
          CHECK(emu::last_launch().kernel == std::string("conv2d_backward_weight_tf32_channels_last"));
          if (tile >= 0) {
            CHECK(emu::last_launch().grid.y == unsigned(tiling::ceil_div(sh.out_channels, tile >= 2 ? 128 : 64)));
            CHECK(emu::last_launch().grid.x == unsigned(tiling::ceil_div(columns, tile % 2 == 1 ? 128 : 64)));
          }
        }
        CHECK(dw.guards_kept());
        CHECK(bit_differences(dw.values(), model) == "");
      }
      // with set_conv2d_channels_last(false): x itself, one launch fewer, the same bits
      const ChannelsLastGuard off(false);
      dw.reset();
      const std::size_t before = emu::launches();
      cu::conv2d_backward_weight_split(s, sh, x.data(), dy.data(), dw.data(), slices);
      CHECK(emu::launches() - before == (slices > 1 ? 2u : 1u));
      if (slices == 1) CHECK(emu::last_launch().kernel == std::string("conv2d_backward_weight_tf32"));
      CHECK(bit_differences(dw.values(), model) == "");
    }
  }
  // where it does not apply: 48 channels, and a 3 x 3 plane of dy (no 16-byte A copies)
  for (const Conv2dShape& sh : {Conv2dShape{1, 48, 4, 4, 8, 3, 3, 1, 1, 1, 1}, Conv2dShape{1, 32, 3, 3, 8, 3, 3, 1, 1, 1, 1}}) {
    INFO(describe(sh));
    const Buffer x(sh.input_size(), 2990, 0), dy(sh.output_size(), 2991, 0), dw(sh.weight_size(), 2992, 0);
    const std::size_t before = emu::launches();
    cu::conv2d_backward_weight_split(s, sh, x.data(), dy.data(), dw.data(), 1);
    CHECK(emu::launches() - before == 1);
    CHECK(emu::last_launch().kernel == std::string("conv2d_backward_weight_tf32"));
    CHECK(bit_differences(dw.values(), tf32_weight_model(sh, x.data(), dy.data(), dw.initial(), 1)) == "");
  }
  MESSAGE("TF32 channels-last weight: ", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
          " s");
}


// The weight gradient in Winograd's F(2x2, 3x3) domain: on 3x3 stride-1 padding-1 layers with odd
// and even planes (a last tile row or column half outside), channel counts past one and two tiles
// of 64, one and several K slices (a part of 2048 tiles), and the batch in parts (the launch limit
// lowered), against ref:: within 32 times the direct product's bound (the transforms add up to 4
// values on each side and G^T M G up to 9: a wrong sign or element is off by the values
// themselves); the same bits twice; other shapes keep the direct product; automatic by default.
TEST_CASE("emulated conv2d: the Winograd weight gradient matches ref::, deterministically, and only where it applies") {
  const auto start = std::chrono::steady_clock::now();
  CHECK(cu::conv2d_weight_algorithm() == cu::Conv2dWeightAlgorithm::automatic);
  const WeightAlgorithmGuard winograd(cu::Conv2dWeightAlgorithm::winograd);
  struct Case {
    Conv2dShape shape;
    std::int64_t launch_elements;  // 0: the default limit
  };
  const Case cases[] = {
      {{1, 1, 1, 1, 1, 3, 3, 1, 1, 1, 1}, 0},     // one pixel: one tile, three quarters of it outside
      {{2, 3, 5, 7, 2, 3, 3, 1, 1, 1, 1}, 0},     // odd planes
      {{3, 17, 4, 4, 5, 3, 3, 1, 1, 1, 1}, 0},    // even plane, 17 in-channels
      {{1, 5, 6, 3, 65, 3, 3, 1, 1, 1, 1}, 0},    // 65 out-channels: two tiles of M
      {{1, 65, 2, 2, 3, 3, 3, 1, 1, 1, 1}, 0},    // 65 in-channels: two tiles of N
      {{2, 2, 64, 64, 3, 3, 3, 1, 1, 1, 1}, 0},   // 2048 tiles: two K slices
      {{3, 4, 5, 6, 7, 3, 3, 1, 1, 1, 1}, 7 * 9},  // the launch limit: one image (9 tiles, 7 channels) a part
  };
  std::uint64_t seed = 4100;
  double worst = 0;  // the largest error / the direct bound
  for (const Case& c : cases) {
    const Conv2dShape& sh = c.shape;
    INFO(describe(sh));
    cu::set_conv2d_launch_elements(c.launch_elements);
    Stream stream;  // a workspace of its own: its size says how the product was cut
    const StreamHandle& s = stream.s;
    seed += 10;
    const Buffer x(sh.input_size(), seed, 1), dy(sh.output_size(), seed + 1, 0), dw(sh.weight_size(), seed + 2, 1);
    // ref::'s dw and each element's sum of |terms|, including the initial |dw|
    const auto [want, magnitude] = expected_weight_gradient(s, sh, x, dy, dw);
    const std::size_t before = emu::launches();
    cu::conv2d_backward_weight(s, sh, x.data(), dy.data(), dw.data());
    const std::int64_t tiles_per_image = tiling::ceil_div(sh.out_h(), 2) * tiling::ceil_div(sh.out_w(), 2);
    const std::int64_t parts = c.launch_elements == 0 ? 1 : sh.batch;
    CHECK(emu::launches() - before == 4u * std::size_t(parts));  // two transforms, the product, the output
    CHECK(emu::last_launch().kernel == std::string("conv2d_backward_weight_winograd_output"));
    // U (16 O T) + V (16 T C) + the partials (slices x 16 O C) of a part's T tiles: two K slices
    // from 2048 tiles (at least 1024 each), else one
    const std::int64_t t = tiles_per_image * (sh.batch / parts), slices = t >= 2048 ? 2 : 1;
    const std::int64_t floats = 16 * (sh.out_channels * t + t * sh.in_channels + slices * sh.out_channels * sh.in_channels);
    CHECK(stream.workspace.capacity() == std::size_t((floats * 4 + 63) / 64 * 64));
    CHECK(dw.guards_kept());
    const std::vector<float> got = dw.values();
    const double error = error_in_bounds(got, want, magnitude, sh.batch * sh.out_h() * sh.out_w() + 1);
    worst = std::max(worst, error);
    CHECK(error <= 32.0);
    dw.reset();
    cu::conv2d_backward_weight(s, sh, x.data(), dy.data(), dw.data());
    CHECK(bit_differences(dw.values(), got) == "");
  }
  cu::set_conv2d_launch_elements(0);
  // In TF32 the 16 products run on the (emulated) tensor cores: within 32 times TF32's bound.
  {
    const MathGuard tf32(cu::Conv2dMath::tf32);
    const Conv2dShape sh{2, 65, 5, 7, 66, 3, 3, 1, 1, 1, 1};
    Stream stream;
    const StreamHandle& s = stream.s;
    const Buffer x(sh.input_size(), 41, 1), dy(sh.output_size(), 42, 0), dw(sh.weight_size(), 43, 1);
    // ref::'s dw and each element's sum of |terms|, including the initial |dw|
    const auto [want, magnitude] = expected_weight_gradient(s, sh, x, dy, dw);
    cu::conv2d_backward_weight(s, sh, x.data(), dy.data(), dw.data());
    CHECK(emu::last_launch().kernel == std::string("conv2d_backward_weight_winograd_output"));
    const std::vector<float> tf32_got = dw.values();
    CHECK(tf32_error_in_bounds(tf32_got, want, magnitude, sh.batch * sh.out_h() * sh.out_w() + 1) <= 32.0);
    // the products really ran in TF32: FP32's bits differ
    dw.reset();
    {
      const MathGuard fp32(cu::Conv2dMath::fp32);
      cu::conv2d_backward_weight(s, sh, x.data(), dy.data(), dw.data());
    }
    CHECK(bit_differences(dw.values(), tf32_got) != "");
  }
  // Not 3x3 at stride 1 and padding 1: the direct product.
  Stream stream;
  const StreamHandle& s = stream.s;
  for (const Conv2dShape& sh : {Conv2dShape{1, 3, 6, 6, 2, 3, 3, 2, 2, 1, 1}, Conv2dShape{1, 3, 6, 6, 2, 3, 3, 1, 1, 0, 0},
                                Conv2dShape{1, 3, 6, 6, 2, 1, 1, 1, 1, 0, 0}}) {
    INFO(describe(sh));
    const Buffer x(sh.input_size(), 17, 0), dy(sh.output_size(), 18, 0), dw(sh.weight_size(), 19, 0);
    cu::conv2d_backward_weight(s, sh, x.data(), dy.data(), dw.data());
    CHECK(emu::last_launch().kernel == std::string("conv2d_backward_weight"));
  }
  MESSAGE("Winograd weight: ", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
          " s; the largest error, in units of the direct product's bound: ", worst);
}

// Conv2dWeightAlgorithm::automatic (the default) takes Winograd's weight gradient where run 12
// timed it faster: 3x3 stride-1 padding-1 layers with 64 or more channels in and out, in TF32 only
// on planes of at most 16 x 16 (256 outputs); the direct product elsewhere, and everywhere under
// direct. The launch names say which ran.
TEST_CASE("emulated conv2d: the automatic weight algorithm takes Winograd where it was measured faster") {
  Stream stream;
  const StreamHandle& s = stream.s;
  CHECK(cu::conv2d_weight_algorithm() == cu::Conv2dWeightAlgorithm::automatic);
  const std::string winograd = "conv2d_backward_weight_winograd_output";
  struct Case {
    Conv2dShape shape;
    cu::Conv2dMath math;
    std::string kernel;  // the last launch of the automatic choice
  };
  const Case cases[] = {
      {{1, 64, 4, 4, 64, 3, 3, 1, 1, 1, 1}, cu::Conv2dMath::fp32, winograd},
      {{1, 64, 4, 4, 64, 3, 3, 1, 1, 1, 1}, cu::Conv2dMath::tf32, winograd},
      {{1, 64, 16, 16, 64, 3, 3, 1, 1, 1, 1}, cu::Conv2dMath::tf32, winograd},   // 256 outputs
      {{1, 64, 17, 16, 64, 3, 3, 1, 1, 1, 1}, cu::Conv2dMath::tf32, "conv2d_backward_weight_tf32_channels_last"},
      {{1, 64, 17, 16, 64, 3, 3, 1, 1, 1, 1}, cu::Conv2dMath::fp32, winograd},
      {{1, 32, 4, 4, 64, 3, 3, 1, 1, 1, 1}, cu::Conv2dMath::fp32, "conv2d_backward_weight"},   // 32 in
      {{1, 64, 4, 4, 63, 3, 3, 1, 1, 1, 1}, cu::Conv2dMath::fp32, "conv2d_backward_weight"},   // 63 out
      {{1, 64, 8, 8, 64, 3, 3, 2, 2, 1, 1}, cu::Conv2dMath::fp32, "conv2d_backward_weight"},   // stride 2
      {{1, 64, 4, 4, 64, 1, 1, 1, 1, 0, 0}, cu::Conv2dMath::fp32, "conv2d_backward_weight"},   // 1x1
  };
  for (const Case& c : cases) {
    const Conv2dShape& sh = c.shape;
    INFO(describe(sh), ", tf32 ", c.math == cu::Conv2dMath::tf32);
    const MathGuard math(c.math);
    const Buffer x(sh.input_size(), 51, 0), dy(sh.output_size(), 52, 0), dw(sh.weight_size(), 53, 0);
    cu::conv2d_backward_weight(s, sh, x.data(), dy.data(), dw.data());
    CHECK(emu::last_launch().kernel == c.kernel);
    const WeightAlgorithmGuard direct(cu::Conv2dWeightAlgorithm::direct);
    cu::conv2d_backward_weight(s, sh, x.data(), dy.data(), dw.data());
    CHECK(emu::last_launch().kernel != winograd);
  }
}

// On small integers (x, dy and dw in -2..2) every step of the Winograd path is exact: U's and V's
// entries are at most 8 in size (TF32 holds them exactly too), their products' sums stay under
// 2^24, and G^T M G only halves. So it must give ref::'s bits, in FP32 and TF32, across K slices
// (2048 tiles: two slices of 1024) and batch parts (the launch limit lowered to two images): an
// error at a slice boundary or a part's offset, which a rounding bound could hide, shows here.
TEST_CASE("emulated conv2d: the Winograd weight gradient is exact on small integers, across slices and parts") {
  const auto start = std::chrono::steady_clock::now();
  const WeightAlgorithmGuard winograd(cu::Conv2dWeightAlgorithm::winograd);
  struct Case {
    Conv2dShape shape;
    std::int64_t launch_elements;  // 0: the default limit
    std::int64_t parts;
  };
  // 32 x 32 tiles an image; 3 out-channels: 3 x 1024 elements an image's U plane, so two images a
  // part (two parts), 2048 tiles a part (two slices). (One case: each takes ~25 s emulated.)
  const Case cases[] = {{{4, 2, 64, 64, 3, 3, 3, 1, 1, 1, 1}, 2 * 3 * 1024, 2}};
  std::mt19937 gen(77);
  std::uniform_int_distribution<int> small(-2, 2);
  const auto integers = [&](std::int64_t n) {
    std::vector<float> v(std::size_t(n), 0.0f);
    for (float& value : v) value = float(small(gen));
    return v;
  };
  for (const Case& c : cases) {
    const Conv2dShape& sh = c.shape;
    INFO(describe(sh));
    const std::vector<float> x = integers(sh.input_size()), dy = integers(sh.output_size()),
                             dw0 = integers(sh.weight_size());
    std::vector<float> want = dw0;
    ref::conv2d_backward_weight<float>(StreamHandle{}, sh, x.data(), dy.data(), want.data());
    for (const cu::Conv2dMath math : {cu::Conv2dMath::fp32, cu::Conv2dMath::tf32}) {
      CAPTURE(int(math));
      const MathGuard chosen(math);
      cu::set_conv2d_launch_elements(c.launch_elements);
      Stream stream;
      std::vector<float> got = dw0;
      const std::size_t before = emu::launches();
      cu::conv2d_backward_weight(stream.s, sh, x.data(), dy.data(), got.data());
      cu::set_conv2d_launch_elements(0);
      CHECK(emu::launches() - before == 4u * std::size_t(c.parts));
      // two slices of a part's 2048 tiles: U, V and 2 x 16 partial M's
      const std::int64_t t = 2048, floats = 16 * (sh.out_channels * t + t * sh.in_channels + 2 * 3 * 2);
      CHECK(stream.workspace.capacity() == std::size_t((floats * 4 + 63) / 64 * 64));
      CHECK(bit_differences(got, want) == "");
    }
  }
  MESSAGE("Winograd weight, exact: ", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
          " s");
}

namespace {

// The Winograd weight gradient F(2x2, 3x3) on the host, in double: dW = G^T (sum over tiles t of
// U_t .* V_t) G with U_t = A dy_t A^T and V_t = B^T x_t B (x_t: the 4 x 4 patch from input row
// 2 ty - 1, zeros outside; dy_t: the 2 x 2 block at 2 ty, zeros past the output), each U and V
// value passed through `round` first (conv2d.cu's transforms compute the same combinations). On
// integer inputs every step is exact, so the rounding of U and V is the only difference from ref::.
template <class Round>
std::vector<float> winograd_weight_model(const Conv2dShape& sh, const std::vector<float>& x,
                                         const std::vector<float>& dy, Round round) {
  const std::int64_t rows = tiling::ceil_div(sh.out_h(), 2), cols = tiling::ceil_div(sh.out_w(), 2);
  std::vector<double> m(std::size_t(sh.out_channels * sh.in_channels * 16), 0.0);
  for (std::int64_t b = 0; b < sh.batch; ++b)
    for (std::int64_t ty = 0; ty < rows; ++ty)
      for (std::int64_t tx = 0; tx < cols; ++tx)
        for (std::int64_t c = 0; c < sh.in_channels; ++c) {
          double d[4][4], bd[4][4], v[4][4];
          for (int r = 0; r < 4; ++r)
            for (int q = 0; q < 4; ++q) {
              const std::int64_t h = 2 * ty - 1 + r, w = 2 * tx - 1 + q;
              d[r][q] = h >= 0 && h < sh.in_h && w >= 0 && w < sh.in_w
                            ? x[std::size_t(((b * sh.in_channels + c) * sh.in_h + h) * sh.in_w + w)]
                            : 0.0;
            }
          for (int q = 0; q < 4; ++q)
            bd[0][q] = d[0][q] - d[2][q], bd[1][q] = d[1][q] + d[2][q], bd[2][q] = d[2][q] - d[1][q],
            bd[3][q] = d[1][q] - d[3][q];
          for (int r = 0; r < 4; ++r) {
            const double e[4] = {bd[r][0] - bd[r][2], bd[r][1] + bd[r][2], bd[r][2] - bd[r][1], bd[r][1] - bd[r][3]};
            for (int q = 0; q < 4; ++q) v[r][q] = round(e[q]);
          }
          for (std::int64_t o = 0; o < sh.out_channels; ++o) {
            double gt[2][2], ag[4][2];
            for (int r = 0; r < 2; ++r)
              for (int q = 0; q < 2; ++q) {
                const std::int64_t h = 2 * ty + r, w = 2 * tx + q;
                gt[r][q] = h < sh.out_h() && w < sh.out_w()
                               ? dy[std::size_t(((b * sh.out_channels + o) * sh.out_h() + h) * sh.out_w() + w)]
                               : 0.0;
              }
            for (int q = 0; q < 2; ++q)
              ag[0][q] = gt[0][q], ag[1][q] = gt[0][q] + gt[1][q], ag[2][q] = gt[0][q] - gt[1][q], ag[3][q] = -gt[1][q];
            for (int r = 0; r < 4; ++r) {
              const double u[4] = {ag[r][0], ag[r][0] + ag[r][1], ag[r][0] - ag[r][1], -ag[r][1]};
              for (int q = 0; q < 4; ++q) m[std::size_t((o * sh.in_channels + c) * 16 + 4 * r + q)] += round(u[q]) * v[r][q];
            }
          }
        }
  std::vector<float> dw(std::size_t(sh.weight_size()));
  for (std::int64_t i = 0; i < sh.out_channels * sh.in_channels; ++i) {
    const double* mm = &m[std::size_t(i * 16)];
    double gm[3][4];
    for (int q = 0; q < 4; ++q)
      gm[0][q] = mm[q] + 0.5 * (mm[4 + q] + mm[8 + q]), gm[1][q] = 0.5 * (mm[4 + q] - mm[8 + q]),
      gm[2][q] = 0.5 * (mm[4 + q] + mm[8 + q]) + mm[12 + q];
    for (int r = 0; r < 3; ++r) {
      const double w[3] = {gm[r][0] + 0.5 * (gm[r][1] + gm[r][2]), 0.5 * (gm[r][1] - gm[r][2]),
                           0.5 * (gm[r][1] + gm[r][2]) + gm[r][3]};
      for (int q = 0; q < 3; ++q) dw[std::size_t(i * 9 + 3 * r + q)] = float(w[q]);
    }
  }
  return dw;
}

}  // namespace

// Under TF32 the transforms write U and V rounded to TF32 and the GEMM's K steps do not round them
// again (WinogradWeightProblem::kRoundedA, kRoundedB); in FP32 nothing is rounded. On inputs where
// one operand is exact in FP32 but not in TF32 (integers of 12 bits, whose transform's sums of
// four need up to 14) and the other is small integers (-1..1 in, exact in both), every other step
// is exact, so TF32 gives the model with U and V rounded once, bit for bit (either left unrounded
// differs), and FP32 gives ref::'s exact result. Wide x (V rounds), then wide dy (U rounds); on
// the scalar-A and the 16-byte-A kernels (T = 18 and 12 tiles: T % 4 decides).
TEST_CASE("emulated conv2d: the TF32 Winograd weight gradient rounds its operands once, in the transforms") {
  const WeightAlgorithmGuard winograd(cu::Conv2dWeightAlgorithm::winograd);
  std::mt19937 gen(91);
  std::uniform_int_distribution<int> wide(2049, 4095), unit(-1, 1);
  const auto wide_value = [&] { return float(wide(gen) * (unit(gen) < 0 ? -1 : 1)); };
  const auto unit_value = [&] { return float(unit(gen)); };
  for (const bool wide_x : {true, false})
    for (const Conv2dShape& sh : {Conv2dShape{2, 3, 6, 6, 2, 3, 3, 1, 1, 1, 1}, Conv2dShape{1, 5, 5, 7, 3, 3, 3, 1, 1, 1, 1}}) {
      INFO(describe(sh), wide_x ? ", wide x" : ", wide dy");
      std::vector<float> x(std::size_t(sh.input_size())), dy(std::size_t(sh.output_size()));
      for (float& v : x) v = wide_x ? wide_value() : unit_value();
      for (float& v : dy) v = wide_x ? unit_value() : wide_value();
      const std::vector<float> exact = winograd_weight_model(sh, x, dy, [](double v) { return v; });
      const std::vector<float> rounded =
          winograd_weight_model(sh, x, dy, [](double v) { return double(tiling::tf32_round(float(v))); });
      REQUIRE(bit_differences(exact, rounded) != "");  // the case can tell rounded from not
      std::vector<float> want(std::size_t(sh.weight_size()), 0.0f);
      ref::conv2d_backward_weight<float>(StreamHandle{}, sh, x.data(), dy.data(), want.data());
      CHECK(bit_differences(exact, want) == "");  // (the model is ref:: where nothing rounds)
      for (const cu::Conv2dMath math : {cu::Conv2dMath::fp32, cu::Conv2dMath::tf32}) {
        CAPTURE(int(math));
        const MathGuard chosen(math);
        Stream stream;
        std::vector<float> got(std::size_t(sh.weight_size()), 0.0f);
        cu::conv2d_backward_weight(stream.s, sh, x.data(), dy.data(), got.data());
        CHECK(emu::last_launch().kernel == std::string("conv2d_backward_weight_winograd_output"));
        CHECK(bit_differences(got, math == cu::Conv2dMath::tf32 ? rounded : exact) == "");
      }
    }
}

namespace {

class ForwardAlgorithmGuard {
 public:
  explicit ForwardAlgorithmGuard(cu::Conv2dForwardAlgorithm algorithm) { cu::set_conv2d_forward_algorithm(algorithm); }
  ~ForwardAlgorithmGuard() { cu::set_conv2d_forward_algorithm(cu::Conv2dForwardAlgorithm::direct); }
  ForwardAlgorithmGuard(const ForwardAlgorithmGuard&) = delete;
  ForwardAlgorithmGuard& operator=(const ForwardAlgorithmGuard&) = delete;
};

// What one Winograd forward or backward data asks of the workspace (winograd_forward_launch): U
// (16 O C) and a part's V (16 in x T) and M (16 out x T), T = the part's tiles.
std::size_t winograd_forward_workspace(const Conv2dShape& sh, std::int64_t images_per_part, bool data) {
  const std::int64_t in = data ? sh.out_channels : sh.in_channels, out = data ? sh.in_channels : sh.out_channels;
  const std::int64_t t = images_per_part * tiling::ceil_div(sh.out_h(), 2) * tiling::ceil_div(sh.out_w(), 2);
  const std::int64_t floats = 16 * (out * in + in * t + out * t);
  return std::size_t((floats * 4 + 63) / 64 * 64);
}

}  // namespace

// The forward and backward data in Winograd's F(2x2, 3x3) domain (set_conv2d_forward_algorithm):
// on 3x3 stride-1 padding-1 layers with odd and even planes (a last tile row or column half
// outside, not stored), channel counts past one tile of 64 in either direction, with and without
// the bias, the batch in parts (the launch limit lowered), against ref:: within 32 times the direct
// product's bound, FP32 and TF32 (16-byte and scalar A copies), the guards kept; on small integers
// every step is exact (U's halves are quarters), so there the same bits as ref::: a wrong tile
// offset, flip or part offset shows. The same bits twice; other shapes and the default stay direct.
TEST_CASE("emulated conv2d: the Winograd forward and backward data match ref::, and only where they apply") {
  const auto start = std::chrono::steady_clock::now();
  CHECK(cu::conv2d_forward_algorithm() == cu::Conv2dForwardAlgorithm::direct);
  const ForwardAlgorithmGuard winograd(cu::Conv2dForwardAlgorithm::winograd);
  struct Case {
    Conv2dShape shape;
    std::int64_t launch_elements;  // 0: the default limit
    cu::Conv2dMath math;
    bool integers;  // small integers: exact
  };
  const auto fp32 = cu::Conv2dMath::fp32, tf32 = cu::Conv2dMath::tf32;
  const Case cases[] = {
      {{1, 1, 1, 1, 1, 3, 3, 1, 1, 1, 1}, 0, fp32, false},     // one pixel: one tile, three quarters outside
      {{2, 3, 5, 7, 2, 3, 3, 1, 1, 1, 1}, 0, fp32, false},     // odd planes
      {{3, 17, 4, 4, 5, 3, 3, 1, 1, 1, 1}, 0, fp32, false},    // even plane, 17 in-channels
      {{1, 5, 6, 3, 65, 3, 3, 1, 1, 1, 1}, 0, fp32, false},    // 65 out-channels: two tiles of M (forward)
      {{1, 65, 3, 2, 3, 3, 3, 1, 1, 1, 1}, 0, fp32, false},    // 65 in-channels: two tiles of M (data)
      {{3, 4, 5, 6, 7, 3, 3, 1, 1, 1, 1}, 7 * 9, fp32, true},  // the launch limit: one image a part
      {{3, 4, 5, 6, 7, 3, 3, 1, 1, 1, 1}, 2 * 7 * 9, fp32, true},  // two images, then a last part of one
      {{2, 8, 9, 7, 6, 3, 3, 1, 1, 1, 1}, 0, fp32, true},      // exact, odd plane
      {{2, 8, 9, 7, 6, 3, 3, 1, 1, 1, 1}, 0, tf32, true},      // exact in TF32 too (16-byte A: 8 and 6 % 4)
      {{2, 12, 5, 7, 66, 3, 3, 1, 1, 1, 1}, 0, tf32, false},   // TF32, 16-byte A forward, scalar A data
      {{1, 66, 4, 5, 12, 3, 3, 1, 1, 1, 1}, 0, tf32, false},   // TF32, scalar A forward, 16-byte A data
  };
  std::uint64_t seed = 5200;
  double worst = 0;  // the largest error / the direct bound, FP32's random cases
  std::mt19937 gen(78);
  std::uniform_int_distribution<int> small(-2, 2);
  for (const Case& c : cases) {
    const Conv2dShape& sh = c.shape;
    INFO(describe(sh), ", tf32 ", c.math == tf32, ", integers ", c.integers);
    const MathGuard math(c.math);
    cu::set_conv2d_launch_elements(c.launch_elements);
    // images a part: the launch limit over the wider of V's and M's planes (9 tiles x 7 channels)
    const std::int64_t per_part = c.launch_elements == 0 ? sh.batch : c.launch_elements / (7 * 9);
    const std::int64_t parts = (sh.batch + per_part - 1) / per_part;
    seed += 10;
    const Buffer x(sh.input_size(), seed, 1), w(sh.weight_size(), seed + 1, 0), bias(sh.out_channels, seed + 2, 1),
        dy(sh.output_size(), seed + 3, 0), y(sh.output_size(), seed + 4, 1, 5, 6), dx(sh.input_size(), seed + 5, 0, 5, 6);
    if (c.integers)
      for (const auto& [buffer, n] : {std::pair{&x, sh.input_size()}, std::pair{&w, sh.weight_size()},
                                      std::pair{&bias, sh.out_channels}, std::pair{&dy, sh.output_size()}})
        for (std::int64_t i = 0; i < n; ++i) buffer->data()[i] = float(small(gen));
    // exact on integers, else within 32 times the direct product's bound (FP32's or TF32's)
    const auto check_result = [&](const std::vector<float>& got, const std::vector<float>& want,
                                  const std::vector<double>& magnitude, std::int64_t terms) {
      if (c.integers) {
        CHECK(bit_differences(got, want) == "");
      } else if (c.math == tf32) {
        CHECK(tf32_error_in_bounds(got, want, magnitude, terms) <= 32.0);
      } else {
        const double error = error_in_bounds(got, want, magnitude, terms);
        worst = std::max(worst, error);
        CHECK(error <= 32.0);
      }
    };
    const bool with_bias = seed % 20 == 10;  // every other case
    const float* b = with_bias ? bias.data() : nullptr;
    // forward
    {
      std::vector<float> want = y.initial();
      ref::conv2d_forward<float>(StreamHandle{}, sh, x.data(), w.data(), b, want.data());
      std::vector<double> magnitude(std::size_t(sh.output_size()));
      const std::vector<double> ax = absolute(x.values()), aw = absolute(w.values()), ab = absolute(bias.values());
      ref::conv2d_forward<double>(StreamHandle{}, sh, ax.data(), aw.data(), with_bias ? ab.data() : nullptr,
                                  magnitude.data());
      Stream stream;
      const std::size_t before = emu::launches();
      cu::conv2d_forward(stream.s, sh, x.data(), w.data(), b, y.data());
      CHECK(emu::launches() - before == 1u + 3u * std::size_t(parts));  // U, then per part V, the product, Y
      CHECK(emu::last_launch().kernel == std::string("conv2d_forward_winograd_output"));
      CHECK(emu::recent_launches(2).at(0).kernel ==
            std::string(c.math == tf32 ? "conv2d_forward_winograd_tf32" : "conv2d_forward_winograd"));
      CHECK(stream.workspace.capacity() == winograd_forward_workspace(sh, per_part, false));
      CHECK(y.guards_kept());
      const std::vector<float> got = y.values();
      check_result(got, want, magnitude, sh.in_channels * 9 + 1);
      y.reset();
      cu::conv2d_forward(stream.s, sh, x.data(), w.data(), b, y.data());
      CHECK(bit_differences(y.values(), got) == "");
    }
    // backward data
    {
      std::vector<float> want = dx.initial();
      ref::conv2d_backward_data<float>(StreamHandle{}, sh, dy.data(), w.data(), want.data());
      std::vector<double> magnitude(std::size_t(sh.input_size()));
      const std::vector<double> ady = absolute(dy.values()), aw = absolute(w.values());
      ref::conv2d_backward_data<double>(StreamHandle{}, sh, ady.data(), aw.data(), magnitude.data());
      Stream stream;
      const std::size_t before = emu::launches();
      cu::conv2d_backward_data(stream.s, sh, dy.data(), w.data(), dx.data());
      CHECK(emu::launches() - before == 1u + 3u * std::size_t(parts));
      CHECK(emu::last_launch().kernel == std::string("conv2d_backward_data_winograd_output"));
      CHECK(stream.workspace.capacity() == winograd_forward_workspace(sh, per_part, true));
      CHECK(dx.guards_kept());
      check_result(dx.values(), want, magnitude, sh.out_channels * 9);
    }
  }
  cu::set_conv2d_launch_elements(0);
  // Not 3x3 at stride 1 and padding 1, or no workspace: the direct products.
  for (const Conv2dShape& sh : {Conv2dShape{1, 3, 6, 6, 2, 3, 3, 2, 2, 1, 1}, Conv2dShape{1, 3, 6, 6, 2, 3, 3, 1, 1, 0, 0},
                                Conv2dShape{1, 3, 6, 6, 2, 1, 1, 1, 1, 0, 0}, Conv2dShape{1, 3, 6, 6, 2, 3, 3, 1, 1, 1, 1}}) {
    INFO(describe(sh));
    const bool applies = sh.stride_h == 1 && sh.pad_h == 1 && sh.kernel_h == 3;  // the last: no workspace
    Stream stream;
    const StreamHandle& s = applies ? StreamHandle{} : stream.s;
    const Buffer x(sh.input_size(), 17, 0), w(sh.weight_size(), 18, 0), y(sh.output_size(), 19, 0);
    cu::conv2d_forward(s, sh, x.data(), w.data(), nullptr, y.data());
    CHECK(emu::last_launch().kernel == std::string("conv2d_forward"));
    cu::conv2d_backward_data(s, sh, y.data(), w.data(), x.data());
    CHECK(emu::last_launch().kernel == std::string("conv2d_backward_data"));
  }
  MESSAGE("Winograd forward and data: ",
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
          " s; the largest error, in units of the direct product's bound: ", worst);
}

namespace {

// The TF32 Winograd forward on the host, as the emulated kernels compute it: U = G g G^T in double
// rounded to float and to TF32, V = B^T d B in float rounded to TF32, M_e[o][t] an fmaf chain over
// the in-channels in order (the mma twin's order), y = A^T M A (+ bias) in float. `flipped`: the
// backward data's form (g = w[o, c] turned by 180 degrees, rows c, depth o, the input dy).
// `round_u` false leaves U unrounded (what a missing rounding would give).
std::vector<float> winograd_tf32_model(const Conv2dShape& sh, const std::vector<float>& input,
                                       const std::vector<float>& w, const float* bias, bool flipped, bool round_u) {
  const std::int64_t in = flipped ? sh.out_channels : sh.in_channels, out = flipped ? sh.in_channels : sh.out_channels;
  const std::int64_t h_count = sh.in_h, w_count = sh.in_w, rows = (h_count + 1) / 2, cols = (w_count + 1) / 2;
  const std::int64_t per_image = rows * cols, t_count = sh.batch * per_image;
  std::vector<float> u(std::size_t(16 * out * in)), v(std::size_t(16 * in * t_count));
  for (std::int64_t r = 0; r < out; ++r)
    for (std::int64_t k = 0; k < in; ++k) {
      const float* kernel = w.data() + ((flipped ? k : r) * sh.in_channels + (flipped ? r : k)) * 9;
      double g[3][3], gg[4][3];
      for (int a = 0; a < 3; ++a)
        for (int b = 0; b < 3; ++b) g[a][b] = flipped ? kernel[(2 - a) * 3 + (2 - b)] : kernel[a * 3 + b];
      for (int b = 0; b < 3; ++b)
        gg[0][b] = g[0][b], gg[1][b] = 0.5 * (g[0][b] + g[1][b] + g[2][b]), gg[2][b] = 0.5 * (g[0][b] - g[1][b] + g[2][b]),
        gg[3][b] = g[2][b];
      for (int a = 0; a < 4; ++a) {
        const double e[4] = {gg[a][0], 0.5 * (gg[a][0] + gg[a][1] + gg[a][2]), 0.5 * (gg[a][0] - gg[a][1] + gg[a][2]),
                             gg[a][2]};
        for (int b = 0; b < 4; ++b)
          u[std::size_t(((4 * a + b) * out + r) * in + k)] = round_u ? tiling::tf32_round(float(e[b])) : float(e[b]);
      }
    }
  for (std::int64_t t = 0; t < t_count; ++t)
    for (std::int64_t c = 0; c < in; ++c) {
      const std::int64_t b = t / per_image, ty = t % per_image / cols, tx = t % cols;
      float d[4][4], bd[4][4];
      for (int r = 0; r < 4; ++r)
        for (int q = 0; q < 4; ++q) {
          const std::int64_t h = 2 * ty - 1 + r, x = 2 * tx - 1 + q;
          d[r][q] = h >= 0 && h < h_count && x >= 0 && x < w_count
                        ? input[std::size_t(((b * in + c) * h_count + h) * w_count + x)]
                        : 0.0f;
        }
      for (int q = 0; q < 4; ++q)
        bd[0][q] = d[0][q] - d[2][q], bd[1][q] = d[1][q] + d[2][q], bd[2][q] = d[2][q] - d[1][q],
        bd[3][q] = d[1][q] - d[3][q];
      for (int r = 0; r < 4; ++r) {
        const float e[4] = {bd[r][0] - bd[r][2], bd[r][1] + bd[r][2], bd[r][2] - bd[r][1], bd[r][1] - bd[r][3]};
        for (int q = 0; q < 4; ++q) v[std::size_t(((4 * r + q) * in + c) * t_count + t)] = tiling::tf32_round(e[q]);
      }
    }
  std::vector<float> y(std::size_t(sh.batch * out * h_count * w_count));
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t t = 0; t < t_count; ++t) {
      float mm[4][4], am[2][4];
      for (int e = 0; e < 16; ++e) {
        float sum = 0.0f;
        for (std::int64_t c = 0; c < in; ++c)
          sum = std::fma(u[std::size_t((e * out + o) * in + c)], v[std::size_t((e * in + c) * t_count + t)], sum);
        mm[e / 4][e % 4] = sum;
      }
      for (int q = 0; q < 4; ++q) am[0][q] = mm[0][q] + mm[1][q] + mm[2][q], am[1][q] = mm[1][q] - mm[2][q] - mm[3][q];
      const std::int64_t b = t / per_image, ty = t % per_image / cols, tx = t % cols;
      for (int a = 0; a < 2; ++a) {
        const float row[2] = {am[a][0] + am[a][1] + am[a][2], am[a][1] - am[a][2] - am[a][3]};
        for (int q = 0; q < 2; ++q) {
          const std::int64_t h = 2 * ty + a, x = 2 * tx + q;
          if (h < h_count && x < w_count)
            y[std::size_t(((b * out + o) * h_count + h) * w_count + x)] = bias != nullptr ? row[q] + bias[o] : row[q];
        }
      }
    }
  return y;
}

}  // namespace

// The TF32 Winograd forward and backward data give their host model's bits: U and V rounded to
// TF32 once, in the transforms (the product takes them as they are: kRoundedA, kRoundedB), the
// in-channels summed in order, the output transform in float. A U left unrounded, which the
// bound of the case above would not see, fails it (the model can tell: checked). Scalar and
// 16-byte A copies (in-channels 5 and 8), an odd plane, with the bias; with the tile the rule
// picks and with 64 x 64, 128 x 128 and its two options forced (two blocks per multiprocessor:
// the scalar stores; the K step of 32), the same bits (the product's K order does not change).
TEST_CASE("emulated conv2d: the TF32 Winograd forward and backward data give their model's bits") {
  const ForwardAlgorithmGuard winograd(cu::Conv2dForwardAlgorithm::winograd);
  const MathGuard tf32(cu::Conv2dMath::tf32);
  for (const Conv2dShape& sh : {Conv2dShape{2, 5, 5, 7, 8, 3, 3, 1, 1, 1, 1}, Conv2dShape{1, 8, 6, 3, 5, 3, 3, 1, 1, 1, 1}})
  for (const int tile : {-1, 0, 3, 4, 5}) {  // the rule's, 64 x 64, 128 x 128 and its two options
    INFO(describe(sh), ", tile ", tile);
    const TileGuard forced(tile);
    const std::vector<float> x = random_values(std::size_t(sh.input_size()), 61),
                             w = random_values(std::size_t(sh.weight_size()), 62),
                             bias = random_values(std::size_t(sh.out_channels), 63),
                             dy = random_values(std::size_t(sh.output_size()), 64);
    Stream stream;
    std::vector<float> y(std::size_t(sh.output_size())), dx(std::size_t(sh.input_size()));
    cu::conv2d_forward(stream.s, sh, x.data(), w.data(), bias.data(), y.data());
    CHECK(emu::last_launch().kernel == std::string("conv2d_forward_winograd_output"));
    const std::vector<float> y_model = winograd_tf32_model(sh, x, w, bias.data(), false, true);
    REQUIRE(bit_differences(winograd_tf32_model(sh, x, w, bias.data(), false, false), y_model) != "");
    CHECK(bit_differences(y, y_model) == "");
    cu::conv2d_backward_data(stream.s, sh, dy.data(), w.data(), dx.data());
    CHECK(emu::last_launch().kernel == std::string("conv2d_backward_data_winograd_output"));
    const std::vector<float> dx_model = winograd_tf32_model(sh, dy, w, nullptr, true, true);
    REQUIRE(bit_differences(winograd_tf32_model(sh, dy, w, nullptr, true, false), dx_model) != "");
    CHECK(bit_differences(dx, dx_model) == "");
  }
}

// Conv2dForwardAlgorithm::automatic takes Winograd's forward and backward data where run 12's
// numbers estimate it faster: 3x3 stride-1 padding-1 layers with 64 or more channels in and out
// and output planes of at most 16 x 16 (256 pixels), in TF32 8 x 8 (64); the direct products
// elsewhere. The launch names say which ran.
TEST_CASE("emulated conv2d: the automatic forward algorithm takes Winograd where estimated faster") {
  const ForwardAlgorithmGuard automatic(cu::Conv2dForwardAlgorithm::automatic);
  Stream stream;
  const StreamHandle& s = stream.s;
  struct Case {
    Conv2dShape shape;
    cu::Conv2dMath math;
    bool winograd;
  };
  const auto fp32 = cu::Conv2dMath::fp32, tf32 = cu::Conv2dMath::tf32;
  const Case cases[] = {
      {{1, 64, 4, 4, 64, 3, 3, 1, 1, 1, 1}, fp32, true},
      {{1, 64, 16, 16, 64, 3, 3, 1, 1, 1, 1}, fp32, true},   // 256 pixels
      {{1, 64, 17, 16, 64, 3, 3, 1, 1, 1, 1}, fp32, false},  // 272 pixels
      {{1, 64, 8, 8, 64, 3, 3, 1, 1, 1, 1}, tf32, true},     // TF32: 64 pixels
      {{1, 64, 9, 8, 64, 3, 3, 1, 1, 1, 1}, tf32, false},    // 72
      {{1, 63, 4, 4, 64, 3, 3, 1, 1, 1, 1}, fp32, false},
      {{1, 64, 4, 4, 63, 3, 3, 1, 1, 1, 1}, fp32, false},
      {{1, 64, 8, 8, 64, 3, 3, 2, 2, 1, 1}, fp32, false},    // stride 2
  };
  for (const Case& c : cases) {
    const Conv2dShape& sh = c.shape;
    INFO(describe(sh), ", tf32 ", c.math == tf32);
    const MathGuard math(c.math);
    const Buffer x(sh.input_size(), 71, 0), w(sh.weight_size(), 72, 0), y(sh.output_size(), 73, 0);
    cu::conv2d_forward(s, sh, x.data(), w.data(), nullptr, y.data());
    CHECK((emu::last_launch().kernel == std::string("conv2d_forward_winograd_output")) == c.winograd);
    cu::conv2d_backward_data(s, sh, y.data(), w.data(), x.data());
    CHECK((emu::last_launch().kernel == std::string("conv2d_backward_data_winograd_output")) == c.winograd);
  }
}

// ---- split-K for the forward and backward data (set_conv2d_split_k) --------------------------------
//
// A product whose 128 x 128 tiles are too few (conv2d_tiling::output_split; under the emulation a
// slice may be as short as 64 terms, so these small shapes split) sums each K slice into partials,
// then adds them in order. Its model, bit for bit: each slice's partial is the unsplit product
// (split off) with the weights outside the slice set to zero (a zero term leaves a sum as it is,
// and the rest are summed in the same order), the partials added in double in slice order, the
// bias added after, in float. That holds the slices' bounds, the partials' addresses, the order of
// the sum and the bias, in every path: the NCHW forward (FP32, and TF32 at stride 2), the
// channels-last forward (TF32), backward data from w (FP32) and from channels-last copies (TF32).
namespace {

class SplitKGuard {
 public:
  explicit SplitKGuard(bool on) { cu::set_conv2d_split_k(on); }
  ~SplitKGuard() { cu::set_conv2d_split_k(false); }
  SplitKGuard(const SplitKGuard&) = delete;
  SplitKGuard& operator=(const SplitKGuard&) = delete;
};

// Where weight w[o, c, i, j] stands in a path's K (each path's k_entry_at): the forward from x
// sums over (c, i, j), from channels-last copies over (i, j, c); backward data at stride 1 from w
// over (o, i, j), from channels-last copies over (i, j, o).
enum class KOrder { forward, forward_channels_last, data, data_channels_last };
std::int64_t k_of(KOrder order, const Conv2dShape& sh, std::int64_t o, std::int64_t c, std::int64_t i,
                  std::int64_t j) {
  const std::int64_t tap = i * sh.kernel_w + j, taps = sh.kernel_h * sh.kernel_w;
  switch (order) {
    case KOrder::forward: return c * taps + tap;
    case KOrder::forward_channels_last: return tap * sh.in_channels + c;
    case KOrder::data: return o * taps + tap;
    case KOrder::data_channels_last: break;
  }
  return tap * sh.out_channels + o;
}

// w with every weight outside K slice [begin, end) of `order` set to zero.
std::vector<float> weights_in_slice(const std::vector<float>& w, const Conv2dShape& sh, KOrder order,
                                    std::int64_t begin, std::int64_t end) {
  std::vector<float> kept = w;
  for (std::int64_t o = 0; o < sh.out_channels; ++o)
    for (std::int64_t c = 0; c < sh.in_channels; ++c)
      for (std::int64_t i = 0; i < sh.kernel_h; ++i)
        for (std::int64_t j = 0; j < sh.kernel_w; ++j) {
          const std::int64_t k = k_of(order, sh, o, c, i, j);
          if (k < begin || k >= end) kept[std::size_t(((o * sh.in_channels + c) * sh.kernel_h + i) * sh.kernel_w + j)] = 0;
        }
  return kept;
}

}  // namespace

TEST_CASE("emulated conv2d: split-K forward and backward data add their slices' partials in order, bit for bit") {
  const auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(cu::conv2d_split_k());  // off by default
  const auto fp32 = cu::Conv2dMath::fp32, tf32 = cu::Conv2dMath::tf32;
  struct Case {
    Conv2dShape shape;
    cu::Conv2dMath math;
    KOrder order;
    std::int64_t slices;
    std::size_t launches;  // the call's (copies, the product, the sum)
    const char* product;   // the product's launch name (the unsplit kernel's)
  };
  // 72 x 72 outputs (one 128 x 128 tile) over K = 144, 216, 288: 2, 3 and 4 slices of 80 terms,
  // the last one shorter (64, 56, 48)
  const Case cases[] = {
      {{2, 16, 6, 6, 72, 3, 3, 1, 1, 1, 1}, fp32, KOrder::forward, 2, 2, "conv2d_forward"},
      {{2, 24, 6, 6, 72, 3, 3, 1, 1, 1, 1}, fp32, KOrder::forward, 3, 2, "conv2d_forward"},
      {{2, 32, 12, 12, 72, 3, 3, 2, 2, 1, 1}, fp32, KOrder::forward, 4, 2, "conv2d_forward"},
      {{2, 16, 12, 12, 72, 3, 3, 2, 2, 1, 1}, tf32, KOrder::forward, 2, 2, "conv2d_forward_tf32"},
      {{2, 24, 6, 6, 72, 3, 3, 1, 1, 1, 1}, tf32, KOrder::forward_channels_last, 3, 4,
       "conv2d_forward_tf32_channels_last"},
      {{2, 72, 6, 6, 16, 3, 3, 1, 1, 1, 1}, fp32, KOrder::data, 2, 2, "conv2d_backward_data"},
      {{2, 72, 6, 6, 24, 3, 3, 1, 1, 1, 1}, tf32, KOrder::data_channels_last, 3, 4,
       "conv2d_backward_data_tf32_channels_last"},
  };
  std::uint64_t seed = 6100;
  for (const Case& c : cases) {
    const Conv2dShape& sh = c.shape;
    const bool data = c.order == KOrder::data || c.order == KOrder::data_channels_last;
    seed += 10;
    const bool with_bias = !data && seed % 20 == 10;
    INFO(describe(sh), ", tf32 ", c.math == tf32, ", data ", data, ", bias ", with_bias);
    const MathGuard math(c.math);
    const tiling::SplitK split = data ? tiling::data_output_split(sh, 64) : tiling::forward_output_split(sh, 64);
    REQUIRE(split.slices == c.slices);
    const Buffer x(sh.input_size(), seed, 1), w(sh.weight_size(), seed + 1, 0), bias(sh.out_channels, seed + 2, 1),
        dy(sh.output_size(), seed + 3, 0), out(data ? sh.input_size() : sh.output_size(), seed + 4, 1, 5, 6);
    const float* b = with_bias ? bias.data() : nullptr;
    Stream stream;
    // the pass, unsplit or split, with weights `weights` and bias `with`
    const auto pass = [&](const float* weights, const float* with, float* result) {
      if (data)
        cu::conv2d_backward_data(stream.s, sh, dy.data(), weights, result);
      else
        cu::conv2d_forward(stream.s, sh, x.data(), weights, with, result);
    };
    // the model: the slices' partials by the unsplit product, added in double, then the bias
    const std::size_t n = std::size_t(data ? sh.input_size() : sh.output_size());
    std::vector<double> sum(n, 0.0);
    for (std::int64_t z = 0; z < split.slices; ++z) {
      const std::vector<float> kept = weights_in_slice(w.values(), sh, c.order, split.begin(z), split.end(z));
      out.reset();
      pass(kept.data(), nullptr, out.data());
      const std::vector<float> partial = out.values();
      for (std::size_t e = 0; e < n; ++e) sum[e] += double(partial[e]);
    }
    std::vector<float> model(n);
    const std::int64_t plane = sh.out_h() * sh.out_w();
    for (std::size_t e = 0; e < n; ++e)
      model[e] = with_bias ? float(sum[e]) + bias.data()[std::int64_t(e) / plane % sh.out_channels] : float(sum[e]);
    // the split
    const SplitKGuard on(true);
    out.reset();
    const std::size_t before = emu::launches();
    pass(w.data(), b, out.data());
    CHECK(emu::launches() - before == c.launches);
    const std::vector<emu::LaunchRecord> last = emu::recent_launches(2);
    CHECK(last.at(1).kernel == std::string(data ? "conv2d_backward_data_slices_sum" : "conv2d_forward_slices_sum"));
    CHECK(last.at(0).kernel == std::string(c.product));
    CHECK(last.at(0).grid.z == unsigned(c.slices));
    CHECK(last.at(0).grid.x * last.at(0).grid.y == 1u);  // one 128 x 128 tile
    CHECK(out.guards_kept());
    const std::vector<float> got = out.values();
    CHECK(bit_differences(got, model) == "");
    out.reset();
    pass(w.data(), b, out.data());
    CHECK(bit_differences(out.values(), got) == "");
    // and against ref::, within the unsplit product's bound
    if (!data) {
      if (c.math == tf32) {
        CHECK(tf32_forward_error(stream.s, sh, x, w, b, out.initial(), got) <= 1.0);
      } else {
        std::vector<float> want = out.initial();
        ref::conv2d_forward<float>(StreamHandle{}, sh, x.data(), w.data(), b, want.data());
        std::vector<double> magnitude(n);
        const std::vector<double> ax = absolute(x.values()), aw = absolute(w.values()), ab = absolute(bias.values());
        ref::conv2d_forward<double>(StreamHandle{}, sh, ax.data(), aw.data(), with_bias ? ab.data() : nullptr,
                                    magnitude.data());
        CHECK(error_in_bounds(got, want, magnitude, sh.in_channels * 9 + 1) <= 1.0);
      }
    } else {
      std::vector<float> want = out.initial();
      ref::conv2d_backward_data<float>(StreamHandle{}, sh, dy.data(), w.data(), want.data());
      std::vector<double> magnitude(n);
      const std::vector<double> ady = absolute(dy.values()), aw = absolute(w.values());
      ref::conv2d_backward_data<double>(StreamHandle{}, sh, ady.data(), aw.data(), magnitude.data());
      const std::int64_t terms = sh.out_channels * 9;
      CHECK((c.math == tf32 ? tf32_error_in_bounds(got, want, magnitude, terms)
                            : error_in_bounds(got, want, magnitude, terms)) <= 1.0);
    }
    // a forced tile runs the unsplit product (bench-cuda's per-tile rows)
    {
      const TileGuard forced(3);
      pass(w.data(), b, out.data());
      CHECK(emu::last_launch().kernel == std::string(c.product));
      CHECK(emu::last_launch().grid.z == 1u);
    }
  }
  // where the rule does not split: backward data at stride 2, 64 rows, a short K
  const SplitKGuard on(true);
  for (const Conv2dShape& sh : {Conv2dShape{2, 72, 12, 12, 16, 3, 3, 2, 2, 1, 1}, Conv2dShape{2, 16, 6, 6, 64, 3, 3, 1, 1, 1, 1},
                                Conv2dShape{2, 8, 6, 6, 72, 3, 3, 1, 1, 1, 1}}) {
    INFO(describe(sh));
    const Buffer x(sh.input_size(), 6190, 0), w(sh.weight_size(), 6191, 0), dy(sh.output_size(), 6192, 0),
        y(sh.output_size(), 6193, 0), dx(sh.input_size(), 6194, 0);
    Stream stream;
    cu::conv2d_forward(stream.s, sh, x.data(), w.data(), nullptr, y.data());
    CHECK(emu::last_launch().kernel == std::string("conv2d_forward"));
    cu::conv2d_backward_data(stream.s, sh, dy.data(), w.data(), dx.data());
    CHECK(emu::last_launch().kernel == std::string("conv2d_backward_data"));
  }
  // TF32 backward data from the NCHW path (out_channels % 4 != 0: no channels-last copies) keeps
  // its weights' copy (wt) in the stream's scratch: it never splits, which would put the partials
  // over wt (the same bits as with the option off)
  {
    const MathGuard tf32(cu::Conv2dMath::tf32);
    const Conv2dShape sh{2, 72, 6, 6, 18, 3, 3, 1, 1, 1, 1};
    INFO(describe(sh));
    REQUIRE(tiling::data_output_split(sh, 64).slices > 1);  // the rule alone would split it
    const Buffer dy(sh.output_size(), 6195, 0), w(sh.weight_size(), 6196, 0), dx(sh.input_size(), 6197, 0);
    Stream stream;
    cu::conv2d_backward_data(stream.s, sh, dy.data(), w.data(), dx.data());
    CHECK(emu::last_launch().kernel == std::string("conv2d_backward_data_tf32"));
    const std::vector<float> split_on = dx.values();
    const SplitKGuard off(false);
    dx.reset();
    cu::conv2d_backward_data(stream.s, sh, dy.data(), w.data(), dx.data());
    CHECK(bit_differences(dx.values(), split_on) == "");
  }
  MESSAGE("split-K: ", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), " s");
}
