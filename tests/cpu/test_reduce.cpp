// tests/cpu/test_reduce.cpp: sum/mean reductions and their backward: hand values, cpu vs ref for
// every mask of several shapes, thread-count independence, and finite-difference gradients.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "petra/kernels/reduce.hpp"
#include "tests/support/testing.hpp"

namespace k = petra::kernels;
using petra::testing::random_values;
using petra::testing::relative_error;
using Dims = std::vector<std::int64_t>;

namespace {

std::int64_t numel(const Dims& dims) {
  std::int64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}

std::int64_t output_numel(const Dims& dims, std::uint32_t mask) {
  return numel(dims) == 0 ? 0 : numel(dims) / k::reduced_count(dims, mask);
}

enum class Op { sum, mean, sum_backward, mean_backward };

// Runs op through cpu:: (fast) or ref:: with input `in`, writing `out`. For the forward ops `in`
// has the full shape and `out` the reduced one; for the backward ops the other way round.
template <class T>
void run(Op op, bool fast, const k::StreamHandle& s, const Dims& dims, std::uint32_t mask, const T* in, T* out) {
  switch (op) {
    case Op::sum: fast ? k::cpu::reduce_sum(s, dims, mask, in, out) : k::ref::reduce_sum(s, dims, mask, in, out); break;
    case Op::mean: fast ? k::cpu::reduce_mean(s, dims, mask, in, out) : k::ref::reduce_mean(s, dims, mask, in, out); break;
    case Op::sum_backward:
      fast ? k::cpu::reduce_sum_backward(s, dims, mask, in, out) : k::ref::reduce_sum_backward(s, dims, mask, in, out);
      break;
    case Op::mean_backward:
      fast ? k::cpu::reduce_mean_backward(s, dims, mask, in, out) : k::ref::reduce_mean_backward(s, dims, mask, in, out);
      break;
  }
}

bool is_forward(Op op) { return op == Op::sum || op == Op::mean; }

// cpu vs ref for one shape, mask and op; also checks that 1 and 2 threads give the same bits.
template <class T>
void compare(Op op, const Dims& dims, std::uint32_t mask, double tolerance, std::uint64_t seed) {
  CAPTURE(int(op));
  CAPTURE(mask);
  CAPTURE(dims.size());
  CAPTURE(numel(dims));
  const std::int64_t full = numel(dims), reduced = output_numel(dims, mask);
  const std::int64_t in_size = is_forward(op) ? full : reduced, out_size = is_forward(op) ? reduced : full;
  const auto in = random_values<T>(std::size_t(in_size), seed);
  std::vector<T> expected(std::size_t(out_size), T(77)), one_thread(std::size_t(out_size), T(77));
  auto two_threads = one_thread;
  k::StreamHandle s1, s2;
  s2.num_threads = 2;
  run(op, false, s1, dims, mask, in.data(), expected.data());
  run(op, true, s1, dims, mask, in.data(), one_thread.data());
  run(op, true, s2, dims, mask, in.data(), two_threads.data());
  CHECK(relative_error(one_thread, expected) <= tolerance);
  CHECK(one_thread == two_threads);
}

}  // namespace

TEST_CASE("reduce: hand-computed sums and means of a 2x3 matrix, outputs assigned") {
  const Dims dims = {2, 3};
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  struct Expect {
    std::uint32_t mask;
    std::vector<float> sum, mean;
  };
  const std::vector<Expect> cases = {
      {0b01, {5, 7, 9}, {2.5f, 3.5f, 4.5f}},
      {0b10, {6, 15}, {2, 5}},
      {0b11, {21}, {3.5f}},
      {0b00, {1, 2, 3, 4, 5, 6}, {1, 2, 3, 4, 5, 6}},
  };
  for (const auto& c : cases) {
    for (bool fast : {false, true}) {
      CAPTURE(c.mask);
      CAPTURE(fast);
      std::vector<float> y(c.sum.size(), 99.f);
      run(Op::sum, fast, {}, dims, c.mask, x.data(), y.data());
      CHECK(y == c.sum);
      std::fill(y.begin(), y.end(), 99.f);
      run(Op::mean, fast, {}, dims, c.mask, x.data(), y.data());
      CHECK(y == c.mean);
    }
  }
}

TEST_CASE("reduce: hand-computed backward of sum and mean over the rows of a 2x3 matrix") {
  const Dims dims = {2, 3};
  const std::vector<float> dy = {1, 2, 4};  // mask 0b01: dy has shape [1, 3]
  for (bool fast : {false, true}) {
    CAPTURE(fast);
    std::vector<float> dx(6, 99.f);
    run(Op::sum_backward, fast, {}, dims, 0b01, dy.data(), dx.data());
    CHECK(dx == std::vector<float>{1, 2, 4, 1, 2, 4});
    std::fill(dx.begin(), dx.end(), 99.f);
    run(Op::mean_backward, fast, {}, dims, 0b01, dy.data(), dx.data());
    CHECK(dx == std::vector<float>{0.5f, 1, 2, 0.5f, 1, 2});
  }
}

TEST_CASE("reduce: cpu matches ref for every mask of small shapes up to 6 dims") {
  const std::vector<Dims> shapes = {{1}, {7}, {3, 5}, {1, 4, 1}, {2, 3, 4, 5}, {3, 1, 2, 5, 1, 3}, {2, 3, 2, 3, 2, 3}};
  std::uint64_t seed = 100;
  for (const auto& dims : shapes) {
    for (std::uint32_t mask = 0; mask < (1u << dims.size()); ++mask) {
      for (Op op : {Op::sum, Op::mean, Op::sum_backward, Op::mean_backward}) {
        compare<float>(op, dims, mask, 1e-6, seed++);
        compare<double>(op, dims, mask, 1e-14, seed++);
      }
    }
  }
}

TEST_CASE("reduce: cpu matches ref on large tensors in the common patterns (threads engaged)") {
  struct Case {
    Dims dims;
    std::uint32_t mask;
  };
  const std::vector<Case> cases = {
      {{64, 32, 14, 14}, 0b1101},  // per-channel of NCHW (batch norm statistics)
      {{1, 3, 101, 99}, 0b1101},   // per-channel, batch 1, few channels
      {{300, 1031}, 0b01},         // leading dim (bias gradient)
      {{1031, 300}, 0b10},         // trailing dim (row sums)
      {{7, 300001}, 0b11},         // everything
      {{5, 3, 1, 9999}, 0b1010},   // kept/reduced/kept/reduced
      {{2, 70001}, 0b00},          // nothing (a copy)
  };
  std::uint64_t seed = 500;
  for (const auto& c : cases)
    for (Op op : {Op::sum, Op::mean, Op::sum_backward, Op::mean_backward}) compare<float>(op, c.dims, c.mask, 1e-6, seed++);
}

TEST_CASE("reduce: empty inputs give zero sums and NaN means") {
  const Dims dims = {0, 3};
  std::vector<float> y(3, 5.f);
  for (bool fast : {false, true}) {
    run<float>(Op::sum, fast, {}, dims, 0b01, nullptr, y.data());
    CHECK(y == std::vector<float>{0, 0, 0});
    run<float>(Op::mean, fast, {}, dims, 0b01, nullptr, y.data());
    CHECK(std::isnan(y[0]));
  }
}

TEST_CASE("reduce: backward of sum and mean matches finite differences (double)") {
  const Dims dims = {2, 3, 4};
  const k::StreamHandle s;
  for (std::uint32_t mask : {0b001u, 0b101u, 0b110u, 0b111u}) {
    for (bool mean : {false, true}) {
      CAPTURE(mask);
      CAPTURE(mean);
      const auto x = random_values<double>(std::size_t(numel(dims)), 7 + mask);
      const auto g = random_values<double>(std::size_t(output_numel(dims, mask)), 8 + mask);
      auto loss = [&](const std::vector<double>& xv) {
        std::vector<double> y(g.size());
        run(mean ? Op::mean : Op::sum, false, s, dims, mask, xv.data(), y.data());
        double l = 0;
        for (std::size_t i = 0; i < y.size(); ++i) l += g[i] * y[i];
        return l;
      };
      std::vector<double> dx(x.size());
      run(mean ? Op::mean_backward : Op::sum_backward, false, s, dims, mask, g.data(), dx.data());
      const auto r = petra::testing::check_gradient(loss, x, dx);
      CHECK_MESSAGE(r.ok, r.worst);
    }
  }
}
