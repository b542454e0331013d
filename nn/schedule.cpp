// nn/schedule.cpp: the learning-rate schedules of nn/schedule.hpp.
#include "petra/nn/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "petra/error.hpp"

namespace petra::nn {

namespace {

void check_non_negative(double value, const char* field) {
  PETRA_CHECK(std::isfinite(value) && value >= 0, ValueError, "learning-rate schedule: ", field,
              " must be finite and >= 0, got ", value);
}

bool decays_to_zero(const std::string& kind) { return kind == "cosine" || kind == "poly"; }

// Fraction of the post-warm-up iterations done, in [0, 1].
double decay_progress(const ScheduleConfig& c, double iteration, double iterations_per_epoch) {
  const double start = c.warmup_epochs * iterations_per_epoch;
  const double end = c.total_epochs * iterations_per_epoch;
  return std::clamp((iteration - start) / (end - start), 0.0, 1.0);
}

}  // namespace

void validate(const ScheduleConfig& c) {
  PETRA_CHECK(c.kind == "constant" || c.kind == "step" || decays_to_zero(c.kind), ValueError,
              "learning-rate schedule: unknown kind '", c.kind, "' (expected constant, step, cosine or poly)");
  check_non_negative(c.base_lr, "base_lr");
  check_non_negative(c.warmup_epochs, "warmup_epochs");
  check_non_negative(c.factor, "factor");
  check_non_negative(c.power, "power");
  check_non_negative(c.total_epochs, "total_epochs");
  for (std::size_t i = 0; i < c.milestones.size(); ++i) {
    check_non_negative(c.milestones[i], "milestone");
    PETRA_CHECK(i == 0 || c.milestones[i] > c.milestones[i - 1], ValueError,
                "learning-rate schedule: milestones must be strictly increasing, got ", c.milestones[i - 1],
                " then ", c.milestones[i]);
  }
  PETRA_CHECK(!decays_to_zero(c.kind) || c.total_epochs > c.warmup_epochs, ValueError, "learning-rate schedule: ",
              c.kind, " needs total_epochs (", c.total_epochs, ") > warmup_epochs (", c.warmup_epochs, ")");
}

double learning_rate(const ScheduleConfig& c, std::int64_t iteration, std::int64_t iterations_per_epoch) {
  validate(c);
  PETRA_CHECK(iteration >= 0 && iterations_per_epoch > 0, ValueError, "learning_rate: iteration ", iteration,
              " must be >= 0 and iterations_per_epoch ", iterations_per_epoch, " > 0");
  const double it = static_cast<double>(iteration);
  const double per_epoch = static_cast<double>(iterations_per_epoch);
  const double warmup_iterations = c.warmup_epochs * per_epoch;
  if (it < warmup_iterations) return c.base_lr * std::min(1.0, (it + 1) / warmup_iterations);

  if (c.kind == "step") {
    const auto passed = std::count_if(c.milestones.begin(), c.milestones.end(),
                                      [&](double milestone) { return it >= milestone * per_epoch; });
    return c.base_lr * std::pow(c.factor, static_cast<double>(passed));
  }
  if (c.kind == "cosine")
    return c.base_lr * 0.5 * (1 + std::cos(std::numbers::pi * decay_progress(c, it, per_epoch)));
  if (c.kind == "poly") return c.base_lr * std::pow(1 - decay_progress(c, it, per_epoch), c.power);
  return c.base_lr;  // constant
}

double goyal_lr(double lr, std::int64_t accumulation, std::int64_t batch) {
  PETRA_CHECK(accumulation >= 1 && batch >= 1, ValueError, "goyal_lr: accumulation ", accumulation, " and batch ",
              batch, " must be >= 1");
  return lr * static_cast<double>(accumulation) * static_cast<double>(batch) / 256;
}

}  // namespace petra::nn
