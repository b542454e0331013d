// tests/cpu/test_stage_layout.cpp: --stages, and the auto rule that picks a layout from the workers
// and the blocks' modelled costs (pipeline/stage_layout.hpp).
#include <doctest/doctest.h>

#include <numeric>

#include "petra/pipeline/stage_layout.hpp"
#include "petra/pipeline/trainer.hpp"

using namespace petra;
using namespace petra::pipeline;
using Kind = nn::StageKind;

namespace {

std::vector<BlockProfile> profiles(const std::vector<Kind>& kinds, const std::vector<double>& costs,
                                   const std::vector<std::int64_t>& inputs) {
  std::vector<BlockProfile> blocks;
  for (std::size_t b = 0; b < kinds.size(); ++b) blocks.push_back({kinds[b], costs[b], inputs[b]});
  return blocks;
}

using Sizes = std::vector<std::int64_t>;

}  // namespace

TEST_CASE("auto: a synchronous method keeps one block per stage, whatever the workers") {
  const auto blocks = profiles({Kind::buffered, Kind::reversible, Kind::head}, {1, 5, 1}, {1, 8, 8});
  CHECK(auto_stage_sizes(blocks, PipelineMethod::backprop, 4) == Sizes{1, 1, 1});
  CHECK(auto_stage_sizes(blocks, PipelineMethod::revbackprop, 2) == Sizes{1, 1, 1});
}

TEST_CASE("auto: one stage per worker, cut where the largest stage costs least") {
  const auto blocks = profiles({Kind::buffered, Kind::reversible, Kind::reversible, Kind::reversible, Kind::head},
                               {1, 4, 4, 4, 1}, {1, 8, 8, 8, 8});
  CHECK(auto_stage_sizes(blocks, PipelineMethod::petra, 1) == Sizes{2, 3});  // a pipeline has two stages at least
  // 5 | 9 and 9 | 5 are equally fast and keep the same (the stem's input): the first cut wins.
  CHECK(auto_stage_sizes(blocks, PipelineMethod::petra, 2) == Sizes{2, 3});
  CHECK(auto_stage_sizes(blocks, PipelineMethod::petra, 3) == Sizes{2, 1, 2});  // 5 | 4 | 5
  // More workers than blocks: one block per stage (a worker with no stage would idle anyway).
  CHECK(auto_stage_sizes(blocks, PipelineMethod::petra, 9) == Sizes{1, 1, 1, 1, 1});
}

TEST_CASE("auto: between equally fast cuts, the one that keeps fewer bytes (reversible runs stay reversible)") {
  // A buffered stem on a small input, a reversible block, a buffered transition, a reversible block,
  // the head. On 3 workers four cuts share the best largest cost, 6: {0},{1},{2,3,4} (3|3|6),
  // {0},{1,2},{3,4}, {0,1},{2},{3,4} and {0,1},{2,3},{4}.
  const auto blocks = profiles({Kind::buffered, Kind::reversible, Kind::buffered, Kind::reversible, Kind::head},
                               {3, 3, 3, 3, 0}, {1, 100, 60, 50, 50});
  // PETRA keeps the input of buffered stages only, stage j of 3 for 2(2-j)+1 mini-batches: every cut
  // keeps the stem's (5 x 1), and all but the first also keep the transition's for 3 (5 + 180), since
  // the stage holding block 2 is buffered. In the first, block 2 sits in the head's group, which keeps
  // nothing between steps, and block 1 is a reversible stage on its own.
  CHECK(auto_stage_sizes(blocks, PipelineMethod::petra, 3) == Sizes{1, 1, 3});
  // DSP keeps every stage's input but the head's: stage 1 starting at block 2 (60) beats block 1 (100).
  CHECK(auto_stage_sizes(blocks, PipelineMethod::dsp, 3) == Sizes{2, 1, 2});
}

TEST_CASE("profile_blocks: RevNet18's kinds, inputs and costs for one image") {
  nn::ModelConfig m;
  m.arch = "revnet18";
  m.width = 4;
  const auto blocks = profile_blocks(m, Shape{1, 28, 28});
  REQUIRE(blocks.size() == 10);
  const std::vector<Kind> kinds{Kind::buffered,   Kind::reversible, Kind::reversible, Kind::buffered, Kind::reversible,
                                Kind::buffered,   Kind::reversible, Kind::buffered,   Kind::reversible, Kind::head};
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    CHECK(blocks[b].kind == kinds[b]);
    CHECK(blocks[b].cost > 0);
  }
  CHECK(blocks[0].input_elements == 28 * 28);
  CHECK(blocks[1].input_elements == 2 * 4 * 28 * 28);  // two streams of w channels
  CHECK(blocks[4].input_elements == 2 * 8 * 14 * 14);
  // Group 0's two reversible blocks are the same block: the same cost.
  CHECK(blocks[1].cost == blocks[2].cost);
}

TEST_CASE("resolve_stage_layout: blocks, J, explicit sizes, auto; bad text names the flag") {
  nn::ModelConfig m;
  m.arch = "revnet18";
  m.width = 4;
  const Shape image{1, 28, 28};
  CHECK(resolve_stage_layout("blocks", m, image, PipelineMethod::petra, 2).empty());
  CHECK(resolve_stage_layout("3", m, image, PipelineMethod::petra, 2) == Sizes{3, 3, 4});
  CHECK(resolve_stage_layout("1,2,2,5", m, image, PipelineMethod::petra, 2) == Sizes{1, 2, 2, 5});
  CHECK(resolve_stage_layout("auto", m, image, PipelineMethod::backprop, 2).empty());  // one block per stage
  const Sizes two = resolve_stage_layout("auto", m, image, PipelineMethod::petra, 2);
  REQUIRE(two.size() == 2);
  CHECK(std::accumulate(two.begin(), two.end(), std::int64_t{0}) == 10);
  const std::vector<double> shares = stage_cost_shares(profile_blocks(m, image), two);
  CHECK(shares[0] + shares[1] == doctest::Approx(1.0));
  CHECK(std::abs(shares[0] - shares[1]) < 0.2);  // balanced within a block's share
  CHECK_THROWS_WITH_AS(resolve_stage_layout("x", m, image, PipelineMethod::petra, 2),
                       doctest::Contains("--stages 'x'"), ValueError);
}

TEST_CASE("a Trainer resolves --stages auto from its workers, and its checkpoint keys hold the layout") {
  TrainConfig c;
  c.dataset = "synthetic";
  c.synthetic_train_size = 64;
  c.width = 4;
  c.batch_size = 32;
  c.epochs = 0;
  c.method = PipelineMethod::petra;
  c.devices = {Device::cpu(0), Device::cpu(1)};
  c.threads = 1;
  c.stages = "auto";
  Trainer two(c);
  CHECK(two.model().num_stages() == 2);
  CHECK(two.config().stage_sizes.size() == 2);
  CHECK(describe(two.config()).at("stage_sizes") != "");
  c.devices = {Device::cpu(0)};
  Trainer one(c);
  CHECK(one.model().num_stages() == 2);  // a pipeline has two stages at least
  c.stages = "blocks";
  Trainer paper(c);
  CHECK(paper.model().num_stages() == 10);
}
