// nn/stage_group.cpp: a pipeline stage made of consecutive blocks (nn/stage_group.hpp).
#include "petra/nn/stage_group.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "petra/nn/blocks.hpp"

namespace petra::nn {

namespace {

StageKind kind_of_group(const std::vector<std::shared_ptr<Stage>>& blocks) {
  if (blocks.back()->kind() == StageKind::head) return StageKind::head;
  const bool all_reversible = std::all_of(blocks.begin(), blocks.end(),
                                          [](const auto& b) { return b->kind() == StageKind::reversible; });
  return all_reversible ? StageKind::reversible : StageKind::buffered;
}

}  // namespace

StageGroup::StageGroup(std::vector<std::shared_ptr<Stage>> blocks, std::size_t first)
    : blocks_(std::move(blocks)), first_(first) {
  PETRA_CHECK(!blocks_.empty(), ValueError, "StageGroup: a stage needs at least one block");
  for (std::size_t i = 0; i + 1 < blocks_.size(); ++i)
    PETRA_CHECK(blocks_[i]->kind() != StageKind::head, ValueError, "StageGroup: block ", first_ + i,
                " is the head, which must be the last block of its stage");
  kind_ = kind_of_group(blocks_);
  const auto* first_buffered = dynamic_cast<const BufferedStage*>(blocks_.front().get());
  input_gradient_ = first_buffered == nullptr || first_buffered->input_gradient();
  for (std::size_t i = 0; i < blocks_.size(); ++i) register_module(std::to_string(i), blocks_[i]);
}

std::string StageGroup::describe() const {
  std::string kinds;
  for (const auto& b : blocks_) kinds += (kinds.empty() ? "" : ", ") + std::string(name_of(b->kind()));
  return fmt::format("blocks {}-{}: {}", first_, first_ + blocks_.size() - 1, kinds);
}

Variable StageGroup::forward(const Variable& x) {
  Variable h = x;
  for (const auto& b : blocks_) h = b->forward(h);
  return h;
}

Tensor StageGroup::inverse(const Tensor& y) {
  if (kind_ != StageKind::reversible) return Stage::inverse(y);
  Tensor h = y;
  for (auto b = blocks_.rbegin(); b != blocks_.rend(); ++b) h = (*b)->inverse(h);
  return h;
}

std::pair<Tensor, Tensor> StageGroup::reconstruct_and_backward(const Tensor& y, const Tensor& dy) {
  if (kind_ != StageKind::reversible) return Stage::reconstruct_and_backward(y, dy);
  std::pair<Tensor, Tensor> h{y, dy};  // (activation, its gradient), walking down the blocks
  for (auto b = blocks_.rbegin(); b != blocks_.rend(); ++b) h = (*b)->reconstruct_and_backward(h.first, h.second);
  return h;
}

Tensor StageGroup::recompute_and_backward(const Tensor& x, const Tensor& dy) {
  if (kind_ != StageKind::buffered) return Stage::recompute_and_backward(x, dy);
  return backward_from_input(*this, x, dy, input_gradient_);
}

HeadResult StageGroup::loss_and_backward(const Tensor& x, const Tensor& labels) {
  if (kind_ != StageKind::head) return Stage::loss_and_backward(x, labels);
  return head_loss_and_backward(*this, x, labels);
}

}  // namespace petra::nn
