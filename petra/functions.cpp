// petra/functions.cpp: the differentiable ops on Variables.
//
// Every op has the same three parts: compute with ops::, a backward closure that captures only
// what the derivative needs (by value: Tensors are cheap shared views), and record. A closure
// computes a gradient only for inputs that require one.
#include "petra/functions.hpp"

namespace petra {

namespace {
bool wants(const Variable& v) { return v.defined() && v.requires_grad(); }

// A zero tensor like t, for the parameter gradients that kernels accumulate into (+=).
Tensor zeros_like(const Tensor& t) { return Tensor::zeros(t.shape(), t.dtype(), t.device()); }
}  // namespace

// The gradient of a broadcast operand is the output's gradient summed over the dims it was
// stretched along (ops::sum_to, which returns the gradient itself when the shapes are equal, so
// the same-shape case runs exactly the ops it always did).
Variable add(const Variable& a, const Variable& b) {
  const Shape a_shape = a.shape(), b_shape = b.shape();
  Variable y = record_one(ops::add(a.data(), b.data()), "add", {a, b}, [a_shape, b_shape](std::span<const Tensor> g) {
    return std::vector<Tensor>{ops::sum_to(g[0], a_shape), ops::sum_to(g[0], b_shape)};
  });
  // Without broadcasting the backward hands its gradient on untouched, so a view may pass through.
  if (y.grad_fn() && a_shape == b_shape) y.grad_fn()->accept_strided_gradients();
  return y;
}

Variable sub(const Variable& a, const Variable& b) {
  const bool need_b = wants(b);
  const Shape a_shape = a.shape(), b_shape = b.shape();
  return record_one(ops::sub(a.data(), b.data()), "sub", {a, b}, [need_b, a_shape, b_shape](std::span<const Tensor> g) {
    return std::vector<Tensor>{ops::sum_to(g[0], a_shape), need_b ? ops::sum_to(ops::scale(g[0], -1.0), b_shape) : Tensor()};
  });
}

Variable mul(const Variable& a, const Variable& b) {
  // d(a*b) = b da + a db: each side keeps the other operand, and only if its gradient is wanted.
  // g * b broadcasts like the forward did; sum_to folds it back to a's shape.
  const Tensor keep_b = wants(a) ? b.data() : Tensor();
  const Tensor keep_a = wants(b) ? a.data() : Tensor();
  const Shape a_shape = a.shape(), b_shape = b.shape();
  return record_one(ops::mul(a.data(), b.data()), "mul", {a, b}, [keep_a, keep_b, a_shape, b_shape](std::span<const Tensor> g) {
    return std::vector<Tensor>{keep_b.defined() ? ops::sum_to(ops::mul(g[0], keep_b), a_shape) : Tensor(),
                               keep_a.defined() ? ops::sum_to(ops::mul(g[0], keep_a), b_shape) : Tensor()};
  });
}

Variable scale(const Variable& a, double factor) {
  return record_one(ops::scale(a.data(), factor), "scale", {a}, [factor](std::span<const Tensor> g) {
    return std::vector<Tensor>{ops::scale(g[0], factor)};
  });
}

Variable relu(const Variable& x) {
  Tensor y = ops::relu(x.data());
  if (!should_record({&x})) return Variable(y);
  // Keeps the output, not the input: relu's derivative is visible in y (y > 0 iff x > 0).
  return record_one(y, "relu", {x}, [y](std::span<const Tensor> g) {
    return std::vector<Tensor>{ops::relu_backward(y, g[0])};
  });
}

Variable reshape(const Variable& x, const Shape& shape) {
  const Shape x_shape = x.shape();
  return record_one(x.data().reshape(shape), "reshape", {x}, [x_shape](std::span<const Tensor> g) {
    return std::vector<Tensor>{g[0].contiguous().reshape(x_shape)};
  });
}

Variable conv2d(const Variable& x, const Variable& w, const Variable& bias, const Conv2dOptions& o) {
  Tensor y = ops::conv2d_forward(x.data(), w.data(), bias.defined() ? bias.data() : Tensor(), o);
  if (!should_record({&x, &w, &bias})) return Variable(y);
  const bool need_x = wants(x), need_w = wants(w), need_b = wants(bias);
  const Tensor keep_x = need_w ? x.data() : Tensor();  // dW needs x; dx needs only w
  const Tensor keep_w = w.data();
  const Shape x_shape = x.shape();
  return record_one(std::move(y), "conv2d", {x, w, bias}, [=](std::span<const Tensor> g) {
    const Tensor dy = g[0];
    std::vector<Tensor> grads(3);
    if (need_x) grads[0] = ops::conv2d_backward_data(dy, keep_w, x_shape, o);
    if (need_w) {
      grads[1] = zeros_like(keep_w);
      ops::conv2d_backward_weight(keep_x, dy, grads[1], o);
    }
    if (need_b) {
      grads[2] = Tensor::zeros({dy.size(1)}, dy.dtype(), dy.device());
      ops::conv2d_backward_bias(dy, grads[2]);
    }
    return grads;
  });
}

Variable batch_norm(const Variable& x, const Variable& gamma, const Variable& beta, const Tensor& running_mean,
                    const Tensor& running_var, const BatchNormOptions& o, const Variable& input_bias) {
  ops::BatchNormSaved saved;
  Tensor y = ops::batchnorm_forward(x.data(), gamma.data(), beta.data(), running_mean, running_var, o, &saved);
  if (!should_record({&x, &gamma, &beta, &input_bias})) return Variable(y);
  PETRA_CHECK(o.training, ValueError, "batch_norm: backward through evaluation mode is not supported; use NoGradGuard");
  const Tensor keep_x = x.data(), keep_gamma = gamma.data();
  const bool need_bias = wants(input_bias);
  Variable out = record_one(std::move(y), "batch_norm", {x, gamma, beta, input_bias}, [=](std::span<const Tensor> g) {
    Tensor dgamma = zeros_like(keep_gamma), dbeta = zeros_like(keep_gamma);
    Tensor dbias = need_bias ? zeros_like(keep_gamma) : Tensor();
    Tensor dx = ops::batchnorm_backward(keep_x, g[0], keep_gamma, saved, dgamma, dbeta, dbias);
    return std::vector<Tensor>{std::move(dx), std::move(dgamma), std::move(dbeta), std::move(dbias)};
  });
  if (out.grad_fn()) out.grad_fn()->accept_strided_gradients();  // ops::batchnorm_backward reads a channel slice of dy in place
  return out;
}

namespace {
// The fused batch norm + ReLU's backward as a node returns it: {dx, dgamma, dbeta, dbias} (dbias,
// the input_bias's gradient, only when wanted). y may be undefined where saved.affine is kept.
std::vector<Tensor> batch_norm_relu_gradients(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& gamma,
                                              const ops::BatchNormSaved& saved, bool need_bias, bool dy_given_up) {
  Tensor dgamma = zeros_like(gamma), dbeta = zeros_like(gamma);
  Tensor dbias = need_bias ? zeros_like(gamma) : Tensor();
  Tensor dx = ops::batchnorm_relu_backward(x, y, dy, gamma, saved, dgamma, dbeta, dbias, dy_given_up);
  return {std::move(dx), std::move(dgamma), std::move(dbeta), std::move(dbias)};
}
}  // namespace

Variable batch_norm_relu(const Variable& x, const Variable& gamma, const Variable& beta, const Tensor& running_mean,
                         const Tensor& running_var, const BatchNormOptions& o, const Variable& input_bias) {
  ops::BatchNormSaved saved;
  Tensor y = ops::batchnorm_relu_forward(x.data(), gamma.data(), beta.data(), running_mean, running_var, o, &saved);
  if (!should_record({&x, &gamma, &beta, &input_bias})) return Variable(y);
  PETRA_CHECK(o.training, ValueError,
              "batch_norm_relu: backward through evaluation mode is not supported; use NoGradGuard");
  // Keeps x (batch norm's backward reads it) and, for the ReLU mask, y; on the CPU (saved.affine
  // defined) the backward recomputes the mask from x and the forward's map, so y is not kept: where
  // it is nobody else's input (F's last batch norm, whose output the coupling only adds), it is freed
  // as soon as it has been used.
  const Tensor keep_x = x.data(), keep_gamma = gamma.data();
  const Tensor keep_y = saved.affine.defined() ? Tensor() : y;
  const bool need_bias = wants(input_bias);
  Variable out = record_one(y, "batch_norm_relu", {x, gamma, beta, input_bias}, [=](std::span<const Tensor> g) {
    // dx may be written over dy where nothing but the engine holds dy's storage (it drops dy once
    // this returns; a caller's seed, a captured gradient or another view hold a reference too)
    const bool dy_given_up = g[0].storage().use_count() == 1;
    return batch_norm_relu_gradients(keep_x, keep_y, g[0], keep_gamma, saved, need_bias, dy_given_up);
  });
  if (out.grad_fn()) out.grad_fn()->accept_strided_gradients();  // as batch_norm's
  return out;
}

Variable conv_batch_norm_relu(const Variable& x, const Variable& w, const Variable& bias, const Variable& gamma,
                              const Variable& beta, const Tensor& running_mean, const Tensor& running_var,
                              const Conv2dOptions& co, const BatchNormOptions& o) {
  PETRA_CHECK(!wants(x) || !grad_enabled(), ValueError,
              "conv_batch_norm_relu: gives no gradient for x, which requires one (use conv2d and batch_norm_relu)");
  ops::BatchNormSaved saved;
  Tensor y = ops::conv_batchnorm_relu_forward(x.data(), w.data(), bias.defined() ? bias.data() : Tensor(),
                                              gamma.data(), beta.data(), running_mean, running_var, co, o, &saved);
  if (!should_record({&w, &bias, &gamma, &beta})) return Variable(y);
  // Keeps x (the one-channel image: the backward recomputes the convolution from it) and the
  // parameters' values, not the convolution's output, which was never stored.
  const Tensor keep_x = x.data(), keep_w = w.data(), keep_bias = bias.defined() ? bias.data() : Tensor();
  const Tensor keep_gamma = gamma.data();
  const bool need_w = wants(w), need_bias = wants(bias), need_gamma = wants(gamma), need_beta = wants(beta);
  return record_one(std::move(y), "conv_batch_norm_relu", {w, bias, gamma, beta}, [=](std::span<const Tensor> g) {
    // The kernel produces all four; the ones nobody wants are dropped.
    Tensor dw = zeros_like(keep_w), dgamma = zeros_like(keep_gamma), dbeta = zeros_like(keep_gamma);
    Tensor dbias = keep_bias.defined() ? zeros_like(keep_bias) : Tensor();
    ops::conv_batchnorm_relu_backward(keep_x, keep_w, keep_bias, g[0], keep_gamma, saved, co, dw, dbias, dgamma,
                                      dbeta);
    return std::vector<Tensor>{need_w ? dw : Tensor(), need_bias ? dbias : Tensor(), need_gamma ? dgamma : Tensor(),
                               need_beta ? dbeta : Tensor()};
  });
}

Variable sum(const Variable& x, std::span<const int> dims) {
  const Shape x_shape = x.shape();
  return record_one(ops::sum(x.data(), dims), "sum", {x}, [x_shape](std::span<const Tensor> g) {
    return std::vector<Tensor>{ops::broadcast_to(g[0], x_shape)};
  });
}

Variable mean(const Variable& x, std::span<const int> dims) {
  const Shape x_shape = x.shape();
  Tensor y = ops::mean(x.data(), dims);
  const double count = static_cast<double>(x_shape.numel()) / static_cast<double>(y.numel());
  return record_one(std::move(y), "mean", {x}, [x_shape, count](std::span<const Tensor> g) {
    return std::vector<Tensor>{ops::broadcast_to(ops::scale(g[0], 1.0 / count), x_shape)};
  });
}

namespace {
std::vector<int> all_dims(const Variable& x) {
  std::vector<int> dims(static_cast<std::size_t>(x.shape().ndim()));
  for (std::size_t d = 0; d < dims.size(); ++d) dims[d] = static_cast<int>(d);
  return dims;
}
}  // namespace

Variable sum(const Variable& x) { return sum(x, all_dims(x)); }
Variable mean(const Variable& x) { return mean(x, all_dims(x)); }

Variable cross_entropy(const Variable& logits, const Tensor& labels, Tensor* first_bad) {
  ops::CrossEntropySaved saved;
  // Deferred on a GPU only: there reading the flag would make the host wait. On the CPU the check
  // costs nothing now, and a bad row leaves its probabilities unwritten, which the backward (and
  // the optimizer's steps until a deferred read) must never see.
  const bool defer = first_bad != nullptr && logits.data().device().is_cuda();
  Tensor loss = ops::cross_entropy_forward(logits.data(), labels, &saved,
                                           defer ? ops::LabelCheck::deferred : ops::LabelCheck::now);
  if (first_bad) *first_bad = saved.first_bad;
  saved.first_bad = Tensor();  // the backward needs only the probabilities
  if (!should_record({&logits})) return Variable(loss);
  return record_one(std::move(loss), "cross_entropy", {logits}, [saved, labels](std::span<const Tensor> g) {
    return std::vector<Tensor>{ops::cross_entropy_backward(saved, labels, g[0])};
  });
}

Variable linear(const Variable& x, const Variable& w, const Variable& bias) {
  Tensor y = ops::linear_forward(x.data(), w.data(), bias.defined() ? bias.data() : Tensor());
  if (!should_record({&x, &w, &bias})) return Variable(y);
  const bool need_x = wants(x), need_w = wants(w), need_b = wants(bias);
  const Tensor keep_x = need_w ? x.data() : Tensor();
  const Tensor keep_w = w.data();
  return record_one(std::move(y), "linear", {x, w, bias}, [=](std::span<const Tensor> g) {
    std::vector<Tensor> grads(3);
    if (need_x) grads[0] = ops::linear_backward_data(g[0], keep_w);
    if (need_w) {
      grads[1] = zeros_like(keep_w);
      ops::linear_backward_weight(keep_x, g[0], grads[1]);
    }
    if (need_b) {
      grads[2] = Tensor::zeros({keep_w.size(0)}, g[0].dtype(), g[0].device());
      ops::linear_backward_bias(g[0], grads[2]);
    }
    return grads;
  });
}

Variable max_pool2d(const Variable& x, const Pool2dOptions& o) {
  const bool record = should_record({&x});
  Tensor argmax;
  Tensor y = ops::max_pool2d_forward(x.data(), o, record ? &argmax : nullptr);
  if (!record) return Variable(y);
  const Shape x_shape = x.shape();
  return record_one(std::move(y), "max_pool2d", {x}, [argmax, x_shape, o](std::span<const Tensor> g) {
    return std::vector<Tensor>{ops::max_pool2d_backward(g[0], argmax, x_shape, o)};
  });
}

Variable avg_pool2d(const Variable& x, const Pool2dOptions& o) {
  const Shape x_shape = x.shape();
  return record_one(ops::avg_pool2d_forward(x.data(), o), "avg_pool2d", {x}, [x_shape, o](std::span<const Tensor> g) {
    return std::vector<Tensor>{ops::avg_pool2d_backward(g[0], x_shape, o)};
  });
}

Variable global_avg_pool(const Variable& x) {
  const Shape x_shape = x.shape();
  return record_one(ops::global_avg_pool_forward(x.data()), "global_avg_pool", {x}, [x_shape](std::span<const Tensor> g) {
    return std::vector<Tensor>{ops::global_avg_pool_backward(g[0], x_shape)};
  });
}

std::vector<Variable> split_channels(const Variable& x, std::span<const std::int64_t> sizes) {
  std::vector<Tensor> parts;
  std::int64_t first = 0;
  for (std::int64_t count : sizes) {
    parts.push_back(ops::channel_slice(x.data(), first, count));
    first += count;
  }
  PETRA_CHECK(first == x.shape()[1], ShapeError, "split_channels: sizes add up to ", first, " but ", x.data().str(),
              " has ", x.shape()[1], " channels");
  const Shape x_shape = x.shape();
  const DType dtype = x.data().dtype();
  const Device device = x.data().device();
  const std::vector<std::int64_t> counts(sizes.begin(), sizes.end());
  return record(std::move(parts), "split_channels", {x}, [=](std::span<const Tensor> g) {
    std::vector<Tensor> pieces;  // an output that received no gradient contributes zeros
    for (std::size_t i = 0; i < g.size(); ++i)
      pieces.push_back(g[i].defined() ? g[i] : Tensor::zeros(x_shape.with(1, counts[i]), dtype, device));
    return std::vector<Tensor>{ops::channel_concat(pieces)};
  });
}

Variable concat_channels(std::span<const Variable> parts) {
  std::vector<Tensor> tensors;
  std::vector<std::int64_t> sizes;
  for (const Variable& p : parts) {
    tensors.push_back(p.data());
    sizes.push_back(p.shape()[1]);
  }
  Tensor y = ops::channel_concat(tensors);
  return record_one(std::move(y), "concat_channels", std::vector<Variable>(parts.begin(), parts.end()),
                    [sizes](std::span<const Tensor> g) {
                      std::vector<Tensor> grads;
                      std::int64_t first = 0;
                      for (std::int64_t count : sizes) {  // views: see coupling below
                        grads.push_back(g[0].slice(1, first, first + count));
                        first += count;
                      }
                      return grads;
                    });
}

namespace {
// `part`, channels [first, first + count) of x (a copy or a view), recorded with its gradient
// declared a channel piece of x's: the engine adds it into channels [first, first + count) of x's
// gradient (the others get none from here).
Variable record_channel_piece(Tensor part, const char* name, const Variable& x, std::int64_t first,
                              std::int64_t count) {
  if (count == 0 || !should_record({&x})) return Variable(part);  // no channel: no gradient either
  Variable y = record_one(std::move(part), name, {x}, [](std::span<const Tensor> g) { return std::vector<Tensor>{g[0]}; });
  y.grad_fn()->set_channel_piece(0, first);
  return y;
}
}  // namespace

Variable slice_channels(const Variable& x, std::int64_t first, std::int64_t count) {
  return record_channel_piece(ops::channel_slice(x.data(), first, count), "slice_channels", x, first, count);
}

Variable channel_view(const Variable& x, std::int64_t first, std::int64_t count) {
  PETRA_CHECK(x.data().ndim() == 4, ShapeError, "channel_view: x ", x.data().str(), " must be 4-d (NCHW)");
  // Tensor::slice checks the range.
  return record_channel_piece(x.data().slice(1, first, first + count), "channel_view", x, first, count);
}

Variable coupling(const Variable& x, const Variable& f) {
  Tensor y = ops::coupling_forward(x.data(), f.data());
  if (!should_record({&x, &f})) return Variable(y);
  const bool need_f = wants(f);
  const std::int64_t streams = f.shape()[1];
  return record_one(std::move(y), "coupling", {x, f}, [=](std::span<const Tensor> g) {
    // y1 = x2 + f, y2 = x1  =>  dx1 = dy2, dx2 = dy1, df = dy1. The generic path adds no vjp of F
    // into dx1 here (autograd does, through F's graph): coupling_backward with a zero vjp, which
    // is the streams swapped (no tensor of zeros is made or read).
    // df is a view of dy's first stream, not a copy: F's last op is batch norm, which reads it in
    // place (the engine packs it for any other, Node::accept_strided_gradients).
    return std::vector<Tensor>{ops::swap_streams(g[0]), need_f ? g[0].slice(1, 0, streams) : Tensor()};
  });
}

Variable batch_norm_relu_coupling(const Variable& x, const Variable& z, const Variable& gamma, const Variable& beta,
                                  const Tensor& running_mean, const Tensor& running_var, const BatchNormOptions& o,
                                  const Variable& input_bias) {
  if (!ops::batchnorm_relu_coupling_keeps_map(z.data(), o) || !should_record({&x, &z, &gamma, &beta, &input_bias}))
    return coupling(x, batch_norm_relu(z, gamma, beta, running_mean, running_var, o, input_bias));
  ops::BatchNormSaved saved;
  Tensor y = ops::batchnorm_relu_coupling_forward(x.data(), z.data(), gamma.data(), beta.data(), running_mean,
                                                  running_var, o, &saved);
  const Tensor keep_z = z.data(), keep_gamma = gamma.data();
  const bool need_x = wants(x), need_z = wants(z) || wants(gamma) || wants(beta) || wants(input_bias);
  const bool need_bias = wants(input_bias);
  const std::int64_t streams = z.shape()[1];
  return record_one(std::move(y), "batch_norm_relu_coupling", {x, z, gamma, beta, input_bias},
                    [=](std::span<const Tensor> g) {
                      // y1 = x2 + f, y2 = x1 with f = relu(BN(z)): dx = (dy2, dy1) (F's vjp reaches
                      // dx1 through F's graph, as with coupling), and batch norm's backward takes
                      // df = dy1, a view of dy's first stream, with the mask from z and the map.
                      std::vector<Tensor> grads{need_x ? ops::swap_streams(g[0]) : Tensor()};
                      if (need_z)  // dz, dgamma, dbeta, dbias
                        for (Tensor& t : batch_norm_relu_gradients(keep_z, Tensor(), g[0].slice(1, 0, streams),
                                                                   keep_gamma, saved, need_bias, false))
                          grads.push_back(std::move(t));
                      grads.resize(5);
                      return grads;
                    });
}

Variable to_device(const Variable& x, Device device) {
  if (x.data().device() == device) return x;
  Tensor y = x.data().to(device);
  if (!should_record({&x})) return Variable(y);
  const Device from = x.data().device();
  return record_one(std::move(y), "to_device", {x},
                    [=](std::span<const Tensor> g) { return std::vector<Tensor>{g[0].to(from)}; });
}

// ---------------------------------------------------------------- operators
namespace {
// A constant (no gradient) of x's shape, dtype and device, every element `value`.
Variable constant_like(const Variable& x, double value) {
  return Variable(Tensor::full(x.shape(), value, x.data().dtype(), x.data().device()));
}
}  // namespace

Variable operator+(const Variable& a, const Variable& b) { return add(a, b); }
Variable operator-(const Variable& a, const Variable& b) { return sub(a, b); }
Variable operator*(const Variable& a, const Variable& b) { return mul(a, b); }
Variable operator-(const Variable& a) { return scale(a, -1.0); }
Variable operator*(double factor, const Variable& a) { return scale(a, factor); }
Variable operator*(const Variable& a, double factor) { return scale(a, factor); }
Variable operator+(const Variable& a, double value) { return add(a, constant_like(a, value)); }
Variable operator+(double value, const Variable& a) { return add(constant_like(a, value), a); }
Variable operator-(const Variable& a, double value) { return sub(a, constant_like(a, value)); }
Variable operator-(double value, const Variable& a) { return sub(constant_like(a, value), a); }

}  // namespace petra
