// petra/autograd.hpp: reverse-mode automatic differentiation, define-by-run.
//
// A Variable holds a Tensor and, when it was computed by a differentiable op while gradients are
// recorded, the graph Node that made it. A Node keeps the op's input Variables (the edges of the
// graph) and a backward closure that captures exactly what the op's derivative needs. backward()
// walks the nodes reachable from the outputs in reverse topological order, calls each closure once
// with the gradients of its outputs, and frees the closure and its edges right after, so the
// activations an op saved are returned to the allocator as soon as they have been used.
//
// Gradient contract:
//   - a leaf Variable with requires_grad (a parameter) ACCUMULATES into .grad() (+=), so gradients
//     of several backward passes add up until zero_grad(); the gradient tensor is allocated with tag
//     "gradients" and the owner of the leaf's data;
//   - the gradients vjp() returns, and those passed between nodes, are ASSIGNED (fresh tensors).
//
// NoGradGuard turns recording off for a scope (per thread): ops then build no nodes and save nothing.
// docs/autograd.md walks through a worked example.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "petra/tensor.hpp"

namespace petra {

class Node;

class Variable {
 public:
  Variable() = default;
  explicit Variable(Tensor data, bool requires_grad = false);

  bool defined() const { return impl_ != nullptr; }
  const Tensor& data() const;
  const Shape& shape() const { return data().shape(); }
  bool requires_grad() const;  // a leaf that wants .grad, or the output of a recorded op
  bool is_leaf() const;        // not produced by a recorded op

  const Tensor& grad() const;  // undefined until a backward pass reached this leaf
  void set_grad(Tensor grad) const;
  void zero_grad() const;      // drops the gradient (the next backward allocates it again)

  // Replaces the data in place (an optimizer step does this); same shape and dtype.
  void set_data(Tensor data) const;

  // The same data, cut from the graph.
  Variable detach() const { return Variable(data(), false); }

  // Backward from this variable. seed defaults to 1 for a single-element variable.
  void backward(const Tensor& seed = {}) const;

  const std::shared_ptr<Node>& grad_fn() const;
  int output_index() const;    // which output of grad_fn() this is

  // Internal: builds the output of a recorded op.
  static Variable from_node(Tensor data, std::shared_ptr<Node> node, int output_index);

  bool same_as(const Variable& other) const { return impl_ == other.impl_; }

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// One recorded op. backward receives one gradient per output (undefined = that output got no
// gradient) and returns one gradient per input (undefined = none for that input).
//
// Channel pieces: an op that reads a range of its input's channels (slice_channels) may declare
// set_channel_piece(i, first): its backward then returns, for input i, only the gradient of
// channels [first, first + count) (count = that tensor's size(1)); the other channels' is zero.
// The engine adds the piece into that range of the input's running gradient in place when it
// holds the only reference to it (ops::channel_accumulate_into), instead of building the
// zero-padded full tensor and adding it: the same values, two full-size passes fewer.
class Node : public std::enable_shared_from_this<Node> {
 public:
  using BackwardFn = std::function<std::vector<Tensor>(std::span<const Tensor> grad_outputs)>;

  Node(std::string name, std::vector<Variable> inputs, int num_outputs, BackwardFn backward);

  const std::string& name() const { return name_; }
  const std::vector<Variable>& inputs() const { return inputs_; }
  int num_outputs() const { return num_outputs_; }
  std::vector<Tensor> apply(std::span<const Tensor> grad_outputs);  // throws if already released
  void release();  // drops the closure (and what it saved) and the edges
  bool released() const { return !backward_; }

  void set_channel_piece(std::size_t input, std::int64_t first_channel);
  std::int64_t channel_piece(std::size_t input) const;  // its first channel, or -1: the whole gradient

  // Strided gradients: a backward may return a view of its upstream gradient (the coupling hands F
  // its stream of dy as a channel slice instead of a copy). The engine packs such a gradient
  // (Tensor::contiguous) before it reaches a node that has not declared, with this call, that its
  // backward reads channel slices in place (batch norm's), and before adding it to another.
  void accept_strided_gradients() { accepts_strided_gradients_ = true; }
  bool accepts_strided_gradients() const { return accepts_strided_gradients_; }

 private:
  std::string name_;
  std::vector<Variable> inputs_;
  int num_outputs_;
  BackwardFn backward_;
  std::vector<std::int64_t> channel_piece_;  // per input, -1 for none; empty when no input has one
  bool accepts_strided_gradients_ = false;
};

// True when ops record a graph on this thread (default true).
bool grad_enabled();

// Sets whether ops record a graph on this thread, for the guard's lifetime (nests).
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled);
  ~GradModeGuard();
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool saved_;
};

class NoGradGuard : public GradModeGuard {
 public:
  NoGradGuard() : GradModeGuard(false) {}
};

// Should an op with these inputs record a node? (grad enabled and some input requires grad)
bool should_record(std::initializer_list<const Variable*> inputs);

// Records `node` as the producer of outputs made from `results` (when recording), or wraps the
// results as plain Variables (when not).
std::vector<Variable> record(std::vector<Tensor> results, std::string name, std::vector<Variable> inputs,
                             Node::BackwardFn backward);
Variable record_one(Tensor result, std::string name, std::vector<Variable> inputs, Node::BackwardFn backward);

// Backward from several outputs at once; each grad_outputs[i] has outputs[i]'s shape. Leaves with
// requires_grad accumulate into .grad(), except the captured ones: the gradients reaching `capture`
// are returned instead (assigned; undefined if none reached one). retain_graph keeps the nodes for
// another pass.
std::vector<Tensor> backward(std::span<const Variable> outputs, std::span<const Tensor> grad_outputs,
                             std::span<const Variable> capture = {}, bool retain_graph = false);

// Vector-Jacobian product: the gradients of sum_i <grad_outputs[i], outputs[i]> with respect to
// `wrt`, returned (assigned) without touching any .grad().
std::vector<Tensor> vjp(std::span<const Variable> outputs, std::span<const Tensor> grad_outputs,
                        std::span<const Variable> wrt, bool retain_graph = false);

}  // namespace petra
