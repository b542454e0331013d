// tests/cpu/test_elementwise.cpp: element-wise kernels: hand-computed values (which also pin the
// "=" / "+=" contract), cpu vs ref on random arrays, in-place use, and relu's gradient.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "petra/kernels/elementwise.hpp"
#include "tests/support/testing.hpp"

namespace k = petra::kernels;
using petra::testing::random_values;
using petra::testing::relative_error;

namespace {

// One element-wise op as a function of two inputs x, y and one output `out`; `fast` picks cpu::
// over ref::. Ops with one input ignore y.
template <class T>
using ElementwiseCall = std::function<void(bool fast, const k::StreamHandle&, std::int64_t n, const T* x,
                                           const T* y, T* out)>;

template <class T>
struct ElementwiseCase {
  std::string name;
  ElementwiseCall<T> call;
  std::vector<double> expected;  // for the hand example below, with `out` pre-filled with 10
};

// The hand example: every value is exact in float.
const std::vector<double> kHandX = {-2, -0.5, 0, 1.5, 3};
const std::vector<double> kHandY = {1, 2, -3, 4, 0.25};
constexpr double kPrefill = 10;

template <class T>
std::vector<ElementwiseCase<T>> all_cases() {
  using S = k::StreamHandle;
  using I = std::int64_t;
  return {
      {"add", [](bool f, const S& s, I n, const T* x, const T* y, T* o) { f ? k::cpu::add(s, n, x, y, o) : k::ref::add(s, n, x, y, o); },
       {-1, 1.5, -3, 5.5, 3.25}},
      {"sub", [](bool f, const S& s, I n, const T* x, const T* y, T* o) { f ? k::cpu::sub(s, n, x, y, o) : k::ref::sub(s, n, x, y, o); },
       {-3, -2.5, 3, -2.5, 2.75}},
      {"mul", [](bool f, const S& s, I n, const T* x, const T* y, T* o) { f ? k::cpu::mul(s, n, x, y, o) : k::ref::mul(s, n, x, y, o); },
       {-2, -1, 0, 6, 0.75}},
      {"scale", [](bool f, const S& s, I n, const T* x, const T*, T* o) { f ? k::cpu::scale(s, n, 2.0, x, o) : k::ref::scale(s, n, 2.0, x, o); },
       {-4, -1, 0, 3, 6}},
      {"axpy", [](bool f, const S& s, I n, const T* x, const T*, T* o) { f ? k::cpu::axpy(s, n, 2.0, x, o) : k::ref::axpy(s, n, 2.0, x, o); },
       {6, 9, 10, 13, 16}},
      {"add_inplace", [](bool f, const S& s, I n, const T* x, const T*, T* o) { f ? k::cpu::add_inplace(s, n, x, o) : k::ref::add_inplace(s, n, x, o); },
       {8, 9.5, 10, 11.5, 13}},
      {"relu", [](bool f, const S& s, I n, const T* x, const T*, T* o) { f ? k::cpu::relu(s, n, x, o) : k::ref::relu(s, n, x, o); },
       {0, 0, 0, 1.5, 3}},
      // here x plays the forward output y, and y plays dy
      {"relu_backward", [](bool f, const S& s, I n, const T* x, const T* y, T* o) { f ? k::cpu::relu_backward(s, n, x, y, o) : k::ref::relu_backward(s, n, x, y, o); },
       {0, 0, 0, 4, 0.25}},
      {"copy", [](bool f, const S& s, I n, const T* x, const T*, T* o) { f ? k::cpu::copy(s, n, x, o) : k::ref::copy(s, n, x, o); },
       {-2, -0.5, 0, 1.5, 3}},
      {"fill", [](bool f, const S& s, I n, const T*, const T*, T* o) { f ? k::cpu::fill(s, n, 7.0, o) : k::ref::fill(s, n, 7.0, o); },
       {7, 7, 7, 7, 7}},
  };
}

template <class T>
std::vector<T> as(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

template <class T>
void check_hand_example() {
  const k::StreamHandle s;
  const auto x = as<T>(kHandX), y = as<T>(kHandY);
  for (const auto& c : all_cases<T>()) {
    for (bool fast : {false, true}) {
      CAPTURE(c.name);
      CAPTURE(fast);
      std::vector<T> out(x.size(), T(kPrefill));
      c.call(fast, s, std::int64_t(x.size()), x.data(), y.data(), out.data());
      for (std::size_t i = 0; i < out.size(); ++i) CHECK(double(out[i]) == c.expected[i]);
    }
  }
}

template <class T>
void check_cpu_matches_ref(double tolerance) {
  // odd sizes, n = 1, and sizes above the threading threshold
  const std::vector<std::int64_t> sizes = {1, 2, 17, 1001, k::kElementwiseParallelThreshold + 3, 300007};
  std::uint64_t seed = 1;
  for (const auto& c : all_cases<T>()) {
    for (std::int64_t n : sizes) {
      for (int threads : {1, 2}) {
        CAPTURE(c.name);
        CAPTURE(n);
        CAPTURE(threads);
        k::StreamHandle s;
        s.num_threads = threads;
        const auto x = random_values<T>(std::size_t(n), seed++);
        const auto y = random_values<T>(std::size_t(n), seed++);
        const auto prefill = random_values<T>(std::size_t(n), seed++);
        auto expected = prefill, got = prefill;
        c.call(false, s, n, x.data(), y.data(), expected.data());
        c.call(true, s, n, x.data(), y.data(), got.data());
        CHECK(relative_error(got, expected) <= tolerance);
      }
    }
  }
}

}  // namespace

TEST_CASE("elementwise: hand-computed values, outputs assigned (=) or accumulated (+=)") {
  check_hand_example<float>();
  check_hand_example<double>();
}

TEST_CASE("elementwise: cpu matches ref on random arrays, 1 and 2 threads") {
  check_cpu_matches_ref<float>(1e-6);
  check_cpu_matches_ref<double>(1e-14);
}

TEST_CASE("elementwise: outputs may alias inputs") {
  const k::StreamHandle s;
  const std::int64_t n = 100003;
  const auto x = random_values<float>(std::size_t(n), 11);
  const auto y = random_values<float>(std::size_t(n), 12);
  std::vector<float> expected(static_cast<std::size_t>(n));

  auto z = y;  // z = x + z
  k::ref::add(s, n, x.data(), y.data(), expected.data());
  k::cpu::add(s, n, x.data(), z.data(), z.data());
  CHECK(relative_error(z, expected) == 0);

  auto r = x;  // relu in place
  k::ref::relu(s, n, x.data(), expected.data());
  k::cpu::relu(s, n, r.data(), r.data());
  CHECK(relative_error(r, expected) == 0);

  auto g = y;  // dx written over dy
  k::ref::relu_backward(s, n, r.data(), y.data(), expected.data());
  k::cpu::relu_backward(s, n, r.data(), g.data(), g.data());
  CHECK(relative_error(g, expected) == 0);
}

TEST_CASE("elementwise: relu passes NaN through and its backward blocks it") {
  const k::StreamHandle s;
  const float nan = std::nanf("");
  const std::vector<float> x = {nan, -1.f, 2.f};
  std::vector<float> y(3), dx(3);
  const std::vector<float> dy = {5.f, 5.f, 5.f};
  k::cpu::relu(s, 3, x.data(), y.data());
  CHECK(std::isnan(y[0]));
  k::cpu::relu_backward(s, 3, y.data(), dy.data(), dx.data());
  CHECK(dx == std::vector<float>{0.f, 0.f, 5.f});
}

TEST_CASE("elementwise: relu backward matches finite differences (double, away from 0)") {
  const k::StreamHandle s;
  const std::size_t n = 64;
  auto x = random_values<double>(n, 21);
  for (auto& v : x) v = v < 0 ? v - 0.1 : v + 0.1;  // |x| >= 0.1, far from the kink at h = 1e-6
  const auto g = random_values<double>(n, 22);

  auto loss = [&](const std::vector<double>& xv) {
    std::vector<double> y(n);
    k::ref::relu(s, std::int64_t(n), xv.data(), y.data());
    double l = 0;
    for (std::size_t i = 0; i < n; ++i) l += g[i] * y[i];
    return l;
  };
  std::vector<double> y(n), dx(n);
  k::ref::relu(s, std::int64_t(n), x.data(), y.data());
  k::ref::relu_backward(s, std::int64_t(n), y.data(), g.data(), dx.data());
  const auto r = petra::testing::check_gradient(loss, x, dx);
  CHECK_MESSAGE(r.ok, r.worst);
}
