// petra/autograd.cpp: Variables, graph nodes, and the backward engine.
#include "petra/autograd.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>

#include "petra/ops.hpp"

namespace petra {

struct Variable::Impl {
  Tensor data;
  Tensor grad;
  bool requires_grad = false;
  std::shared_ptr<Node> node;  // producer, when recorded
  int output_index = 0;
};

Variable::Variable(Tensor data, bool requires_grad) : impl_(std::make_shared<Impl>()) {
  PETRA_CHECK(data.defined(), ValueError, "Variable: undefined tensor");
  PETRA_CHECK(!requires_grad || is_floating(data.dtype()), ValueError, "Variable: only floating tensors can require grad, got ",
              data.str());
  impl_->data = std::move(data);
  impl_->requires_grad = requires_grad;
}

Variable Variable::from_node(Tensor data, std::shared_ptr<Node> node, int output_index) {
  Variable v(std::move(data), false);
  v.impl_->node = std::move(node);
  v.impl_->output_index = output_index;
  return v;
}

namespace {
const Tensor& undefined_tensor() {
  static const Tensor t;
  return t;
}
}  // namespace

const Tensor& Variable::data() const {
  PETRA_CHECK(defined(), ValueError, "Variable: undefined variable");
  return impl_->data;
}
bool Variable::requires_grad() const { return defined() && (impl_->requires_grad || impl_->node != nullptr); }
bool Variable::is_leaf() const { return defined() && impl_->node == nullptr; }
const Tensor& Variable::grad() const { return defined() ? impl_->grad : undefined_tensor(); }
void Variable::set_grad(Tensor grad) const {
  PETRA_CHECK(!grad.defined() || grad.shape() == shape(), ShapeError, "Variable::set_grad: gradient ", grad.str(),
              " for data ", data().str());
  impl_->grad = std::move(grad);
}
void Variable::zero_grad() const { impl_->grad = Tensor(); }
void Variable::set_data(Tensor data) const {
  PETRA_CHECK(data.shape() == shape() && data.dtype() == impl_->data.dtype(), ShapeError, "Variable::set_data: ",
              data.str(), " replaces ", impl_->data.str());
  impl_->data = std::move(data);
}
const std::shared_ptr<Node>& Variable::grad_fn() const { return impl_->node; }
int Variable::output_index() const { return impl_->output_index; }

void Variable::backward(const Tensor& seed) const {
  Tensor s = seed;
  if (!s.defined()) {
    PETRA_CHECK(data().numel() == 1, ShapeError, "Variable::backward: a seed is needed for non-scalar ", data().str());
    MemoryScope scope(MemoryTag::activations, data().storage()->owner());
    s = Tensor::full(shape(), 1.0, data().dtype(), data().device());
  }
  const Variable outputs[] = {*this};
  const Tensor seeds[] = {s};
  petra::backward(outputs, seeds);
}

// ---- nodes and recording
Node::Node(std::string name, std::vector<Variable> inputs, int num_outputs, BackwardFn backward)
    : name_(std::move(name)), inputs_(std::move(inputs)), num_outputs_(num_outputs), backward_(std::move(backward)) {}

std::vector<Tensor> Node::apply(std::span<const Tensor> grad_outputs) {
  PETRA_CHECK(backward_ != nullptr, Error, "autograd: backward through ", name_,
              " a second time; its saved tensors were freed (pass retain_graph to keep them)");
  std::vector<Tensor> grads = backward_(grad_outputs);
  PETRA_CHECK(grads.size() == inputs_.size(), Error, "autograd: ", name_, " returned ", grads.size(),
              " gradients for ", inputs_.size(), " inputs");
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) continue;
    const Shape& input = inputs_[i].shape();
    const std::int64_t first = channel_piece(i);
    const bool fits = first < 0 ? grads[i].shape() == input
                                : grads[i].ndim() == input.ndim() && grads[i].shape().with(1, input[1]) == input &&
                                      first + grads[i].size(1) <= input[1];
    PETRA_CHECK(fits, ShapeError, "autograd: ", name_, " returned gradient ", grads[i].str(), " for input ", i,
                " of shape ", input.str(), first < 0 ? std::string() : " (a piece from channel " + std::to_string(first) + ")");
  }
  return grads;
}

void Node::set_channel_piece(std::size_t input, std::int64_t first_channel) {
  PETRA_CHECK(input < inputs_.size() && inputs_[input].shape().ndim() >= 2 && first_channel >= 0 &&
                  first_channel < inputs_[input].shape()[1],
              ValueError, "autograd: ", name_, ": no channel ", first_channel, " in input ", input);
  channel_piece_.resize(inputs_.size(), -1);
  channel_piece_[input] = first_channel;
}

std::int64_t Node::channel_piece(std::size_t input) const {
  return input < channel_piece_.size() ? channel_piece_[input] : -1;
}

void Node::release() {
  backward_ = nullptr;
  inputs_.clear();
  inputs_.shrink_to_fit();
  channel_piece_.clear();
}

namespace {
thread_local bool tls_grad_enabled = true;
}

bool grad_enabled() { return tls_grad_enabled; }
GradModeGuard::GradModeGuard(bool enabled) : saved_(tls_grad_enabled) { tls_grad_enabled = enabled; }
GradModeGuard::~GradModeGuard() { tls_grad_enabled = saved_; }

bool should_record(std::initializer_list<const Variable*> inputs) {
  if (!tls_grad_enabled) return false;
  for (const Variable* v : inputs)
    if (v != nullptr && v->requires_grad()) return true;
  return false;
}

std::vector<Variable> record(std::vector<Tensor> results, std::string name, std::vector<Variable> inputs,
                             Node::BackwardFn backward) {
  std::vector<Variable> outputs;
  outputs.reserve(results.size());
  bool any = false;
  if (tls_grad_enabled)
    for (const Variable& v : inputs) any = any || (v.defined() && v.requires_grad());
  if (!any) {
    for (Tensor& t : results) outputs.emplace_back(std::move(t), false);
    return outputs;
  }
  auto node = std::make_shared<Node>(std::move(name), std::move(inputs), static_cast<int>(results.size()),
                                     std::move(backward));
  for (std::size_t i = 0; i < results.size(); ++i)
    outputs.push_back(Variable::from_node(std::move(results[i]), node, static_cast<int>(i)));
  return outputs;
}

Variable record_one(Tensor result, std::string name, std::vector<Variable> inputs, Node::BackwardFn backward) {
  std::vector<Tensor> results;
  results.push_back(std::move(result));
  return std::move(record(std::move(results), std::move(name), std::move(inputs), std::move(backward))[0]);
}

// ---- the engine
namespace {

// Adds g to the running sum `sum`. The first gradient is kept as is (no copy); later ones make a
// new tensor, because the first may alias a tensor another node also received (add returns its
// upstream gradient to both inputs).
void accumulate(Tensor& sum, const Tensor& g) {
  if (!sum.defined())
    sum = g;
  else
    sum = ops::add(sum.contiguous(), g.contiguous());  // either may be a view (Node::accept_strided_gradients)
}

// Nodes reachable from `roots`, in reverse post-order: every node before the nodes it depends on.
// The list owns the nodes: releasing a node drops its edges, which may hold the last reference
// to the nodes below it.
std::vector<std::shared_ptr<Node>> topological_order(std::span<const Variable> roots) {
  std::vector<std::shared_ptr<Node>> post_order;
  std::unordered_map<Node*, bool> visited;
  std::vector<std::pair<Node*, std::size_t>> stack;  // node, next input to visit
  for (const Variable& r : roots) {
    Node* n = r.defined() ? r.grad_fn().get() : nullptr;
    if (n == nullptr || visited[n]) continue;
    visited[n] = true;
    stack.emplace_back(n, 0);
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->inputs().size()) {
        const Variable& input = node->inputs()[next++];  // undefined: an absent optional operand (a bias)
        Node* child = input.defined() ? input.grad_fn().get() : nullptr;
        if (child != nullptr && !visited[child]) {
          visited[child] = true;
          stack.emplace_back(child, 0);
        }
      } else {
        post_order.push_back(node->shared_from_this());
        stack.pop_back();
      }
    }
  }
  return {post_order.rbegin(), post_order.rend()};
}

struct Engine {
  bool accumulate_leaves;
  std::unordered_map<Node*, std::vector<Tensor>> pending;  // gradients of each node's outputs
  std::vector<Tensor> captured;
  std::unordered_map<const void*, std::size_t> leaf_capture;                  // leaf identity -> index
  std::unordered_map<Node*, std::vector<std::pair<int, std::size_t>>> node_capture;  // (output, index)

  static const void* identity(const Variable& v) { return &v.data(); }  // stable per Impl

  void set_captures(std::span<const Variable> capture) {
    captured.resize(capture.size());
    for (std::size_t i = 0; i < capture.size(); ++i) {
      PETRA_CHECK(capture[i].defined(), ValueError, "autograd: undefined variable in the capture list");
      if (capture[i].is_leaf())
        leaf_capture[identity(capture[i])] = i;
      else
        node_capture[capture[i].grad_fn().get()].emplace_back(capture[i].output_index(), i);
    }
  }

  // Running sums that began as a channel piece (deliver_piece): per (node, output), the channel
  // ranges written so far. The other channels of such a sum are not initialised until
  // finish_pieces zeroes them, before anything reads the sum whole. So pieces that together cover
  // the tensor (a transition's two streams) are each copied in once: no tensor of zeros is written
  // and read again.
  using Slot = std::pair<Node*, int>;
  std::map<Slot, std::vector<std::pair<std::int64_t, std::int64_t>>> pieces;

  static bool disjoint(const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges, std::int64_t first,
                       std::int64_t count) {
    for (const auto& [f, c] : ranges)
      if (first < f + c && f < first + count) return false;
    return true;
  }

  // The slot's sum made whole: its channels no piece wrote set to zero.
  void finish_pieces(Node* node, int output, Tensor& sum) {
    const auto it = pieces.find({node, output});
    if (it == pieces.end()) return;
    auto ranges = std::move(it->second);
    pieces.erase(it);
    std::sort(ranges.begin(), ranges.end());
    std::int64_t next = 0;
    const std::int64_t channels = sum.size(1);
    ranges.emplace_back(channels, 0);
    for (const auto& [first, count] : ranges) {
      if (first > next)
        ops::channel_copy_into(sum, Tensor::zeros(sum.shape().with(1, first - next), sum.dtype(), sum.device()), next);
      next = std::max(next, first + count);
    }
  }

  // A channel piece (Node::set_channel_piece) of v's gradient arrives. Into the running sum of v's
  // producer: copied in where it is the first to reach its channels (a new sum is left
  // uninitialised elsewhere, finish_pieces), otherwise added in place when nothing else holds
  // the sum: it may alias a tensor another node also received (add's backward hands its gradient
  // to both inputs) or the caller's seed. Into a capture slot or a leaf's .grad: added in place the
  // same way. Otherwise expanded with zeros and delivered as a whole gradient.
  void deliver_piece(const Variable& v, const Tensor& piece, std::int64_t first) {
    Tensor* sum = nullptr;
    if (Node* n = v.grad_fn().get()) {
      auto& slots = pending[n];
      if (slots.empty()) slots.resize(n->num_outputs());
      const int output = v.output_index();
      sum = &slots[output];
      if (!sum->defined()) {
        *sum = Tensor::empty(v.shape(), piece.dtype(), piece.device());
        ops::channel_copy_into(*sum, piece.contiguous(), first);
        pieces[{n, output}].emplace_back(first, piece.size(1));
        return;
      }
      if (auto it = pieces.find({n, output}); it != pieces.end()) {
        if (disjoint(it->second, first, piece.size(1))) {
          ops::channel_copy_into(*sum, piece.contiguous(), first);
          it->second.emplace_back(first, piece.size(1));
          return;
        }
        finish_pieces(n, output, *sum);
      }
    } else if (auto it = leaf_capture.find(identity(v)); it != leaf_capture.end()) {
      sum = &captured[it->second];
    } else if (accumulate_leaves && v.requires_grad() && v.grad().defined()) {
      ops::channel_accumulate_into(v.grad(), piece, first);
      return;
    }
    if (sum != nullptr && sum->defined() && sum->storage().use_count() == 1 && sum->is_contiguous()) {
      ops::channel_accumulate_into(*sum, piece, first);
      return;
    }
    Tensor full = Tensor::zeros(v.shape(), piece.dtype(), piece.device());
    ops::channel_accumulate_into(full, piece, first);
    deliver(v, full, /*from_node=*/true);  // the engine's own tensor
  }

  // Whether a leaf's first gradient may be g itself rather than a copy: g came from a node's
  // backward (not the caller's seed), nothing else holds its storage, and it is all of it.
  static bool adoptable(const Tensor& g, const Variable& leaf) {
    return g.device() == leaf.data().device() && g.is_contiguous() && g.storage().use_count() == 1 &&
           g.raw_data() == g.storage()->data();
  }

  // A gradient arrives at variable v: route it to its producer node, or to the leaf. `from_node`:
  // g is a node's result, which the engine drops after delivering it (else the caller's seed).
  void deliver(const Variable& v, const Tensor& g, bool from_node = false) {
    if (Node* n = v.grad_fn().get()) {
      auto& slots = pending[n];
      if (slots.empty()) slots.resize(n->num_outputs());
      finish_pieces(n, v.output_index(), slots[v.output_index()]);  // a whole gradient reads it whole
      accumulate(slots[v.output_index()], g);
      return;
    }
    if (auto it = leaf_capture.find(identity(v)); it != leaf_capture.end()) {
      accumulate(captured[it->second], g);  // returned to the caller instead of stored in .grad()
      return;
    }
    if (accumulate_leaves && v.requires_grad()) {
      if (!v.grad().defined()) {
        const int owner = v.data().storage()->owner();
        if (from_node && adoptable(g, v)) {  // no copy: the engine's reference goes when it moves on
          g.storage()->retag(MemoryTag::gradients, owner);
          v.set_grad(g);
          return;
        }
        MemoryScope scope(MemoryTag::gradients, owner);
        v.set_grad(g.device() == v.data().device() ? g.clone() : g.contiguous().to(v.data().device()));
      } else {
        ops::add_into(v.grad(), g.contiguous());
      }
    }
  }

  void run(std::span<const Variable> outputs, std::span<const Tensor> grad_outputs, bool retain_graph) {
    PETRA_CHECK(outputs.size() == grad_outputs.size(), ValueError, "autograd: ", outputs.size(), " outputs but ",
                grad_outputs.size(), " gradients");
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      PETRA_CHECK(outputs[i].defined() && grad_outputs[i].defined(), ValueError, "autograd: undefined output or gradient ", i);
      PETRA_CHECK(grad_outputs[i].shape() == outputs[i].shape(), ShapeError, "autograd: gradient ", grad_outputs[i].str(),
                  " for output ", i, " of shape ", outputs[i].shape().str());
      deliver(outputs[i], grad_outputs[i]);
    }
    std::vector<std::shared_ptr<Node>> order = topological_order(outputs);
    for (std::shared_ptr<Node>& owned : order) {
      Node* node = owned.get();
      auto it = pending.find(node);
      if (it != pending.end()) {
        std::vector<Tensor> grads_out = std::move(it->second);
        pending.erase(it);
        for (std::size_t o = 0; o < grads_out.size(); ++o) finish_pieces(node, static_cast<int>(o), grads_out[o]);
        if (!node->accepts_strided_gradients())
          for (Tensor& g : grads_out) g = g.contiguous();  // a view some backward returned
        if (auto c = node_capture.find(node); c != node_capture.end())
          for (auto [output, index] : c->second) captured[index] = grads_out[output];
        const std::vector<Tensor> grads_in = node->apply(grads_out);
        grads_out.clear();  // free the upstream gradients before walking on
        for (std::size_t i = 0; i < grads_in.size(); ++i) {
          if (!grads_in[i].defined()) continue;
          if (const std::int64_t first = node->channel_piece(i); first >= 0)
            deliver_piece(node->inputs()[i], grads_in[i], first);
          else
            deliver(node->inputs()[i], grads_in[i], /*from_node=*/true);
        }
      }
      if (!retain_graph) node->release();
      owned.reset();  // what only the graph kept alive goes now, not at the end of the pass
    }
  }
};

}  // namespace

std::vector<Tensor> backward(std::span<const Variable> outputs, std::span<const Tensor> grad_outputs,
                             std::span<const Variable> capture, bool retain_graph) {
  Engine engine{true, {}, {}, {}, {}, {}};
  engine.set_captures(capture);
  engine.run(outputs, grad_outputs, retain_graph);
  return std::move(engine.captured);
}

std::vector<Tensor> vjp(std::span<const Variable> outputs, std::span<const Tensor> grad_outputs,
                        std::span<const Variable> wrt, bool retain_graph) {
  Engine engine{false, {}, {}, {}, {}, {}};
  engine.set_captures(wrt);
  engine.run(outputs, grad_outputs, retain_graph);
  return std::move(engine.captured);
}

}  // namespace petra
