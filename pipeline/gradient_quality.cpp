// pipeline/gradient_quality.cpp: a delayed gradient against backprop's, per stage, at one step.
#include "petra/pipeline/gradient_quality.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "petra/nn/layers.hpp"
#include "petra/pipeline/backprop_reference.hpp"

namespace petra::pipeline {

namespace {
// All gradients of one stage's parameters, flattened (zeros where a parameter has none).
std::vector<double> flat_gradients(const std::vector<Tensor>& grads) {
  std::vector<double> flat;
  for (const Tensor& g : grads) {
    const auto v = g.to_vector<float>();
    flat.insert(flat.end(), v.begin(), v.end());
  }
  return flat;
}

StageGradientQuality compare_gradients(const std::vector<double>& delayed, const std::vector<double>& exact) {
  double dot = 0, dd = 0, ee = 0, diff = 0;
  for (std::size_t i = 0; i < delayed.size(); ++i) {
    dot += delayed[i] * exact[i];
    dd += delayed[i] * delayed[i];
    ee += exact[i] * exact[i];
    diff += (delayed[i] - exact[i]) * (delayed[i] - exact[i]);
  }
  StageGradientQuality q;
  q.cosine = dot / std::max(std::sqrt(dd * ee), 1e-300);
  q.norm_ratio = std::sqrt(dd / std::max(ee, 1e-300));
  q.relative_error = std::sqrt(diff / std::max(ee, 1e-300));
  return q;
}
}  // namespace

GradientQuality tracked_step(nn::Model& model, SequentialExecutor& executor, const Schedule& grid, std::int64_t t,
                             const BatchSource& batches, const HeadCallback& on_head) {
  const int J = static_cast<int>(model.num_stages());
  // Which mini-batch each stage runs backward at step t (one full backprop per mini-batch).
  std::map<std::int64_t, std::vector<int>> stages_of;
  for (int j = 0; j < J; ++j)
    for (const Action& a : grid.cells[t][j])
      if (a.kind == Action::Kind::backward) stages_of[a.microbatch].push_back(j);
  // 1. Exact gradients at the current parameters; the accumulated delayed gradients are set aside
  //    and batch norm's running statistics are left alone, so training is not disturbed.
  const auto params = model.parameters();
  std::vector<Tensor> accumulated;
  for (const auto& p : params) {
    accumulated.push_back(p.grad());
    p.zero_grad();
  }
  std::vector<std::vector<double>> exact(J);
  for (const auto& [m, stages] : stages_of) {
    const MiniBatch b = batches(m);
    {
      nn::RunningStatsGuard frozen;
      backprop_step(model, b.images, b.labels);
    }
    for (int j : stages) {
      std::vector<Tensor> grads;
      for (const auto& p : model.stage(j).parameters())
        grads.push_back(p.grad().defined() ? p.grad() : Tensor::zeros(p.shape(), p.data().dtype(), p.data().device()));
      exact[j] = flat_gradients(grads);
    }
    model.zero_grad();
  }
  for (std::size_t i = 0; i < params.size(); ++i)
    if (accumulated[i].defined()) params[i].set_grad(accumulated[i]);
  // 2. The step itself, each stage keeping the contribution of its backward.
  for (int j = 0; j < J; ++j) executor.stage(j).set_capture_gradient(true);
  executor.run(grid, t, t + 1, batches, on_head);
  for (int j = 0; j < J; ++j) executor.stage(j).set_capture_gradient(false);
  // 3. Compare.
  GradientQuality quality{t, {}};
  for (const auto& [m, stages] : stages_of)
    for (int j : stages) {
      StageGradientQuality q = compare_gradients(flat_gradients(executor.stage(j).captured_gradient()), exact[j]);
      q.stage = j;
      q.microbatch = m;
      quality.stages.push_back(q);
    }
  std::sort(quality.stages.begin(), quality.stages.end(),
            [](const auto& a, const auto& b) { return a.stage < b.stage; });
  return quality;
}

}  // namespace petra::pipeline
