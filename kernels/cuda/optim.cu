// kernels/cuda/optim.cu: the cuda:: optimizer steps of kernels/optim.hpp (SGD, Adam, LARS).
//
// SGD and Adam are element-wise: one fused grid-stride pass (launch_grid_stride) reads the
// parameter, the gradient and the state once and writes the parameter and the state once, where
// PyTorch's unfused version makes a pass per operation. Each thread owns its elements, so nothing
// is shared and the result does not depend on the grid. The arithmetic is cpu::'s, in float and in
// PyTorch's order of operations (nvcc may contract a * b + c into an FMA: results agree with ref::
// to float rounding, not bit for bit). The scalar coefficients (lr, 1 - dampening, Adam's bias
// corrections) are computed once on the host in double and passed as float, as cpu:: does.
//
// LARS needs ||param|| and ||grad|| before any element is updated, and must be deterministic
// (the same bits on every run, whatever the scheduling): no floating-point atomics. Three launches
// on the stream, which orders them:
//   1. lars_partials: a grid of B <= kMaxPartialBlocks blocks; each thread accumulates the squares
//      of its grid-stride elements in double, the block adds its threads' sums with a fixed binary
//      tree in shared memory (block_tree_sum, kernels/cuda/block_reduce.cuh), and thread 0 writes
//      the block's two partial sums. B depends only on n (and the grid-stride cap), so the
//      partition, and with it every rounding, is fixed.
//   2. lars_trust: one block adds the B partials, each thread a fixed strided subset in order and
//      then the same fixed tree, computes the trust ratio in double as ref:: does, and writes
//      float(lr * trust) to scratch.
//   3. lars_update: the element-wise momentum update, a grid-stride pass reading that scalar from
//      device memory (no host round trip, so the step stays asynchronous).
// The partials and the scalar live in s.scratch() (the stream's workspace), so two streams never
// share them. The norm passes read param and grad once more than the update does; with a double
// accumulator per thread and at most 1024 partials the sums are as accurate as cpu::'s.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "petra/kernels/cuda/block_reduce.cuh"
#include "petra/kernels/cuda/launch.cuh"
#include "petra/kernels/optim.hpp"

namespace petra::kernels::cuda {
namespace {

using cuda_detail::block_tree_sum;
using cuda_detail::grid_threads;
using cuda_detail::kBlockThreads;
using cuda_detail::launch_blocks;
using cuda_detail::launch_grid_stride;
using cuda_detail::thread_index;

// ---- SGD

// The three variants of kernels/optim.hpp, each one kernel so that the loop has no branch on the
// options.
enum class SgdKind { kPlain, kMomentum, kCompensated };

struct SgdCoefficients {
  float lr, weight_decay, momentum, one_minus_dampening;
  float velocity_weight, gradient_weight;  // kCompensated
  bool nesterov, first_step;
};

template <SgdKind kind>
__global__ void sgd_kernel(std::int64_t n, SgdCoefficients c, float* param, const float* grad,
                           float* momentum_buffer) {
  for (std::int64_t i = thread_index(); i < n; i += grid_threads()) {
    const float p = param[i];
    const float g = grad[i] + c.weight_decay * p;
    if constexpr (kind == SgdKind::kPlain) {
      param[i] = p - c.lr * g;
    } else if constexpr (kind == SgdKind::kMomentum) {
      const float buf =
          c.first_step ? g : c.momentum * momentum_buffer[i] + c.one_minus_dampening * g;
      momentum_buffer[i] = buf;
      param[i] = p - c.lr * (c.nesterov ? g + c.momentum * buf : buf);
    } else {
      const float buf = c.first_step ? g : c.momentum * momentum_buffer[i] + g;
      momentum_buffer[i] = buf;
      param[i] = p - c.lr * (c.velocity_weight * buf + c.gradient_weight * g);
    }
  }
}

// ---- Adam

struct AdamCoefficients {
  float step_size, inv_bias_correction2_sqrt, weight_decay, one_minus_beta1, beta2,
      one_minus_beta2, eps;
};

__global__ void adam_kernel(std::int64_t n, AdamCoefficients c, float* param, const float* grad,
                            float* exp_avg, float* exp_avg_sq) {
  for (std::int64_t i = thread_index(); i < n; i += grid_threads()) {
    const float p = param[i];
    const float g = grad[i] + c.weight_decay * p;
    const float m = exp_avg[i] + c.one_minus_beta1 * (g - exp_avg[i]);
    const float v = c.beta2 * exp_avg_sq[i] + c.one_minus_beta2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p - c.step_size * m / (sqrtf(v) * c.inv_bias_correction2_sqrt + c.eps);
  }
}

// ---- LARS

// At most this many partial sums: few enough for one block to combine quickly, many enough to
// fill a GPU with the first pass (1024 blocks of 256 threads, each looping).
inline constexpr unsigned kMaxPartialBlocks = 1024;

// partials[2 * b] = sum of param^2, partials[2 * b + 1] = sum of grad^2 over block b's elements.
__global__ void __launch_bounds__(kBlockThreads)
    lars_partials(std::int64_t n, const float* param, const float* grad, double* partials) {
  __shared__ double param_sums[kBlockThreads];
  __shared__ double grad_sums[kBlockThreads];
  double p2 = 0, g2 = 0;
  for (std::int64_t i = thread_index(); i < n; i += grid_threads()) {
    const double p = param[i], g = grad[i];
    p2 += p * p;
    g2 += g * g;
  }
  param_sums[threadIdx.x] = p2;
  grad_sums[threadIdx.x] = g2;
  block_tree_sum(param_sums, grad_sums);  // kernels/cuda/block_reduce.cuh: a fixed tree
  if (threadIdx.x == 0) {
    partials[2 * blockIdx.x] = param_sums[0];
    partials[2 * blockIdx.x + 1] = grad_sums[0];
  }
}

// One block: adds the `blocks` partial pairs and writes *scaled_lr = float(lr * trust).
__global__ void __launch_bounds__(kBlockThreads)
    lars_trust(unsigned blocks, const double* partials, double lr, double eta,
               double weight_decay, float* scaled_lr) {
  __shared__ double param_sums[kBlockThreads];
  __shared__ double grad_sums[kBlockThreads];
  double p2 = 0, g2 = 0;
  for (unsigned b = threadIdx.x; b < blocks; b += kBlockThreads) {
    p2 += partials[2 * b];
    g2 += partials[2 * b + 1];
  }
  param_sums[threadIdx.x] = p2;
  grad_sums[threadIdx.x] = g2;
  block_tree_sum(param_sums, grad_sums);
  if (threadIdx.x == 0) {
    const double param_norm = sqrt(param_sums[0]), grad_norm = sqrt(grad_sums[0]);
    const double trust = param_norm > 0 && grad_norm > 0
                             ? eta * param_norm / (grad_norm + weight_decay * param_norm)
                             : 1.0;
    *scaled_lr = float(lr * trust);
  }
}

__global__ void lars_update(std::int64_t n, const float* scaled_lr_at, float weight_decay,
                            float momentum, float* param, const float* grad,
                            float* momentum_buffer) {
  const float scaled_lr = *scaled_lr_at;
  for (std::int64_t i = thread_index(); i < n; i += grid_threads()) {
    const float p = param[i];
    const float buf = momentum * momentum_buffer[i] + scaled_lr * (grad[i] + weight_decay * p);
    momentum_buffer[i] = buf;
    param[i] = p - buf;
  }
}

}  // namespace

void sgd_step(const StreamHandle& s, std::int64_t n, const SgdOptions& o, bool first_step,
              float* param, const float* grad, float* momentum_buffer) {
  SgdCoefficients c{};
  c.lr = float(o.lr);
  c.weight_decay = float(o.weight_decay);
  c.momentum = float(o.momentum);
  c.one_minus_dampening = float(1 - o.dampening);
  c.nesterov = o.nesterov;
  c.first_step = first_step;
  if (o.momentum == 0) {
    launch_grid_stride("sgd_step", s, n, sgd_kernel<SgdKind::kPlain>, n, c, param, grad,
                       momentum_buffer);
  } else if (o.delay > 0) {  // spike compensation (kernels/optim.hpp)
    const CompensatedMomentum spike = compensated_momentum(o);
    c.velocity_weight = float(spike.velocity_weight);
    c.gradient_weight = float(spike.gradient_weight);
    launch_grid_stride("sgd_step", s, n, sgd_kernel<SgdKind::kCompensated>, n, c, param, grad,
                       momentum_buffer);
  } else {
    launch_grid_stride("sgd_step", s, n, sgd_kernel<SgdKind::kMomentum>, n, c, param, grad,
                       momentum_buffer);
  }
}

void adam_step(const StreamHandle& s, std::int64_t n, const AdamOptions& o, std::int64_t step,
               float* param, const float* grad, float* exp_avg, float* exp_avg_sq) {
  const double bias_correction1 = 1 - std::pow(o.beta1, double(step));
  const double bias_correction2 = 1 - std::pow(o.beta2, double(step));
  const AdamCoefficients c{float(o.lr / bias_correction1),
                           float(1 / std::sqrt(bias_correction2)),
                           float(o.weight_decay),
                           float(1 - o.beta1),
                           float(o.beta2),
                           float(1 - o.beta2),
                           float(o.eps)};
  launch_grid_stride("adam_step", s, n, adam_kernel, n, c, param, grad, exp_avg, exp_avg_sq);
}

void lars_step(const StreamHandle& s, std::int64_t n, const LarsOptions& o, float* param,
               const float* grad, float* momentum_buffer) {
  if (n <= 0) return;
  const unsigned blocks = std::min(cuda_detail::grid_stride_blocks(std::size_t(n)),
                                   kMaxPartialBlocks);
  // Scratch: the partial pairs (doubles), then the scaled learning rate.
  auto* partials = static_cast<double*>(s.scratch((2 * std::size_t(blocks) + 1) * sizeof(double)));
  auto* scaled_lr = reinterpret_cast<float*>(partials + 2 * blocks);
  launch_blocks("lars_partials", s, blocks, kBlockThreads, lars_partials, n, param, grad, partials);
  launch_blocks("lars_trust", s, 1, kBlockThreads, lars_trust, blocks, partials, o.lr, o.eta,
                o.weight_decay, scaled_lr);
  launch_grid_stride("lars_step", s, n, lars_update, n, scaled_lr, float(o.weight_decay),
                     float(o.momentum), param, grad, momentum_buffer);
}

}  // namespace petra::kernels::cuda
