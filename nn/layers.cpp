// nn/layers.cpp: Conv2d, BatchNorm2d, Linear and their PyTorch-default initialisation.
#include "petra/nn/layers.hpp"

#include <cmath>

#include <fmt/format.h>

namespace petra::nn {

Tensor uniform_fan_in(const Shape& shape, std::int64_t fan_in, Init& init) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
  Tensor t = Tensor::empty(shape, DType::f32);
  init.rng.fill_uniform(t.data_ptr<float>(), static_cast<std::size_t>(t.numel()), -bound, bound);
  return t.to(init.dtype);
}

Conv2d::Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel, std::int64_t stride,
               std::int64_t padding, Init& init, bool bias)
    : options_{stride, padding} {
  PETRA_CHECK(in_channels > 0 && out_channels > 0 && kernel > 0, ValueError, "Conv2d: channels ", in_channels, " -> ",
              out_channels, ", kernel ", kernel);
  const std::int64_t fan_in = in_channels * kernel * kernel;
  weight_ = register_parameter("weight", uniform_fan_in({out_channels, in_channels, kernel, kernel}, fan_in, init));
  if (bias) bias_ = register_parameter("bias", uniform_fan_in({out_channels}, fan_in, init));
}

Variable Conv2d::forward(const Variable& x) const { return conv2d(x, weight_, bias_, options_); }

BatchNorm2d::BatchNorm2d(std::int64_t channels, const Init& init, double momentum, double eps)
    : momentum_(momentum), eps_(eps) {
  gamma_ = register_parameter("weight", Tensor::full({channels}, 1.0, init.dtype));
  beta_ = register_parameter("bias", Tensor::zeros({channels}, init.dtype));
  running_mean_ = register_buffer("running_mean", Tensor::zeros({channels}, init.dtype));
  running_var_ = register_buffer("running_var", Tensor::full({channels}, 1.0, init.dtype));
}

BatchNormOptions BatchNorm2d::options() const {
  BatchNormOptions o;
  o.training = is_training();
  o.momentum = RunningStatsMomentumGuard::momentum_or(momentum_);
  o.eps = eps_;
  return o;
}

std::pair<Tensor, Tensor> BatchNorm2d::running_statistics(const BatchNormOptions& o) const {
  // Evaluation reads the running statistics; training updates them only when the guard allows.
  if (o.training && !RunningStatsGuard::updates_enabled()) return {};
  return {running_mean_, running_var_};
}

Variable BatchNorm2d::forward(const Variable& x, const Variable& input_bias) const {
  const BatchNormOptions o = options();
  const auto [mean, var] = running_statistics(o);
  return batch_norm(x, gamma_, beta_, mean, var, o, input_bias);
}

Variable BatchNorm2d::forward_relu(const Variable& x, const Variable& input_bias) const {
  const BatchNormOptions o = options();
  const auto [mean, var] = running_statistics(o);
  return batch_norm_relu(x, gamma_, beta_, mean, var, o, input_bias);
}

namespace {
// conv(x) for a batch norm that takes the bias as its input_bias: the convolution adds the bias's
// values, but only batch norm records the bias as an input.
Variable conv_for_batch_norm(const Conv2d& conv, const Variable& x) {
  const Variable& bias = conv.bias();
  return conv2d(x, conv.weight(), bias.defined() ? Variable(bias.data()) : Variable(), conv.options());
}
}  // namespace

Variable conv_batch_norm(const Conv2d& conv, const BatchNorm2d& bn, const Variable& x, bool relu) {
  if (relu)
    if (Variable y = bn.forward_conv_relu_recomputed(conv, x); y.defined()) return y;
  const Variable z = conv_for_batch_norm(conv, x);
  return relu ? bn.forward_relu(z, conv.bias()) : bn.forward(z, conv.bias());
}

Variable conv_batch_norm_coupling(const Conv2d& conv, const BatchNorm2d& bn, const Variable& h, const Variable& x) {
  return bn.coupling_relu(x, conv_for_batch_norm(conv, h), conv.bias());
}

Variable BatchNorm2d::forward_conv_relu_recomputed(const Conv2d& conv, const Variable& x) const {
  const BatchNormOptions o = options();
  if (!o.training || (x.requires_grad() && grad_enabled()) ||
      !ops::conv_batchnorm_relu_fits(x.data(), conv.weight().data(), conv.options()))
    return {};
  const auto [mean, var] = running_statistics(o);
  return conv_batch_norm_relu(x, conv.weight(), conv.bias(), gamma_, beta_, mean, var, conv.options(), o);
}

Tensor BatchNorm2d::coupling_relu_forward(const Tensor& x, const Tensor& z) const {
  PETRA_CHECK(!grad_enabled(), ValueError, "BatchNorm2d::coupling_relu_forward keeps no graph: call it with gradients off");
  const BatchNormOptions o = options();
  const auto [mean, var] = running_statistics(o);
  return ops::batchnorm_relu_coupling_forward(x, z, gamma_.data(), beta_.data(), mean, var, o);
}

Variable BatchNorm2d::coupling_relu(const Variable& x, const Variable& z, const Variable& input_bias) const {
  const BatchNormOptions o = options();
  const auto [mean, var] = running_statistics(o);
  return batch_norm_relu_coupling(x, z, gamma_, beta_, mean, var, o, input_bias);
}

Tensor BatchNorm2d::coupling_relu_inverse(const Tensor& y, const Tensor& z) const {
  PETRA_CHECK(!grad_enabled(), ValueError, "BatchNorm2d::coupling_relu_inverse keeps no graph: call it with gradients off");
  const BatchNormOptions o = options();
  const auto [mean, var] = running_statistics(o);
  return ops::batchnorm_relu_coupling_inverse(y, z, gamma_.data(), beta_.data(), mean, var, o);
}

Linear::Linear(std::int64_t in_features, std::int64_t out_features, Init& init, bool bias) {
  PETRA_CHECK(in_features > 0 && out_features > 0, ValueError, "Linear: features ", in_features, " -> ", out_features);
  weight_ = register_parameter("weight", uniform_fan_in({out_features, in_features}, in_features, init));
  if (bias) bias_ = register_parameter("bias", uniform_fan_in({out_features}, in_features, init));
}

Variable Linear::forward(const Variable& x) const { return linear(x, weight_, bias_); }

namespace {
thread_local bool tls_running_stats = true;
thread_local StatisticsPass tls_statistics_pass = StatisticsPass::forward;
thread_local double tls_statistics_momentum = -1;  // < 0: no RunningStatsMomentumGuard alive
}  // namespace
RunningStatsGuard::RunningStatsGuard(bool update) : saved_(tls_running_stats) { tls_running_stats = update; }
RunningStatsGuard::~RunningStatsGuard() { tls_running_stats = saved_; }
bool RunningStatsGuard::updates_enabled() { return tls_running_stats; }

RunningStatsMomentumGuard::RunningStatsMomentumGuard(double momentum) : saved_(tls_statistics_momentum) {
  PETRA_CHECK(momentum > 0 && momentum <= 1, ValueError, "RunningStatsMomentumGuard: momentum ", momentum,
              " outside (0, 1]");
  tls_statistics_momentum = momentum;
}
RunningStatsMomentumGuard::~RunningStatsMomentumGuard() { tls_statistics_momentum = saved_; }
double RunningStatsMomentumGuard::momentum_or(double own) {
  return tls_statistics_momentum < 0 ? own : tls_statistics_momentum;
}

StatisticsPass parse_statistics_pass(std::string_view name) {
  if (name == "forward") return StatisticsPass::forward;
  if (name == "backward") return StatisticsPass::backward;
  throw ValueError(fmt::format("batch-norm statistics pass '{}': expected forward or backward", name));
}
StatisticsPassScope::StatisticsPassScope(StatisticsPass pass) : saved_(tls_statistics_pass) {
  tls_statistics_pass = pass;
}
StatisticsPassScope::~StatisticsPassScope() { tls_statistics_pass = saved_; }
StatisticsPass StatisticsPassScope::current() { return tls_statistics_pass; }

}  // namespace petra::nn
