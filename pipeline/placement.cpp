// pipeline/placement.cpp: which worker runs which stage: stage costs measured as a worker runs
// them, and the contiguous split of the stages that balances those costs.
#include "petra/pipeline/placement.hpp"

#include <algorithm>
#include <chrono>

#include "petra/nn/layers.hpp"
#include "petra/stream.hpp"

namespace petra::pipeline {

std::vector<double> measure_stage_costs(nn::Model& model, const MiniBatch& batch, int threads) {
  using Clock = std::chrono::steady_clock;
  Stream stream(Device::cpu(), threads);  // as a worker will run them (a GPU stage: on its device's stream)
  StreamGuard guard(stream);
  const std::size_t J = model.num_stages();
  std::vector<double> costs(J, 0.0);
  Tensor x = batch.images;
  for (std::size_t j = 0; j < J; ++j) {
    nn::Stage& stage = model.stage(j);
    double best = 1e300;
    Tensor y;
    for (int repeat = 0; repeat < 3; ++repeat) {  // the best of 3: the first warms caches and allocator
      const auto start = Clock::now();
      if (stage.kind() == nn::StageKind::head) {
        stage.loss_and_backward(x, batch.labels);
      } else {
        {
          NoGradGuard no_grad;
          nn::RunningStatsGuard keep_statistics;
          y = stage.forward(Variable(x)).data();
        }
        const Tensor dy = Tensor::full(y.shape(), 1e-3, y.dtype(), y.device());
        if (stage.kind() == nn::StageKind::reversible)
          stage.reconstruct_and_backward(y, dy);  // what PETRA's backward runs
        else
          nn::backward_from_input(stage, x, dy, j > 0);
      }
      if (x.device().is_cuda()) Stream::for_device(x.device()).synchronize();  // the kernels, not their launches
      best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
    }
    costs[j] = best;
    stage.zero_grad();
    if (y.defined()) x = y;
  }
  return costs;
}

std::vector<int> balanced_placement(const std::vector<double>& costs, int workers) {
  PETRA_CHECK(workers >= 1, ValueError, "balanced_placement: need at least one worker");
  const int n = static_cast<int>(costs.size());
  // best[w][i]: the smallest possible largest load when stages [0, i) go to w workers.
  std::vector<std::vector<double>> best(workers + 1, std::vector<double>(n + 1, 1e300));
  std::vector<std::vector<int>> cut(workers + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int w = 1; w <= workers; ++w)
    for (int i = 0; i <= n; ++i) {
      double load = 0;
      for (int start = i; start >= 0; --start) {  // worker w takes stages [start, i)
        if (start < i) load += costs[start];
        const double candidate = std::max(best[w - 1][start], load);
        if (candidate < best[w][i]) {
          best[w][i] = candidate;
          cut[w][i] = start;
        }
      }
    }
  std::vector<int> placement(n, 0);
  for (int w = workers, i = n; w >= 1; --w) {
    for (int j = cut[w][i]; j < i; ++j) placement[j] = w - 1;
    i = cut[w][i];
  }
  return placement;
}

}  // namespace petra::pipeline
