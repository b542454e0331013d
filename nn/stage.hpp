// nn/stage.hpp: a pipeline stage, the unit PETRA places on a device.
//
// A network is a chain of J stages. The pipeline (pipeline/) decides *when* a stage runs and
// *what is kept* between its forward and its backward; the stage decides *how* to compute
// (docs/architecture.md, "The stage contract"). Three kinds:
//
//   buffered   (stem, downsampling transitions, ResNet blocks): not invertible. The runtime keeps
//              its input and, in the backward, calls recompute_and_backward(x, dy) -> dx, which
//              rebuilds the graph with the current parameters.
//   reversible (a RevNet coupling block): forward(x) keeps nothing; inverse(y) -> x rebuilds the
//              input; reconstruct_and_backward(y, dy) -> (x, dx) does both at once, building the
//              graph of F once during the inversion and reusing it for the vector-Jacobian product
//              (two F-sized passes instead of three).
//   head       (pool, classifier, loss): forward(x) -> logits; loss_and_backward(x, labels) ->
//              loss, correct count (HeadNumbers, read later) and dx.
//
// Every *_backward call ACCUMULATES (+=) the stage's parameter gradients, so the runtime can
// average k of them before an optimizer step. forward() records no graph unless called with
// gradients enabled (exact backprop keeps the whole graph).
#pragma once

#include <string>
#include <utility>

#include "petra/nn/module.hpp"

namespace petra::nn {

enum class StageKind { buffered, reversible, head };
std::string_view name_of(StageKind kind);

// The head's numbers for one mini-batch, left where its kernels wrote them (device memory on a
// GPU). Reading them is the one thing in a training step that would make the host wait for a GPU,
// so the pipeline passes these tensors on and the trainer reads them when it reports, after a
// chunk of steps: meanwhile the host queues the next steps' kernels.
struct HeadNumbers {
  Tensor loss;       // float [1]: mean cross-entropy over the batch
  Tensor correct;    // int64 [1]: rows whose argmax is their label
  Tensor first_bad;  // int64 [1]: -1, or the first sample whose label is outside [0, classes)
  Tensor labels;     // to name a bad label
  std::int64_t classes = 0;

  struct Values {
    double loss = 0;
    std::int64_t correct = 0;
  };
  // The numbers on the host; a bad label raises ValueError as cross_entropy does (the loss is
  // unspecified then). On a GPU: a copy and a wait on the calling thread's stream.
  Values read() const;
};

struct HeadResult {
  HeadNumbers numbers;
  Tensor dx;  // gradient of the mean loss with respect to the head's input
};

class Stage : public Module {
 public:
  virtual StageKind kind() const = 0;
  virtual std::string describe() const = 0;  // "reversible basic block, 64 channels per stream"

  // x -> y (buffered, reversible) or x -> logits (head).
  virtual Variable forward(const Variable& x) = 0;

  // Reversible stages only (the others raise ValueError).
  virtual Tensor inverse(const Tensor& y);
  virtual std::pair<Tensor, Tensor> reconstruct_and_backward(const Tensor& y, const Tensor& dy);

  // Buffered stages only: dx, with the parameter gradients accumulated.
  virtual Tensor recompute_and_backward(const Tensor& x, const Tensor& dy);

  // Head only.
  virtual HeadResult loss_and_backward(const Tensor& x, const Tensor& labels);
};

// The backward of any stage from its stored input: rebuilds the stage's graph at x with the
// current parameters (batch norm's running statistics left alone), back-propagates dy, and returns
// dx (undefined when input_gradient is false). Buffered stages use it for recompute_and_backward;
// the delayed-gradient baselines use it for reversible stages too, which then keep their input.
Tensor backward_from_input(Stage& stage, const Tensor& x, const Tensor& dy, bool input_gradient = true);

// The head's step from its input: forward (moving batch norm's running statistics once), mean
// cross-entropy, and its backward, with the parameter gradients accumulated.
HeadResult head_loss_and_backward(Stage& stage, const Tensor& x, const Tensor& labels);

}  // namespace petra::nn
