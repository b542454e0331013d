// petra/functions.hpp: the differentiable operations of petra, on Variables (petra/autograd.hpp).
//
// Each one computes with the Tensor ops of petra/ops.hpp and records a graph node when gradients are
// recorded. A differentiable op has three parts, in this order: compute with the ops:: functions; a
// backward closure that captures only what the derivative needs; record it (petra::record_one).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "petra/autograd.hpp"
#include "petra/ops.hpp"

namespace petra {

// add, sub and mul broadcast like their ops:: versions (NumPy's rules); the gradient of an operand
// that was stretched is summed over the stretched dims (ops::sum_to).
Variable add(const Variable& a, const Variable& b);
Variable sub(const Variable& a, const Variable& b);
Variable mul(const Variable& a, const Variable& b);
Variable scale(const Variable& a, double factor);
Variable relu(const Variable& x);
// Reductions keep the reduced dims with size 1; without dims they reduce every dim (a
// single-element result, so backward() needs no seed).
Variable sum(const Variable& x, std::span<const int> dims);
Variable mean(const Variable& x, std::span<const int> dims);
Variable sum(const Variable& x);
Variable mean(const Variable& x);
Variable reshape(const Variable& x, const Shape& shape);
Variable linear(const Variable& x, const Variable& w, const Variable& bias);
Variable conv2d(const Variable& x, const Variable& w, const Variable& bias, const Conv2dOptions& o);
// running_mean / running_var are buffers (plain tensors, updated in place in training mode).
// input_bias, when given, is a bias that x's producer added to every value of its channel (a
// convolution's: conv2d_then_batch_norm): its gradient, the sum of dx over each channel, is taken
// here as batch norm's backward writes dx, so that the producer need not read dx again for it. The
// producer must then not record the bias as its own input, and x must have no other consumer.
Variable batch_norm(const Variable& x, const Variable& gamma, const Variable& beta, const Tensor& running_mean,
                    const Tensor& running_var, const BatchNormOptions& o, const Variable& input_bias = {});
// relu(batch_norm(...)) as one op (ops::batchnorm_relu_forward): one pass and one tensor fewer
// forward and backward. Same arguments, same running-statistics rule as batch_norm.
Variable batch_norm_relu(const Variable& x, const Variable& gamma, const Variable& beta, const Tensor& running_mean,
                         const Tensor& running_var, const BatchNormOptions& o, const Variable& input_bias = {});
// relu(batch_norm(conv2d(x, w, bias), ...)) in training mode as one op that never stores the
// convolution's output (ops::conv_batchnorm_relu_forward: the stem on a one-channel image
// recomputes its 3x3 convolution in each pass). Only where ops::conv_batchnorm_relu_fits, and only
// for an x that needs no gradient: the op gives none for x (a ValueError says so otherwise).
Variable conv_batch_norm_relu(const Variable& x, const Variable& w, const Variable& bias, const Variable& gamma,
                              const Variable& beta, const Tensor& running_mean, const Tensor& running_var,
                              const Conv2dOptions& co, const BatchNormOptions& o);
Variable max_pool2d(const Variable& x, const Pool2dOptions& o);
Variable avg_pool2d(const Variable& x, const Pool2dOptions& o);
Variable global_avg_pool(const Variable& x);
std::vector<Variable> split_channels(const Variable& x, std::span<const std::int64_t> sizes);
Variable concat_channels(std::span<const Variable> parts);
// x's values on `device` (x itself when already there); the gradient goes back to x's device. How a
// model whose stages sit on several GPUs runs forward (nn::Model::forward).
Variable to_device(const Variable& x, Device device);
Variable slice_channels(const Variable& x, std::int64_t first, std::int64_t count);  // a packed copy; its
                                                                                    // gradient a channel piece
// The same channels as a view of x (no copy), for a convolution's input: conv2d reads a channel
// slice in place, other ops require contiguous operands (ShapeError). Its gradient is a channel piece.
Variable channel_view(const Variable& x, std::int64_t first, std::int64_t count);
// Mean over the batch. A bad label raises at once; with first_bad on a GPU, the check is the
// caller's: it receives the flag to pass to ops::check_labels later (no wait for the GPU,
// ops::cross_entropy_forward). On the CPU the check is made at once either way (it costs nothing
// there), and first_bad still receives the flag.
Variable cross_entropy(const Variable& logits, const Tensor& labels, Tensor* first_bad = nullptr);
Variable coupling(const Variable& x, const Variable& f);                // (x2 + f, x1)
// coupling(x, batch_norm_relu(z, ...)) as one op (ops::batchnorm_relu_coupling_forward, same
// bits): F's output is never stored, and its backward reads z and the forward's map, not y. Where
// the map cannot be kept (ops::batchnorm_relu_coupling_keeps_map: the GPU, doubles, evaluation)
// it is that composition, op by op. Arguments as batch_norm_relu's, z with half x's channels.
Variable batch_norm_relu_coupling(const Variable& x, const Variable& z, const Variable& gamma, const Variable& beta,
                                  const Tensor& running_mean, const Tensor& running_var, const BatchNormOptions& o,
                                  const Variable& input_bias = {});

// Arithmetic operators: a + b, a - b, a * b broadcast (add, sub, mul); -a and a double factor are
// scale; a double added or subtracted is a constant tensor of the operand's shape (no gradient).
Variable operator+(const Variable& a, const Variable& b);
Variable operator-(const Variable& a, const Variable& b);
Variable operator*(const Variable& a, const Variable& b);
Variable operator-(const Variable& a);
Variable operator*(double factor, const Variable& a);
Variable operator*(const Variable& a, double factor);
Variable operator+(const Variable& a, double value);
Variable operator+(double value, const Variable& a);
Variable operator-(const Variable& a, double value);
Variable operator-(double value, const Variable& a);

}  // namespace petra
