// nn/stage_group.hpp: consecutive blocks of a network run as ONE pipeline stage.
//
// By default every residual block is its own stage (J = 10 for RevNet18), as in the paper. With
// fewer stages the delays shrink: stage j's gradients are 2(J-1-j) steps old. A group's kind
// follows from its blocks, so the runtime needs nothing new:
//
//   only reversible blocks    reversible: inverse() inverts the blocks from the last to the first;
//                             reconstruct_and_backward() chains the blocks' own, so each block
//                             rebuilds its input and back-propagates through it in turn, and the
//                             group still keeps no activation between its forward and backward
//   ends with the head        head: forward, loss and backward of all its blocks in one graph
//   anything else             buffered: the runtime keeps the group's input, and the backward
//                             rebuilds the graph of every block from it
//
// The blocks stay registered with the Model under their block index ("stages.<block>"), so
// parameter files and checkpoints of the weights do not depend on the grouping.
#pragma once

#include <memory>
#include <vector>

#include "petra/nn/stage.hpp"

namespace petra::nn {

class StageGroup : public Stage {
 public:
  // blocks: two or more consecutive blocks of a model, in order; first: the index of the first one
  // (for describe()).
  StageGroup(std::vector<std::shared_ptr<Stage>> blocks, std::size_t first);

  StageKind kind() const override { return kind_; }
  std::string describe() const override;  // "blocks 1-3: reversible, reversible, buffered"
  Variable forward(const Variable& x) override;
  Tensor inverse(const Tensor& y) override;
  std::pair<Tensor, Tensor> reconstruct_and_backward(const Tensor& y, const Tensor& dy) override;
  Tensor recompute_and_backward(const Tensor& x, const Tensor& dy) override;
  HeadResult loss_and_backward(const Tensor& x, const Tensor& labels) override;

 private:
  std::vector<std::shared_ptr<Stage>> blocks_;
  std::size_t first_;
  StageKind kind_;
  bool input_gradient_;  // the first block's, when it is buffered (off for the stem: its input is the image)
};

}  // namespace petra::nn
