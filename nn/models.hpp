// nn/models.hpp: the paper's models as ordered lists of stages.
//
// RevNet18/34/50 and ResNet18/34/50 as in the official PETRA code: one residual block per stage,
// plus the stem and the head, so J = 10 / 18 / 18 for RevNet18 / 34 / 50 (and for the ResNets).
// ModelConfig::stage_sizes groups consecutive blocks into fewer stages (shorter delays).
// Stream widths are [w, 2w, 4w, 8w] (bottleneck outputs 4x that); w = 64 gives the paper's models,
// smaller widths run on a laptop. Stems: "cifar" (conv3x3 stride 1; CIFAR, ImageNet32, MNIST)
// or "imagenet" (conv7x7 stride 2 and a 2x2 max-pool, as the official code).
//
// With 1000 classes and the ImageNet stem the parameter counts are the official code's:
// ResNet18 11.69M, RevNet18 12.22M, RevNet34 22.33M, ResNet50 25.58M, RevNet50 30.42M.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "petra/nn/stage.hpp"
#include "petra/dtype.hpp"

namespace petra::nn {

// The widest first group a model may have: 16x the paper's 64 (wide ResNets use 10x). A RevNet50 of
// this width has about 7.8 billion parameters; anything wider is a typo (petra-train --width).
inline constexpr std::int64_t kMaxWidth = 1'024;

struct ModelConfig {
  std::string arch = "revnet18";  // revnet18|revnet34|revnet50|resnet18|resnet34|resnet50
  std::int64_t width = 64;        // w: channels of one stream in the first group, 1 to kMaxWidth
  std::int64_t in_channels = 3;
  std::int64_t classes = 10;
  std::string stem = "cifar";     // cifar|imagenet
  std::uint64_t seed = 0;         // initialisation (Philox stream 0 of this seed)
  DType dtype = DType::f32;       // float64 for finite-difference checks
  // Blocks per pipeline stage, in order (nn/stage_group.hpp); empty: one block per stage, as the
  // paper. The sizes must add up to block_count(arch).
  std::vector<std::int64_t> stage_sizes;
};

// Blocks of an architecture: the stem, the residual blocks and the head (10 for RevNet18).
std::int64_t block_count(const std::string& arch);

// `stages` runs of consecutive blocks as equal as possible, the longer ones last:
// even_stage_sizes(10, 3) = {3, 3, 4}.
std::vector<std::int64_t> even_stage_sizes(std::int64_t blocks, std::int64_t stages);

// petra-train's --stages: "J" (even_stage_sizes of the architecture's blocks) or "a,b,c" (blocks
// per stage, in order; Model checks that they add up). ValueError names a malformed item.
std::vector<std::int64_t> parse_stage_sizes(const std::string& text, const std::string& arch);

class Model : public Module {
 public:
  explicit Model(const ModelConfig& config);

  const ModelConfig& config() const { return config_; }
  std::size_t num_stages() const { return stages_.size(); }
  std::size_t num_blocks() const { return blocks_.size(); }
  Stage& stage(std::size_t j) const { return *stages_.at(j); }
  const std::vector<std::shared_ptr<Stage>>& stages() const { return stages_; }
  bool is_reversible() const;  // a RevNet

  // All stages in order: the logits. (Evaluation calls it under NoGradGuard in eval mode.)
  Variable forward(const Variable& x) const;

  // One line per stage: index, kind, input and output shape for `input` (one sample is pushed
  // through in evaluation mode), parameter count; and the total. For --print-model.
  std::string summary(const Shape& input);

 private:
  ModelConfig config_;
  std::vector<std::shared_ptr<Stage>> blocks_;  // registered as "stages.<block>"
  std::vector<std::shared_ptr<Stage>> stages_;  // the blocks, or StageGroups of them
};

// The architectures make_model knows, for --help texts and errors.
const std::vector<std::string>& known_architectures();

}  // namespace petra::nn
