// tests/emulation/test_emulated_coupling.cpp: the kernels of kernels/cuda/coupling.cu (forward,
// inverse, backward), run on the CPU by the CUDA emulation (emulated_coupling.cpp), against
// kernels::ref, bit for bit (one float add or subtract per element, as ref's rounded double).
//
// Stream sizes 1, 31, 33, 27, 105 take the float path; 4, 80, 1000, 16384 the float4 path when the
// pointers are aligned (offset 0) and the float path when they are not (offset 1); the test checks
// from the launched grid which path ran. Grid caps of 1 and 2 blocks make the threads go round the
// grid-stride loop, across sample boundaries. Guard elements after every output must not change.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "petra/kernels/common.hpp"
#include "petra/kernels/coupling.hpp"
#include "tests/emulation/kernel_checks.hpp"

namespace {

using namespace petra::emulation_testing::vocabulary;
using petra::kernels::CouplingShape;

using Op = std::function<void(const StreamHandle&, const CouplingShape&, const float*, const float*,
                              float*)>;

// {batch, channels, height, width}; the comment is the stream size C*H*W.
const std::vector<CouplingShape> kShapes = {
    {1, 1, 1, 1},    // 1
    {2, 1, 1, 31},   // 31
    {3, 1, 3, 11},   // 33
    {7, 3, 3, 3},    // 27
    {2, 3, 5, 7},    // 105
    {4, 2, 2, 1},    // 4: float4, one vector per stream
    {3, 5, 4, 4},    // 80
    {2, 10, 10, 10}, // 1000
    {1, 16, 32, 32}, // 16384
};

const std::vector<std::size_t> kCaps = {8192, 1, 2};

void check(const char* name, const Op& ref_op, const Op& emulated_op) {
  const StreamHandle s;
  for (const std::size_t cap : kCaps) {
    const emu::GridStrideCap capped(cap);
    for (const CouplingShape& shape : kShapes)
      for (const std::size_t offset : kOffsets) {
        const auto half = std::size_t(shape.half_size());
        const std::uint64_t seed = half + 10 * offset;
        const AlignedFloats in(random_values(2 * half + offset + kGuard, 400 + seed));
        const AlignedFloats h(random_values(half + offset + kGuard, 500 + seed));
        const std::vector<float> before =
            random_values(2 * half + offset + kGuard, 600 + seed, 5.0, 6.0);
        std::vector<float> expected = before;
        ref_op(s, shape, in.data() + offset, h.data() + offset, expected.data() + offset);

        const AlignedFloats out(before);
        emulated_op(s, shape, in.data() + offset, h.data() + offset, out.data() + offset);
        const std::vector<float> got = out.values();

        INFO(std::string(name), ": shape N=", shape.batch, " C=", shape.channels,
             " H=", shape.height, " W=", shape.width, " offset=", offset, " grid cap=", cap);
        CHECK_MESSAGE(bit_differences(got, expected).empty(), bit_differences(got, expected));
        const std::int64_t size = shape.stream_size();
        const bool vectors = size % 4 == 0 && offset == 0;
        const std::int64_t items = vectors ? shape.batch * size / 4 : shape.batch * size;
        CHECK(emu::last_launch().grid.x == expected_blocks(items));
        CHECK(emu::last_launch().kernel == std::string(name));
      }
  }
}

using S = const StreamHandle&;
using Sh = const CouplingShape&;
using P = const float*;

}  // namespace

TEST_CASE("emulated coupling: forward, inverse and backward match ref bit for bit") {
  check("coupling_forward",
        [](S s, Sh sh, P in, P h, float* out) { ref::coupling_forward<float>(s, sh, in, h, out); },
        cu::coupling_forward);
  check("coupling_inverse",
        [](S s, Sh sh, P in, P h, float* out) { ref::coupling_inverse<float>(s, sh, in, h, out); },
        cu::coupling_inverse);
  check("coupling_backward",
        [](S s, Sh sh, P in, P h, float* out) { ref::coupling_backward<float>(s, sh, in, h, out); },
        cu::coupling_backward);
  // g null (zero): the swap kernel, which must not read h.
  check("coupling_backward",
        [](S s, Sh sh, P in, P, float* out) { ref::coupling_backward<float>(s, sh, in, nullptr, out); },
        [](S s, Sh sh, P in, P, float* out) { cu::coupling_backward(s, sh, in, nullptr, out); });
}

TEST_CASE("emulated coupling: inverse(forward(x)) gives x1 back exactly") {
  const StreamHandle s;
  for (const CouplingShape shape : {CouplingShape{8, 16, 14, 14}, CouplingShape{3, 3, 5, 7}}) {
    const auto half = std::size_t(shape.half_size());
    const auto size = std::size_t(shape.stream_size());
    const AlignedFloats x(random_values(2 * half, 700 + half));
    const AlignedFloats f(random_values(half, 800 + half, -3.0, 3.0));
    const AlignedFloats y(std::vector<float>(2 * half)), back(std::vector<float>(2 * half));
    cu::coupling_forward(s, shape, x.data(), f.data(), y.data());
    cu::coupling_inverse(s, shape, y.data(), f.data(), back.data());
    const std::vector<float> xs = x.values(), backs = back.values();
    std::size_t first_stream_mismatches = 0;
    double worst_second = 0;
    for (std::size_t n = 0; n < std::size_t(shape.batch); ++n)
      for (std::size_t i = 0; i < size; ++i) {
        first_stream_mismatches += backs[2 * n * size + i] != xs[2 * n * size + i];
        worst_second = std::max(worst_second, double(std::abs(backs[(2 * n + 1) * size + i] -
                                                              xs[(2 * n + 1) * size + i])));
      }
    INFO("shape N=", shape.batch, " C=", shape.channels, " H=", shape.height, " W=", shape.width);
    CHECK(first_stream_mismatches == 0);
    CHECK(worst_second <= 0x1p-22);
  }
}
