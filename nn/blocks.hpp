// nn/blocks.hpp: the stages of the paper's RevNets and ResNets, laid out as in the official PETRA
// code (github.com/stephane-rivaud/PETRA, async_torch/models).
//
// A RevNet activation has two streams, the channel halves (x1, x2) of one tensor, each of the
// ResNet width. F is the residual function of a block:
//   basic:      conv3x3 -> BN -> ReLU -> conv3x3 -> BN -> ReLU
//   bottleneck: conv1x1 -> BN -> ReLU -> conv3x3 (stride) -> BN -> ReLU -> conv1x1 -> BN -> ReLU
// (conv biases everywhere, ReLU at the end of F, before the addition, none after it).
//
//   StemStage                 conv (3x3 s1, or 7x7 s2 + 2x2 max-pool) -> BN -> ReLU   [buffered]
//   ReversibleStage           (x1, x2) -> (x2 + F(x1), x1)                           [reversible]
//   BasicTransitionStage      h = ReLU(BN(conv3x3_s2(x1)))
//                             (x1, x2) -> (ReLU(BN(conv3x3(h))) + BN(conv1x1_s2(x2)), h)  [buffered]
//   BottleneckTransitionStage (x1, x2) -> (F_s(x1) + BN(conv1x1_s(x2)), BN(conv1x1_s(x1)))  [buffered]
//   ResidualStage             a ResNet block: ReLU(G(x) + shortcut(x)), torchvision layout  [buffered]
//   HeadStage                 global average pool -> linear -> cross-entropy            [head]
// BatchNorm2d modules are always named "bn..." (the optimizer's no-weight-decay rule reads it).
#pragma once

#include <memory>

#include "petra/nn/layers.hpp"
#include "petra/nn/stage.hpp"

namespace petra::nn {

// F of a reversible or transition block. in -> out channels; hidden is the bottleneck width.
class ResidualFunction : public Module {
 public:
  static std::shared_ptr<ResidualFunction> basic(std::int64_t in, std::int64_t out, std::int64_t stride, Init& init);
  static std::shared_ptr<ResidualFunction> bottleneck(std::int64_t in, std::int64_t hidden, std::int64_t out,
                                                      std::int64_t stride, Init& init);
  Variable forward(const Variable& x) const;  // conv -> BN -> ReLU, for each layer
  // ops::coupling_forward(x, F(x1)) and ops::coupling_inverse(y, F(x1)), the same bits, with F's
  // last batch norm + ReLU fused into the coupling so that F's output is never stored
  // (BatchNorm2d::coupling_relu_*). No graph: gradients off.
  Tensor coupling_forward(const Tensor& x, const Tensor& x1) const;
  Tensor coupling_inverse(const Tensor& y, const Tensor& x1) const;
  // coupling(x, forward(x1)) with a graph, the last batch norm + ReLU fused into the coupling
  // (conv_batch_norm_coupling): the same bits, F's output never stored. x1 is x's first stream.
  Variable coupling(const Variable& x, const Variable& x1) const;

 private:
  ResidualFunction() = default;
  // F(x1) up to its last batch norm: the last convolution's output.
  Tensor last_convolution(const Tensor& x1) const;
  // F(x) with a graph up to its last layer (conv -> BN -> ReLU for each layer but the last).
  Variable hidden(const Variable& x) const;
  struct Layer {
    std::shared_ptr<Conv2d> conv;
    std::shared_ptr<BatchNorm2d> bn;
  };
  void add_layer(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride, Init& init);
  std::vector<Layer> layers_;
};

// Shared behaviour of stages that are not invertible: the backward recomputes from the stored input.
class BufferedStage : public Stage {
 public:
  StageKind kind() const override { return StageKind::buffered; }
  Tensor recompute_and_backward(const Tensor& x, const Tensor& dy) override;
  // Whether recompute_and_backward computes dx (off for the stem: its input is the image).
  void set_input_gradient(bool on) { input_gradient_ = on; }
  bool input_gradient() const { return input_gradient_; }

 protected:
  bool input_gradient_ = true;
};

class StemStage : public BufferedStage {
 public:
  StemStage(std::int64_t in_channels, std::int64_t out_channels, bool imagenet, Init& init);
  std::string describe() const override;
  Variable forward(const Variable& x) override;

 private:
  bool imagenet_;
  std::shared_ptr<Conv2d> conv_;
  std::shared_ptr<BatchNorm2d> bn_;
};

class ReversibleStage : public Stage {
 public:
  ReversibleStage(std::shared_ptr<ResidualFunction> f, std::int64_t stream_channels, std::string what);
  StageKind kind() const override { return StageKind::reversible; }
  std::string describe() const override { return what_; }
  Variable forward(const Variable& x) override;
  Tensor inverse(const Tensor& y) override;
  std::pair<Tensor, Tensor> reconstruct_and_backward(const Tensor& y, const Tensor& dy) override;

 private:
  std::shared_ptr<ResidualFunction> f_;
  std::int64_t stream_channels_;
  std::string what_;
};

class BasicTransitionStage : public BufferedStage {
 public:
  BasicTransitionStage(std::int64_t in_stream, std::int64_t out_stream, Init& init);
  std::string describe() const override;
  Variable forward(const Variable& x) override;

 private:
  std::int64_t in_stream_, out_stream_;
  std::shared_ptr<Conv2d> conv1_, conv2_, conv_proj_;
  std::shared_ptr<BatchNorm2d> bn1_, bn2_, bn_proj_;
};

class BottleneckTransitionStage : public BufferedStage {
 public:
  BottleneckTransitionStage(std::int64_t in_stream, std::int64_t hidden, std::int64_t out_stream, std::int64_t stride,
                            Init& init);
  std::string describe() const override;
  Variable forward(const Variable& x) override;

 private:
  std::int64_t in_stream_, out_stream_, stride_;
  std::shared_ptr<ResidualFunction> f_;
  std::shared_ptr<Conv2d> conv_proj1_, conv_proj2_;
  std::shared_ptr<BatchNorm2d> bn_proj1_, bn_proj2_;
};

// A ResNet block (torchvision layout, conv biases as in the official code): basic
// ReLU(BN(conv3x3(ReLU(BN(conv3x3_s(x)))))+ shortcut) or bottleneck (1x1, 3x3 with the stride, 1x1);
// the shortcut is BN(conv1x1_s(x)) when the shape changes, else x.
class ResidualStage : public BufferedStage {
 public:
  ResidualStage(bool bottleneck, std::int64_t in, std::int64_t hidden, std::int64_t out, std::int64_t stride,
                Init& init);
  std::string describe() const override;
  Variable forward(const Variable& x) override;

 private:
  bool bottleneck_;
  std::int64_t in_, out_, stride_;
  std::vector<std::shared_ptr<Conv2d>> convs_;
  std::vector<std::shared_ptr<BatchNorm2d>> bns_;
  std::shared_ptr<Conv2d> conv_proj_;
  std::shared_ptr<BatchNorm2d> bn_proj_;
};

class HeadStage : public Stage {
 public:
  HeadStage(std::int64_t channels, std::int64_t classes, Init& init);
  StageKind kind() const override { return StageKind::head; }
  std::string describe() const override;
  Variable forward(const Variable& x) override;  // logits
  HeadResult loss_and_backward(const Tensor& x, const Tensor& labels) override;

 private:
  std::int64_t channels_, classes_;
  std::shared_ptr<Linear> fc_;
};

}  // namespace petra::nn
