// kernels/batchnorm.hpp: 2-d batch normalisation over NCHW tensors, with PyTorch's semantics.
//
// For each channel c, the statistics run over the batch and the spatial positions, n = N*H*W values:
//   mean_c = (1/n) sum x,   var_c = (1/n) sum (x - mean_c)^2   (biased: used to normalise)
//   invstd_c = 1 / sqrt(var_c + eps)
//   y = gamma_c * (x - mean_c) * invstd_c + beta_c
// Training mode also moves the running statistics, with the UNBIASED variance as PyTorch does:
//   running_mean = (1 - momentum) * running_mean + momentum * mean_c
//   running_var  = (1 - momentum) * running_var  + momentum * var_c * n / (n - 1)
// Evaluation mode normalises with the running statistics instead.
//
// Backward (training mode, the statistics depend on x): with xhat = (x - mean) * invstd,
//   dbeta_c  += sum dy
//   dgamma_c += sum dy * xhat
//   dx = gamma_c * invstd_c * (dy - sum(dy)/n - xhat * sum(dy * xhat)/n)
// It takes the input x (a reversible network reconstructs it) and the mean and invstd saved by the
// training forward, so nothing is recomputed but the two per-channel sums.
//
// Layout: x, y, dy, dx are (batch, channels, height, width), contiguous. gamma, beta, dgamma,
// dbeta, running_mean, running_var, saved_mean, saved_invstd hold one value per channel.
// The callers pass eps = 1e-5 and momentum = 0.1 (PyTorch's defaults); training needs n > 1.
//
// cpu:: gives each thread a block of channels and walks memory in order, two passes (sums, then
// the output); its training forward and backward need s.workspace (3 samples' worth of floats).
#pragma once

#include <cstdint>

#include "petra/config.hpp"
#include "petra/kernels/common.hpp"

namespace petra::kernels {

struct BatchNormShape {
  std::int64_t batch = 0, channels = 0, height = 0, width = 0;

  std::int64_t plane() const { return height * width; }
  std::int64_t values_per_channel() const { return batch * height * width; }
  std::int64_t size() const { return batch * channels * height * width; }
};

namespace ref {

// Training forward. y =, saved_mean =, saved_invstd =; running_mean and running_var are updated
// in place (either may be nullptr: not updated).
template <class T>
void batchnorm_forward_train(const StreamHandle& s, const BatchNormShape& shape, double eps,
                             double momentum, const T* x, const T* gamma, const T* beta, T* y,
                             T* saved_mean, T* saved_invstd, T* running_mean, T* running_var);

// Evaluation forward with the running statistics. y =.
template <class T>
void batchnorm_forward_eval(const StreamHandle& s, const BatchNormShape& shape, double eps,
                            const T* x, const T* gamma, const T* beta, const T* running_mean,
                            const T* running_var, T* y);

// Training-mode backward. dx =, dgamma +=, dbeta +=.
template <class T>
void batchnorm_backward(const StreamHandle& s, const BatchNormShape& shape, const T* x,
                        const T* dy, const T* gamma, const T* saved_mean, const T* saved_invstd,
                        T* dx, T* dgamma, T* dbeta);

}  // namespace ref

namespace cpu {

void batchnorm_forward_train(const StreamHandle& s, const BatchNormShape& shape, double eps,
                             double momentum, const float* x, const float* gamma,
                             const float* beta, float* y, float* saved_mean, float* saved_invstd,
                             float* running_mean, float* running_var);

void batchnorm_forward_eval(const StreamHandle& s, const BatchNormShape& shape, double eps,
                            const float* x, const float* gamma, const float* beta,
                            const float* running_mean, const float* running_var, float* y);

void batchnorm_backward(const StreamHandle& s, const BatchNormShape& shape, const float* x,
                        const float* dy, const float* gamma, const float* saved_mean,
                        const float* saved_invstd, float* dx, float* dgamma, float* dbeta);

}  // namespace cpu

#if PETRA_HAVE_CUDA
// Same contracts as ref::, float, launched on s.cuda_stream; pointers are device memory
// (kernels/cuda/batchnorm.cu). The per-channel sums are a deterministic two-level reduction in
// double (per-block partials over fixed slices of each channel, then a fixed-order combine; no
// atomics), followed by an element-wise pass for y or dx. The training forward and the backward
// need s.workspace (16 bytes per channel and slice, at most 64 slices, and 12 bytes per channel).
namespace cuda {

void batchnorm_forward_train(const StreamHandle& s, const BatchNormShape& shape, double eps,
                             double momentum, const float* x, const float* gamma,
                             const float* beta, float* y, float* saved_mean, float* saved_invstd,
                             float* running_mean, float* running_var);

void batchnorm_forward_eval(const StreamHandle& s, const BatchNormShape& shape, double eps,
                            const float* x, const float* gamma, const float* beta,
                            const float* running_mean, const float* running_var, float* y);

void batchnorm_backward(const StreamHandle& s, const BatchNormShape& shape, const float* x,
                        const float* dy, const float* gamma, const float* saved_mean,
                        const float* saved_invstd, float* dx, float* dgamma, float* dbeta);

}  // namespace cuda
#endif

}  // namespace petra::kernels
