// pipeline/stage_layout.hpp: how a model's blocks are grouped into pipeline stages (--stages).
//
//   "blocks"   one block per stage: the paper's layout (J = 10 for RevNet18)
//   "J"        J stages of block counts as equal as possible (even_stage_sizes)
//   "a,b,c"    blocks per stage, in order
//   "auto"     the rule below (petra-train's default)
//
// The auto rule. A synchronous method (backprop, revbackprop) runs its stages one after another on
// one worker: stages only say what is kept and what is rebuilt, so each block stays its own stage
// (revbackprop then keeps no activation of a reversible block). A pipelined method on W workers
// gets J = min(max(W, 2), blocks) stages: as few as keep every worker busy (and a pipeline has two at
// least), since stage j's gradients are 2(J-1-j) steps old and fewer stages mean shorter delays. The J-1 cuts minimise the largest stage's
// cost, which is the pipeline's step time; among the cuts within kAutoCostSlack of the best, the one
// that keeps the fewest bytes between a forward and its backward, so a run of reversible blocks is
// not swallowed by a buffered stage that must keep its input. The cost of a block is a model, not
// a timing (docs/petra.md, "Stage layout"): a layout decides the numbers a run computes, and the same
// command must compute the same numbers on every machine and every time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "petra/nn/models.hpp"
#include "petra/pipeline/schedule.hpp"

namespace petra::pipeline {

// Cuts whose largest stage costs at most this much more than the best cut's are equally fast.
inline constexpr double kAutoCostSlack = 0.05;

// What the auto rule knows of one block, for one image of the run's shape.
struct BlockProfile {
  nn::StageKind kind;
  double cost = 0;                   // forward FLOPs + kMemoryCostPerElement x output elements
  std::int64_t input_elements = 0;   // the block's input, per image
};

// The memory-bound work (batch norm, ReLU, the coupling's additions, in the forward, the backward
// and the reconstruction) per output element, in FLOPs of the convolutions: fitted to the measured
// stage costs of RevNet18 width 16 on this project's CPU kernels (docs/petra.md).
inline constexpr double kMemoryCostPerElement = 250;

// Each block of `model` (its stage_sizes are ignored) pushed one image of `image` (C, H, W) through.
std::vector<BlockProfile> profile_blocks(nn::ModelConfig model, const Shape& image);

// The auto rule on profiled blocks (see the file comment).
std::vector<std::int64_t> auto_stage_sizes(const std::vector<BlockProfile>& blocks, PipelineMethod method,
                                           int workers);

// --stages text → blocks per stage for `model` (empty for "blocks": the model's default). `workers`:
// the pipeline's workers (devices, or processes of one replica under --mpi). ValueError names the
// flag and the bad item.
std::vector<std::int64_t> resolve_stage_layout(const std::string& text, const nn::ModelConfig& model,
                                               const Shape& image, PipelineMethod method, int workers);
// The same, from blocks profiled already (profile_blocks(model, image)).
std::vector<std::int64_t> resolve_stage_layout(const std::string& text, const nn::ModelConfig& model,
                                               const std::vector<BlockProfile>& blocks, PipelineMethod method,
                                               int workers);

// Each stage's share of the modelled cost, for --print-model and the run's first lines.
std::vector<double> stage_cost_shares(const std::vector<BlockProfile>& blocks,
                                      const std::vector<std::int64_t>& sizes);

}  // namespace petra::pipeline
