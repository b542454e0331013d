// pipeline/placement.hpp: which worker of the concurrent executor runs which stage.
#pragma once

#include <vector>

#include "petra/nn/models.hpp"
#include "petra/pipeline/messages.hpp"

namespace petra::pipeline {

// Seconds of one forward and one backward of each stage on `batch` with `threads` kernel threads
// (reversible stages: reconstruct_and_backward, what PETRA runs; best of 3; the parameters'
// gradients are cleared afterwards), for placing stages on workers.
std::vector<double> measure_stage_costs(nn::Model& model, const MiniBatch& batch, int threads = 1);

// Contiguous stages per worker, balancing the sum of `costs` (the largest worker load is minimal).
std::vector<int> balanced_placement(const std::vector<double>& costs, int workers);

}  // namespace petra::pipeline
