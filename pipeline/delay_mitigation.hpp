// pipeline/delay_mitigation.hpp: two remedies for the staleness of a delayed stage's gradients,
// each off by default (docs/petra.md, "Weight prediction and PipeMare's learning-rate warm-up").
//
// Stage j of a delayed pipeline computes a gradient at parameters that are D = delay_of(j)
// updates older than the parameters the gradient is applied to (update_delay in
// stage_runtime.hpp: 2(J-1-j)/k, 0 for the head and the synchronous methods).
//
// Linear weight prediction (Kosson et al. 2020, "Pipelined backpropagation at scale"): the
// stage's forward runs with the parameters extrapolated D updates ahead along SGD's momentum
// buffer v, the direction the coming updates will move them:
//   theta_hat = theta - lr * h * D * v          (h: the horizon scale, 1 = the full delay)
// With Nesterov momentum the step SGD applies is lr * (g + momentum * v); when the gradients stay
// near their running mean, g ~ (1 - momentum) * v and that step is lr * v too, so the same
// extrapolation serves both forms. The backward of that mini-batch then runs with the parameters
// of its own time, the ones the prediction aimed at.
//
// PipeMare's learning-rate warm-up (Yang et al. 2021): stage j's learning rate is divided by its
// delay raised to a power that falls from 1 to 0 over the first T mini-batches of the run,
//   lr_j(m) = lr(m) * tau_j^(-p(m)),  p(m) = max(0, 1 - m / T),  tau_j = max(1, D)
// so the stages that see the stalest gradients start with the smallest steps. tau is bounded
// below by 1 so a delay under one update (k > 2(J-1-j)) never raises a rate.
#pragma once

#include <cstdint>
#include <string_view>

#include "petra/tensor.hpp"

namespace petra::pipeline {

enum class WeightPrediction { none, linear };
std::string_view name_of(WeightPrediction prediction);
// "none" or "linear"; anything else is a ValueError naming --weight-prediction.
WeightPrediction parse_weight_prediction(std::string_view text);

// theta - step * velocity, a new tensor (theta and velocity are not changed), computed as
// theta + (-step) * velocity in theta's dtype; step = lr * h * D.
Tensor predict_parameter(const Tensor& theta, const Tensor& velocity, double step);

// PipeMare's factor tau^(-p(m)) above for a stage `delay` updates late, at mini-batch `microbatch`
// of the run (the learning-rate schedule's clock), warming up over `warmup` mini-batches. Exactly 1
// when warmup is 0, when the delay is at most one update, and from mini-batch `warmup` on.
double delay_lr_factor(double delay, std::int64_t microbatch, std::int64_t warmup);

}  // namespace petra::pipeline
