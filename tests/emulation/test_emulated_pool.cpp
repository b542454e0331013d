// tests/emulation/test_emulated_pool.cpp: the kernels of kernels/cuda/pool.cu (max and average
// pooling forward and backward, global average pooling), run on the CPU by the CUDA emulation
// (emulated_pool.cpp), against kernels::ref.
//
// Window pooling: planes of 1x1, 5x7, 31x1, 1x33, 33x3 and 8x8, batch 1 and 5, 1 and 3 channels,
// with kernel 1, 2 and 3, stride 1 and 2, padding 0 and 1 (wherever the window fits), so that
// windows overlap, leave rows out and are clipped by the padding on every side; grid caps of 1 and
// 3 blocks make the grid-stride loops go round. Max pool on inputs full of ties (values from
// {-1, 0, 1}), on inputs with NaNs and -inf, and on distinct values: indices and y equal ref's
// (the first maximum wins, NaN wins), and the backward, fed ref's indices, equals ref's dx bit for
// bit (the gather adds each dx element's terms in ref's order, in double). Average pool forward
// and backward bit for bit too. Global average pool: planes of 1, 31, 33, 49 and 1000, up to 15
// planes (warps that loop with a cap of one block); the forward within one rounding of ref's (the
// warp's fixed tree adds in another order than ref's loop), the same bits across grid caps and
// runs; the backward bit for bit. Pointers aligned and one float off (pool.cu has no vector loads;
// for max pool, once per shape); outputs pre-filled, with guard elements after them that must not
// change.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "petra/kernels/common.hpp"
#include "petra/kernels/pool.hpp"
#include "tests/emulation/kernel_checks.hpp"

namespace {

using namespace petra::emulation_testing::vocabulary;
using petra::kernels::GlobalPoolShape;
using petra::kernels::Pool2dShape;

struct Plane {
  std::int64_t batch, channels, height, width;
};
const std::vector<Plane> kPlanes = {{1, 1, 1, 1}, {5, 1, 5, 7}, {1, 3, 31, 1}, {1, 1, 1, 33},
                                    {5, 3, 33, 3}, {1, 3, 8, 8}};
struct Window {
  std::int64_t kernel, stride, padding;
};
const std::vector<Window> kWindows = {{1, 1, 0}, {2, 1, 0}, {2, 2, 0}, {2, 2, 1},
                                      {3, 1, 0}, {3, 1, 1}, {3, 2, 0}, {3, 2, 1}};

// The shapes where the window fits the padded input (what petra/ops.cpp accepts).
std::vector<Pool2dShape> window_shapes() {
  std::vector<Pool2dShape> shapes;
  for (const Plane& p : kPlanes)
    for (const Window& w : kWindows)
      if (p.height + 2 * w.padding >= w.kernel && p.width + 2 * w.padding >= w.kernel)
        shapes.push_back({p.batch, p.channels, p.height, p.width, w.kernel, w.stride, w.padding});
  return shapes;
}

std::string describe(const Pool2dShape& s) {
  return std::to_string(s.batch) + "x" + std::to_string(s.channels) + "x" + std::to_string(s.height) +
         "x" + std::to_string(s.width) + " kernel " + std::to_string(s.kernel) + " stride " +
         std::to_string(s.stride) + " padding " + std::to_string(s.padding);
}

enum class Fill { kTies, kSpecial, kDistinct };

// n values, then kGuard: ties from {-1, 0, 1}; or values with NaN and -inf among them; or random.
std::vector<float> inputs(std::size_t n, std::uint64_t seed, Fill fill) {
  std::vector<float> v = random_values(n + kGuard, seed);
  for (std::size_t i = 0; i < n; ++i) {
    if (fill == Fill::kTies) v[i] = std::round(v[i]);
    if (fill == Fill::kSpecial && i % 7 == 3) v[i] = std::numeric_limits<float>::quiet_NaN();
    if (fill == Fill::kSpecial && i % 5 == 1) v[i] = -INFINITY;
  }
  return v;
}

// got equals want bit for bit, and the guard elements after n are untouched.
void check_exact(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& before,
                 std::size_t offset, std::size_t n) {
  CHECK_MESSAGE(bit_differences(got, want).empty(), bit_differences(got, want));
  for (std::size_t i = 0; i < got.size(); ++i)
    if (i < offset || i >= offset + n) CHECK(got[i] == before[i]);
}

}  // namespace

TEST_CASE("emulated pool: max pool forward and backward equal ref, indices and ties included") {
  const StreamHandle s;
  std::uint64_t seed = 100;
  int compared = 0;
  for (const Pool2dShape& shape : window_shapes())
    for (const Fill fill : {Fill::kTies, Fill::kSpecial, Fill::kDistinct}) {
      // No vector loads in pool.cu: the pointers one float off once per shape are enough.
      const std::size_t offset = fill == Fill::kDistinct ? 1 : 0;
      seed += 10;
      const auto in_n = std::size_t(shape.input_size()), out_n = std::size_t(shape.output_size());
      const AlignedFloats x(inputs(in_n + offset, seed, fill));
      const std::vector<float> y0 = random_values(out_n + offset + kGuard, seed + 1, 5, 6);
      const std::vector<float> dx0 = random_values(in_n + offset + kGuard, seed + 2, 5, 6);
      const AlignedFloats dy(random_values(out_n + offset + kGuard, seed + 3));
      std::vector<float> y_ref = y0, dx_ref = dx0;
      std::vector<std::int32_t> idx_ref(out_n + kGuard, -7);
      ref::max_pool2d_forward<float>(s, shape, x.data() + offset, y_ref.data() + offset, idx_ref.data());
      ref::max_pool2d_backward<float>(s, shape, dy.data() + offset, idx_ref.data(), dx_ref.data() + offset);
      for (const std::size_t cap : kGridCaps) {
        const emu::GridStrideCap capped(cap);
        INFO(describe(shape), " fill ", int(fill), " offset ", offset, " grid cap ", cap);
        const AlignedFloats y(y0), y_plain(y0), dx(dx0);
        std::vector<std::int32_t> idx(out_n + kGuard, -7);
        cu::max_pool2d_forward(s, shape, x.data() + offset, y.data() + offset, idx.data());
        CHECK(emu::last_launch().grid.x == expected_blocks(shape.output_size()));
        check_exact(y.values(), y_ref, y0, offset, out_n);
        CHECK(idx == idx_ref);
        cu::max_pool2d_forward(s, shape, x.data() + offset, y_plain.data() + offset, nullptr);
        check_exact(y_plain.values(), y_ref, y0, offset, out_n);
        cu::max_pool2d_backward(s, shape, dy.data() + offset, idx_ref.data(), dx.data() + offset);
        CHECK(emu::last_launch().grid.x == expected_blocks(shape.input_size()));
        check_exact(dx.values(), dx_ref, dx0, offset, in_n);
        ++compared;
      }
    }
  MESSAGE("max pool: ", compared, " comparisons");
}

TEST_CASE("emulated pool: average pool forward and backward equal ref bit for bit") {
  const StreamHandle s;
  std::uint64_t seed = 5000;
  int compared = 0;
  for (const Pool2dShape& shape : window_shapes())
    for (const std::size_t offset : kOffsets) {
      seed += 10;
      const auto in_n = std::size_t(shape.input_size()), out_n = std::size_t(shape.output_size());
      const AlignedFloats x(random_values(in_n + offset + kGuard, seed));
      const AlignedFloats dy(random_values(out_n + offset + kGuard, seed + 1));
      const std::vector<float> y0 = random_values(out_n + offset + kGuard, seed + 2, 5, 6);
      const std::vector<float> dx0 = random_values(in_n + offset + kGuard, seed + 3, 5, 6);
      std::vector<float> y_ref = y0, dx_ref = dx0;
      ref::avg_pool2d_forward<float>(s, shape, x.data() + offset, y_ref.data() + offset);
      ref::avg_pool2d_backward<float>(s, shape, dy.data() + offset, dx_ref.data() + offset);
      for (const std::size_t cap : kGridCaps) {
        const emu::GridStrideCap capped(cap);
        INFO(describe(shape), " offset ", offset, " grid cap ", cap);
        const AlignedFloats y(y0), dx(dx0);
        cu::avg_pool2d_forward(s, shape, x.data() + offset, y.data() + offset);
        check_exact(y.values(), y_ref, y0, offset, out_n);
        cu::avg_pool2d_backward(s, shape, dy.data() + offset, dx.data() + offset);
        check_exact(dx.values(), dx_ref, dx0, offset, in_n);
        ++compared;
      }
    }
  MESSAGE("average pool: ", compared, " comparisons");
}

TEST_CASE("emulated pool: global average pool, a warp per plane, deterministic, within a rounding of ref") {
  const StreamHandle s;
  std::uint64_t seed = 9000;
  const std::vector<GlobalPoolShape> shapes = {{1, 1, 1, 1}, {1, 1, 31, 1}, {5, 3, 1, 33},
                                               {5, 3, 7, 7}, {1, 2, 25, 40}, {2, 1, 0, 3}};
  for (const GlobalPoolShape& shape : shapes)
    for (const std::size_t offset : kOffsets) {
      seed += 10;
      const auto in_n = std::size_t(shape.input_size()), out_n = std::size_t(shape.output_size());
      const std::int64_t plane = shape.height * shape.width;
      // Centred at 3 so that the sums are not all near zero.
      const AlignedFloats x(random_values(in_n + offset + kGuard, seed, 2, 4));
      const AlignedFloats dy(random_values(out_n + offset + kGuard, seed + 1));
      const std::vector<float> y0 = random_values(out_n + offset + kGuard, seed + 2, 5, 6);
      const std::vector<float> dx0 = random_values(in_n + offset + kGuard, seed + 3, 5, 6);
      std::vector<float> y_ref = y0, dx_ref = dx0;
      ref::global_avg_pool_forward<float>(s, shape, x.data() + offset, y_ref.data() + offset);
      ref::global_avg_pool_backward<float>(s, shape, dy.data() + offset, dx_ref.data() + offset);
      std::vector<float> first_run;
      for (const std::size_t cap : kGridCaps) {
        const emu::GridStrideCap capped(cap);
        INFO("global pool ", shape.batch, "x", shape.channels, "x", shape.height, "x", shape.width, " offset ",
             offset, " grid cap ", cap);
        for (int run = 0; run < 2; ++run) {
          const AlignedFloats y(y0);
          cu::global_avg_pool_forward(s, shape, x.data() + offset, y.data() + offset);
          const std::vector<float> got = y.values();
          for (std::size_t p = 0; p < out_n; ++p) {
            const float want = y_ref[offset + p];
            if (plane == 0) {
              CHECK(std::isnan(got[offset + p]));  // 0 / 0, as ref
              continue;
            }
            double sum_abs = 0;  // the mean of |terms|
            for (std::int64_t k = 0; k < plane; ++k) sum_abs += std::abs(double(x.data()[offset + p * plane + k]));
            CHECK(std::abs(double(got[offset + p]) - double(want)) <= 1.2e-7 * sum_abs / double(plane));
          }
          for (std::size_t i = 0; i < got.size(); ++i)
            if (i < offset || i >= offset + out_n) CHECK(got[i] == y0[i]);
          // The same bits on every run and whatever the grid.
          if (first_run.empty()) first_run = got;
          else CHECK_MESSAGE(bit_differences(got, first_run).empty(), bit_differences(got, first_run));
        }
        const AlignedFloats dx(dx0);
        cu::global_avg_pool_backward(s, shape, dy.data() + offset, dx.data() + offset);
        check_exact(dx.values(), dx_ref, dx0, offset, in_n);
      }
    }
}

TEST_CASE("emulated pool: empty tensors launch nothing") {
  const StreamHandle s;
  const std::size_t launches = emu::launches();
  cu::max_pool2d_forward(s, Pool2dShape{0, 3, 4, 4, 2, 2, 0}, nullptr, nullptr, nullptr);
  cu::max_pool2d_backward(s, Pool2dShape{0, 3, 4, 4, 2, 2, 0}, nullptr, nullptr, nullptr);
  cu::avg_pool2d_forward(s, Pool2dShape{2, 0, 4, 4, 2, 2, 0}, nullptr, nullptr);
  cu::avg_pool2d_backward(s, Pool2dShape{2, 0, 4, 4, 2, 2, 0}, nullptr, nullptr);
  cu::global_avg_pool_forward(s, GlobalPoolShape{0, 3, 2, 2}, nullptr, nullptr);
  cu::global_avg_pool_backward(s, GlobalPoolShape{2, 3, 0, 2}, nullptr, nullptr);
  CHECK(emu::launches() == launches);
}
