// pipeline/stage_layout.cpp: --stages: the block profiles, the auto rule's search over cuts, and
// the parsing of the explicit layouts.
#include "petra/pipeline/stage_layout.hpp"

#include <algorithm>
#include <limits>

#include "petra/autograd.hpp"
#include "petra/nn/layers.hpp"
#include "petra/pipeline/stage_runtime.hpp"

namespace petra::pipeline {

namespace {

// Multiply-adds x 2 of one image through `stage` whose output has `positions` pixels: each 4-d
// weight (a convolution) at every output position (a block's convolutions all produce its output
// resolution), each 2-d weight (the linear head) once.
double forward_flops(const nn::Stage& stage, std::int64_t positions) {
  double flops = 0;
  for (const auto& p : stage.parameters()) {
    const auto n = static_cast<double>(p.data().numel());
    if (p.shape().ndim() == 4) flops += 2.0 * n * static_cast<double>(positions);
    if (p.shape().ndim() == 2) flops += 2.0 * n;
  }
  return flops;
}

// A group's kind, as nn::StageGroup derives it from its blocks.
nn::StageKind group_kind(const std::vector<BlockProfile>& blocks, std::size_t first, std::size_t end) {
  if (blocks[end - 1].kind == nn::StageKind::head) return nn::StageKind::head;
  for (std::size_t b = first; b < end; ++b)
    if (blocks[b].kind != nn::StageKind::reversible) return nn::StageKind::buffered;
  return nn::StageKind::reversible;
}

struct Cut {
  double largest_cost;
  double kept_elements;  // per image, summed over the mini-batches each stage keeps in steady state
};

// The cost and the kept inputs of the layout `sizes`: stage j of J keeps its input for the
// 2(J-1-j) + 1 mini-batches between its forward and its backward where the method keeps it.
Cut evaluate(const std::vector<BlockProfile>& blocks, const std::vector<std::int64_t>& sizes, PipelineMethod method) {
  Cut cut{0, 0};
  const auto J = static_cast<std::int64_t>(sizes.size());
  std::size_t first = 0;
  for (std::int64_t j = 0; j < J; ++j) {
    const std::size_t end = first + static_cast<std::size_t>(sizes[static_cast<std::size_t>(j)]);
    double cost = 0;
    for (std::size_t b = first; b < end; ++b) cost += blocks[b].cost;
    cut.largest_cost = std::max(cut.largest_cost, cost);
    if (keeping(method, group_kind(blocks, first, end)).input)
      cut.kept_elements += static_cast<double>(2 * (J - 1 - j) + 1) * static_cast<double>(blocks[first].input_elements);
    first = end;
  }
  return cut;
}

// Calls visit(sizes) for every way of cutting `blocks` consecutive blocks into `stages` non-empty
// runs (C(blocks-1, stages-1) of them: at most 24,310 for the 18 blocks of RevNet34/50).
template <class Visit>
void for_each_layout(std::int64_t blocks, std::int64_t stages, std::vector<std::int64_t>& sizes, const Visit& visit) {
  if (stages == 1) {
    sizes.push_back(blocks);
    visit(sizes);
    sizes.pop_back();
    return;
  }
  for (std::int64_t first = 1; first <= blocks - (stages - 1); ++first) {
    sizes.push_back(first);
    for_each_layout(blocks - first, stages - 1, sizes, visit);
    sizes.pop_back();
  }
}

}  // namespace

std::vector<BlockProfile> profile_blocks(nn::ModelConfig config, const Shape& image) {
  PETRA_CHECK(image.ndim() == 3, ValueError, "profile_blocks: an image is (C, H, W), not ", image.str());
  config.stage_sizes.clear();
  config.in_channels = image[0];
  nn::Model model(config);
  model.eval();
  NoGradGuard no_grad;
  Tensor x = Tensor::zeros(Shape{1, image[0], image[1], image[2]});
  std::vector<BlockProfile> blocks;
  for (std::size_t j = 0; j < model.num_stages(); ++j) {
    nn::Stage& stage = model.stage(j);
    BlockProfile block{stage.kind(), 0, x.numel()};
    if (stage.kind() == nn::StageKind::head) {
      block.cost = forward_flops(stage, 1);
    } else {
      const Tensor y = stage.forward(Variable(x)).data();
      block.cost = forward_flops(stage, y.shape()[2] * y.shape()[3]) + kMemoryCostPerElement * static_cast<double>(y.numel());
      x = y;
    }
    blocks.push_back(block);
  }
  return blocks;
}

std::vector<std::int64_t> auto_stage_sizes(const std::vector<BlockProfile>& blocks, PipelineMethod method,
                                           int workers) {
  PETRA_CHECK(workers >= 1, ValueError, "--stages auto: ", workers, " workers");
  const auto n = static_cast<std::int64_t>(blocks.size());
  if (!is_delayed(method)) return std::vector<std::int64_t>(static_cast<std::size_t>(n), 1);
  // A pipeline has at least two stages (a delayed method on one worker still delays stage 0).
  const std::int64_t J = std::min<std::int64_t>(std::max(workers, 2), n);
  // Two passes over the layouts: the best largest cost, then the fewest kept bytes within the slack
  // (the first such layout in the enumeration's order on a tie: deterministic).
  double best_cost = std::numeric_limits<double>::infinity();
  std::vector<std::int64_t> sizes;
  for_each_layout(n, J, sizes, [&](const std::vector<std::int64_t>& s) {
    best_cost = std::min(best_cost, evaluate(blocks, s, method).largest_cost);
  });
  std::vector<std::int64_t> chosen;
  double fewest_kept = std::numeric_limits<double>::infinity();
  for_each_layout(n, J, sizes, [&](const std::vector<std::int64_t>& s) {
    const Cut cut = evaluate(blocks, s, method);
    if (cut.largest_cost <= (1 + kAutoCostSlack) * best_cost && cut.kept_elements < fewest_kept) {
      fewest_kept = cut.kept_elements;
      chosen = s;
    }
  });
  return chosen;
}

std::vector<std::int64_t> resolve_stage_layout(const std::string& text, const nn::ModelConfig& model,
                                               const Shape& image, PipelineMethod method, int workers) {
  return resolve_stage_layout(text, model, text == "auto" ? profile_blocks(model, image) : std::vector<BlockProfile>{},
                              method, workers);
}

std::vector<std::int64_t> resolve_stage_layout(const std::string& text, const nn::ModelConfig& model,
                                               const std::vector<BlockProfile>& blocks, PipelineMethod method,
                                               int workers) {
  if (text == "blocks") return {};
  if (text == "auto") {
    std::vector<std::int64_t> sizes = auto_stage_sizes(blocks, method, workers);
    // One block per stage is the default layout: said as such, so a checkpoint of it reads the same.
    if (std::all_of(sizes.begin(), sizes.end(), [](std::int64_t s) { return s == 1; })) sizes.clear();
    return sizes;
  }
  return nn::parse_stage_sizes(text, model.arch);
}

std::vector<double> stage_cost_shares(const std::vector<BlockProfile>& blocks,
                                      const std::vector<std::int64_t>& sizes) {
  double total = 0;
  for (const BlockProfile& b : blocks) total += b.cost;
  std::vector<std::int64_t> layout = sizes;
  if (layout.empty()) layout.assign(blocks.size(), 1);
  std::vector<double> shares;
  std::size_t first = 0;
  for (std::int64_t size : layout) {
    double cost = 0;
    for (std::size_t b = first; b < first + static_cast<std::size_t>(size) && b < blocks.size(); ++b) cost += blocks[b].cost;
    shares.push_back(total > 0 ? cost / total : 0);
    first += static_cast<std::size_t>(size);
  }
  return shares;
}

}  // namespace petra::pipeline
