// tests/cpu/test_conv_batchnorm.cpp: the stem's convolution + batch norm + ReLU that recomputes the
// convolution (kernels/conv_batchnorm.hpp): cpu:: against ref:: in double (conv2d, then batch norm
// + ReLU, and their backwards), on odd planes and 1-3 threads; the autograd op against the unfused
// pair; nn's routing; and what it refuses.
#include <doctest/doctest.h>

#include <vector>

#include "petra/functions.hpp"
#include "petra/kernels/batchnorm.hpp"
#include "petra/kernels/conv2d.hpp"
#include "petra/kernels/conv_batchnorm.hpp"
#include "petra/nn/layers.hpp"
#include "petra/ops.hpp"
#include "tests/support/testing.hpp"

namespace pk = petra::kernels;
using petra::testing::random_values;
using petra::testing::relative_error;

namespace {

constexpr double kEps = 1e-5;
constexpr double kMomentum = 0.1;

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// One case: x (batch images of one channel, `image_stride` floats apart), w, bias, gamma, beta,
// running statistics, and an upstream gradient dy.
struct StemCase {
  pk::Conv2dShape conv;
  std::vector<float> x, w, bias, gamma, beta, running_mean, running_var, dy;
  StemCase(std::int64_t batch, std::int64_t h, std::int64_t w_, std::int64_t channels, std::uint64_t seed,
           std::int64_t image_stride = 0)
      : conv(pk::conv2d_shape(batch, 1, h, w_, channels, 3, 1, 1)) {
    conv.in_image_stride = image_stride;
    x = random_values<float>(std::size_t(batch * conv.x_image_stride()), seed, 0, 1);  // images in [0, 1)
    w = random_values<float>(std::size_t(channels * 9), seed + 1, -0.5, 0.5);
    bias = random_values<float>(std::size_t(channels), seed + 2, -0.1, 0.1);
    gamma = random_values<float>(std::size_t(channels), seed + 3, 0.5, 1.5);
    beta = random_values<float>(std::size_t(channels), seed + 4, -0.2, 0.2);
    running_mean = random_values<float>(std::size_t(channels), seed + 5);
    running_var = random_values<float>(std::size_t(channels), seed + 6, 0.5, 2);
    dy = random_values<float>(std::size_t(conv.output_size()), seed + 7);
  }
  pk::BatchNormShape bn() const { return {conv.batch, conv.out_channels, conv.in_h, conv.in_w}; }
};

// What the op computes, forward and backward, in float (cpu::) or double (ref:: composition).
template <class T>
struct StemResult {
  std::vector<T> y, mean, invstd, running_mean, running_var, dw, dbias, dgamma, dbeta;
};

StemResult<double> reference(const StemCase& c) {
  pk::StreamHandle s;
  const auto n = c.bn().size();
  const auto channels = std::size_t(c.conv.out_channels);
  StemResult<double> r{std::vector<double>(n), std::vector<double>(channels), std::vector<double>(channels),
                       widen(c.running_mean), widen(c.running_var), std::vector<double>(c.w.size(), 0.0),
                       std::vector<double>(channels, 0.0), std::vector<double>(channels, 0.0),
                       std::vector<double>(channels, 0.0)};
  const auto x = widen(c.x), w = widen(c.w), bias = widen(c.bias), gamma = widen(c.gamma), beta = widen(c.beta),
             dy = widen(c.dy);
  std::vector<double> z(n), dz(n);
  pk::ref::conv2d_forward(s, c.conv, x.data(), w.data(), bias.data(), z.data());
  pk::ref::batchnorm_relu_forward_train(s, c.bn(), kEps, kMomentum, z.data(), gamma.data(), beta.data(), r.y.data(),
                                        r.mean.data(), r.invstd.data(), r.running_mean.data(), r.running_var.data());
  pk::ref::batchnorm_relu_backward(s, c.bn(), z.data(), r.y.data(), dy.data(), gamma.data(), r.mean.data(),
                                   r.invstd.data(), dz.data(), r.dgamma.data(), r.dbeta.data());
  pk::ref::conv2d_backward_weight(s, c.conv, x.data(), dz.data(), r.dw.data());
  pk::ref::conv2d_backward_bias(s, c.conv, dz.data(), r.dbias.data());
  return r;
}

StemResult<float> fused(const StemCase& c, int threads) {
  pk::HeapWorkspace workspace;
  pk::StreamHandle s;
  s.num_threads = threads;
  s.workspace = &workspace;
  const auto channels = std::size_t(c.conv.out_channels);
  StemResult<float> r{std::vector<float>(c.bn().size(), 777.f), std::vector<float>(channels),
                      std::vector<float>(channels), c.running_mean, c.running_var,
                      std::vector<float>(c.w.size(), 0.f), std::vector<float>(channels, 0.f),
                      std::vector<float>(channels, 0.f), std::vector<float>(channels, 0.f)};
  std::vector<float> affine(3 * channels);
  pk::cpu::conv_batchnorm_relu_forward_train(s, c.conv, kEps, kMomentum, c.x.data(), c.w.data(), c.bias.data(),
                                             c.gamma.data(), c.beta.data(), r.y.data(), r.mean.data(),
                                             r.invstd.data(), r.running_mean.data(), r.running_var.data(),
                                             affine.data());
  pk::cpu::conv_batchnorm_relu_backward(s, c.conv, c.x.data(), c.w.data(), c.bias.data(), affine.data(), c.dy.data(),
                                        c.gamma.data(), r.mean.data(), r.invstd.data(), r.dw.data(), r.dbias.data(),
                                        r.dgamma.data(), r.dbeta.data());
  return r;
}

}  // namespace

TEST_CASE("conv + batch norm + ReLU recomputed: cpu matches the ref composition") {
  if (!pk::cpu::conv_batchnorm_relu_fits(pk::conv2d_shape(2, 1, 4, 4, 16, 3, 1, 1))) {
    MESSAGE("skipped: the fused stem needs AVX-512 compiled in");
    return;
  }
  struct Case {
    std::int64_t batch, h, w, channels, image_stride;
  };
  // Planes of 28 x 28 (49 whole blocks of 16 positions), 5 x 7 (35: a tail of 3), 1 x 1, one
  // column, 16 and 48 channels, and images further apart than their size (a channel slice).
  const Case cases[] = {{3, 28, 28, 32, 0}, {4, 5, 7, 16, 0}, {5, 1, 1, 16, 0}, {2, 9, 1, 48, 0},
                        {3, 6, 6, 16, 2 * 36}, {7, 12, 11, 32, 0}};
  std::uint64_t seed = 100;
  for (const Case& k : cases) {
    const StemCase c(k.batch, k.h, k.w, k.channels, seed += 10, k.image_stride);
    const StemResult<double> want = reference(c);
    for (int threads : {1, 2, 3}) {
      CAPTURE(k.batch);
      CAPTURE(k.h);
      CAPTURE(k.w);
      CAPTURE(k.channels);
      CAPTURE(threads);
      const StemResult<float> got = fused(c, threads);
      CHECK(relative_error(got.y, want.y) < 1e-5);
      CHECK(relative_error(got.mean, want.mean) < 1e-5);
      CHECK(relative_error(got.invstd, want.invstd) < 1e-5);
      CHECK(relative_error(got.running_mean, want.running_mean) < 1e-5);
      CHECK(relative_error(got.running_var, want.running_var) < 1e-5);
      CHECK(relative_error(got.dgamma, want.dgamma) < 1e-4);
      CHECK(relative_error(got.dbeta, want.dbeta) < 1e-4);
      CHECK(relative_error(got.dw, want.dw) < 1e-4);
      // The bias's gradient is the sum of dz, zero up to rounding (batch norm removes the mean):
      // compared in absolute terms, against the size of the other gradients.
      for (std::size_t i = 0; i < got.dbias.size(); ++i) CHECK(std::abs(got.dbias[i] - want.dbias[i]) < 1e-3);
    }
  }
}

TEST_CASE("conv + batch norm + ReLU recomputed: the same bits for the same thread count") {
  if (!pk::cpu::conv_batchnorm_relu_fits(pk::conv2d_shape(2, 1, 4, 4, 16, 3, 1, 1))) return;
  const StemCase c(6, 10, 13, 32, 7);
  for (int threads : {1, 2}) {
    const StemResult<float> a = fused(c, threads), b = fused(c, threads);
    CHECK(a.y == b.y);
    CHECK(a.dw == b.dw);
    CHECK(a.dgamma == b.dgamma);
  }
}

TEST_CASE("conv + batch norm + ReLU recomputed: which shapes it takes") {
  const auto fits = [](std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride, std::int64_t pad) {
    return pk::cpu::conv_batchnorm_relu_fits(pk::conv2d_shape(4, in, 8, 8, out, k, stride, pad));
  };
  if (!fits(1, 32, 3, 1, 1)) {
    MESSAGE("the fused stem is not compiled in (no AVX-512): it takes no shape");
    CHECK_FALSE(fits(1, 16, 3, 1, 1));
    return;
  }
  CHECK(fits(1, 16, 3, 1, 1));
  CHECK(fits(1, 64, 3, 1, 1));
  CHECK_FALSE(fits(3, 32, 3, 1, 1));  // RGB: 27 taps, recomputing costs more than it saves
  CHECK_FALSE(fits(1, 24, 3, 1, 1));  // channels in whole vectors only
  CHECK_FALSE(fits(1, 32, 3, 2, 1));
  CHECK_FALSE(fits(1, 32, 5, 1, 2));
  CHECK_FALSE(fits(1, 32, 3, 1, 0));
}

TEST_CASE("conv_batch_norm_relu: the autograd op gives the unfused pair's gradients") {
  using namespace petra;
  const StemCase c(4, 9, 10, 32, 55);
  if (!ops::conv_batchnorm_relu_fits(Tensor::zeros({4, 1, 9, 10}), Tensor::zeros({32, 1, 3, 3}), {1, 1})) return;
  const Tensor x = Tensor::from_vector<float>({4, 1, 9, 10}, c.x);
  const Tensor dy = Tensor::from_vector<float>({4, 32, 9, 10}, c.dy);
  const auto run = [&](bool fuse) {
    const Variable w(Tensor::from_vector<float>({32, 1, 3, 3}, c.w), true);
    const Variable bias(Tensor::from_vector<float>({32}, c.bias), true);
    const Variable gamma(Tensor::from_vector<float>({32}, c.gamma), true);
    const Variable beta(Tensor::from_vector<float>({32}, c.beta), true);
    const Tensor running_mean = Tensor::from_vector<float>({32}, c.running_mean);
    const Tensor running_var = Tensor::from_vector<float>({32}, c.running_var);
    const Conv2dOptions co{1, 1};
    const BatchNormOptions o;
    const Variable y = fuse ? conv_batch_norm_relu(Variable(x), w, bias, gamma, beta, running_mean, running_var, co, o)
                            : batch_norm_relu(conv2d(Variable(x), w, bias, co), gamma, beta, running_mean,
                                              running_var, o);
    CHECK(y.grad_fn()->name() == (fuse ? "conv_batch_norm_relu" : "batch_norm_relu"));
    y.backward(dy);
    return std::vector<std::vector<float>>{y.data().to_vector<float>(),      w.grad().to_vector<float>(),
                                           gamma.grad().to_vector<float>(), beta.grad().to_vector<float>(),
                                           running_mean.to_vector<float>(), running_var.to_vector<float>()};
  };
  const auto fused_values = run(true), unfused_values = run(false);
  const char* names[] = {"y", "dw", "dgamma", "dbeta", "running_mean", "running_var"};
  for (std::size_t i = 0; i < fused_values.size(); ++i) {
    CAPTURE(names[i]);
    CHECK(relative_error(fused_values[i], unfused_values[i]) < 1e-4);
  }
}

TEST_CASE("conv_batch_norm routes the stem to the recomputing op, and only where it gives the same") {
  using namespace petra;
  nn::Init init(3);
  const nn::Conv2d conv(1, 16, 3, 1, 1, init);
  const nn::BatchNorm2d bn(16, init);
  const Tensor image = Tensor::uniform({2, 1, 6, 6}, 5);
  if (!ops::conv_batchnorm_relu_fits(image, conv.weight().data(), conv.options())) return;
  // An image needs no gradient: the fused op.
  CHECK(nn::conv_batch_norm(conv, bn, Variable(image), true).grad_fn()->name() == "conv_batch_norm_relu");
  // An input that needs one (the fused op gives none for x), or no ReLU: the unfused ops.
  const Variable needs_grad(image, true);
  const Variable y = nn::conv_batch_norm(conv, bn, needs_grad, true);
  CHECK(y.grad_fn()->name() == "batch_norm_relu");
  y.backward(Tensor::full(y.shape(), 1.0));
  CHECK(needs_grad.grad().defined());
  CHECK(nn::conv_batch_norm(conv, bn, Variable(image), false).grad_fn()->name() == "batch_norm");
  // Asked directly for x's gradient, the op refuses with a clear error.
  CHECK_THROWS_AS(conv_batch_norm_relu(needs_grad, conv.weight(), conv.bias(), Variable(Tensor::full({16}, 1.0), true),
                                       Variable(Tensor::zeros({16}), true), Tensor(), Tensor(), conv.options(), {}),
                  ValueError);
}

TEST_CASE("ops::conv_batchnorm_relu_forward refuses what it does not take") {
  using namespace petra;
  const Tensor gamma = Tensor::full({16}, 1.0), beta = Tensor::zeros({16});
  ops::BatchNormSaved saved;
  // Three input channels: not a shape it takes.
  CHECK_THROWS_AS(ops::conv_batchnorm_relu_forward(Tensor::zeros({2, 3, 6, 6}), Tensor::zeros({16, 3, 3, 3}),
                                                   Tensor(), gamma, beta, Tensor(), Tensor(), {1, 1}, {}, &saved),
                  ShapeError);
  if (!ops::conv_batchnorm_relu_fits(Tensor::zeros({2, 1, 6, 6}), Tensor::zeros({16, 1, 3, 3}), {1, 1})) return;
  // Evaluation mode runs the unfused ops.
  BatchNormOptions eval;
  eval.training = false;
  CHECK_THROWS_AS(ops::conv_batchnorm_relu_forward(Tensor::zeros({2, 1, 6, 6}), Tensor::zeros({16, 1, 3, 3}),
                                                   Tensor(), gamma, beta, Tensor(), Tensor(), {1, 1}, eval, &saved),
                  ValueError);
  // A backward with nowhere to add dgamma.
  ops::BatchNormSaved forward_saved;
  const Tensor x = Tensor::uniform({2, 1, 6, 6}, 9), w = Tensor::uniform({16, 1, 3, 3}, 10);
  const Tensor y = ops::conv_batchnorm_relu_forward(x, w, Tensor(), gamma, beta, Tensor(), Tensor(), {1, 1}, {},
                                                    &forward_saved);
  CHECK_THROWS_AS(ops::conv_batchnorm_relu_backward(x, w, Tensor(), y, gamma, forward_saved, {1, 1},
                                                    Tensor::zeros({16, 1, 3, 3}), Tensor(), Tensor(),
                                                    Tensor::zeros({16})),
                  ValueError);
  // gamma of the wrong size.
  CHECK_THROWS_AS(ops::conv_batchnorm_relu_forward(Tensor::zeros({2, 1, 6, 6}), Tensor::zeros({16, 1, 3, 3}),
                                                   Tensor(), Tensor::full({8}, 1.0), beta, Tensor(), Tensor(), {1, 1},
                                                   {}, &saved),
                  ShapeError);
}
