// tests/emulation/test_emulated_reduce.cpp: the kernels of kernels/cuda/reduce.cu (sum, mean and
// their backward), run on the CPU by the CUDA emulation (emulated_reduce.cpp), against kernels::ref.
//
// Shapes: size-1 and one-element tensors, 31 and 33 (a warp and a bit, partial blocks), every mask
// of 4-d shapes (inner dim kept: a thread per output; inner dim reduced: a block per output), dims
// of size 1 between others, sums long enough to take the two-pass split path (one and a few
// outputs of 40000 to 70001 elements, the last chunk partial), and zero-size dims (sums 0, means
// NaN, no launch when there is no output). Pointers aligned and one float off; grid caps of 1 and
// 3 blocks make the grid-stride and block-stride loops go round. Sums and means within 1e-6 of
// ref (the cpu tests' tolerance; the kernel adds in double in another order), and the same bits
// whatever the grid cap; the backward bit for bit. Outputs are pre-filled and guard elements after
// them must not change.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "petra/kernels/common.hpp"
#include "petra/kernels/reduce.hpp"
#include "tests/emulation/kernel_checks.hpp"

namespace {

using namespace petra::emulation_testing::vocabulary;
using Dims = std::vector<std::int64_t>;

enum class Op { sum, mean, sum_backward, mean_backward };
const char* name(Op op) {
  switch (op) {
    case Op::sum: return "reduce_sum";
    case Op::mean: return "reduce_mean";
    case Op::sum_backward: return "reduce_sum_backward";
    default: return "reduce_mean_backward";
  }
}
bool is_forward(Op op) { return op == Op::sum || op == Op::mean; }

std::int64_t numel(const Dims& dims) {
  std::int64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}
std::int64_t output_numel(const Dims& dims, std::uint32_t mask) {
  std::int64_t m = 1;
  for (std::size_t d = 0; d < dims.size(); ++d)
    if (!(mask >> d & 1u)) m *= dims[d];
  return m;
}

void run(Op op, bool emulated, const StreamHandle& s, const Dims& dims, std::uint32_t mask, const float* in,
         float* out) {
  switch (op) {
    case Op::sum:
      emulated ? cu::reduce_sum(s, dims, mask, in, out) : ref::reduce_sum<float>(s, dims, mask, in, out);
      break;
    case Op::mean:
      emulated ? cu::reduce_mean(s, dims, mask, in, out) : ref::reduce_mean<float>(s, dims, mask, in, out);
      break;
    case Op::sum_backward:
      emulated ? cu::reduce_sum_backward(s, dims, mask, in, out)
               : ref::reduce_sum_backward<float>(s, dims, mask, in, out);
      break;
    case Op::mean_backward:
      emulated ? cu::reduce_mean_backward(s, dims, mask, in, out)
               : ref::reduce_mean_backward<float>(s, dims, mask, in, out);
      break;
  }
}

// Every op, offset and grid cap on one shape and mask; returns the number of comparisons.
int check(const Dims& dims, std::uint32_t mask, std::uint64_t seed, bool backward = true) {
  HeapWorkspace workspace;
  StreamHandle s;
  s.workspace = &workspace;
  int compared = 0;
  for (const Op op : {Op::sum, Op::mean, Op::sum_backward, Op::mean_backward}) {
    if (!backward && !is_forward(op)) continue;
    const std::int64_t full = numel(dims), reduced = output_numel(dims, mask);
    const auto in_size = std::size_t(is_forward(op) ? full : reduced);
    const auto out_size = std::size_t(is_forward(op) ? reduced : full);
    for (const std::size_t offset : kOffsets) {
      const AlignedFloats in(random_values(in_size + offset + kGuard, seed));
      const std::vector<float> before = random_values(out_size + offset + kGuard, seed + 1, 5.0, 6.0);
      std::vector<float> expected = before;
      run(op, false, s, dims, mask, in.data() + offset, expected.data() + offset);
      std::vector<float> first_grid;
      for (const std::size_t cap : kGridCaps) {
        const emu::GridStrideCap capped(cap);
        const AlignedFloats out(before);
        run(op, true, s, dims, mask, in.data() + offset, out.data() + offset);
        const std::vector<float> got = out.values();
        std::string shape;
        for (auto d : dims) shape += " " + std::to_string(d);
        INFO(name(op), ": dims", shape, " mask ", mask, " offset ", offset, " grid cap ", cap);
        if (is_forward(op)) {
          const std::vector<float> g(got.begin() + std::ptrdiff_t(offset), got.end() - std::ptrdiff_t(kGuard));
          const std::vector<float> w(expected.begin() + std::ptrdiff_t(offset),
                                     expected.end() - std::ptrdiff_t(kGuard));
          bool nan_where_expected = true;
          std::vector<float> gf, wf;
          for (std::size_t i = 0; i < g.size(); ++i) {
            if (std::isnan(w[i])) nan_where_expected = nan_where_expected && std::isnan(g[i]);
            else gf.push_back(g[i]), wf.push_back(w[i]);
          }
          CHECK(nan_where_expected);
          CHECK(relative_error(gf, wf) <= 1e-6);
          for (std::size_t i = 0; i < got.size(); ++i)
            if (i < offset || i >= offset + out_size) CHECK(got[i] == before[i]);
          // The same bits whatever the grid.
          if (first_grid.empty()) first_grid = got;
          else CHECK_MESSAGE(bit_differences(got, first_grid).empty(), bit_differences(got, first_grid));
        } else {
          CHECK_MESSAGE(bit_differences(got, expected).empty(), bit_differences(got, expected));
        }
        ++compared;
      }
    }
  }
  return compared;
}

}  // namespace

TEST_CASE("emulated reduce: small and odd shapes, every mask up to rank 2, chosen masks above") {
  std::uint64_t seed = 1000;
  int compared = 0;
  for (const Dims& dims : {Dims{1}, Dims{31}, Dims{33}, Dims{1, 1}})
    for (std::uint32_t mask = 0; mask < (1u << dims.size()); ++mask) compared += check(dims, mask, seed += 10);
  for (const Dims& dims : {Dims{5, 31}, Dims{33, 3}})
    for (std::uint32_t mask = 0; mask < (1u << dims.size()); ++mask) compared += check(dims, mask, seed += 10);
  // Higher ranks: every mask would take minutes with a block of real threads per launch; these cover
  // inner reduced or kept, runs of reduced and kept dims, size-1 dims, everything and nothing.
  for (const std::uint32_t mask : {0b0000u, 0b1111u, 0b0101u, 0b1010u, 0b0011u, 0b1100u})
    compared += check({2, 3, 1, 7}, mask, seed += 10);
  for (const std::uint32_t mask : {0b0110u, 0b1001u}) compared += check({3, 4, 3, 5}, mask, seed += 10);
  for (const std::uint32_t mask : {0b00000u, 0b11111u, 0b10101u, 0b01010u, 0b00110u})
    compared += check({2, 1, 33, 1, 2}, mask, seed += 10);
  // Masks with bits above the rank are ignored.
  compared += check({4, 5}, 0b1110, seed += 10);
  MESSAGE("reduce: ", compared, " comparisons");
}

TEST_CASE("emulated reduce: long sums take the two-pass split path") {
  std::uint64_t seed = 2000;
  // Forward only (the broadcast of that many elements is slow in the emulation; the small shapes
  // cover it).
  check({70001}, 0b1, seed += 10, false);         // one output, 5 chunks, the last partial
  check({3, 40000}, 0b10, seed += 10, false);     // three outputs of 3 chunks
  check({2, 17000, 3}, 0b011, seed += 10, false); // inner kept: a thread per output, 17000 rows each
  check({257, 70}, 0b11, seed += 10, false);      // everything, 17990 elements: 2 chunks
}

TEST_CASE("emulated reduce: zero-size dims give zero sums and NaN means, no output launches nothing") {
  std::uint64_t seed = 3000;
  check({0, 3}, 0b01, seed += 10);
  check({3, 0}, 0b10, seed += 10);
  check({0, 3}, 0b10, seed += 10);
  const StreamHandle s;
  const std::size_t launches = emu::launches();
  cu::reduce_sum(s, Dims{0, 3}, 0b10, nullptr, nullptr);
  cu::reduce_sum_backward(s, Dims{0, 3}, 0b01, nullptr, nullptr);
  CHECK(emu::launches() == launches);
}
