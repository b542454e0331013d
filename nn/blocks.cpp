// nn/blocks.cpp: the stages of RevNets and ResNets (layouts in nn/blocks.hpp).
#include "petra/nn/blocks.hpp"

#include <optional>

#include <fmt/format.h>

#include "petra/profile.hpp"

namespace petra::nn {

std::string_view name_of(StageKind kind) {
  switch (kind) {
    case StageKind::buffered: return "buffered";
    case StageKind::reversible: return "reversible";
    case StageKind::head: return "head";
  }
  return "?";
}

// ---------------------------------------------------------------- Stage defaults
Tensor Stage::inverse(const Tensor&) { throw ValueError(describe() + ": inverse() exists only for reversible stages"); }
std::pair<Tensor, Tensor> Stage::reconstruct_and_backward(const Tensor&, const Tensor&) {
  throw ValueError(describe() + ": reconstruct_and_backward() exists only for reversible stages");
}
Tensor Stage::recompute_and_backward(const Tensor&, const Tensor&) {
  throw ValueError(describe() + ": recompute_and_backward() exists only for buffered stages");
}
HeadResult Stage::loss_and_backward(const Tensor&, const Tensor&) {
  throw ValueError(describe() + ": loss_and_backward() exists only for the head");
}

// ---------------------------------------------------------------- F
void ResidualFunction::add_layer(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride,
                                 Init& init) {
  const auto index = std::to_string(layers_.size() + 1);
  Layer layer;
  layer.conv = register_module("conv" + index, std::make_shared<Conv2d>(in, out, kernel, stride, kernel / 2, init));
  layer.bn = register_module("bn" + index, std::make_shared<BatchNorm2d>(out, init));
  layers_.push_back(layer);
}

std::shared_ptr<ResidualFunction> ResidualFunction::basic(std::int64_t in, std::int64_t out, std::int64_t stride,
                                                          Init& init) {
  std::shared_ptr<ResidualFunction> f(new ResidualFunction);
  f->add_layer(in, out, 3, stride, init);
  f->add_layer(out, out, 3, 1, init);
  return f;
}

std::shared_ptr<ResidualFunction> ResidualFunction::bottleneck(std::int64_t in, std::int64_t hidden, std::int64_t out,
                                                               std::int64_t stride, Init& init) {
  std::shared_ptr<ResidualFunction> f(new ResidualFunction);
  f->add_layer(in, hidden, 1, 1, init);
  f->add_layer(hidden, hidden, 3, stride, init);
  f->add_layer(hidden, out, 1, 1, init);
  return f;
}

Variable ResidualFunction::hidden(const Variable& x) const {
  Variable h = x;
  // Every BN here is followed by a ReLU, fused into it (BatchNorm2d::forward_relu); the convolution's
  // bias gradient comes out of the BN's backward (conv_batch_norm).
  for (std::size_t i = 0; i + 1 < layers_.size(); ++i)
    h = conv_batch_norm(*layers_[i].conv, *layers_[i].bn, h, /*relu=*/true);
  return h;
}

Variable ResidualFunction::forward(const Variable& x) const {
  return conv_batch_norm(*layers_.back().conv, *layers_.back().bn, hidden(x), /*relu=*/true);
}

Variable ResidualFunction::coupling(const Variable& x, const Variable& x1) const {
  return conv_batch_norm_coupling(*layers_.back().conv, *layers_.back().bn, hidden(x1), x);
}

Tensor ResidualFunction::last_convolution(const Tensor& x1) const {
  Variable h(x1);
  for (std::size_t i = 0; i + 1 < layers_.size(); ++i) h = layers_[i].bn->forward_relu(layers_[i].conv->forward(h));
  return layers_.back().conv->forward(h).data();
}

Tensor ResidualFunction::coupling_forward(const Tensor& x, const Tensor& x1) const {
  return layers_.back().bn->coupling_relu_forward(x, last_convolution(x1));
}

Tensor ResidualFunction::coupling_inverse(const Tensor& y, const Tensor& x1) const {
  return layers_.back().bn->coupling_relu_inverse(y, last_convolution(x1));
}

// ---------------------------------------------------------------- buffered stages
Tensor backward_from_input(Stage& stage, const Tensor& x, const Tensor& dy, bool input_gradient) {
  GradModeGuard grad(true);
  RecomputationStatsGuard recomputation;  // by default the forward pass already moved them
  const Variable input(x, input_gradient);
  const Variable outputs[] = {stage.forward(input)};
  const Tensor seeds[] = {dy};
  if (!input_gradient) {
    petra::backward(outputs, seeds);
    return {};
  }
  const Variable capture[] = {input};
  return petra::backward(outputs, seeds, capture)[0];
}

Tensor BufferedStage::recompute_and_backward(const Tensor& x, const Tensor& dy) {
  return backward_from_input(*this, x, dy, input_gradient_);
}

StemStage::StemStage(std::int64_t in_channels, std::int64_t out_channels, bool imagenet, Init& init)
    : imagenet_(imagenet) {
  input_gradient_ = false;
  const std::int64_t kernel = imagenet ? 7 : 3, stride = imagenet ? 2 : 1;
  conv_ = register_module("conv", std::make_shared<Conv2d>(in_channels, out_channels, kernel, stride, kernel / 2, init));
  bn_ = register_module("bn", std::make_shared<BatchNorm2d>(out_channels, init));
}

std::string StemStage::describe() const {
  const auto& w = conv_->weight().shape();
  return fmt::format("stem: conv{}x{} {}->{}{}, BN, ReLU{}", w[2], w[3], w[1], w[0], imagenet_ ? " stride 2" : "",
                     imagenet_ ? ", max-pool 2x2" : "");
}

Variable StemStage::forward(const Variable& x) {
  Variable y = conv_batch_norm(*conv_, *bn_, x, /*relu=*/true);
  return imagenet_ ? max_pool2d(y, {2, 2, 0}) : y;
}

// ---------------------------------------------------------------- reversible
ReversibleStage::ReversibleStage(std::shared_ptr<ResidualFunction> f, std::int64_t stream_channels, std::string what)
    : stream_channels_(stream_channels), what_(std::move(what)) {
  f_ = register_module("f", std::move(f));
}

Variable ReversibleStage::forward(const Variable& x) {
  const std::int64_t c = stream_channels_;
  // x1 is a view of x's first stream: F's first convolution reads it in place (ops::conv2d_forward).
  if (!grad_enabled())  // the pipeline's forward: nothing is recorded or kept, F's output not even stored
    return Variable(f_->coupling_forward(x.data(), x.data().slice(1, 0, c)));
  return f_->coupling(x, channel_view(x, 0, c));  // exact backprop: the graph is kept
}

Tensor ReversibleStage::inverse(const Tensor& y) {
  NoGradGuard no_grad;
  RunningStatsGuard no_running_stats;
  const Tensor x1 = y.slice(1, stream_channels_, 2 * stream_channels_);  // x1 = y2, a view
  return f_->coupling_inverse(y, x1);                                   // x2 = y1 - F(x1)
}

std::pair<Tensor, Tensor> ReversibleStage::reconstruct_and_backward(const Tensor& y, const Tensor& dy) {
  const std::int64_t c = stream_channels_;
  GradModeGuard grad(true);
  RecomputationStatsGuard recomputation;
  // Invert: x1 = y2 exactly; F(x1) is evaluated once, with its graph, ... (timed as the stage's
  // reconstruction by petra-train --profile, apart from the backward that follows)
  std::optional<profile::PhaseTimer> reconstruction(std::in_place, profile::Phase::reconstruction);
  const Variable x1(y.slice(1, c, 2 * c), /*requires_grad=*/true);  // a view: F's convolution reads it in place
  const Variable f = f_->forward(x1);
  Tensor x = ops::coupling_inverse(y, f.data());  // x2 = y1 - F(x1)
  reconstruction.reset();
  // ... and the same graph gives the vector-Jacobian product: with y1 = x2 + F(x1) and y2 = x1,
  // dx2 = dy1 and dx1 = dy2 + J_F(x1)^T dy1; F's parameter gradients accumulate on the way.
  const Variable outputs[] = {f};
  const Tensor seeds[] = {dy.slice(1, 0, c)};  // a view: F's last op, batch norm, reads it in place
  const Variable capture[] = {x1};
  const Tensor vjp_f = petra::backward(outputs, seeds, capture)[0];
  return {std::move(x), ops::coupling_backward(dy, vjp_f)};
}

// ---------------------------------------------------------------- transitions
BasicTransitionStage::BasicTransitionStage(std::int64_t in_stream, std::int64_t out_stream, Init& init)
    : in_stream_(in_stream), out_stream_(out_stream) {
  conv1_ = register_module("conv1", std::make_shared<Conv2d>(in_stream, out_stream, 3, 2, 1, init));
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(out_stream, init));
  conv2_ = register_module("conv2", std::make_shared<Conv2d>(out_stream, out_stream, 3, 1, 1, init));
  bn2_ = register_module("bn2", std::make_shared<BatchNorm2d>(out_stream, init));
  conv_proj_ = register_module("conv_proj", std::make_shared<Conv2d>(in_stream, out_stream, 1, 2, 0, init));
  bn_proj_ = register_module("bn_proj", std::make_shared<BatchNorm2d>(out_stream, init));
}

std::string BasicTransitionStage::describe() const {
  return fmt::format("basic transition: {} -> {} channels per stream, stride 2", in_stream_, out_stream_);
}

Variable BasicTransitionStage::forward(const Variable& x) {
  // Views of the two streams: each goes only into convolutions, which read a channel slice in place.
  const Variable x1 = channel_view(x, 0, in_stream_), x2 = channel_view(x, in_stream_, in_stream_);
  const Variable h = conv_batch_norm(*conv1_, *bn1_, x1, /*relu=*/true);
  const Variable y1 = add(conv_batch_norm(*conv2_, *bn2_, h, /*relu=*/true), conv_batch_norm(*conv_proj_, *bn_proj_, x2, false));
  const Variable streams[] = {y1, h};
  return concat_channels(streams);
}

BottleneckTransitionStage::BottleneckTransitionStage(std::int64_t in_stream, std::int64_t hidden,
                                                     std::int64_t out_stream, std::int64_t stride, Init& init)
    : in_stream_(in_stream), out_stream_(out_stream), stride_(stride) {
  f_ = register_module("f", ResidualFunction::bottleneck(in_stream, hidden, out_stream, stride, init));
  conv_proj1_ = register_module("conv_proj1", std::make_shared<Conv2d>(in_stream, out_stream, 1, stride, 0, init));
  bn_proj1_ = register_module("bn_proj1", std::make_shared<BatchNorm2d>(out_stream, init));
  conv_proj2_ = register_module("conv_proj2", std::make_shared<Conv2d>(in_stream, out_stream, 1, stride, 0, init));
  bn_proj2_ = register_module("bn_proj2", std::make_shared<BatchNorm2d>(out_stream, init));
}

std::string BottleneckTransitionStage::describe() const {
  return fmt::format("bottleneck transition: {} -> {} channels per stream, stride {}", in_stream_, out_stream_, stride_);
}

Variable BottleneckTransitionStage::forward(const Variable& x) {
  // Views of the two streams: each goes only into convolutions, which read a channel slice in place.
  const Variable x1 = channel_view(x, 0, in_stream_), x2 = channel_view(x, in_stream_, in_stream_);
  const Variable y1 = add(f_->forward(x1), conv_batch_norm(*conv_proj2_, *bn_proj2_, x2, /*relu=*/false));
  const Variable y2 = conv_batch_norm(*conv_proj1_, *bn_proj1_, x1, /*relu=*/false);
  const Variable streams[] = {y1, y2};
  return concat_channels(streams);
}

// ---------------------------------------------------------------- ResNet blocks
ResidualStage::ResidualStage(bool bottleneck, std::int64_t in, std::int64_t hidden, std::int64_t out,
                             std::int64_t stride, Init& init)
    : bottleneck_(bottleneck), in_(in), out_(out), stride_(stride) {
  auto add = [&](std::int64_t cin, std::int64_t cout, std::int64_t kernel, std::int64_t s) {
    const auto index = std::to_string(convs_.size() + 1);
    convs_.push_back(register_module("conv" + index, std::make_shared<Conv2d>(cin, cout, kernel, s, kernel / 2, init)));
    bns_.push_back(register_module("bn" + index, std::make_shared<BatchNorm2d>(cout, init)));
  };
  if (bottleneck) {
    add(in, hidden, 1, 1);
    add(hidden, hidden, 3, stride);
    add(hidden, out, 1, 1);
  } else {
    add(in, out, 3, stride);
    add(out, out, 3, 1);
  }
  if (stride != 1 || in != out) {
    conv_proj_ = register_module("conv_proj", std::make_shared<Conv2d>(in, out, 1, stride, 0, init));
    bn_proj_ = register_module("bn_proj", std::make_shared<BatchNorm2d>(out, init));
  }
}

std::string ResidualStage::describe() const {
  return fmt::format("{} residual block: {} -> {} channels, stride {}", bottleneck_ ? "bottleneck" : "basic", in_, out_,
                     stride_);
}

Variable ResidualStage::forward(const Variable& x) {
  Variable h = x;
  for (std::size_t i = 0; i < convs_.size(); ++i) {
    // The last BN is followed by the addition, the others by a ReLU (fused into them).
    h = conv_batch_norm(*convs_[i], *bns_[i], h, /*relu=*/i + 1 < convs_.size());
  }
  const Variable shortcut = conv_proj_ ? conv_batch_norm(*conv_proj_, *bn_proj_, x, /*relu=*/false) : x;
  return relu(add(h, shortcut));
}

// ---------------------------------------------------------------- head
HeadStage::HeadStage(std::int64_t channels, std::int64_t classes, Init& init) : channels_(channels), classes_(classes) {
  fc_ = register_module("fc", std::make_shared<Linear>(channels, classes, init));
}

std::string HeadStage::describe() const {
  return fmt::format("head: global average pool, linear {} -> {}, cross-entropy", channels_, classes_);
}

Variable HeadStage::forward(const Variable& x) { return fc_->forward(global_avg_pool(x)); }

HeadResult HeadStage::loss_and_backward(const Tensor& x, const Tensor& labels) {
  return head_loss_and_backward(*this, x, labels);
}

HeadNumbers::Values HeadNumbers::read() const {
  ops::check_labels(first_bad, labels, classes);
  return {loss.item(), static_cast<std::int64_t>(correct.item())};
}

HeadResult head_loss_and_backward(Stage& stage, const Tensor& x, const Tensor& labels) {
  GradModeGuard grad(true);
  const Variable input(x, /*requires_grad=*/true);
  const Variable logits = stage.forward(input);
  HeadResult result;
  HeadNumbers& numbers = result.numbers;
  const Variable loss = cross_entropy(logits, labels, &numbers.first_bad);
  numbers.loss = loss.data();
  numbers.correct = ops::correct_predictions(logits.data(), labels);
  numbers.labels = labels;
  numbers.classes = logits.data().size(1);
  const Variable outputs[] = {loss};
  const Tensor seeds[] = {Tensor::full({1}, 1.0, loss.data().dtype(), loss.data().device())};
  const Variable capture[] = {input};
  result.dx = petra::backward(outputs, seeds, capture)[0];
  return result;
}

}  // namespace petra::nn
