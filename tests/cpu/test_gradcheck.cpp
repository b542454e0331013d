// tests/cpu/test_gradcheck.cpp: the finite-difference checker itself must catch a wrong derivative.
#include <doctest/doctest.h>

#include <cmath>

#include "tests/support/testing.hpp"

using petra::testing::check_gradient;

namespace {
// L(x) = sum_i sin(x_i) * x_{i+1}, a function with coupled coordinates.
double loss(const std::vector<double>& x) {
  double l = 0;
  for (std::size_t i = 0; i + 1 < x.size(); ++i) l += std::sin(x[i]) * x[i + 1];
  return l;
}
std::vector<double> true_gradient(const std::vector<double>& x) {
  std::vector<double> g(x.size(), 0.0);
  for (std::size_t i = 0; i + 1 < x.size(); ++i) {
    g[i] += std::cos(x[i]) * x[i + 1];
    g[i + 1] += std::sin(x[i]);
  }
  return g;
}
}  // namespace

TEST_CASE("gradcheck accepts the true derivative") {
  const auto x = petra::testing::random_values<double>(7, 1);
  const auto r = check_gradient(loss, x, true_gradient(x));
  CHECK_MESSAGE(r.ok, r.worst);
  CHECK(r.max_error < 0.1);
}

TEST_CASE("gradcheck rejects a deliberately wrong derivative") {
  const auto x = petra::testing::random_values<double>(7, 2);
  auto wrong = true_gradient(x);
  SUBCASE("one element off by 1e-3") { wrong[3] += 1e-3; }
  SUBCASE("a sign flipped") { wrong[0] = -wrong[0]; }
  SUBCASE("a term forgotten (cos instead of cos * x)") { wrong[1] = std::cos(x[1]); }
  const auto r = check_gradient(loss, x, wrong);
  CHECK_FALSE(r.ok);
  CHECK(r.max_error > 1.0);
}

TEST_CASE("gradcheck rejects a gradient of the wrong size") {
  const auto x = petra::testing::random_values<double>(4, 3);
  CHECK_FALSE(check_gradient(loss, x, std::vector<double>(3, 0.0)).ok);
}
