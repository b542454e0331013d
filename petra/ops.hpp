// petra/ops.hpp: the operations of petra on Tensors (namespace petra::ops), with no graph. Their
// differentiable versions on Variables are in petra/functions.hpp; the optimizer steps in
// petra/optimizer_steps.hpp. Includes run one way: tensor -> ops -> autograd -> functions.
//
// Each op validates its operands (shape, dtype, device; a mistake raises petra::ShapeError or
// DeviceError naming the op and the shapes), allocates its outputs with the calling thread's
// MemoryScope, and runs the kernel for the operands' device and dtype on the current stream
// (Stream::current(), or the thread's default stream of that device):
//   float32 on the CPU -> kernels::cpu,  float64 on the CPU -> kernels::ref (the oracle; float64
//   exists for gradient checks),  float32 on a GPU -> kernels::cuda.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "petra/tensor.hpp"

namespace petra {

// ---------------------------------------------------------------- options
struct Conv2dOptions {
  std::int64_t stride = 1;
  std::int64_t padding = 0;
};

struct BatchNormOptions {
  bool training = true;
  double momentum = 0.1;
  double eps = 1e-5;
};

struct Pool2dOptions {
  std::int64_t kernel = 2;
  std::int64_t stride = 2;
  std::int64_t padding = 0;
};

// ---------------------------------------------------------------- Tensor level (no graph)
namespace ops {

// element-wise (contiguous). add, sub and mul broadcast with NumPy's rules: shapes are aligned on
// the right, and a dim of size 1 (or a missing leading dim) stretches to the other operand's size;
// incompatible shapes raise ShapeError naming the op and both shapes. Equal shapes run the kernel
// directly; otherwise each operand not of the result shape is first expanded with broadcast_to
// (a copy), then the same kernel runs. The other ops need equal shapes.
Tensor add(const Tensor& a, const Tensor& b);                 // a + b
Tensor sub(const Tensor& a, const Tensor& b);                 // a - b
Tensor mul(const Tensor& a, const Tensor& b);                 // a * b
Tensor scale(const Tensor& a, double factor);                 // factor * a
void add_into(const Tensor& dst, const Tensor& src);          // dst += src
void axpy_into(const Tensor& dst, double a, const Tensor& x); // dst += a * x
Tensor relu(const Tensor& x);
Tensor relu_backward(const Tensor& y, const Tensor& dy);      // dy * (y > 0), y = relu's output

// reductions over `dims` (kept as size-1 dims in the result)
Tensor sum(const Tensor& x, std::span<const int> dims);
Tensor mean(const Tensor& x, std::span<const int> dims);
// The shape a and b broadcast to (NumPy's rules, see add); ShapeError naming `op` and both shapes
// when they are incompatible.
Shape broadcast_shape(const Shape& a, const Shape& b, const char* op = "broadcast_shape");
// A packed copy of `small` expanded to `shape` (NumPy's rules: size-1 dims repeat, missing leading
// dims are added); also the backward of sum.
Tensor broadcast_to(const Tensor& small, const Shape& shape);
// The reverse of broadcast_to (the backward of a broadcast): x summed over the dims that `shape`
// stretches, reshaped to `shape`. x itself when it already has that shape.
Tensor sum_to(const Tensor& x, const Shape& shape);
// ||approx - exact|| / ||exact|| over all elements, accumulated in double on the host (same
// shape; a diagnostic, not a hot-path op). 0 when both are zero.
double relative_error(const Tensor& approx, const Tensor& exact);

// linear: x [batch, in], w [out, in], bias [out] or undefined
Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias);
Tensor linear_backward_data(const Tensor& dy, const Tensor& w);
void linear_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw);  // dw +=
void linear_backward_bias(const Tensor& dy, const Tensor& db);                      // db +=

// conv2d: x [N, C, H, W], w [K, C, kh, kw], bias [K] or undefined. x may be a channel slice
// (x.slice(1, ..)) as well as contiguous: on the CPU the forward and backward-weight passes read it in place.
Tensor conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& o);
Tensor conv2d_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape, const Conv2dOptions& o);
void conv2d_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Conv2dOptions& o);  // dw +=
void conv2d_backward_bias(const Tensor& dy, const Tensor& db);                                            // db +=

// batch norm 2d. Training: batch statistics, running statistics updated in place (if defined).
struct BatchNormSaved {
  Tensor mean, invstd;  // per channel, for the backward
  // The fused batch norm + ReLU's training forward on the CPU in float: the per-channel map it
  // applied (3 floats a channel, kernels::cpu::batchnorm_relu_forward_train_mapped), from which its
  // backward recomputes the ReLU's mask from x, bit for bit y > 0, instead of reading y.
  Tensor affine;
};
Tensor batchnorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                         const Tensor& running_var, const BatchNormOptions& o, BatchNormSaved* saved);
// The backwards return dx; dgamma +=, dbeta +=. dx_sum, when given (per channel, like dgamma), +=
// the sum of dx over each channel: the gradient of a bias that x's producer added (a convolution's,
// functions.hpp's batch_norm), taken while dx is written instead of in conv2d_backward_bias's pass.
Tensor batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const BatchNormSaved& saved,
                          const Tensor& dgamma, const Tensor& dbeta, const Tensor& dx_sum = {});
// batch norm then ReLU, fused (kernels/batchnorm.hpp): relu(batchnorm_forward(...)) in one op, with
// the same arguments and running-statistics rule. The backward takes y, the fused forward's output,
// for the ReLU mask (y > 0); where the forward saved its map (saved.affine: CPU, float), the backward
// takes the mask from x and the map instead and does not read y, which may then be undefined.
// `dy_given_up`: the caller reads dy no more after this call (the autograd node's upstream
// gradient, which nothing else holds); that backward then writes dx over dy where dy is contiguous,
// so that dx's lines are the ones it has just read, not lines of a fresh block that must first come
// from DRAM. Elsewhere dx is a tensor of its own.
Tensor batchnorm_relu_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                              const Tensor& running_var, const BatchNormOptions& o, BatchNormSaved* saved);
Tensor batchnorm_relu_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& gamma,
                               const BatchNormSaved& saved, const Tensor& dgamma, const Tensor& dbeta,
                               const Tensor& dx_sum = {}, bool dy_given_up = false);

// conv2d -> batch norm (training) -> ReLU in one op that never stores the convolution's output
// (kernels/conv_batchnorm.hpp: the stem on grey images, recomputing its cheap one-channel convolution
// in each pass). Only where conv_batchnorm_relu_fits: CPU, float, AVX-512 compiled in, one input
// channel, 3x3, stride 1, padding 1, a multiple of 16 output channels; a ShapeError elsewhere. The
// forward fills saved as batchnorm_relu_forward's CPU path (affine included); the backward gives
// no gradient for x, and dw, dbias (may be undefined), dgamma, dbeta get +=.
bool conv_batchnorm_relu_fits(const Tensor& x, const Tensor& w, const Conv2dOptions& o);
Tensor conv_batchnorm_relu_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& gamma,
                                   const Tensor& beta, const Tensor& running_mean, const Tensor& running_var,
                                   const Conv2dOptions& co, const BatchNormOptions& o, BatchNormSaved* saved);
void conv_batchnorm_relu_backward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& dy,
                                  const Tensor& gamma, const BatchNormSaved& saved, const Conv2dOptions& co,
                                  const Tensor& dw, const Tensor& dbias, const Tensor& dgamma, const Tensor& dbeta);

// pooling
Tensor max_pool2d_forward(const Tensor& x, const Pool2dOptions& o, Tensor* argmax);
Tensor max_pool2d_backward(const Tensor& dy, const Tensor& argmax, const Shape& x_shape, const Pool2dOptions& o);
Tensor avg_pool2d_forward(const Tensor& x, const Pool2dOptions& o);
Tensor avg_pool2d_backward(const Tensor& dy, const Shape& x_shape, const Pool2dOptions& o);
Tensor global_avg_pool_forward(const Tensor& x);                          // [N, C, H, W] -> [N, C]
Tensor global_avg_pool_backward(const Tensor& dy, const Shape& x_shape);

// channels of NCHW tensors (any rank >= 2: dims after the channels are flattened)
Tensor channel_slice(const Tensor& x, std::int64_t first, std::int64_t count);  // packed copy
Tensor channel_concat(std::span<const Tensor> parts);
void channel_accumulate_into(const Tensor& full, const Tensor& part, std::int64_t first);  // full[:, first:..] += part
void channel_copy_into(const Tensor& full, const Tensor& part, std::int64_t first);        // full[:, first:..] = part

// loss: logits [batch, classes], labels int64 [batch]
struct CrossEntropySaved {
  Tensor probs;      // softmax of the logits
  Tensor first_bad;  // int64 [1] where the logits are: -1, or the first sample whose label is out of range
};
// Mean over the batch. Labels are int64 [batch] on the logits' device (DeviceError otherwise). A
// label outside [0, classes) raises ValueError naming the sample: at once with LabelCheck::now (on
// a GPU the forward then waits for its kernels), or when the caller passes saved->first_bad to
// check_labels with LabelCheck::deferred, so that a training step on a GPU never waits for the
// device (the trainer checks when it reads the loss). Until then the loss is unspecified, and so
// are the probabilities on the CPU backends (they stop at the bad row), so check before a backward
// there; the backward of a bad row has no onehot term and reads nothing out of range.
enum class LabelCheck { now, deferred };
Tensor cross_entropy_forward(const Tensor& logits, const Tensor& labels, CrossEntropySaved* saved,
                             LabelCheck check = LabelCheck::now);  // scalar [1]
void check_labels(const Tensor& first_bad, const Tensor& labels, std::int64_t classes);
Tensor cross_entropy_backward(const CrossEntropySaved& saved, const Tensor& labels, const Tensor& dloss);
Tensor argmax(const Tensor& logits);                                  // int64 [batch]
// The number of rows whose argmax is their label: correct_predictions leaves it where the logits are
// (int64 [1], no wait on a GPU); count_correct reads it back.
Tensor correct_predictions(const Tensor& logits, const Tensor& labels);
std::int64_t count_correct(const Tensor& logits, const Tensor& labels);

// additive coupling with swap: x has 2C channels, f has C
Tensor coupling_forward(const Tensor& x, const Tensor& f);   // (x2 + f, x1)
Tensor coupling_inverse(const Tensor& y, const Tensor& f);   // (y2, y1 - f)
// dx = (dy2 + g, dy1), with g the vjp of F at x1 with dy1 (a reversible stage passes F's vjp
// here and saves materialising dy2 + g; the generic autograd path passes zeros).
Tensor coupling_backward(const Tensor& dy, const Tensor& g);
// (dy2, dy1): coupling_backward with g = 0, without a tensor of zeros (the kernel's null g).
Tensor swap_streams(const Tensor& dy);
// F's last batch norm + ReLU fused into the coupling (kernels/batchnorm.hpp,
// batchnorm_relu_coupling_*): coupling_forward(x, f) and coupling_inverse(y, f) with
// f = batchnorm_relu_forward(z, ...) (same arguments, same statistics rule, same bits), but f is
// never stored. z has C channels (F's last convolution's output). No gradient: for the passes
// that keep no graph (a pipelined stage's forward, a stage group's inverse). The forward's `saved`,
// when given, receives what batchnorm_relu_backward needs without y (saved.affine), for a graph
// (functions.hpp's batch_norm_relu_coupling); only where batchnorm_relu_coupling_keeps_map says so.
Tensor batchnorm_relu_coupling_forward(const Tensor& x, const Tensor& z, const Tensor& gamma, const Tensor& beta,
                                       const Tensor& running_mean, const Tensor& running_var,
                                       const BatchNormOptions& o, BatchNormSaved* saved = nullptr);
// Whether batchnorm_relu_coupling_forward can keep its map for z: training, on the CPU, in float.
bool batchnorm_relu_coupling_keeps_map(const Tensor& z, const BatchNormOptions& o);
Tensor batchnorm_relu_coupling_inverse(const Tensor& y, const Tensor& z, const Tensor& gamma, const Tensor& beta,
                                       const Tensor& running_mean, const Tensor& running_var,
                                       const BatchNormOptions& o);

}  // namespace ops

}  // namespace petra
