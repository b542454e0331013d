// nn/schedule.hpp: learning-rate schedules, as pure functions of the global iteration.
//
// The learning rate of iteration `it` (0-based, counted over the whole run; iterations_per_epoch
// of them make an epoch) is, with W = warmup_epochs * iterations_per_epoch warm-up iterations and
// T = total_epochs * iterations_per_epoch:
//   warm-up (it < W):  base_lr * min(1, (it + 1) / W)     linear per iteration, as the official
//                      PETRA code (lr * (it + 1) / (5 * iters_per_epoch) for 5 warm-up epochs)
//   then, by kind:
//     "constant"  base_lr
//     "step"      base_lr * factor^(number of milestones m with it >= m * iterations_per_epoch):
//                 milestones are absolute epochs (warm-up included), so with 100 iterations per
//                 epoch a milestone at epoch 150 drops the rate from iteration 15000 on
//     "cosine"    base_lr * 0.5 * (1 + cos(pi * progress))
//     "poly"      base_lr * (1 - progress)^power
//   where progress = (it - W) / (T - W), clamped to [0, 1]: the cosine and polynomial decays run
//   over the iterations after the warm-up and reach 0 at iteration T (and stay there).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace petra::nn {

struct ScheduleConfig {
  std::string kind = "constant";  // "constant", "step", "cosine", "poly"
  double base_lr = 0.1;
  double warmup_epochs = 0;
  std::vector<double> milestones = {};  // "step": absolute epochs, strictly increasing
  double factor = 0.1;             // "step": multiplier at each milestone
  double power = 2;                // "poly": exponent
  double total_epochs = 0;         // "cosine", "poly": end of the decay (> warmup_epochs)
};

// Throws ValueError naming the field: unknown kind, a negative or non-finite value, milestones not
// strictly increasing, or (cosine, poly) total_epochs not above warmup_epochs.
void validate(const ScheduleConfig& config);

// The learning rate of iteration `iteration` (>= 0); iterations_per_epoch > 0. Validates config.
double learning_rate(const ScheduleConfig& config, std::int64_t iteration, std::int64_t iterations_per_epoch);

// Goyal et al.'s linear scaling rule: lr for a batch of `batch` samples with `accumulation`
// mini-batches per update, from an lr tuned for 256 samples.
double goyal_lr(double lr, std::int64_t accumulation, std::int64_t batch);

}  // namespace petra::nn
