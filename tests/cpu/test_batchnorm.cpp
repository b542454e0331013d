// tests/cpu/test_batchnorm.cpp: batch normalisation: cpu:: against ref::, ref::'s backward
// against finite differences, the running statistics against numbers worked out by hand, and the
// "=" / "+=" contract.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "petra/kernels/batchnorm.hpp"
#include "petra/kernels/elementwise.hpp"
#include "tests/support/gradcheck.hpp"
#include "tests/support/testing.hpp"

namespace pk = petra::kernels;
using petra::testing::random_values;
using petra::testing::relative_error;

namespace {

constexpr double kEps = 1e-5;
constexpr double kMomentum = 0.1;

// Odd sizes, batch 1, one pixel, and shapes big enough for the threaded path. (Not n = 2 values
// per channel: there the normalised output is +-1 whatever x is, dx is pure cancellation noise.)
const std::vector<pk::BatchNormShape> kShapes = {
    {1, 3, 5, 7}, {7, 5, 1, 1}, {3, 8, 4, 4}, {2, 17, 3, 5}, {8, 32, 16, 16}, {5, 3, 33, 31},
    {5, 7, 32, 32}};

// Everything a training forward reads and writes, filled with random values.
template <class T>
struct TrainCase {
  pk::BatchNormShape shape;
  std::vector<T> x, gamma, beta, y, mean, invstd, running_mean, running_var;

  TrainCase(const pk::BatchNormShape& sh, std::uint64_t seed, double x_lo = -1, double x_hi = 1)
      : shape(sh),
        x(random_values<T>(sh.size(), seed, x_lo, x_hi)),
        gamma(random_values<T>(sh.channels, seed + 1, 0.5, 1.5)),
        beta(random_values<T>(sh.channels, seed + 2)),
        y(sh.size(), T(777)),
        mean(sh.channels, T(777)),
        invstd(sh.channels, T(777)),
        running_mean(random_values<T>(sh.channels, seed + 3)),
        running_var(random_values<T>(sh.channels, seed + 4, 0.5, 2)) {}
};

}  // namespace

TEST_CASE("batchnorm: cpu training forward matches ref") {
  pk::HeapWorkspace workspace;
  pk::StreamHandle s;
  s.num_threads = 2;
  s.workspace = &workspace;
  std::uint64_t seed = 10;
  for (const auto& shape : kShapes) {
    // Also an offset input (|mean| >> std), which a naive sum of squares gets wrong.
    for (double offset : {0.0, 1000.0}) {
      CAPTURE(shape.batch);
      CAPTURE(shape.channels);
      CAPTURE(shape.height);
      CAPTURE(shape.width);
      CAPTURE(offset);
      TrainCase<float> cpu(shape, seed++, offset - 1, offset + 1), ref = cpu;
      pk::cpu::batchnorm_forward_train(s, shape, kEps, kMomentum, cpu.x.data(), cpu.gamma.data(),
                                       cpu.beta.data(), cpu.y.data(), cpu.mean.data(),
                                       cpu.invstd.data(), cpu.running_mean.data(),
                                       cpu.running_var.data());
      pk::ref::batchnorm_forward_train(s, shape, kEps, kMomentum, ref.x.data(), ref.gamma.data(),
                                       ref.beta.data(), ref.y.data(), ref.mean.data(),
                                       ref.invstd.data(), ref.running_mean.data(),
                                       ref.running_var.data());
      CHECK(relative_error(cpu.y, ref.y) < 1e-5);
      CHECK(relative_error(cpu.mean, ref.mean) < 1e-6);
      CHECK(relative_error(cpu.invstd, ref.invstd) < 1e-5);
      CHECK(relative_error(cpu.running_mean, ref.running_mean) < 1e-6);
      CHECK(relative_error(cpu.running_var, ref.running_var) < 1e-5);
    }
  }
}

TEST_CASE("batchnorm: cpu eval forward matches ref") {
  pk::HeapWorkspace workspace;
  pk::StreamHandle s;
  s.num_threads = 2;
  s.workspace = &workspace;
  std::uint64_t seed = 50;
  for (const auto& shape : kShapes) {
    CAPTURE(shape.channels);
    CAPTURE(shape.height);
    TrainCase<float> c(shape, seed++);
    std::vector<float> y_ref(shape.size(), 777.f);
    pk::cpu::batchnorm_forward_eval(s, shape, kEps, c.x.data(), c.gamma.data(), c.beta.data(),
                                    c.running_mean.data(), c.running_var.data(), c.y.data());
    pk::ref::batchnorm_forward_eval(s, shape, kEps, c.x.data(), c.gamma.data(), c.beta.data(),
                                    c.running_mean.data(), c.running_var.data(), y_ref.data());
    CHECK(relative_error(c.y, y_ref) < 1e-6);
    // Hand check of one value: y = gamma (x - rm) / sqrt(rv + eps) + beta.
    const std::int64_t k = shape.size() - 1, ch = shape.channels - 1;
    const double expected = c.gamma[ch] * (c.x[k] - c.running_mean[ch]) /
                                std::sqrt(c.running_var[ch] + kEps) + c.beta[ch];
    CHECK(y_ref[k] == doctest::Approx(expected).epsilon(1e-6));
  }
}

TEST_CASE("batchnorm: cpu backward matches ref, dx assigned, dgamma and dbeta accumulated") {
  pk::HeapWorkspace workspace;
  pk::StreamHandle s;
  s.num_threads = 2;
  s.workspace = &workspace;
  std::uint64_t seed = 90;
  for (const auto& shape : kShapes) {
    for (double offset : {0.0, 1000.0}) {
      CAPTURE(shape.batch);
      CAPTURE(shape.channels);
      CAPTURE(shape.height);
      CAPTURE(shape.width);
      CAPTURE(offset);
      TrainCase<float> c(shape, seed, offset - 1, offset + 1);
      seed += 5;
      pk::ref::batchnorm_forward_train<float>(s, shape, kEps, kMomentum, c.x.data(),
                                              c.gamma.data(), c.beta.data(), c.y.data(),
                                              c.mean.data(), c.invstd.data(), nullptr, nullptr);
      const auto dy = random_values<float>(shape.size(), seed++);
      const auto prior_dgamma = random_values<float>(shape.channels, seed++);
      const auto prior_dbeta = random_values<float>(shape.channels, seed++);
      std::vector<float> dx_cpu(shape.size(), 777.f), dx_ref(shape.size(), -777.f);
      std::vector<float> dgamma_cpu = prior_dgamma, dbeta_cpu = prior_dbeta;
      std::vector<float> dgamma_ref(shape.channels, 0.f), dbeta_ref(shape.channels, 0.f);
      pk::cpu::batchnorm_backward(s, shape, c.x.data(), dy.data(), c.gamma.data(), c.mean.data(),
                                  c.invstd.data(), dx_cpu.data(), dgamma_cpu.data(),
                                  dbeta_cpu.data());
      pk::ref::batchnorm_backward(s, shape, c.x.data(), dy.data(), c.gamma.data(), c.mean.data(),
                                  c.invstd.data(), dx_ref.data(), dgamma_ref.data(),
                                  dbeta_ref.data());
      CHECK(relative_error(dx_cpu, dx_ref) < 1e-5);
      // ref accumulates too: a second call doubles its parameter gradients.
      std::vector<float> dgamma_twice = dgamma_ref, dbeta_twice = dbeta_ref;
      pk::ref::batchnorm_backward(s, shape, c.x.data(), dy.data(), c.gamma.data(), c.mean.data(),
                                  c.invstd.data(), dx_ref.data(), dgamma_twice.data(),
                                  dbeta_twice.data());
      for (std::int64_t ch = 0; ch < shape.channels; ++ch) {
        CHECK(dgamma_cpu[ch] - prior_dgamma[ch] ==
              doctest::Approx(dgamma_ref[ch]).epsilon(1e-4).scale(1));
        CHECK(dbeta_cpu[ch] - prior_dbeta[ch] ==
              doctest::Approx(dbeta_ref[ch]).epsilon(1e-4).scale(1));
        CHECK(dgamma_twice[ch] == doctest::Approx(2 * dgamma_ref[ch]));
        CHECK(dbeta_twice[ch] == doctest::Approx(2 * dbeta_ref[ch]));
      }
    }
  }
}

TEST_CASE("batchnorm: forward outputs are assigned, running statistics follow PyTorch") {
  // Two samples, two channels, 1x2 pixels: channel 0 holds {1, 2, 3, 6}, channel 1 {0, 0, 0, 4}.
  // channel 0: mean 3, biased var (4+1+0+9)/4 = 3.5, unbiased 14/3
  // channel 1: mean 1, biased var (1+1+1+9)/4 = 3,   unbiased 4
  const pk::BatchNormShape shape{2, 2, 1, 2};
  const std::vector<double> x = {1, 2, 0, 0, 3, 6, 0, 4};
  const std::vector<double> gamma = {2, 0.5}, beta = {1, -1};
  const double means[2] = {3, 1}, vars[2] = {3.5, 3}, unbiased[2] = {14.0 / 3, 4};
  pk::HeapWorkspace workspace;
  pk::StreamHandle s;
  s.workspace = &workspace;
  auto run = [&](auto forward, auto value) {
    using T = decltype(value);
    std::vector<T> xt(x.begin(), x.end()), g(gamma.begin(), gamma.end()), b(beta.begin(), beta.end());
    std::vector<T> y(8, T(777)), mean(2, T(777)), invstd(2, T(777));
    std::vector<T> running_mean = {T(0.5), T(-2)}, running_var = {T(2), T(1)};
    forward(s, shape, kEps, kMomentum, xt.data(), g.data(), b.data(), y.data(), mean.data(),
            invstd.data(), running_mean.data(), running_var.data());
    for (int c = 0; c < 2; ++c) {
      CHECK(mean[c] == doctest::Approx(means[c]).epsilon(1e-6));
      CHECK(invstd[c] == doctest::Approx(1 / std::sqrt(vars[c] + kEps)).epsilon(1e-6));
    }
    // running = 0.9 * running + 0.1 * batch statistic (unbiased variance)
    CHECK(running_mean[0] == doctest::Approx(0.9 * 0.5 + 0.1 * means[0]).epsilon(1e-6));
    CHECK(running_mean[1] == doctest::Approx(0.9 * -2 + 0.1 * means[1]).epsilon(1e-6));
    CHECK(running_var[0] == doctest::Approx(0.9 * 2 + 0.1 * unbiased[0]).epsilon(1e-6));
    CHECK(running_var[1] == doctest::Approx(0.9 * 1 + 0.1 * unbiased[1]).epsilon(1e-6));
    for (int n = 0; n < 2; ++n)
      for (int c = 0; c < 2; ++c)
        for (int i = 0; i < 2; ++i) {
          const int k = (n * 2 + c) * 2 + i;
          const double expected = gamma[c] * (x[k] - means[c]) / std::sqrt(vars[c] + kEps) + beta[c];
          CHECK(y[k] == doctest::Approx(expected).epsilon(1e-6));
        }
    // Null running pointers: nothing updated, same y.
    std::vector<T> y2(8, T(777));
    forward(s, shape, kEps, kMomentum, xt.data(), g.data(), b.data(), y2.data(), mean.data(),
            invstd.data(), nullptr, nullptr);
    CHECK(y2 == y);
  };
  SUBCASE("ref double") {
    run([](auto&&... a) { pk::ref::batchnorm_forward_train<double>(a...); }, double{});
  }
  SUBCASE("ref float") {
    run([](auto&&... a) { pk::ref::batchnorm_forward_train<float>(a...); }, float{});
  }
  SUBCASE("cpu") {
    run([](auto&&... a) { pk::cpu::batchnorm_forward_train(a...); }, float{});
  }
}

TEST_CASE("batchnorm: ref backward matches finite differences (training mode)") {
  const pk::BatchNormShape shape{2, 3, 3, 2};
  const auto x0 = random_values<double>(shape.size(), 200);
  const auto gamma0 = random_values<double>(shape.channels, 201, 0.5, 1.5);
  const auto beta0 = random_values<double>(shape.channels, 202);
  const auto g = random_values<double>(shape.size(), 203);  // L = <g, y>
  pk::StreamHandle s;

  std::vector<double> y(shape.size()), mean(shape.channels), invstd(shape.channels);
  pk::ref::batchnorm_forward_train(s, shape, kEps, kMomentum, x0.data(), gamma0.data(),
                                   beta0.data(), y.data(), mean.data(), invstd.data(),
                                   static_cast<double*>(nullptr), static_cast<double*>(nullptr));
  std::vector<double> dx(shape.size()), dgamma(shape.channels, 0.0), dbeta(shape.channels, 0.0);
  pk::ref::batchnorm_backward(s, shape, x0.data(), g.data(), gamma0.data(), mean.data(),
                              invstd.data(), dx.data(), dgamma.data(), dbeta.data());

  petra::testing::check_vjp(
      [&](const auto& in) {
        std::vector<double> y(shape.size()), mean(shape.channels), invstd(shape.channels);
        pk::ref::batchnorm_forward_train(s, shape, kEps, kMomentum, in[0].data(), in[1].data(),
                                         in[2].data(), y.data(), mean.data(), invstd.data(),
                                         static_cast<double*>(nullptr), static_cast<double*>(nullptr));
        return y;
      },
      {x0, gamma0, beta0}, g, {dx, dgamma, dbeta}, {"dx", "dgamma", "dbeta"});
}

// ---------------------------------------------------------------- batch norm + ReLU, fused
// The fused kernels against the unfused composition (batch norm, then kernels/elementwise.hpp's
// relu / relu_backward) of the same backend, bit for bit, and cpu:: against ref::; relu'(0); ref::'s
// backward against finite differences. Shapes: 1, 3
// and 17 channels; planes 1x1, 7x7 and 5x3; batch 1 (with a plane: training needs n > 1), odd
// batches, and sizes for the threaded path.
namespace {

const std::vector<pk::BatchNormShape> kReluShapes = {
    {2, 1, 1, 1},  {5, 3, 1, 1}, {1, 17, 7, 7}, {3, 3, 7, 7},   {1, 1, 5, 3},
    {4, 17, 5, 3}, {7, 3, 5, 3}, {2, 17, 1, 1}, {8, 32, 16, 16}, {5, 7, 32, 32}};

// ref::'s element-wise relu, in place.
template <class T>
void relu_in_place_ref(std::vector<T>& y) {
  pk::StreamHandle s;
  pk::ref::relu<T>(s, std::int64_t(y.size()), y.data(), y.data());
}

std::string describe(const pk::BatchNormShape& sh) {
  return "N=" + std::to_string(sh.batch) + " C=" + std::to_string(sh.channels) + " H=" +
         std::to_string(sh.height) + " W=" + std::to_string(sh.width);
}

// The fraction of y's values the ReLU set to zero (the tests want both sides of the mask).
double zero_fraction(const std::vector<float>& y) {
  return double(std::count(y.begin(), y.end(), 0.f)) / double(y.size());
}

}  // namespace

TEST_CASE("batchnorm_relu: training and eval forwards equal batch norm then relu, bit for bit") {
  pk::HeapWorkspace workspace;
  pk::StreamHandle s;
  s.num_threads = 2;
  s.workspace = &workspace;
  std::uint64_t seed = 300;
  for (const auto& shape : kReluShapes)
    for (double offset : {0.0, 1000.0}) {
      INFO(describe(shape), " offset=", offset);
      const TrainCase<float> start(shape, seed++, offset - 1, offset + 1);

      // cpu:: fused against cpu:: batch norm then cpu:: relu.
      TrainCase<float> fused = start, unfused = start;
      pk::cpu::batchnorm_relu_forward_train(s, shape, kEps, kMomentum, fused.x.data(), fused.gamma.data(),
                                            fused.beta.data(), fused.y.data(), fused.mean.data(),
                                            fused.invstd.data(), fused.running_mean.data(),
                                            fused.running_var.data());
      pk::cpu::batchnorm_forward_train(s, shape, kEps, kMomentum, unfused.x.data(), unfused.gamma.data(),
                                       unfused.beta.data(), unfused.y.data(), unfused.mean.data(),
                                       unfused.invstd.data(), unfused.running_mean.data(),
                                       unfused.running_var.data());
      pk::cpu::relu(s, shape.size(), unfused.y.data(), unfused.y.data());
      CHECK(fused.y == unfused.y);
      CHECK(fused.mean == unfused.mean);
      CHECK(fused.invstd == unfused.invstd);
      CHECK(fused.running_mean == unfused.running_mean);
      CHECK(fused.running_var == unfused.running_var);
      if (shape.size() >= 100) {  // both sides of the mask are exercised
        const double zeros = zero_fraction(fused.y);
        CHECK(zeros > 0.1);
        CHECK(zeros < 0.9);
      }

      // ref:: fused against ref:: batch norm then relu, and cpu:: against ref::.
      TrainCase<float> ref = start, ref_unfused = start;
      pk::ref::batchnorm_relu_forward_train<float>(s, shape, kEps, kMomentum, ref.x.data(), ref.gamma.data(),
                                                   ref.beta.data(), ref.y.data(), ref.mean.data(),
                                                   ref.invstd.data(), ref.running_mean.data(),
                                                   ref.running_var.data());
      pk::ref::batchnorm_forward_train<float>(s, shape, kEps, kMomentum, ref_unfused.x.data(),
                                              ref_unfused.gamma.data(), ref_unfused.beta.data(),
                                              ref_unfused.y.data(), ref_unfused.mean.data(),
                                              ref_unfused.invstd.data(), ref_unfused.running_mean.data(),
                                              ref_unfused.running_var.data());
      relu_in_place_ref(ref_unfused.y);
      CHECK(ref.y == ref_unfused.y);
      CHECK(ref.running_var == ref_unfused.running_var);
      CHECK(relative_error(fused.y, ref.y) < 1e-5);
      CHECK(relative_error(fused.mean, ref.mean) < 1e-6);
      CHECK(relative_error(fused.invstd, ref.invstd) < 1e-5);
      CHECK(relative_error(fused.running_mean, ref.running_mean) < 1e-6);
      CHECK(relative_error(fused.running_var, ref.running_var) < 1e-5);

      // Evaluation: the running statistics, then relu.
      std::vector<float> y_eval(shape.size(), 777.f), y_eval_unfused(shape.size(), -777.f),
          y_eval_ref(shape.size(), 555.f);
      pk::cpu::batchnorm_relu_forward_eval(s, shape, kEps, start.x.data(), start.gamma.data(), start.beta.data(),
                                           start.running_mean.data(), start.running_var.data(), y_eval.data());
      pk::cpu::batchnorm_forward_eval(s, shape, kEps, start.x.data(), start.gamma.data(), start.beta.data(),
                                      start.running_mean.data(), start.running_var.data(), y_eval_unfused.data());
      pk::cpu::relu(s, shape.size(), y_eval_unfused.data(), y_eval_unfused.data());
      pk::ref::batchnorm_relu_forward_eval<float>(s, shape, kEps, start.x.data(), start.gamma.data(),
                                                  start.beta.data(), start.running_mean.data(),
                                                  start.running_var.data(), y_eval_ref.data());
      CHECK(y_eval == y_eval_unfused);
      if (offset == 0) CHECK(relative_error(y_eval, y_eval_ref) < 1e-6);
    }
}

TEST_CASE("batchnorm_relu: backward equals relu_backward then batch norm's backward, bit for bit") {
  pk::HeapWorkspace workspace;
  pk::StreamHandle s;
  s.num_threads = 2;
  s.workspace = &workspace;
  std::uint64_t seed = 600;
  for (const auto& shape : kReluShapes)
    for (double offset : {0.0, 1000.0}) {
      INFO(describe(shape), " offset=", offset);
      TrainCase<float> c(shape, seed, offset - 1, offset + 1);
      seed += 5;
      // One y for every backend, from ref's fused forward: the masks agree by construction.
      pk::ref::batchnorm_relu_forward_train<float>(s, shape, kEps, kMomentum, c.x.data(), c.gamma.data(),
                                                   c.beta.data(), c.y.data(), c.mean.data(), c.invstd.data(),
                                                   nullptr, nullptr);
      const auto dy = random_values<float>(shape.size(), seed++);
      const auto prior_dgamma = random_values<float>(shape.channels, seed++);
      const auto prior_dbeta = random_values<float>(shape.channels, seed++);

      std::vector<float> dx(shape.size(), 777.f), dgamma = prior_dgamma, dbeta = prior_dbeta;
      pk::cpu::batchnorm_relu_backward(s, shape, c.x.data(), c.y.data(), dy.data(), c.gamma.data(),
                                       c.mean.data(), c.invstd.data(), dx.data(), dgamma.data(), dbeta.data());

      std::vector<float> dy_masked(shape.size(), 555.f), dx_unfused(shape.size(), -777.f);
      std::vector<float> dgamma_unfused = prior_dgamma, dbeta_unfused = prior_dbeta;
      pk::cpu::relu_backward(s, shape.size(), c.y.data(), dy.data(), dy_masked.data());
      pk::cpu::batchnorm_backward(s, shape, c.x.data(), dy_masked.data(), c.gamma.data(), c.mean.data(),
                                  c.invstd.data(), dx_unfused.data(), dgamma_unfused.data(), dbeta_unfused.data());
      CHECK(dx == dx_unfused);
      CHECK(dgamma == dgamma_unfused);
      CHECK(dbeta == dbeta_unfused);

      std::vector<float> dx_ref(shape.size(), 333.f), dgamma_ref(shape.channels, 0.f), dbeta_ref(shape.channels, 0.f);
      pk::ref::batchnorm_relu_backward<float>(s, shape, c.x.data(), c.y.data(), dy.data(), c.gamma.data(),
                                              c.mean.data(), c.invstd.data(), dx_ref.data(), dgamma_ref.data(),
                                              dbeta_ref.data());
      if (shape.values_per_channel() > 2) CHECK(relative_error(dx, dx_ref) < 1e-5);
      for (std::int64_t ch = 0; ch < shape.channels; ++ch) {
        CHECK(dgamma[ch] - prior_dgamma[ch] == doctest::Approx(dgamma_ref[ch]).epsilon(1e-4).scale(1));
        CHECK(dbeta[ch] - prior_dbeta[ch] == doctest::Approx(dbeta_ref[ch]).epsilon(1e-4).scale(1));
      }
    }
}

TEST_CASE("batchnorm_relu: relu'(0) = 0, as PyTorch: outputs at exactly 0 pass no gradient") {
  // gamma = 0, beta = 0: every output is exactly 0, so no gradient may pass the ReLU: dbeta (the sum
  // of the masked dy) and dgamma stay at their prior values and dx is 0. With relu'(0) = 1, dbeta
  // would move by sum(dy).
  const pk::BatchNormShape shape{3, 2, 2, 2};
  pk::HeapWorkspace workspace;
  pk::StreamHandle s;
  s.workspace = &workspace;
  const auto x = random_values<float>(shape.size(), 700);
  const auto dy = random_values<float>(shape.size(), 701, 0.5, 1.5);  // all positive: sum(dy) != 0
  const std::vector<float> gamma(2, 0.f), beta(2, 0.f);
  std::vector<float> y(shape.size(), 777.f), mean(2), invstd(2);
  pk::cpu::batchnorm_relu_forward_train(s, shape, kEps, kMomentum, x.data(), gamma.data(), beta.data(), y.data(),
                                        mean.data(), invstd.data(), nullptr, nullptr);
  for (float v : y) CHECK(v == 0.f);
  std::vector<float> dx(shape.size(), 777.f), dgamma = {0.25f, -0.5f}, dbeta = {1.f, 2.f};
  pk::cpu::batchnorm_relu_backward(s, shape, x.data(), y.data(), dy.data(), gamma.data(), mean.data(), invstd.data(),
                                   dx.data(), dgamma.data(), dbeta.data());
  CHECK(dbeta == std::vector<float>{1.f, 2.f});
  CHECK(dgamma == std::vector<float>{0.25f, -0.5f});
  for (float v : dx) CHECK(v == 0.f);
  std::vector<double> dx_ref(shape.size()), dgamma_ref(2, 0.0), dbeta_ref(2, 0.0);
  const std::vector<double> xd(x.begin(), x.end()), yd(y.begin(), y.end()), dyd(dy.begin(), dy.end()),
      zero(2, 0.0), meand(mean.begin(), mean.end()), invstdd(invstd.begin(), invstd.end());
  pk::ref::batchnorm_relu_backward(s, shape, xd.data(), yd.data(), dyd.data(), zero.data(), meand.data(),
                                   invstdd.data(), dx_ref.data(), dgamma_ref.data(), dbeta_ref.data());
  CHECK(dbeta_ref == std::vector<double>{0.0, 0.0});
}

TEST_CASE("batchnorm_relu: ref backward matches finite differences (training mode)") {
  // Shapes with batch 1, 1 channel and odd planes. Finite differences need the outputs away from
  // the ReLU's kink: the loop below checks that no |BN(x)| is within 1e-3 of 0 (h = 1e-6).
  for (const pk::BatchNormShape shape : {pk::BatchNormShape{2, 3, 3, 2}, pk::BatchNormShape{1, 1, 5, 3},
                                         pk::BatchNormShape{3, 2, 1, 1}}) {
    INFO(describe(shape));
    const auto x0 = random_values<double>(shape.size(), 210 + shape.size());
    const auto gamma0 = random_values<double>(shape.channels, 211, 0.5, 1.5);
    const auto beta0 = random_values<double>(shape.channels, 212, -0.3, 0.3);
    const auto g = random_values<double>(shape.size(), 213);  // L = <g, y>
    pk::StreamHandle s;
    std::vector<double> y(shape.size()), bn(shape.size()), mean(shape.channels), invstd(shape.channels);
    pk::ref::batchnorm_forward_train(s, shape, kEps, kMomentum, x0.data(), gamma0.data(), beta0.data(), bn.data(),
                                     mean.data(), invstd.data(), static_cast<double*>(nullptr),
                                     static_cast<double*>(nullptr));
    double closest = 1e9;
    for (double v : bn) closest = std::min(closest, std::abs(v));
    REQUIRE(closest > 1e-3);
    pk::ref::batchnorm_relu_forward_train(s, shape, kEps, kMomentum, x0.data(), gamma0.data(), beta0.data(),
                                          y.data(), mean.data(), invstd.data(), static_cast<double*>(nullptr),
                                          static_cast<double*>(nullptr));
    const auto zeros = std::count(y.begin(), y.end(), 0.0);
    CHECK(zeros > 0);  // the mask is exercised
    CHECK(zeros < std::int64_t(y.size()));
    std::vector<double> dx(shape.size()), dgamma(shape.channels, 0.0), dbeta(shape.channels, 0.0);
    pk::ref::batchnorm_relu_backward(s, shape, x0.data(), y.data(), g.data(), gamma0.data(), mean.data(),
                                     invstd.data(), dx.data(), dgamma.data(), dbeta.data());
    petra::testing::check_vjp(
        [&](const auto& in) {
          std::vector<double> out(shape.size()), m(shape.channels), is(shape.channels);
          pk::ref::batchnorm_relu_forward_train(s, shape, kEps, kMomentum, in[0].data(), in[1].data(), in[2].data(),
                                                out.data(), m.data(), is.data(), static_cast<double*>(nullptr),
                                                static_cast<double*>(nullptr));
          return out;
        },
        {x0, gamma0, beta0}, g, {dx, dgamma, dbeta}, {"dx", "dgamma", "dbeta"});
  }
}

// ---------------------------------------------------------------- batch norm + ReLU + coupling
TEST_CASE("batchnorm_relu_coupling: cpu and ref equal batch norm + relu then the coupling, bit for bit") {
  pk::HeapWorkspace workspace;
  pk::StreamHandle s;
  s.num_threads = 2;
  s.workspace = &workspace;
  std::uint64_t seed = 700;
  for (const auto& shape : kReluShapes)
    for (const auto direction : {pk::CouplingDirection::forward, pk::CouplingDirection::inverse}) {
      const bool forward = direction == pk::CouplingDirection::forward;
      INFO(describe(shape), forward ? " forward" : " inverse");
      const pk::CouplingShape coupling{shape.batch, shape.channels, shape.height, shape.width};
      const TrainCase<float> start(shape, seed, -1, 1);
      const std::vector<float> a = random_values<float>(2 * shape.size(), seed + 10);
      seed += 20;
      // What the fused op must equal, per backend: f = relu(BN(z)) stored, then the coupling.
      auto compose = [&](auto bn_relu, auto couple, TrainCase<float>& c) {
        bn_relu(s, shape, kEps, kMomentum, c.x.data(), c.gamma.data(), c.beta.data(), c.y.data(), c.mean.data(),
                c.invstd.data(), c.running_mean.data(), c.running_var.data());
        std::vector<float> out(a.size(), -555.f);
        couple(s, coupling, a.data(), c.y.data(), out.data());
        return out;
      };

      TrainCase<float> fused = start, unfused = start;
      std::vector<float> out(a.size(), 777.f);
      pk::cpu::batchnorm_relu_coupling_train(s, shape, kEps, kMomentum, direction, fused.x.data(), fused.gamma.data(),
                                             fused.beta.data(), a.data(), out.data(), fused.mean.data(),
                                             fused.invstd.data(), fused.running_mean.data(),
                                             fused.running_var.data());
      const std::vector<float> expected =
          forward ? compose(pk::cpu::batchnorm_relu_forward_train, pk::cpu::coupling_forward, unfused)
                  : compose(pk::cpu::batchnorm_relu_forward_train, pk::cpu::coupling_inverse, unfused);
      CHECK(out == expected);
      CHECK(fused.mean == unfused.mean);
      CHECK(fused.invstd == unfused.invstd);
      CHECK(fused.running_mean == unfused.running_mean);
      CHECK(fused.running_var == unfused.running_var);

      TrainCase<float> ref = start, ref_unfused = start;
      std::vector<float> out_ref(a.size(), 333.f);
      pk::ref::batchnorm_relu_coupling_train<float>(s, shape, kEps, kMomentum, direction, ref.x.data(),
                                                    ref.gamma.data(), ref.beta.data(), a.data(), out_ref.data(),
                                                    ref.mean.data(), ref.invstd.data(), ref.running_mean.data(),
                                                    ref.running_var.data());
      const std::vector<float> expected_ref =
          forward ? compose(pk::ref::batchnorm_relu_forward_train<float>, pk::ref::coupling_forward<float>, ref_unfused)
                  : compose(pk::ref::batchnorm_relu_forward_train<float>, pk::ref::coupling_inverse<float>, ref_unfused);
      CHECK(out_ref == expected_ref);
      CHECK(ref.running_var == ref_unfused.running_var);
      CHECK(relative_error(out, out_ref) < 1e-5);
      CHECK(relative_error(fused.running_mean, ref.running_mean) < 1e-6);

      // The moved stream is a copy, bit for bit: forward out2 = a1, inverse out1 = a2.
      const std::int64_t stream = shape.size() / shape.batch;
      for (std::int64_t n = 0; n < shape.batch; ++n)
        for (std::int64_t i = 0; i < stream; ++i) {
          const std::size_t moved = std::size_t((2 * n + (forward ? 1 : 0)) * stream + i);
          const std::size_t from = std::size_t((2 * n + (forward ? 0 : 1)) * stream + i);
          if (out[moved] != a[from]) {
            FAIL_CHECK("moved stream differs at sample ", n, " position ", i);
            n = shape.batch;
            break;
          }
        }

      // Evaluation, with the running statistics.
      std::vector<float> out_eval(a.size(), 777.f), f_eval(std::size_t(shape.size()), 0.f),
          expected_eval(a.size(), -1.f), out_eval_ref(a.size(), 1.f);
      pk::cpu::batchnorm_relu_coupling_eval(s, shape, kEps, direction, start.x.data(), start.gamma.data(),
                                            start.beta.data(), start.running_mean.data(), start.running_var.data(),
                                            a.data(), out_eval.data());
      pk::cpu::batchnorm_relu_forward_eval(s, shape, kEps, start.x.data(), start.gamma.data(), start.beta.data(),
                                           start.running_mean.data(), start.running_var.data(), f_eval.data());
      if (forward) pk::cpu::coupling_forward(s, coupling, a.data(), f_eval.data(), expected_eval.data());
      else pk::cpu::coupling_inverse(s, coupling, a.data(), f_eval.data(), expected_eval.data());
      CHECK(out_eval == expected_eval);
      pk::ref::batchnorm_relu_coupling_eval<float>(s, shape, kEps, direction, start.x.data(), start.gamma.data(),
                                                   start.beta.data(), start.running_mean.data(),
                                                   start.running_var.data(), a.data(), out_eval_ref.data());
      CHECK(relative_error(out_eval, out_eval_ref) < 1e-5);
    }
}

TEST_CASE("batchnorm: the summed backwards write the same dx and add its per-channel sums into dx_sum") {
  pk::HeapWorkspace workspace;
  pk::StreamHandle s;
  s.num_threads = 2;
  s.workspace = &workspace;
  std::uint64_t seed = 900;
  for (const bool relu : {false, true})
    for (const auto& shape : relu ? kReluShapes : kShapes) {
      INFO(describe(shape), " relu=", relu);
      TrainCase<float> c(shape, seed);
      seed += 5;
      pk::ref::batchnorm_relu_forward_train<float>(s, shape, kEps, kMomentum, c.x.data(), c.gamma.data(),
                                                   c.beta.data(), c.y.data(), c.mean.data(), c.invstd.data(),
                                                   nullptr, nullptr);
      // With the batch's own mean, dx sums to zero over each channel (up to rounding), and so would
      // a dx_sum that was never added to: a shifted mean makes the sums count.
      for (float& m : c.mean) m += 0.25f;
      const auto dy = random_values<float>(shape.size(), seed++);
      const auto prior = random_values<float>(shape.channels, seed++);
      // cpu: dx, dgamma and dbeta bit for bit those of the plain backward
      std::vector<float> dx(shape.size(), 777.f), dgamma(shape.channels, 0.f), dbeta(shape.channels, 0.f);
      std::vector<float> dx_s(shape.size(), -777.f), dgamma_s(shape.channels, 0.f), dbeta_s(shape.channels, 0.f);
      std::vector<float> dx_sum = prior;
      if (relu) {
        pk::cpu::batchnorm_relu_backward(s, shape, c.x.data(), c.y.data(), dy.data(), c.gamma.data(), c.mean.data(),
                                         c.invstd.data(), dx.data(), dgamma.data(), dbeta.data());
        pk::cpu::batchnorm_relu_backward_summed(s, shape, c.x.data(), c.y.data(), dy.data(), c.gamma.data(),
                                                c.mean.data(), c.invstd.data(), dx_s.data(), dgamma_s.data(),
                                                dbeta_s.data(), dx_sum.data());
      } else {
        pk::cpu::batchnorm_backward(s, shape, c.x.data(), dy.data(), c.gamma.data(), c.mean.data(), c.invstd.data(),
                                    dx.data(), dgamma.data(), dbeta.data());
        pk::cpu::batchnorm_backward_summed(s, shape, c.x.data(), dy.data(), c.gamma.data(), c.mean.data(),
                                           c.invstd.data(), dx_s.data(), dgamma_s.data(), dbeta_s.data(),
                                           dx_sum.data());
      }
      CHECK(dx_s == dx);
      CHECK(dgamma_s == dgamma);
      CHECK(dbeta_s == dbeta);
      // ref, in double: dx_sum += the channel sums of its dx
      const std::vector<double> xd(c.x.begin(), c.x.end()), yd(c.y.begin(), c.y.end()), dyd(dy.begin(), dy.end()),
          gd(c.gamma.begin(), c.gamma.end()), md(c.mean.begin(), c.mean.end()), id(c.invstd.begin(), c.invstd.end());
      std::vector<double> dxd(shape.size()), dgd(shape.channels, 0.0), dbd(shape.channels, 0.0), sumd(shape.channels, 0.5);
      if (relu)
        pk::ref::batchnorm_relu_backward_summed<double>(s, shape, xd.data(), yd.data(), dyd.data(), gd.data(), md.data(),
                                                        id.data(), dxd.data(), dgd.data(), dbd.data(), sumd.data());
      else
        pk::ref::batchnorm_backward_summed<double>(s, shape, xd.data(), dyd.data(), gd.data(), md.data(), id.data(),
                                                   dxd.data(), dgd.data(), dbd.data(), sumd.data());
      for (std::int64_t ch = 0; ch < shape.channels; ++ch) {
        double exact = 0, magnitude = 0, exact_ref = 0;
        for (std::int64_t n = 0; n < shape.batch; ++n)
          for (std::int64_t i = 0; i < shape.plane(); ++i) {
            const std::int64_t k = (n * shape.channels + ch) * shape.plane() + i;
            exact += dx[k];
            magnitude += std::abs(dx[k]);
            exact_ref += dxd[k];
          }
        REQUIRE((magnitude == 0 || std::abs(exact) > 1e-4 * magnitude));  // the shifted mean's doing: 100x the tolerance below
        CHECK(std::abs((dx_sum[ch] - prior[ch]) - exact) <= 1e-6 * (magnitude + std::abs(prior[ch])) + 1e-7);
        CHECK(std::abs((sumd[ch] - 0.5) - exact_ref) <= 1e-12 * (magnitude + 1));
      }
    }
}


TEST_CASE("batchnorm: the backwards read dy as a channel slice of a wider tensor, with the bits of the packed dy") {
  pk::HeapWorkspace workspace;
  pk::StreamHandle s;
  s.num_threads = 2;
  s.workspace = &workspace;
  std::uint64_t seed = 1300;
  for (const bool relu : {false, true})
    for (const auto& shape : kShapes) {
      INFO(describe(shape), " relu=", relu);
      TrainCase<float> c(shape, seed);
      seed += 5;
      pk::ref::batchnorm_relu_forward_train<float>(s, shape, kEps, kMomentum, c.x.data(), c.gamma.data(),
                                                   c.beta.data(), c.y.data(), c.mean.data(), c.invstd.data(),
                                                   nullptr, nullptr);
      // dy: channels [C, 2C) of a (batch, 3C, H, W) tensor; packed: the same values alone.
      const std::int64_t per_sample = shape.channels * shape.plane();
      const auto wide = random_values<float>(3 * shape.size(), seed++);
      std::vector<float> packed(shape.size());
      for (std::int64_t n = 0; n < shape.batch; ++n)
        std::copy_n(wide.begin() + (3 * n + 1) * per_sample, per_sample, packed.begin() + n * per_sample);
      pk::BatchNormShape strided = shape;
      strided.dy_image_stride = 3 * per_sample;
      const float* dy_view = wide.data() + per_sample;
      for (const bool cpu : {true, false}) {
        CAPTURE(cpu);
        std::vector<float> dx_a(shape.size()), dx_b(shape.size()), dg_a(shape.channels, 0.f), dg_b = dg_a,
            db_a = dg_a, db_b = dg_a;
        auto run = [&](const pk::BatchNormShape& sh, const float* dy, float* dx, float* dg, float* db) {
          if (cpu && relu)
            pk::cpu::batchnorm_relu_backward(s, sh, c.x.data(), c.y.data(), dy, c.gamma.data(), c.mean.data(),
                                             c.invstd.data(), dx, dg, db);
          else if (cpu)
            pk::cpu::batchnorm_backward(s, sh, c.x.data(), dy, c.gamma.data(), c.mean.data(), c.invstd.data(), dx, dg, db);
          else if (relu)
            pk::ref::batchnorm_relu_backward<float>(s, sh, c.x.data(), c.y.data(), dy, c.gamma.data(), c.mean.data(),
                                                    c.invstd.data(), dx, dg, db);
          else
            pk::ref::batchnorm_backward<float>(s, sh, c.x.data(), dy, c.gamma.data(), c.mean.data(), c.invstd.data(),
                                               dx, dg, db);
        };
        run(shape, packed.data(), dx_a.data(), dg_a.data(), db_a.data());
        run(strided, dy_view, dx_b.data(), dg_b.data(), db_b.data());
        CHECK(dx_b == dx_a);
        CHECK(dg_b == dg_a);
        CHECK(db_b == db_a);
      }
    }
}

TEST_CASE("batchnorm_relu: the mapped pair (the mask from x and the forward's map) has the fused pair's bits") {
  pk::HeapWorkspace workspace;
  pk::StreamHandle s;
  s.workspace = &workspace;
  std::uint64_t seed = 1500;
  for (const int threads : {1, 2})
    for (const auto& shape : kReluShapes)
      for (double offset : {0.0, 1000.0}) {
        INFO(describe(shape), " offset=", offset, " threads=", threads);
        s.num_threads = threads;
        TrainCase<float> c(shape, seed, offset - 1, offset + 1);
        seed += 5;
        // Channel 0 outputs exactly 0 everywhere (gamma = beta = 0): relu'(0) = 0 must hold for the
        // recomputed mask too (a mask of v >= 0 would pass dy there).
        c.gamma[0] = 0.f;
        c.beta[0] = 0.f;
        TrainCase<float> m = c;
        std::vector<float> affine(3 * shape.channels, 777.f);
        pk::cpu::batchnorm_relu_forward_train(s, shape, kEps, kMomentum, c.x.data(), c.gamma.data(), c.beta.data(),
                                              c.y.data(), c.mean.data(), c.invstd.data(), c.running_mean.data(),
                                              c.running_var.data());
        pk::cpu::batchnorm_relu_forward_train_mapped(s, shape, kEps, kMomentum, m.x.data(), m.gamma.data(),
                                                     m.beta.data(), m.y.data(), m.mean.data(), m.invstd.data(),
                                                     m.running_mean.data(), m.running_var.data(), affine.data());
        CHECK(m.y == c.y);
        CHECK(m.mean == c.mean);
        CHECK(m.invstd == c.invstd);
        CHECK(m.running_mean == c.running_mean);
        CHECK(m.running_var == c.running_var);
        // The map is the one y was made with: the same fma gives y's mask at every value.
        std::int64_t mismatches = 0, zeros = 0;
        for (std::int64_t i = 0; i < shape.size(); ++i) {
          const std::int64_t ch = i / shape.plane() % shape.channels;
          const float v = std::fma(m.x[i] - affine[3 * ch], affine[3 * ch + 1], affine[3 * ch + 2]);
          mismatches += (v > 0.f) != (c.y[i] > 0.f);
          zeros += c.y[i] == 0.f;
        }
        CHECK(mismatches == 0);
        CHECK(zeros >= shape.values_per_channel());  // channel 0 at least

        // dy packed, then as a channel slice of a wider tensor; without and with dx_sum.
        const std::int64_t per_sample = shape.channels * shape.plane();
        const auto wide = random_values<float>(2 * shape.size(), seed++);
        std::vector<float> packed(shape.size());
        for (std::int64_t n = 0; n < shape.batch; ++n)
          std::copy_n(wide.begin() + (2 * n + 1) * per_sample, per_sample, packed.begin() + n * per_sample);
        pk::BatchNormShape strided = shape;
        strided.dy_image_stride = 2 * per_sample;
        const auto prior = random_values<float>(shape.channels, seed++);
        for (const bool summed : {false, true})
          for (const bool slice : {false, true}) {
            CAPTURE(summed);
            CAPTURE(slice);
            const pk::BatchNormShape& sh = slice ? strided : shape;
            const float* dy = slice ? wide.data() + per_sample : packed.data();
            std::vector<float> dx_y(shape.size(), 777.f), dx_x(shape.size(), -777.f);
            std::vector<float> dg_y = prior, db_y = prior, sum_y = prior, dg_x = prior, db_x = prior, sum_x = prior;
            if (summed)
              pk::cpu::batchnorm_relu_backward_summed(s, sh, c.x.data(), c.y.data(), dy, c.gamma.data(), c.mean.data(),
                                                      c.invstd.data(), dx_y.data(), dg_y.data(), db_y.data(),
                                                      sum_y.data());
            else
              pk::cpu::batchnorm_relu_backward(s, sh, c.x.data(), c.y.data(), dy, c.gamma.data(), c.mean.data(),
                                               c.invstd.data(), dx_y.data(), dg_y.data(), db_y.data());
            pk::cpu::batchnorm_relu_backward_mapped(s, sh, m.x.data(), affine.data(), dy, m.gamma.data(),
                                                    m.mean.data(), m.invstd.data(), dx_x.data(), dg_x.data(),
                                                    db_x.data(), summed ? sum_x.data() : nullptr);
            CHECK(dx_x == dx_y);
            CHECK(dg_x == dg_y);
            CHECK(db_x == db_y);
            CHECK(sum_x == sum_y);  // untouched without dx_sum, the same sums with it
          }
      }
}

TEST_CASE("batchnorm: one, two and three sample parts (threads) give the ref's numbers, forward and summed backward") {
  // 7 samples x 5 channels of 40x40: big enough for 3 parts (each >= 16K values), whose shares of
  // the samples (2, 2, 3) and of the channels (1, 2, 2) are uneven; an offset mean as above.
  const pk::BatchNormShape shape{7, 5, 40, 40};
  pk::HeapWorkspace workspace;
  pk::StreamHandle s;
  s.workspace = &workspace;
  const std::uint64_t seed = 1700;
  TrainCase<double> exact(shape, seed, 99, 101);
  const auto dy = random_values<double>(shape.size(), seed + 10);
  std::vector<double> dx(shape.size()), dgamma(shape.channels, 0.0), dbeta(shape.channels, 0.0),
      dx_sum(shape.channels, 0.0);
  pk::ref::batchnorm_relu_forward_train<double>(s, shape, kEps, kMomentum, exact.x.data(), exact.gamma.data(),
                                                exact.beta.data(), exact.y.data(), exact.mean.data(),
                                                exact.invstd.data(), exact.running_mean.data(),
                                                exact.running_var.data());
  pk::ref::batchnorm_relu_backward_summed<double>(s, shape, exact.x.data(), exact.y.data(), dy.data(),
                                                  exact.gamma.data(), exact.mean.data(), exact.invstd.data(),
                                                  dx.data(), dgamma.data(), dbeta.data(), dx_sum.data());
  const std::vector<float> dy_f(dy.begin(), dy.end());
  for (const int threads : {1, 2, 3}) {
    CAPTURE(threads);
    s.num_threads = threads;
    TrainCase<float> c(shape, seed, 99, 101);  // the same values, in float
    std::vector<float> affine(3 * shape.channels);
    pk::cpu::batchnorm_relu_forward_train_mapped(s, shape, kEps, kMomentum, c.x.data(), c.gamma.data(), c.beta.data(),
                                                 c.y.data(), c.mean.data(), c.invstd.data(), c.running_mean.data(),
                                                 c.running_var.data(), affine.data());
    CHECK(relative_error(c.y, exact.y) < 1e-5);
    CHECK(relative_error(c.mean, exact.mean) < 1e-7);
    CHECK(relative_error(c.invstd, exact.invstd) < 1e-5);
    CHECK(relative_error(c.running_var, exact.running_var) < 1e-5);
    std::vector<float> dx_f(shape.size(), 777.f), dgamma_f(shape.channels, 0.f), dbeta_f(shape.channels, 0.f),
        dx_sum_f(shape.channels, 0.f);
    pk::cpu::batchnorm_relu_backward_mapped(s, shape, c.x.data(), affine.data(), dy_f.data(), c.gamma.data(),
                                            c.mean.data(), c.invstd.data(), dx_f.data(), dgamma_f.data(),
                                            dbeta_f.data(), dx_sum_f.data());
    CHECK(relative_error(dx_f, dx) < 1e-4);
    CHECK(relative_error(dgamma_f, dgamma) < 1e-4);
    CHECK(relative_error(dbeta_f, dbeta) < 1e-5);
    // dx sums to almost zero per channel: compare against the scale of dx's values instead.
    for (std::int64_t ch = 0; ch < shape.channels; ++ch)
      CHECK(std::abs(dx_sum_f[ch] - dx_sum[ch]) < 1e-3);
  }
}
