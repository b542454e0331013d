// pipeline/delay_mitigation.cpp: the formulas of linear weight prediction and PipeMare's
// learning-rate warm-up (pipeline/delay_mitigation.hpp); the stage runtime applies them.
#include "petra/pipeline/delay_mitigation.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "petra/error.hpp"
#include "petra/ops.hpp"

namespace petra::pipeline {

std::string_view name_of(WeightPrediction prediction) {
  return prediction == WeightPrediction::linear ? "linear" : "none";
}

WeightPrediction parse_weight_prediction(std::string_view text) {
  if (text == "none") return WeightPrediction::none;
  if (text == "linear") return WeightPrediction::linear;
  throw ValueError(detail::concat("--weight-prediction '", std::string(text), "': expected none or linear"));
}

Tensor predict_parameter(const Tensor& theta, const Tensor& velocity, double step) {
  Tensor predicted = theta.clone();
  ops::axpy_into(predicted, -step, velocity);
  return predicted;
}

double delay_lr_factor(double delay, std::int64_t microbatch, std::int64_t warmup) {
  if (warmup <= 0 || delay <= 1 || microbatch >= warmup) return 1.0;
  const double power = 1.0 - static_cast<double>(microbatch) / static_cast<double>(warmup);
  return std::pow(delay, -power);
}

}  // namespace petra::pipeline
