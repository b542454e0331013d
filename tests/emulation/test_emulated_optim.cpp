// tests/emulation/test_emulated_optim.cpp: the kernels of kernels/cuda/optim.cu (SGD in its four
// variants, Adam, LARS), run on the CPU by the CUDA emulation (emulated_optim.cpp), against
// kernels::ref.
//
// Three steps on random arrays of sizes 1, 31, 33, 1000 and 4099 (blocks partly used), with
// the real grid-stride cap and caps of 1 and 3 blocks (every thread goes round its loop; for LARS
// the norms are then summed over 1 or 3 partials); pointers aligned and one float off. The
// tolerance is the cpu suite's for cpu:: against ref:: (relative 1e-6 after three steps: the
// kernels compute in float, ref:: in double; 1e-5 for n = 1). Guard elements after every array
// must not change.
// LARS also: the same bits on every run, and the trust ratio 1 when a norm is zero. (The cap of
// 1024 partials is not reached here: an array that large is too slow to emulate.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "petra/kernels/common.hpp"
#include "petra/kernels/optim.hpp"
#include "tests/emulation/kernel_checks.hpp"

namespace {

using namespace petra::emulation_testing::vocabulary;
using petra::kernels::AdamOptions;
using petra::kernels::LarsOptions;
using petra::kernels::SgdOptions;

const std::vector<std::int64_t> kSizes = {1, 31, 33, 1000, 4099};

// Step t (1-based) of one optimizer: (emulated, s, n, t, param, grad, state_a, state_b).
using Step = std::function<void(bool, const StreamHandle&, std::int64_t, int, float*, const float*,
                                float*, float*)>;

std::vector<float> part(const std::vector<float>& v, std::size_t offset, std::int64_t n) {
  return std::vector<float>(v.begin() + std::ptrdiff_t(offset),
                            v.begin() + std::ptrdiff_t(offset) + n);
}

// Everything outside [offset, offset + n) is as it was.
bool untouched_outside(const std::vector<float>& got, const std::vector<float>& before,
                       std::size_t offset, std::int64_t n) {
  for (std::size_t i = 0; i < got.size(); ++i)
    if ((i < offset || i >= offset + std::size_t(n)) && got[i] != before[i]) return false;
  return true;
}

void check(const char* name, const Step& step, std::size_t launches_per_step) {
  HeapWorkspace workspace;
  StreamHandle s;
  s.workspace = &workspace;
  std::uint64_t seed = 1000;
  for (const std::size_t cap : kGridCaps) {
    const emu::GridStrideCap capped(cap);
    for (const std::int64_t n : kSizes)
      for (const std::size_t offset : kOffsets) {
        seed += 10;
        const std::size_t count = std::size_t(n) + offset + kGuard;
        const std::vector<float> p0 = random_values(count, seed);
        const std::vector<float> state0 = random_values(count, seed + 1, 0.0, 0.01);  // v >= 0
        std::vector<float> p_ref = p0, a_ref = state0, b_ref = state0;
        const AlignedFloats p(p0), a(state0), b(state0);
        INFO(std::string(name), ": n=", n, " offset=", offset, " grid cap=", cap);
        for (int t = 1; t <= 3; ++t) {
          const AlignedFloats grad(random_values(count, seed + 2 + std::uint64_t(t)));
          step(false, s, n, t, p_ref.data() + offset, grad.data() + offset, a_ref.data() + offset,
               b_ref.data() + offset);
          const std::size_t launches = emu::launches();
          step(true, s, n, t, p.data() + offset, grad.data() + offset, a.data() + offset,
               b.data() + offset);
          CHECK(emu::launches() == launches + launches_per_step);
          CHECK(emu::last_launch().kernel == std::string(name));
          CHECK(emu::last_launch().grid.x == expected_blocks(n));
        }
        // One element alone can lose digits to cancellation (buf = momentum * buf + g), which
        // an array's relative error averages out: a looser bound for n = 1.
        const double tolerance = n == 1 ? 1e-5 : 1e-6;
        CHECK(relative_error(part(p.values(), offset, n), part(p_ref, offset, n)) <= tolerance);
        CHECK(relative_error(part(a.values(), offset, n), part(a_ref, offset, n)) <= tolerance);
        CHECK(relative_error(part(b.values(), offset, n), part(b_ref, offset, n)) <= tolerance);
        CHECK(untouched_outside(p.values(), p0, offset, n));
        CHECK(untouched_outside(a.values(), state0, offset, n));
        CHECK(untouched_outside(b.values(), state0, offset, n));
      }
  }
}

Step sgd(const SgdOptions& o) {
  return [o](bool emulated, const StreamHandle& s, std::int64_t n, int t, float* p, const float* g,
             float* buf, float*) {
    if (emulated)
      cu::sgd_step(s, n, o, t == 1, p, g, buf);
    else
      ref::sgd_step<float>(s, n, o, t == 1, p, g, buf);
  };
}

const LarsOptions kLars{0.1, 0.9, 5e-4, 0.001};

void lars(bool emulated, const StreamHandle& s, std::int64_t n, int, float* p, const float* g,
          float* buf, float*) {
  if (emulated)
    cu::lars_step(s, n, kLars, p, g, buf);
  else
    ref::lars_step<float>(s, n, kLars, p, g, buf);
}

}  // namespace

TEST_CASE("emulated optim: SGD (plain, momentum with dampening, Nesterov, delay) matches ref") {
  check("sgd_step", sgd({0.1, 0, 0, 0, false}), 1);
  check("sgd_step", sgd({0.1, 0, 0, 1e-2, false}), 1);
  check("sgd_step", sgd({0.05, 0.9, 0.1, 1e-4, false}), 1);
  check("sgd_step", sgd({0.05, 0.9, 0, 5e-4, true}), 1);
  check("sgd_step", sgd({0.05, 0.9, 0, 5e-4, true, 3.0}), 1);
  check("sgd_step", sgd({0.05, 0.9, 0, 0, false, 2.5}), 1);
}

TEST_CASE("emulated optim: Adam with weight decay matches ref") {
  for (const AdamOptions& o : {AdamOptions{1e-3, 0.9, 0.999, 1e-8, 1e-2}, AdamOptions{}}) {
    check("adam_step",
          [o](bool emulated, const StreamHandle& s, std::int64_t n, int t, float* p,
              const float* g, float* m, float* v) {
            if (emulated)
              cu::adam_step(s, n, o, t, p, g, m, v);
            else
              ref::adam_step<float>(s, n, o, t, p, g, m, v);
          },
          1);
  }
}

TEST_CASE("emulated optim: LARS matches ref, its norms from a fixed tree") {
  check("lars_step", lars, 3);
}

TEST_CASE("emulated optim: LARS gives the same bits on every run, and trust 1 for a zero norm") {
  HeapWorkspace workspace;
  StreamHandle s;
  s.workspace = &workspace;
  for (const std::int64_t n : {std::int64_t(33), std::int64_t(4099)}) {
    const std::vector<float> p0 = random_values(std::size_t(n), 77), g = random_values(std::size_t(n), 78);
    const std::vector<float> buf0 = random_values(std::size_t(n), 79);
    std::vector<float> p1 = p0, b1 = buf0, p2 = p0, b2 = buf0;
    cu::lars_step(s, n, kLars, p1.data(), g.data(), b1.data());
    cu::lars_step(s, n, kLars, p2.data(), g.data(), b2.data());
    CHECK(p1 == p2);
    CHECK(b1 == b2);
  }
  // param all zero: ||param|| = 0, trust 1, so buf = momentum * buf + lr * grad (weight decay
  // times zero).
  const std::int64_t n = 40;
  std::vector<float> p(std::size_t(n), 0.0f), p_ref = p;
  const std::vector<float> g = random_values(std::size_t(n), 80), buf0 = random_values(std::size_t(n), 81);
  std::vector<float> b = buf0, b_ref = buf0;
  cu::lars_step(s, n, kLars, p.data(), g.data(), b.data());
  ref::lars_step<float>(s, n, kLars, p_ref.data(), g.data(), b_ref.data());
  CHECK(relative_error(b, b_ref) <= 1e-6);
  CHECK(relative_error(p, p_ref) <= 1e-6);
  for (std::size_t i = 0; i < std::size_t(n); ++i)
    CHECK(b[i] == doctest::Approx(0.9 * buf0[i] + 0.1 * g[i]).epsilon(1e-6));
}
