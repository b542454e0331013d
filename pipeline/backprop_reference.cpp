// pipeline/backprop_reference.cpp: exact backprop of one mini-batch through one recorded graph.
#include "petra/pipeline/backprop_reference.hpp"

#include "petra/functions.hpp"

namespace petra::pipeline {

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

}  // namespace petra::pipeline
