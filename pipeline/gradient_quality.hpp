// pipeline/gradient_quality.hpp: how good a delayed gradient is (--track-gradient-quality). At one
// step of the grid, each stage that runs a backward there computes its delayed gradient (with stale
// activations and/or parameters); the same mini-batch's exact backprop gradient at the parameters
// of that moment is computed beside it, without disturbing training, and the two are compared.
#pragma once

#include <cstdint>
#include <vector>

#include "petra/nn/models.hpp"
#include "petra/pipeline/executor.hpp"

namespace petra::pipeline {

// --track-gradient-quality: at one step of the grid, for each stage that ran a backward there, its
// delayed gradient (of that mini-batch, computed with stale activations and/or parameters) against
// the exact backprop gradient of the same mini-batch at the parameters of that moment.
struct StageGradientQuality {
  int stage = 0;
  std::int64_t microbatch = 0;
  double cosine = 0;          // <g_delayed, g_exact> / (|g_delayed| |g_exact|)
  double norm_ratio = 0;      // |g_delayed| / |g_exact|
  double relative_error = 0;  // |g_delayed - g_exact| / |g_exact|
};
struct GradientQuality {
  std::int64_t step = 0;  // of the grid
  std::vector<StageGradientQuality> stages;
};

// Runs step t of `grid` on `executor` (as executor.run(grid, t, t + 1, ...) would) and compares
// each stage's delayed gradient there with backprop's (pipeline/backprop_reference.hpp).
GradientQuality tracked_step(nn::Model& model, SequentialExecutor& executor, const Schedule& grid, std::int64_t t,
                             const BatchSource& batches, const HeadCallback& on_head);

}  // namespace petra::pipeline
