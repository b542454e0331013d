// tests/support/testing.hpp: helpers shared by the test suites.
//
//   random_values(n, seed)          reproducible uniform values in [lo, hi)
//   max_abs_diff / relative_error   compare two arrays
//   check_gradient(loss, x, grad)   compares an analytic gradient with central finite differences
//   kTimingIsMeaningful             false under a sanitizer: timing assertions are skipped
//   AlignedVector<T>                a std::vector on 64-byte boundaries, as petra's tensors
//
// The gradient checker works on a scalar function of one flat vector of doubles. To check a
// vector-valued op y = f(x), build the scalar L(x) = <g, f(x)> with a fixed random g; the analytic
// gradient of L is then the op's vector-Jacobian product with g. Repeat per input.
//
// Built on these: gradcheck.hpp (finite-difference harnesses for kernels, ops and model
// parameters), fixtures.hpp (random tensors and batches, small models, temporary directories),
// backend_ops.hpp (the table of ops:: cases run on every backend against ref::).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace petra::testing {

// Whether timings mean anything in this build: not under a sanitizer (scripts/check.sh builds
// with ASan, UBSan or TSan, which slow every memory access several times). Tests that assert a
// time check it and only report the time otherwise.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kTimingIsMeaningful = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kTimingIsMeaningful = false;
#else
inline constexpr bool kTimingIsMeaningful = true;
#endif
#else
inline constexpr bool kTimingIsMeaningful = true;
#endif

// Storage at 64-byte boundaries, as petra's allocator gives every tensor. A kernel's result can
// depend on where its operands start: where it hands a small product to Eigen, which vectorises
// from the first aligned element, the rounding of an output can move with its address (two outputs
// compared bit for bit must then be equally aligned: with malloc's 16 bytes, a comparison failed
// in about one run in ten); and its speed too (cache-line splits).
template <class T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <class U>
  Aligned64(const Aligned64<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(64)); }
  friend bool operator==(const Aligned64&, const Aligned64&) { return true; }
};
template <class T>
using AlignedVector = std::vector<T, Aligned64<T>>;

template <class T = float>
std::vector<T> random_values(std::size_t n, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(gen));
  return v;
}

template <class A, class B>
double max_abs_diff(const A& a, const B& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

// ||a - b|| / max(||b||, tiny): the error measure used to compare cpu:: with ref::.
template <class A, class B>
double relative_error(const A& a, const B& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

struct GradCheckResult {
  bool ok = true;
  double max_error = 0;  // max over i of |analytic - numeric| / (atol + rtol * |numeric|); ok iff <= 1
  std::string worst;     // description of the worst element
};

// Central differences: numeric_i = (L(x + h e_i) - L(x - h e_i)) / 2h. Element i passes when
// |analytic_i - numeric_i| <= atol + rtol * |numeric_i|.
inline GradCheckResult check_gradient(const std::function<double(const std::vector<double>&)>& loss,
                                      std::vector<double> x, const std::vector<double>& analytic,
                                      double h = 1e-6, double atol = 1e-7, double rtol = 1e-5) {
  GradCheckResult r;
  if (analytic.size() != x.size()) {
    r.ok = false;
    r.worst = "analytic gradient has the wrong size";
    r.max_error = INFINITY;
    return r;
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = loss(x);
    x[i] = saved - h;
    const double down = loss(x);
    x[i] = saved;
    const double numeric = (up - down) / (2 * h);
    const double err = std::abs(analytic[i] - numeric) / (atol + rtol * std::abs(numeric));
    if (err > r.max_error) {
      r.max_error = err;
      std::ostringstream s;
      s << "element " << i << ": analytic " << analytic[i] << " numeric " << numeric;
      r.worst = s.str();
    }
  }
  r.ok = r.max_error <= 1.0;
  return r;
}

}  // namespace petra::testing
