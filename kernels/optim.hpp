// kernels/optim.hpp: optimizer updates of one flat parameter array from its gradient, with
// PyTorch's semantics. The "shape" is the element count n. Parameters and optimizer state are
// updated in place; the gradient is read only.
//
// SGD (torch.optim.SGD), with g = grad + weight_decay * p (coupled weight decay):
//   momentum == 0:  p -= lr * g                                    (buffer unused, may be null)
//   otherwise:      buf = g on the first step, else buf = momentum * buf + (1 - dampening) * g
//                   g = nesterov ? g + momentum * buf : buf
//                   p -= lr * g
//   Nesterov needs momentum > 0 and dampening == 0; the caller checks.
//
// Adam (torch.optim.Adam, not AdamW; amsgrad off), step t = 1, 2, ... counted by the caller,
// with g = grad + weight_decay * p:
//   m = beta1 * m + (1 - beta1) * g        (cpu:: computes m += (1 - beta1) * (g - m), as PyTorch)
//   v = beta2 * v + (1 - beta2) * g^2
//   p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//   m and v start at zero.
//
// LARS (You et al. 2017, "Large batch training of convolutional networks", as in the common
// PyTorch implementations used for ResNets), per parameter array:
//   trust = eta * ||p|| / (||grad|| + weight_decay * ||p||), or 1 when ||p|| or ||grad|| is 0
//   buf = momentum * buf + lr * trust * (grad + weight_decay * p)
//   p -= buf
//   buf starts at zero (so the first step is buf = lr * trust * (grad + wd * p)). Arrays that
//   should not be adapted (batch-norm parameters, biases) are the caller's concern: it uses SGD
//   for them.
//
// The norms are in double; the cpu:: versions compute the update in T (float), in PyTorch's
// order of operations.
#pragma once

#include <cmath>
#include <cstdint>

#include "petra/config.hpp"
#include "petra/kernels/common.hpp"

namespace petra::kernels {

struct SgdOptions {
  double lr = 0.1;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  // Spike compensation (Kosson et al. 2020, "Pipelined backpropagation at scale") for gradients
  // that arrive `delay` updates after the parameters they were computed at: the step applies
  // a * buf + b * g instead of buf (heavy ball) or g + momentum * buf (Nesterov), with
  //   a = momentum^E,  b = (1 - momentum^E) / (1 - momentum),  E = delay (+ 1 for Nesterov),
  // so that each gradient moves the parameters, from its arrival on, exactly as it would have
  // without the delay, the steps it missed being applied at once. delay 0 is plain SGD (a = 1,
  // b = 0; Nesterov a = momentum, b = 1). Needs momentum in (0, 1) and dampening 0.
  double delay = 0;
};

// The (a, b) above. nn::Sgd checks that momentum is in (0, 1) and dampening is 0.
struct CompensatedMomentum {
  double velocity_weight, gradient_weight;
};
inline CompensatedMomentum compensated_momentum(const SgdOptions& o) {
  const double a = std::pow(o.momentum, o.delay + (o.nesterov ? 1 : 0));
  return {a, (1 - a) / (1 - o.momentum)};
}

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
};

struct LarsOptions {
  double lr = 0.1;
  double momentum = 0.9;
  double weight_decay = 0;
  double eta = 0.001;  // trust coefficient
};

namespace ref {

// param, momentum_buffer: updated in place. first_step: this buffer has never been written.
template <class T>
void sgd_step(const StreamHandle& s, std::int64_t n, const SgdOptions& options, bool first_step, T* param,
              const T* grad, T* momentum_buffer);
// param, exp_avg (m), exp_avg_sq (v): updated in place. step: 1 on the first call.
template <class T>
void adam_step(const StreamHandle& s, std::int64_t n, const AdamOptions& options, std::int64_t step, T* param,
               const T* grad, T* exp_avg, T* exp_avg_sq);
// param, momentum_buffer: updated in place.
template <class T>
void lars_step(const StreamHandle& s, std::int64_t n, const LarsOptions& options, T* param, const T* grad,
               T* momentum_buffer);

}  // namespace ref

// Same contracts as ref::, for float and double.
namespace cpu {

template <class T>
void sgd_step(const StreamHandle& s, std::int64_t n, const SgdOptions& options, bool first_step, T* param,
              const T* grad, T* momentum_buffer);
template <class T>
void adam_step(const StreamHandle& s, std::int64_t n, const AdamOptions& options, std::int64_t step, T* param,
               const T* grad, T* exp_avg, T* exp_avg_sq);
template <class T>
void lars_step(const StreamHandle& s, std::int64_t n, const LarsOptions& options, T* param, const T* grad,
               T* momentum_buffer);

}  // namespace cpu

#if PETRA_HAVE_CUDA
// Same contracts as ref::, float, launched on s.cuda_stream; pointers are device memory
// (kernels/cuda/optim.cu). SGD and Adam are one fused grid-stride pass in cpu::'s float order.
// LARS computes its two norms in double with a fixed-tree reduction (per-block partials, then one
// block combining them in a fixed order; no atomics), so the step is deterministic; it needs
// s.workspace (scratch for the partials and the scaled learning rate).
namespace cuda {

void sgd_step(const StreamHandle& s, std::int64_t n, const SgdOptions& options, bool first_step, float* param,
              const float* grad, float* momentum_buffer);
void adam_step(const StreamHandle& s, std::int64_t n, const AdamOptions& options, std::int64_t step, float* param,
               const float* grad, float* exp_avg, float* exp_avg_sq);
void lars_step(const StreamHandle& s, std::int64_t n, const LarsOptions& options, float* param, const float* grad,
               float* momentum_buffer);

}  // namespace cuda
#endif

}  // namespace petra::kernels
