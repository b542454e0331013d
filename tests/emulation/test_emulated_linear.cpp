// tests/emulation/test_emulated_linear.cpp: the kernels of kernels/cuda/linear.cu (forward with and
// without bias, backward data, backward weight, backward bias), run on the CPU by the CUDA
// emulation (emulated_linear.cpp), against kernels::ref, with the cpu suite's tolerance for
// cpu:: in float (test_linear.cpp: relative 1e-5).
//
// Shapes (batch, in, out) with every dimension 1, below a tile (31), just above one or two
// (33, 65), and uneven mixes, so that the tiles' tails in M, N and K all occur; K = 0 too.
// Outputs are pre-filled with guard elements after them: y and dx must be assigned, dw and db
// accumulated, the guards untouched. The bias gradient runs with grid caps of 1 and 3 blocks as
// well (its grid-stride loop goes round). The tiled kernel's grid is checked against the shape.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "petra/kernels/common.hpp"
#include "petra/kernels/linear.hpp"
#include "tests/emulation/kernel_checks.hpp"

namespace {

using namespace petra::emulation_testing::vocabulary;
using petra::kernels::LinearShape;

const std::vector<LinearShape> kShapes = {
    {1, 1, 1},   {1, 31, 1},  {31, 1, 33}, {33, 31, 1}, {2, 33, 31},
    {33, 65, 31}, {65, 33, 70}, {5, 100, 7}, {40, 64, 32}, {3, 0, 5},
};

std::vector<float> values(std::int64_t n, std::uint64_t seed, double lo = -1, double hi = 1) {
  return random_values(std::size_t(n) + kGuard, seed, lo, hi);
}
std::vector<float> head(const std::vector<float>& v, std::int64_t n) {
  return std::vector<float>(v.begin(), v.begin() + n);
}
bool guards_kept(const std::vector<float>& got, const std::vector<float>& before, std::int64_t n) {
  for (std::size_t i = std::size_t(n); i < got.size(); ++i)
    if (got[i] != before[i]) return false;
  return true;
}
std::string describe(const LinearShape& sh) {
  return "batch " + std::to_string(sh.batch) + ", " + std::to_string(sh.in_features) + " -> " +
         std::to_string(sh.out_features);
}
unsigned tiles(std::int64_t n) { return unsigned((n + 31) / 32); }

constexpr double kTolerance = 1e-5;

}  // namespace

TEST_CASE("emulated linear: forward (with and without bias) and backward data match ref") {
  const StreamHandle s;
  std::uint64_t seed = 10;
  for (const LinearShape& sh : kShapes) {
    seed += 10;
    const std::int64_t B = sh.batch, I = sh.in_features, O = sh.out_features;
    const AlignedFloats x(values(B * I, seed)), w(values(O * I, seed + 1)),
        bias(values(O, seed + 2)), dy(values(B * O, seed + 3));
    const std::vector<float> y0 = values(B * O, seed + 4, 5, 6);
    const std::vector<float> dx0 = values(B * I, seed + 5, 5, 6);
    INFO(describe(sh));
    for (const bool with_bias : {true, false}) {
      std::vector<float> y_ref = y0;
      ref::linear_forward<float>(s, sh, x.data(), w.data(), with_bias ? bias.data() : nullptr,
                                 y_ref.data());
      const AlignedFloats y(y0);
      cu::linear_forward(s, sh, x.data(), w.data(), with_bias ? bias.data() : nullptr, y.data());
      CAPTURE(with_bias);
      CHECK(emu::last_launch().kernel == std::string("linear_forward"));
      CHECK(emu::last_launch().grid.x == tiles(B));
      CHECK(emu::last_launch().grid.y == tiles(O));
      CHECK(relative_error(head(y.values(), B * O), head(y_ref, B * O)) <= kTolerance);
      CHECK(guards_kept(y.values(), y0, B * O));
    }
    std::vector<float> dx_ref = dx0;
    ref::linear_backward_data<float>(s, sh, dy.data(), w.data(), dx_ref.data());
    const AlignedFloats dx(dx0);
    cu::linear_backward_data(s, sh, dy.data(), w.data(), dx.data());
    CHECK(relative_error(head(dx.values(), B * I), head(dx_ref, B * I)) <= kTolerance);
    if (I == 0) continue;
    CHECK(emu::last_launch().grid.x == tiles(B));
    CHECK(emu::last_launch().grid.y == tiles(I));
    CHECK(guards_kept(dx.values(), dx0, B * I));
  }
}

TEST_CASE("emulated linear: backward weight accumulates, matching ref") {
  const StreamHandle s;
  std::uint64_t seed = 500;
  for (const LinearShape& sh : kShapes) {
    seed += 10;
    const std::int64_t B = sh.batch, I = sh.in_features, O = sh.out_features;
    const AlignedFloats x(values(B * I, seed)), dy(values(B * O, seed + 1));
    const std::vector<float> dw0 = values(O * I, seed + 2);
    std::vector<float> dw_ref = dw0;
    ref::linear_backward_weight<float>(s, sh, x.data(), dy.data(), dw_ref.data());
    const AlignedFloats dw(dw0);
    cu::linear_backward_weight(s, sh, x.data(), dy.data(), dw.data());
    INFO(describe(sh));
    CHECK(relative_error(head(dw.values(), O * I), head(dw_ref, O * I)) <= kTolerance);
    CHECK(guards_kept(dw.values(), dw0, O * I));
    if (I == 0) continue;
    CHECK(emu::last_launch().kernel == std::string("linear_backward_weight"));
    CHECK(emu::last_launch().grid.x == tiles(O));
    CHECK(emu::last_launch().grid.y == tiles(I));
    // A second call adds the same product again.
    std::vector<float> twice_ref = dw_ref;
    ref::linear_backward_weight<float>(s, sh, x.data(), dy.data(), twice_ref.data());
    cu::linear_backward_weight(s, sh, x.data(), dy.data(), dw.data());
    CHECK(relative_error(head(dw.values(), O * I), head(twice_ref, O * I)) <= kTolerance);
  }
}

TEST_CASE("emulated linear: backward bias accumulates, matching ref, grid-stride loop wraps") {
  const StreamHandle s;
  std::uint64_t seed = 900;
  for (const std::size_t cap : kGridCaps) {
    const emu::GridStrideCap capped(cap);
    for (const LinearShape& sh :
         {LinearShape{1, 3, 1}, LinearShape{7, 2, 31}, LinearShape{3, 1, 33},
          LinearShape{2, 1, 1000}, LinearShape{33, 1, 4099}}) {
      seed += 10;
      const std::int64_t B = sh.batch, O = sh.out_features;
      const AlignedFloats dy(values(B * O, seed));
      const std::vector<float> db0 = values(O, seed + 1);
      std::vector<float> db_ref = db0;
      ref::linear_backward_bias<float>(s, sh, dy.data(), db_ref.data());
      const AlignedFloats db(db0);
      cu::linear_backward_bias(s, sh, dy.data(), db.data());
      INFO(describe(sh), " grid cap=", cap);
      CHECK(emu::last_launch().kernel == std::string("linear_backward_bias"));
      CHECK(emu::last_launch().grid.x == expected_blocks(O));
      CHECK(relative_error(head(db.values(), O), head(db_ref, O)) <= kTolerance);
      CHECK(guards_kept(db.values(), db0, O));
    }
  }
}
