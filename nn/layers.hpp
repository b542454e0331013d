// nn/layers.hpp: the layers the paper's models are made of: Conv2d (with bias, as in the official
// PETRA code), BatchNorm2d, Linear.
//
// Initialisation is PyTorch's default, drawn from the Philox generator of the Init passed to the constructor
// (so a model is a pure function of its seed and its construction order):
//   Conv2d / Linear weight: kaiming_uniform(a = sqrt(5)), which is U(-1/sqrt(fan_in), 1/sqrt(fan_in));
//   bias: U(-1/sqrt(fan_in), 1/sqrt(fan_in)); BatchNorm2d: gamma 1, beta 0, running mean 0, var 1.
//
// Batch norm normalises with batch statistics in training mode and with the running statistics
// in evaluation mode. Whether a training-mode call also moves the running statistics is decided
// per thread by RunningStatsGuard. By default PETRA's stages update them in the forward pass (as the
// official code does) and not when they rebuild or recompute activations in the backward pass; a
// StatisticsPassScope moves the update to that recomputation instead (the pipeline's
// --bn-statistics backward option: the statistics then follow the mini-batches in backward order).
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>

#include "petra/nn/module.hpp"
#include "petra/functions.hpp"
#include "petra/rng.hpp"

namespace petra::nn {

// How parameters are created: the generator they are drawn from, in construction order, and
// their element type (float32 to train; float64 for finite-difference checks of whole stages).
struct Init {
  explicit Init(std::uint64_t seed, DType dtype = DType::f32) : rng(seed), dtype(dtype) {}
  Philox rng;
  DType dtype;
};

class Conv2d : public Module {
 public:
  Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel, std::int64_t stride,
         std::int64_t padding, Init& init, bool bias = true);
  Variable forward(const Variable& x) const;

  const Variable& weight() const { return weight_; }
  const Variable& bias() const { return bias_; }
  const Conv2dOptions& options() const { return options_; }

 private:
  Conv2dOptions options_;
  Variable weight_, bias_;
};

class BatchNorm2d : public Module {
 public:
  BatchNorm2d(std::int64_t channels, const Init& init, double momentum = 0.1, double eps = 1e-5);
  // input_bias: see batch_norm (petra/functions.hpp) and conv_batch_norm below.
  Variable forward(const Variable& x, const Variable& input_bias = {}) const;
  // relu(forward(x)) as one fused op (batch_norm_relu, petra/functions.hpp): the same numbers, the
  // same running-statistics rule, one pass over memory and one tensor fewer.
  Variable forward_relu(const Variable& x, const Variable& input_bias = {}) const;
  // The reversible coupling of `x` (or its inverse, of `y`) with f = relu(forward(z)), fused so that
  // f is never stored (ops::batchnorm_relu_coupling_*): forward_relu's numbers and running-statistics
  // rule, and no graph, so it is called with gradients off (a ValueError otherwise).
  Tensor coupling_relu_forward(const Tensor& x, const Tensor& z) const;
  Tensor coupling_relu_inverse(const Tensor& y, const Tensor& z) const;
  // coupling_relu_forward with a graph (batch_norm_relu_coupling, petra/functions.hpp): f is not
  // stored there either, and the backward needs z and the forward's map only.
  Variable coupling_relu(const Variable& x, const Variable& z, const Variable& input_bias = {}) const;

  // relu(forward(conv.forward(x))) in training mode as one op that never stores the convolution's
  // output (conv_batch_norm_relu, petra/functions.hpp: the stem on images recomputes its cheap
  // one-channel convolution in each pass), where that op takes conv and x and x needs no gradient;
  // an undefined Variable where it does not (evaluation mode, another shape), for conv_batch_norm
  // to run the unfused pair instead.
  Variable forward_conv_relu_recomputed(const Conv2d& conv, const Variable& x) const;

  const Tensor& running_mean() const { return running_mean_; }
  const Tensor& running_var() const { return running_var_; }

 private:
  // The options of a call now (training mode, the momentum a RunningStatsMomentumGuard may set).
  BatchNormOptions options() const;
  // The running statistics a call with options o passes to its op: read in evaluation, moved in
  // training when RunningStatsGuard allows, undefined (neither) otherwise.
  std::pair<Tensor, Tensor> running_statistics(const BatchNormOptions& o) const;

  double momentum_, eps_;
  Variable gamma_, beta_;
  Tensor running_mean_, running_var_;
};

// bn.forward(conv.forward(x)), or bn.forward_relu(...) when relu: the same numbers, but the
// convolution's bias gradient is taken by batch norm's backward as it writes its dx (the bias is
// batch norm's input_bias, not the convolution's recorded input), which saves a pass over that
// gradient. conv's output must go to bn only, as in every block here. With relu, a one-channel image x
// that needs no gradient (the stem) goes to bn.forward_conv_relu_recomputed: the same numbers up to
// float rounding, without the convolution's output in memory.
Variable conv_batch_norm(const Conv2d& conv, const BatchNorm2d& bn, const Variable& x, bool relu);
// The reversible coupling of x with f = relu(bn(conv(h))), batch norm + ReLU fused into the
// coupling (BatchNorm2d::coupling_relu), the bias's gradient taken as in conv_batch_norm.
Variable conv_batch_norm_coupling(const Conv2d& conv, const BatchNorm2d& bn, const Variable& h, const Variable& x);

class Linear : public Module {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, Init& init, bool bias = true);
  Variable forward(const Variable& x) const;

 private:
  Variable weight_, bias_;
};

// While alive, training-mode batch norm on this thread moves its running statistics iff `update`.
class RunningStatsGuard {
 public:
  explicit RunningStatsGuard(bool update = false);
  ~RunningStatsGuard();
  RunningStatsGuard(const RunningStatsGuard&) = delete;
  RunningStatsGuard& operator=(const RunningStatsGuard&) = delete;
  static bool updates_enabled();

 private:
  bool saved_;
};

// While alive, training-mode batch norm on this thread that moves its running statistics does so
// with `momentum` instead of its own: 1/(i+1) for the i-th of a series of batches makes the
// statistics their cumulative average, whatever they were before (Trainer's recomputation after a
// drain; torch.optim.swa_utils.update_bn does the same with momentum None).
class RunningStatsMomentumGuard {
 public:
  explicit RunningStatsMomentumGuard(double momentum);
  ~RunningStatsMomentumGuard();
  RunningStatsMomentumGuard(const RunningStatsMomentumGuard&) = delete;
  RunningStatsMomentumGuard& operator=(const RunningStatsMomentumGuard&) = delete;
  static double momentum_or(double own);  // the guard's momentum if one is alive on this thread, else `own`

 private:
  double saved_;
};

// Which pass of a stage moves batch norm's running statistics (per thread, for the stages' backward
// recomputations: nn::backward_from_input and the reversible reconstruction read it).
enum class StatisticsPass { forward, backward };
StatisticsPass parse_statistics_pass(std::string_view name);  // "forward" | "backward"
class StatisticsPassScope {
 public:
  explicit StatisticsPassScope(StatisticsPass pass);
  ~StatisticsPassScope();
  StatisticsPassScope(const StatisticsPassScope&) = delete;
  StatisticsPassScope& operator=(const StatisticsPassScope&) = delete;
  static StatisticsPass current();

 private:
  StatisticsPass saved_;
};

// The guard a stage's backward takes around its recomputation of the forward pass: it moves the
// running statistics only when this thread's StatisticsPass is backward.
class RecomputationStatsGuard : public RunningStatsGuard {
 public:
  RecomputationStatsGuard() : RunningStatsGuard(StatisticsPassScope::current() == StatisticsPass::backward) {}
};

// U(-bound, bound) with bound = 1/sqrt(fan_in): PyTorch's default for conv and linear layers.
Tensor uniform_fan_in(const Shape& shape, std::int64_t fan_in, Init& init);

}  // namespace petra::nn
