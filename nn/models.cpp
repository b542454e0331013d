// nn/models.cpp: building RevNets and ResNets stage by stage.
#include "petra/nn/models.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "petra/nn/blocks.hpp"
#include "petra/nn/stage_group.hpp"

namespace petra::nn {

namespace {

struct Architecture {
  bool reversible;
  bool bottleneck;
  std::vector<int> blocks;  // per group
};

Architecture architecture_of(const std::string& arch) {
  if (arch == "revnet18") return {true, false, {2, 2, 2, 2}};
  if (arch == "revnet34") return {true, false, {3, 4, 6, 3}};
  if (arch == "revnet50") return {true, true, {3, 4, 6, 3}};
  if (arch == "resnet18") return {false, false, {2, 2, 2, 2}};
  if (arch == "resnet34") return {false, false, {3, 4, 6, 3}};
  if (arch == "resnet50") return {false, true, {3, 4, 6, 3}};
  throw ValueError(fmt::format("make_model: unknown architecture '{}' (known: revnet18, revnet34, revnet50, "
                               "resnet18, resnet34, resnet50)",
                               arch));
}

// Builders call add(make) once per stage, in order; `make` constructs the stage. add() runs it
// inside MemoryScope(parameters, index of the stage), so every parameter is tagged with its stage.

// The stages of a RevNet: every block is reversible except the first of each group, which
// changes the width (and, from the second group on, the resolution) and is a buffered transition.
template <class Add>
void build_revnet(const ModelConfig& c, const Architecture& a, Init& init, const Add& add) {
  const std::int64_t w = c.width, expansion = a.bottleneck ? 4 : 1;
  std::int64_t stream = w;  // the stem's output has two streams of w channels
  add([&] { return std::make_shared<StemStage>(c.in_channels, 2 * w, c.stem == "imagenet", init); });
  for (std::size_t g = 0; g < a.blocks.size(); ++g) {
    const std::int64_t hidden = w << g, out = hidden * expansion, stride = g == 0 ? 1 : 2;
    for (int b = 0; b < a.blocks[g]; ++b) {
      if (b == 0 && (stride != 1 || stream != out)) {
        if (a.bottleneck)
          add([&] { return std::make_shared<BottleneckTransitionStage>(stream, hidden, out, stride, init); });
        else
          add([&] { return std::make_shared<BasicTransitionStage>(stream, out, init); });
      } else {
        add([&] {
          auto f = a.bottleneck ? ResidualFunction::bottleneck(out, hidden, out, 1, init)
                                : ResidualFunction::basic(out, out, 1, init);
          return std::make_shared<ReversibleStage>(
              std::move(f), out,
              fmt::format("reversible {} block, {} channels per stream", a.bottleneck ? "bottleneck" : "basic", out));
        });
      }
      stream = out;
    }
  }
  add([&] { return std::make_shared<HeadStage>(2 * stream, c.classes, init); });
}

template <class Add>
void build_resnet(const ModelConfig& c, const Architecture& a, Init& init, const Add& add) {
  const std::int64_t w = c.width, expansion = a.bottleneck ? 4 : 1;
  std::int64_t channels = w;
  add([&] { return std::make_shared<StemStage>(c.in_channels, w, c.stem == "imagenet", init); });
  for (std::size_t g = 0; g < a.blocks.size(); ++g) {
    const std::int64_t hidden = w << g, out = hidden * expansion;
    for (int b = 0; b < a.blocks[g]; ++b) {
      const std::int64_t stride = (g > 0 && b == 0) ? 2 : 1;
      add([&] { return std::make_shared<ResidualStage>(a.bottleneck, channels, hidden, out, stride, init); });
      channels = out;
    }
  }
  add([&] { return std::make_shared<HeadStage>(channels, c.classes, init); });
}

// The stage of every block, from the blocks per stage (checked against the architecture).
std::vector<int> stage_of_blocks(const ModelConfig& c) {
  const std::int64_t blocks = block_count(c.arch);
  if (c.stage_sizes.empty()) {
    std::vector<int> stage(static_cast<std::size_t>(blocks));
    for (std::size_t i = 0; i < stage.size(); ++i) stage[i] = static_cast<int>(i);
    return stage;
  }
  std::vector<int> stage;
  for (std::size_t j = 0; j < c.stage_sizes.size(); ++j) {
    PETRA_CHECK(c.stage_sizes[j] >= 1, ValueError, "make_model: stage ", j, " has ", c.stage_sizes[j],
                " blocks; every stage needs at least one");
    stage.insert(stage.end(), static_cast<std::size_t>(c.stage_sizes[j]), static_cast<int>(j));
  }
  PETRA_CHECK(static_cast<std::int64_t>(stage.size()) == blocks, ValueError, "make_model: the stage sizes add up to ",
              stage.size(), " blocks but ", c.arch, " has ", blocks, " (stem, residual blocks, head)");
  return stage;
}

}  // namespace

std::int64_t block_count(const std::string& arch) {
  const Architecture a = architecture_of(arch);
  std::int64_t blocks = 2;  // the stem and the head
  for (int b : a.blocks) blocks += b;
  return blocks;
}

std::vector<std::int64_t> even_stage_sizes(std::int64_t blocks, std::int64_t stages) {
  PETRA_CHECK(stages >= 1 && stages <= blocks, ValueError, "even_stage_sizes: ", stages, " stages of ", blocks,
              " blocks (1 to ", blocks, ")");
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(stages), blocks / stages);
  for (std::int64_t j = stages - blocks % stages; j < stages; ++j) ++sizes[static_cast<std::size_t>(j)];
  return sizes;
}

std::vector<std::int64_t> parse_stage_sizes(const std::string& text, const std::string& arch) {
  std::vector<std::int64_t> sizes;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, end - begin);
    std::int64_t value = 0;
    const auto [rest, error] = std::from_chars(item.data(), item.data() + item.size(), value);
    PETRA_CHECK(error == std::errc() && rest == item.data() + item.size() && value >= 1, ValueError, "--stages '",
                text, "': expected a stage count or blocks per stage separated by commas, not '", item, "'");
    sizes.push_back(value);
    begin = end + 1;
  }
  if (sizes.size() > 1) return sizes;
  const std::int64_t blocks = block_count(arch);
  PETRA_CHECK(sizes.front() <= blocks, ValueError, "--stages ", sizes.front(), ": ", arch, " has ", blocks,
              " blocks (stem, residual blocks, head), so 1 to ", blocks, " stages");
  return even_stage_sizes(blocks, sizes.front());
}

const std::vector<std::string>& known_architectures() {
  static const std::vector<std::string> names{"revnet18", "revnet34", "revnet50", "resnet18", "resnet34", "resnet50"};
  return names;
}

Model::Model(const ModelConfig& config) : config_(config) {
  const Architecture a = architecture_of(config.arch);
  PETRA_CHECK(config.width >= 1 && config.in_channels >= 1 && config.classes >= 2, ValueError,
              "make_model: width ", config.width, ", input channels ", config.in_channels, ", classes ", config.classes);
  PETRA_CHECK(config.width <= kMaxWidth, ValueError, "make_model: width ", config.width, " is above the limit of ",
              kMaxWidth);
  PETRA_CHECK(config.stem == "cifar" || config.stem == "imagenet", ValueError, "make_model: unknown stem '",
              config.stem, "' (cifar or imagenet)");
  const std::vector<int> stage_of_block = stage_of_blocks(config);
  Init init(config.seed, config.dtype);
  const auto add = [&](const auto& make) {
    MemoryScope scope(MemoryTag::parameters, stage_of_block.at(blocks_.size()));
    std::shared_ptr<Stage> block = make();
    blocks_.push_back(register_module("stages." + std::to_string(blocks_.size()), std::move(block)));
  };
  if (a.reversible)
    build_revnet(config, a, init, add);
  else
    build_resnet(config, a, init, add);
  for (std::size_t first = 0; first < blocks_.size();) {  // one stage per run of blocks
    std::size_t last = first;
    while (last + 1 < blocks_.size() && stage_of_block[last + 1] == stage_of_block[first]) ++last;
    if (last == first)
      stages_.push_back(blocks_[first]);
    else
      stages_.push_back(std::make_shared<StageGroup>(
          std::vector<std::shared_ptr<Stage>>(blocks_.begin() + first, blocks_.begin() + last + 1), first));
    first = last + 1;
  }
}

bool Model::is_reversible() const { return architecture_of(config_.arch).reversible; }

Variable Model::forward(const Variable& x) const {
  Variable h = x;
  for (const auto& stage : stages_) {
    // The stages may sit on several GPUs (the concurrent executor's workers): h follows them.
    const auto params = stage->parameters();
    if (!params.empty()) h = to_device(h, params.front().data().device());
    h = stage->forward(h);
  }
  return h;
}

std::string Model::summary(const Shape& input) {
  NoGradGuard no_grad;
  const bool was_training = is_training();
  eval();  // one sample: batch statistics would be degenerate
  std::string out = fmt::format("{} (width {}, {} stem, {} classes): {} stages\n", config_.arch, config_.width,
                                config_.stem, config_.classes, stages_.size());
  out += fmt::format("{:>5}  {:<10}  {:<18}  {:<18}  {:>12}  {}\n", "stage", "kind", "input", "output", "parameters",
                     "what");
  Variable h(Tensor::zeros(input, config_.dtype));
  for (std::size_t j = 0; j < stages_.size(); ++j) {
    const Variable next = stages_[j]->forward(h);
    out += fmt::format("{:>5}  {:<10}  {:<18}  {:<18}  {:>12}  {}\n", j, name_of(stages_[j]->kind()), h.shape().str(),
                       next.shape().str(), stages_[j]->parameter_count(), stages_[j]->describe());
    h = next;
  }
  out += fmt::format("total parameters: {} ({:.2f}M)\n", parameter_count(), parameter_count() / 1e6);
  train(was_training);
  return out;
}

}  // namespace petra::nn
