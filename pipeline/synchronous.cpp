// pipeline/synchronous.cpp: exact backprop and reversible backprop over a model's stages.
#include "pipeline/synchronous.hpp"

#include <tuple>
#include <vector>

#include "petra/ops.hpp"

namespace petra::pipeline {

namespace {
// Stage j's output is kept by stage j+1 when that stage is buffered: it becomes j+1's input buffer
// (the forward's temporaries stay stage j's activations).
void tag_output(const nn::Model& model, std::size_t j, const Tensor& output) {
  const std::size_t next = j + 1;
  if (next < model.num_stages() && model.stage(next).kind() == nn::StageKind::buffered)
    output.storage()->retag(MemoryTag::input_buffer, static_cast<int>(next));
}
}  // namespace

StepResult backprop_step(nn::Model& model, const Tensor& images, const Tensor& labels) {
  const std::size_t head = model.num_stages() - 1;
  GradModeGuard grad(true);
  Variable h(images);
  for (std::size_t j = 0; j < head; ++j) {
    MemoryScope scope(MemoryTag::activations, static_cast<int>(j));  // the graph keeps everything
    h = model.stage(j).forward(h);
  }
  MemoryScope scope(MemoryTag::activations, static_cast<int>(head));
  const Variable logits = model.stage(head).forward(h);
  const Variable loss = cross_entropy(logits, labels);
  StepResult r{loss.data().item(), ops::count_correct(logits.data(), labels), images.size(0)};
  loss.backward();
  return r;
}

StepResult revbackprop_step(nn::Model& model, const Tensor& images, const Tensor& labels) {
  const std::size_t head = model.num_stages() - 1;
  std::vector<Tensor> kept_input(model.num_stages());  // buffered stages only
  Tensor h = images;
  {
    NoGradGuard no_grad;
    for (std::size_t j = 0; j < head; ++j) {
      if (model.stage(j).kind() == nn::StageKind::buffered) kept_input[j] = h;
      MemoryScope scope(MemoryTag::activations, static_cast<int>(j));
      h = model.stage(j).forward(Variable(h)).data();
      tag_output(model, j, h);
    }
  }
  nn::HeadResult result;
  {
    MemoryScope scope(MemoryTag::activations, static_cast<int>(head));
    result = model.stage(head).loss_and_backward(h, labels);
  }
  // Walk down: (y, dy) of stage j is (x, dx) of stage j + 1.
  Tensor y = std::move(h), dy = std::move(result.dx);
  for (std::size_t j = head; j-- > 0;) {
    MemoryScope scope(MemoryTag::activations, static_cast<int>(j));
    nn::Stage& stage = model.stage(j);
    if (stage.kind() == nn::StageKind::reversible) {
      std::tie(y, dy) = stage.reconstruct_and_backward(y, dy);
    } else {
      dy = stage.recompute_and_backward(kept_input[j], dy);
      y = std::move(kept_input[j]);
    }
  }
  return {result.loss, result.correct, images.size(0)};
}

StepResult train_step(nn::Model& model, PipelineMethod method, const Tensor& images, const Tensor& labels) {
  PETRA_CHECK(!is_delayed(method), ValueError, "train_step: ", name_of(method),
              " is a pipelined method; run it on a schedule (pipeline/runtime.hpp)");
  return method == PipelineMethod::backprop ? backprop_step(model, images, labels)
                                            : revbackprop_step(model, images, labels);
}

}  // namespace petra::pipeline
