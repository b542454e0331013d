// tests/emulation/test_emulated_elementwise.cpp: every kernel of kernels/cuda/elementwise.cu, run
// on the CPU by the CUDA emulation (emulated_elementwise.cpp), against kernels::ref.
//
// Sizes 1 to 5 and 31, 33, 1000, 1002, 4099 cover every remainder of the float4 path (n % 4) and
// blocks that are partly used; offset 0 takes the float4 path, offset 1 (pointers one float past
// 16-byte alignment) the float path, and the test checks from the launched grid which one ran;
// grid caps of 1 and 3 blocks make every thread go round the grid-stride loop. Outputs are
// pre-filled, so "=" and "+=" are both checked, and the guard elements after each output must stay
// as they were.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "petra/kernels/common.hpp"
#include "petra/kernels/elementwise.hpp"
#include "tests/emulation/kernel_checks.hpp"

namespace {

using namespace petra::emulation_testing::vocabulary;

const std::vector<std::int64_t> kSizes = {1, 2, 3, 4, 5, 31, 33, 1000, 1002, 4099};

// One op as (stream, n, a, b, out): a and b are inputs (b unused by unary ops).
using Op =
    std::function<void(const StreamHandle&, std::int64_t, const float*, const float*, float*)>;

struct Case {
  const char* name;
  Op ref_op, emulated_op;
  bool exact;     // the float result equals ref's (rounded from double) bit for bit
  bool launches;  // runs a kernel (copy is a cudaMemcpyAsync)
};

void check(const Case& c) {
  const StreamHandle s;  // cuda_stream null: the emulation runs synchronously
  for (const std::size_t cap : kGridCaps) {
    const emu::GridStrideCap capped(cap);
    for (const std::int64_t n : kSizes)
      for (const std::size_t offset : kOffsets) {
        const std::size_t count = std::size_t(n) + offset + kGuard;
        const AlignedFloats a(random_values(count, 100 + std::uint64_t(n)));
        const AlignedFloats b(random_values(count, 200 + std::uint64_t(n)));
        const std::vector<float> before = random_values(count, 300 + std::uint64_t(n), 5.0, 6.0);
        std::vector<float> expected = before;
        c.ref_op(s, n, a.data() + offset, b.data() + offset, expected.data() + offset);

        const AlignedFloats out(before);
        const std::size_t launches = emu::launches();
        c.emulated_op(s, n, a.data() + offset, b.data() + offset, out.data() + offset);
        const std::vector<float> got = out.values();

        INFO(std::string(c.name), ": n=", n, " offset=", offset, " grid cap=", cap);
        if (c.exact) {
          CHECK_MESSAGE(bit_differences(got, expected).empty(), bit_differences(got, expected));
        } else {
          const std::vector<float> got_out(got.begin() + std::ptrdiff_t(offset),
                                           got.begin() + std::ptrdiff_t(offset) + n);
          const std::vector<float> want_out(expected.begin() + std::ptrdiff_t(offset),
                                            expected.begin() + std::ptrdiff_t(offset) + n);
          CHECK(relative_error(got_out, want_out) <= 1e-6);
          for (std::size_t i = 0; i < count; ++i)
            if (i < offset || i >= offset + std::size_t(n)) CHECK(got[i] == before[i]);
        }
        if (c.launches) {
          // Offset 0: every pointer is 16-byte aligned, the float4 path runs over n / 4 vectors.
          const std::int64_t items = offset == 0 ? (n + 3) / 4 : n;
          CHECK(emu::launches() == launches + 1);
          CHECK(emu::last_launch().grid.x == expected_blocks(items));
          CHECK(emu::last_launch().block.x == 256);
        }
      }
  }
}

using S = const StreamHandle&;
using I = std::int64_t;
using P = const float*;

}  // namespace

TEST_CASE("emulated elementwise: add, sub, mul match ref bit for bit") {
  check({"add", [](S s, I n, P a, P b, float* o) { ref::add<float>(s, n, a, b, o); },
         [](S s, I n, P a, P b, float* o) { cu::add(s, n, a, b, o); }, true, true});
  check({"sub", [](S s, I n, P a, P b, float* o) { ref::sub<float>(s, n, a, b, o); },
         [](S s, I n, P a, P b, float* o) { cu::sub(s, n, a, b, o); }, true, true});
  check({"mul", [](S s, I n, P a, P b, float* o) { ref::mul<float>(s, n, a, b, o); },
         [](S s, I n, P a, P b, float* o) { cu::mul(s, n, a, b, o); }, true, true});
}

TEST_CASE("emulated elementwise: scale and axpy match ref to float rounding") {
  check({"scale", [](S s, I n, P a, P, float* o) { ref::scale<float>(s, n, -0.3, a, o); },
         [](S s, I n, P a, P, float* o) { cu::scale(s, n, -0.3, a, o); }, false, true});
  check({"axpy", [](S s, I n, P a, P, float* o) { ref::axpy<float>(s, n, 1.7, a, o); },
         [](S s, I n, P a, P, float* o) { cu::axpy(s, n, 1.7, a, o); }, false, true});
}

TEST_CASE("emulated elementwise: add_inplace, relu, relu_backward, copy, fill match ref") {
  check({"add_inplace", [](S s, I n, P a, P, float* o) { ref::add_inplace<float>(s, n, a, o); },
         [](S s, I n, P a, P, float* o) { cu::add_inplace(s, n, a, o); }, true, true});
  check({"relu", [](S s, I n, P a, P, float* o) { ref::relu<float>(s, n, a, o); },
         [](S s, I n, P a, P, float* o) { cu::relu(s, n, a, o); }, true, true});
  check({"relu_backward",
         [](S s, I n, P a, P b, float* o) { ref::relu_backward<float>(s, n, a, b, o); },
         [](S s, I n, P a, P b, float* o) { cu::relu_backward(s, n, a, b, o); }, true, true});
  check({"copy", [](S s, I n, P a, P, float* o) { ref::copy<float>(s, n, a, o); },
         [](S s, I n, P a, P, float* o) { cu::copy(s, n, a, o); }, true, false});
  check({"fill", [](S s, I n, P, P, float* o) { ref::fill<float>(s, n, 2.5, o); },
         [](S s, I n, P, P, float* o) { cu::fill(s, n, 2.5, o); }, true, true});
}

TEST_CASE("emulated elementwise: outputs that are inputs (z = x + z, relu in place)") {
  const StreamHandle s;
  for (const std::size_t offset : kOffsets) {
    const std::int64_t n = 1003;
    const std::size_t count = std::size_t(n) + offset;
    const std::vector<float> x = random_values(count, 5), z = random_values(count, 6);
    std::vector<float> expected_sum = z, expected_relu = x;
    ref::add<float>(s, n, x.data() + offset, z.data() + offset, expected_sum.data() + offset);
    ref::relu<float>(s, n, x.data() + offset, expected_relu.data() + offset);

    const AlignedFloats dx(x), dz(z);
    cu::add(s, n, dx.data() + offset, dz.data() + offset, dz.data() + offset);
    cu::relu(s, n, dx.data() + offset, dx.data() + offset);
    INFO("offset ", offset);
    CHECK(bit_differences(dz.values(), expected_sum).empty());
    CHECK(bit_differences(dx.values(), expected_relu).empty());
  }
}

TEST_CASE("emulated elementwise: relu keeps NaN, relu_backward passes dy where y > 0") {
  const StreamHandle s;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const AlignedFloats x({-1.0f, nan, 0.0f, -0.0f, 2.0f, nan, -3.0f, 4.0f, 5.0f});
  const AlignedFloats y(std::vector<float>(9, 7.0f));
  cu::relu(s, 9, x.data(), y.data());
  const std::vector<float> r = y.values();
  CHECK(r[0] == 0.0f);
  CHECK(std::isnan(r[1]));
  CHECK(std::isnan(r[5]));
  CHECK(r[4] == 2.0f);
  CHECK(r[8] == 5.0f);
  const AlignedFloats dy(std::vector<float>(9, 3.0f));
  const AlignedFloats dx(std::vector<float>(9, 7.0f));
  cu::relu_backward(s, 9, y.data(), dy.data(), dx.data());
  CHECK(dx.values() == std::vector<float>{0, 0, 0, 0, 3, 0, 0, 3, 3});
}

TEST_CASE("emulated elementwise: n = 0 launches nothing") {
  const StreamHandle s;
  const std::size_t before = emu::launches();
  cu::add(s, 0, nullptr, nullptr, nullptr);
  cu::relu(s, 0, nullptr, nullptr);
  cu::copy(s, 0, nullptr, nullptr);
  cu::fill(s, 0, 1.0, nullptr);
  CHECK(emu::launches() == before);
}
