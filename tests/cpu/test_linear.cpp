// tests/cpu/test_linear.cpp: the linear (fully connected) kernels: cpu:: against ref::, ref::'s
// backward passes against finite differences, and the "=" / "+=" contract of each output.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "petra/kernels/linear.hpp"
#include "tests/support/gradcheck.hpp"
#include "tests/support/testing.hpp"

namespace {

using petra::kernels::LinearShape;
using petra::kernels::StreamHandle;
using petra::testing::random_values;
using petra::testing::relative_error;
namespace ref = petra::kernels::ref;
namespace cpu = petra::kernels::cpu;

std::string describe(const LinearShape& s) {
  return "batch " + std::to_string(s.batch) + ", " + std::to_string(s.in_features) + " -> " +
         std::to_string(s.out_features);
}

std::size_t size_of(std::int64_t n) { return static_cast<std::size_t>(n); }

// Runs the four cpu:: kernels in T on random data and compares them with ref:: in double.
template <class T>
void compare_with_reference(const LinearShape& shape, int threads, double tolerance) {
  CAPTURE(describe(shape));
  CAPTURE(threads);
  const auto x = random_values<double>(size_of(shape.batch * shape.in_features), 1);
  const auto w = random_values<double>(size_of(shape.out_features * shape.in_features), 2);
  const auto bias = random_values<double>(size_of(shape.out_features), 3);
  const auto dy = random_values<double>(size_of(shape.batch * shape.out_features), 4);
  const std::vector<T> xt(x.begin(), x.end()), wt(w.begin(), w.end()), bt(bias.begin(), bias.end()),
      dyt(dy.begin(), dy.end());

  const StreamHandle serial;
  std::vector<double> y(dy.size()), y_without_bias(dy.size()), dx(x.size()), dw(w.size(), 0.0),
      db(bias.size(), 0.0);
  ref::linear_forward(serial, shape, x.data(), w.data(), bias.data(), y.data());
  ref::linear_forward(serial, shape, x.data(), w.data(), static_cast<const double*>(nullptr),
                      y_without_bias.data());
  ref::linear_backward_data(serial, shape, dy.data(), w.data(), dx.data());
  ref::linear_backward_weight(serial, shape, x.data(), dy.data(), dw.data());
  ref::linear_backward_bias(serial, shape, dy.data(), db.data());

  StreamHandle s;
  s.num_threads = threads;
  std::vector<T> yt(y.size()), dxt(dx.size()), dwt(dw.size(), T(0)), dbt(db.size(), T(0));
  cpu::linear_forward(s, shape, xt.data(), wt.data(), bt.data(), yt.data());
  CHECK(relative_error(yt, y) <= tolerance);
  cpu::linear_forward(s, shape, xt.data(), wt.data(), static_cast<const T*>(nullptr), yt.data());
  CHECK(relative_error(yt, y_without_bias) <= tolerance);
  cpu::linear_backward_data(s, shape, dyt.data(), wt.data(), dxt.data());
  CHECK(relative_error(dxt, dx) <= tolerance);
  cpu::linear_backward_weight(s, shape, xt.data(), dyt.data(), dwt.data());
  CHECK(relative_error(dwt, dw) <= tolerance);
  cpu::linear_backward_bias(s, shape, dyt.data(), dbt.data());
  CHECK(relative_error(dbt, db) <= tolerance);
}

const std::vector<LinearShape> comparison_shapes = {
    {1, 1, 1}, {1, 7, 3}, {5, 13, 17}, {64, 100, 10}, {33, 257, 65}, {2, 512, 1}, {128, 64, 300},
    {61, 200, 130}};  // the last two are large enough for a multi-threaded GEMM

}  // namespace

TEST_CASE("linear: ref forward on a hand-computed example") {
  const LinearShape s{2, 3, 2};
  const std::vector<double> x = {1, 2, 3, 4, 5, 6}, w = {1, 0, -1, 10, 100, 1000}, bias = {0.5, -1};
  std::vector<double> y(4);
  ref::linear_forward(StreamHandle{}, s, x.data(), w.data(), bias.data(), y.data());
  CHECK(y[0] == doctest::Approx(1 - 3 + 0.5));
  CHECK(y[1] == doctest::Approx(10 + 200 + 3000 - 1));
  CHECK(y[2] == doctest::Approx(4 - 6 + 0.5));
  CHECK(y[3] == doctest::Approx(40 + 500 + 6000 - 1));
}

TEST_CASE("linear: cpu matches ref (float, 1, 2 and 3 threads)") {
  for (const auto& shape : comparison_shapes)
    for (int threads : {1, 2, 3}) compare_with_reference<float>(shape, threads, 1e-5);
}

TEST_CASE("linear: cpu matches ref (double)") {
  for (const auto& shape : comparison_shapes) compare_with_reference<double>(shape, 2, 1e-12);
}

TEST_CASE("linear: ref backward passes match finite differences") {
  for (const LinearShape shape : {LinearShape{3, 4, 5}, LinearShape{1, 6, 2}}) {
    CAPTURE(describe(shape));
    const StreamHandle s;
    auto x = random_values<double>(size_of(shape.batch * shape.in_features), 11);
    auto w = random_values<double>(size_of(shape.out_features * shape.in_features), 12);
    auto bias = random_values<double>(size_of(shape.out_features), 13);
    const auto g = random_values<double>(size_of(shape.batch * shape.out_features), 14);
    std::vector<double> dx(x.size()), dw(w.size(), 0.0), db(bias.size(), 0.0);
    ref::linear_backward_data(s, shape, g.data(), w.data(), dx.data());
    ref::linear_backward_weight(s, shape, x.data(), g.data(), dw.data());
    ref::linear_backward_bias(s, shape, g.data(), db.data());
    // L = <g, x w^T + bias>; its gradients are the backward passes applied to g.
    petra::testing::check_vjp(
        [&](const auto& in) {
          std::vector<double> y(g.size());
          ref::linear_forward(s, shape, in[0].data(), in[1].data(), in[2].data(), y.data());
          return y;
        },
        {x, w, bias}, g, {dx, dw, db}, {"dx", "dw", "db"});
  }
}

// y and dx are assigned (whatever they held is gone); dw and db are accumulated.
template <class Kernels>
void check_assign_accumulate_contract(const Kernels& run) {
  const LinearShape shape{5, 9, 7};
  const auto x = random_values<float>(size_of(shape.batch * shape.in_features), 21);
  const auto w = random_values<float>(size_of(shape.out_features * shape.in_features), 22);
  const auto bias = random_values<float>(size_of(shape.out_features), 23);
  const auto dy = random_values<float>(size_of(shape.batch * shape.out_features), 24);
  std::vector<float> y_fresh(dy.size()), dx_fresh(x.size()), dw_fresh(w.size(), 0.f),
      db_fresh(bias.size(), 0.f);
  run(shape, x, w, bias, dy, y_fresh, dx_fresh, dw_fresh, db_fresh);

  std::vector<float> y(dy.size(), 7.f), dx(x.size(), -3.f), dw(w.size(), 5.f), db(bias.size(), -2.f);
  run(shape, x, w, bias, dy, y, dx, dw, db);
  CHECK(relative_error(y, y_fresh) <= 1e-6);
  CHECK(relative_error(dx, dx_fresh) <= 1e-6);
  for (auto& v : dw_fresh) v += 5.f;
  for (auto& v : db_fresh) v += -2.f;
  CHECK(relative_error(dw, dw_fresh) <= 1e-6);
  CHECK(relative_error(db, db_fresh) <= 1e-6);
}

TEST_CASE("linear: forward and backward-data assign, backward-weight and -bias accumulate") {
  SUBCASE("ref") {
    check_assign_accumulate_contract([](const LinearShape& shape, const auto& x, const auto& w,
                                        const auto& bias, const auto& dy, auto& y, auto& dx,
                                        auto& dw, auto& db) {
      const StreamHandle s;
      ref::linear_forward(s, shape, x.data(), w.data(), bias.data(), y.data());
      ref::linear_backward_data(s, shape, dy.data(), w.data(), dx.data());
      ref::linear_backward_weight(s, shape, x.data(), dy.data(), dw.data());
      ref::linear_backward_bias(s, shape, dy.data(), db.data());
    });
  }
  SUBCASE("cpu") {
    check_assign_accumulate_contract([](const LinearShape& shape, const auto& x, const auto& w,
                                        const auto& bias, const auto& dy, auto& y, auto& dx,
                                        auto& dw, auto& db) {
      StreamHandle s;
      s.num_threads = 2;
      cpu::linear_forward(s, shape, x.data(), w.data(), bias.data(), y.data());
      cpu::linear_backward_data(s, shape, dy.data(), w.data(), dx.data());
      cpu::linear_backward_weight(s, shape, x.data(), dy.data(), dw.data());
      cpu::linear_backward_bias(s, shape, dy.data(), db.data());
    });
  }
}
