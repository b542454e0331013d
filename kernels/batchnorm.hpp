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
// cpu:: gives each thread a contiguous run of samples and walks memory in order, two passes (sums,
// then the output); its training forward and backward need s.workspace (3 samples' worth of floats
// per thread).
//
// Batch norm fused with the ReLU that follows it (every BN of the RevNet/ResNet blocks but the
// last one of a bottleneck/basic residual branch, nn/blocks.cpp): y = max(0, BN(x)), same
// arguments as the plain kernels, and the same workspace. The ReLU costs nothing extra: it is
// applied in the pass that writes y, and its derivative in the passes that read dy.
//   forward: y = relu(gamma * xhat + beta), relu(v) = v < 0 ? 0 : v (kernels/elementwise.hpp's: NaN
//            passes through);
//   backward: dy_bn = y > 0 ? dy : 0 (relu'(0) = 0 as in PyTorch), then batch norm's backward with
//            dy_bn. The mask is read from the fused op's own output y, not recomputed from x and
//            the statistics: y is kept anyway (it is the next convolution's input, which keeps it
//            for its weight gradient), so the mask costs no memory, and it is exactly the forward's
//            sign, whatever the backend's rounding or FMA contraction.
// Every backend evaluates the same expressions, in the same order, as its plain batch norm
// followed by its relu (and its relu_backward followed by its batch norm backward), so the fusion
// removes a pass over memory and a tensor and is meant to change no number (tests/cpu/
// test_batchnorm.cpp checks cpu:: and ref:: for bit identity with the unfused composition).
//
// Batch norm + ReLU fused into the additive coupling of a reversible stage (batchnorm_relu_coupling_*):
// F ends with batch norm + ReLU, and its output f = relu(BN(z)) is only ever added to, or
// subtracted from, the other stream (kernels/coupling.hpp). The fused op never stores f: the pass
// that would write it writes the coupling's output instead,
//   forward (a = x):  out1 = a2 + f,  out2 = a1      (y of the coupling)
//   inverse (a = y):  out1 = a2,      out2 = a1 - f  (x of the coupling)
// where z is (batch, C, H, W), F's last convolution's output, and a, out are (batch, 2C, H, W)
// (stream 1 = channels [0, C), stream 2 = [C, 2C)). Per value it reads z and both streams of a and
// writes both of out; the unfused pair also writes f and reads it back (8 bytes per value of f).
// It has no backward: it serves the passes that keep no graph (a pipelined stage's forward, and the
// inverse of a stage group), where f is needed for nothing else. Statistics, running statistics
// and the workspace are as batchnorm_relu_forward_train/_eval, and every backend evaluates the
// same expressions in the same order as its batchnorm_relu_forward_* followed by its coupling, so
// the result is the same bits (tests/cpu/test_batchnorm.cpp, tests/emulation/).
#pragma once

#include <cstdint>

#include "petra/config.hpp"
#include "petra/kernels/common.hpp"
#include "petra/kernels/coupling.hpp"
#include "petra/kernels/host_device.hpp"

namespace petra::kernels {

struct BatchNormShape {
  std::int64_t batch = 0, channels = 0, height = 0, width = 0;
  // Floats from one sample of the backward's dy to the next, 0 for packed: dy may then be a channel
  // slice of a wider tensor (the coupling hands F its stream of the gradient that way). ref:: and
  // cpu:: honour it; the CUDA kernels require 0 (ops packs dy for them).
  std::int64_t dy_image_stride = 0;

  std::int64_t dy_sample_stride() const { return dy_image_stride ? dy_image_stride : channels * height * width; }
  std::int64_t plane() const { return height * width; }
  std::int64_t values_per_channel() const { return batch * height * width; }
  std::int64_t size() const { return batch * channels * height * width; }
};

// The fused ReLU, shared by every backend's forward: max(v, 0) with NaN passed through and -0
// kept, as kernels/elementwise.hpp's relu.
template <class T>
PETRA_HOST_DEVICE inline T relu_of(T v) {
  return v < T(0) ? T(0) : v;
}

// The fused ReLU's derivative applied to dy, from the forward's output y: dy where y > 0, else 0.
template <class T>
PETRA_HOST_DEVICE inline T relu_masked(T y, T dy) {
  return y > T(0) ? dy : T(0);
}

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

// Batch norm then ReLU, fused (see the top of this file). Training forward: y =, saved_mean =,
// saved_invstd =, running statistics as batchnorm_forward_train.
template <class T>
void batchnorm_relu_forward_train(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                  double momentum, const T* x, const T* gamma, const T* beta,
                                  T* y, T* saved_mean, T* saved_invstd, T* running_mean,
                                  T* running_var);

// Evaluation forward of the fused op. y =.
template <class T>
void batchnorm_relu_forward_eval(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                 const T* x, const T* gamma, const T* beta, const T* running_mean,
                                 const T* running_var, T* y);

// Backward of the fused op; y is the fused forward's output (the ReLU mask). dx =, dgamma +=,
// dbeta +=.
template <class T>
void batchnorm_relu_backward(const StreamHandle& s, const BatchNormShape& shape, const T* x,
                             const T* y, const T* dy, const T* gamma, const T* saved_mean,
                             const T* saved_invstd, T* dx, T* dgamma, T* dbeta);

// The two backwards that also add the per-channel sum of dx into dx_sum: the gradient of a bias
// added to x upstream (the convolution that produced x: ops::batchnorm*_backward's dx_sum), taken
// while dx is written instead of in a pass of its own. dx =, dgamma +=, dbeta +=, dx_sum +=.
template <class T>
void batchnorm_backward_summed(const StreamHandle& s, const BatchNormShape& shape, const T* x,
                               const T* dy, const T* gamma, const T* saved_mean,
                               const T* saved_invstd, T* dx, T* dgamma, T* dbeta, T* dx_sum);
template <class T>
void batchnorm_relu_backward_summed(const StreamHandle& s, const BatchNormShape& shape, const T* x,
                                    const T* y, const T* dy, const T* gamma, const T* saved_mean,
                                    const T* saved_invstd, T* dx, T* dgamma, T* dbeta, T* dx_sum);

// Batch norm + ReLU fused into the coupling (see the top of this file). z: (batch, C, H, W) as
// `shape`; a, out: (batch, 2C, H, W). Training: out =, saved_mean =, saved_invstd =, running
// statistics as batchnorm_relu_forward_train.
template <class T>
void batchnorm_relu_coupling_train(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                   double momentum, CouplingDirection direction, const T* z,
                                   const T* gamma, const T* beta, const T* a, T* out,
                                   T* saved_mean, T* saved_invstd, T* running_mean,
                                   T* running_var);
// Evaluation, with the running statistics. out =.
template <class T>
void batchnorm_relu_coupling_eval(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                  CouplingDirection direction, const T* z, const T* gamma,
                                  const T* beta, const T* running_mean, const T* running_var,
                                  const T* a, T* out);

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

void batchnorm_relu_forward_train(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                  double momentum, const float* x, const float* gamma,
                                  const float* beta, float* y, float* saved_mean,
                                  float* saved_invstd, float* running_mean, float* running_var);

void batchnorm_relu_forward_eval(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                 const float* x, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, float* y);

void batchnorm_relu_backward(const StreamHandle& s, const BatchNormShape& shape, const float* x,
                             const float* y, const float* dy, const float* gamma,
                             const float* saved_mean, const float* saved_invstd, float* dx,
                             float* dgamma, float* dbeta);

void batchnorm_backward_summed(const StreamHandle& s, const BatchNormShape& shape, const float* x,
                               const float* dy, const float* gamma, const float* saved_mean,
                               const float* saved_invstd, float* dx, float* dgamma, float* dbeta,
                               float* dx_sum);

// The fused batch norm + ReLU with its ReLU mask taken from x instead of y (cpu:: only). The
// training forward also writes the per-channel map it applied, affine[3c], [3c + 1], [3c + 2] =
// the float mean, scale and bias with y = relu(fma(x - mean, scale, bias)); the backward takes it
// in place of y and applies it to x again, which gives the forward's bits and so its mask, and
// reads two tensors per value instead of three in each of its two passes. dx_sum may be nullptr
// (as batchnorm_relu_backward) or not (as batchnorm_relu_backward_summed). The backward takes 5
// samples' worth of s.workspace per thread (the mean, scale and bias per position beside its two
// sums), the forward 3 as the others.
void batchnorm_relu_forward_train_mapped(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                         double momentum, const float* x, const float* gamma, const float* beta,
                                         float* y, float* saved_mean, float* saved_invstd, float* running_mean,
                                         float* running_var, float* affine);
void batchnorm_relu_backward_mapped(const StreamHandle& s, const BatchNormShape& shape, const float* x,
                                    const float* affine, const float* dy, const float* gamma,
                                    const float* saved_mean, const float* saved_invstd, float* dx, float* dgamma,
                                    float* dbeta, float* dx_sum);
// The coupling fused with the training forward (batchnorm_relu_coupling_train, same bits) that also
// writes the map it applied, as batchnorm_relu_forward_train_mapped: for a graph that keeps z, whose
// batch norm backward (batchnorm_relu_backward_mapped) then needs neither F's output nor y.
void batchnorm_relu_coupling_train_mapped(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                          double momentum, CouplingDirection direction, const float* z,
                                          const float* gamma, const float* beta, const float* a, float* out,
                                          float* saved_mean, float* saved_invstd, float* running_mean,
                                          float* running_var, float* affine);
void batchnorm_relu_backward_summed(const StreamHandle& s, const BatchNormShape& shape,
                                    const float* x, const float* y, const float* dy,
                                    const float* gamma, const float* saved_mean,
                                    const float* saved_invstd, float* dx, float* dgamma,
                                    float* dbeta, float* dx_sum);

void batchnorm_relu_coupling_train(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                   double momentum, CouplingDirection direction, const float* z,
                                   const float* gamma, const float* beta, const float* a,
                                   float* out, float* saved_mean, float* saved_invstd,
                                   float* running_mean, float* running_var);
void batchnorm_relu_coupling_eval(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                  CouplingDirection direction, const float* z, const float* gamma,
                                  const float* beta, const float* running_mean,
                                  const float* running_var, const float* a, float* out);

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

// The fused batch norm + ReLU: the same kernels with the ReLU in the element-wise pass of the
// forward, and the mask y > 0 applied to dy where the backward's sums and its dx pass read it.

void batchnorm_relu_forward_train(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                  double momentum, const float* x, const float* gamma,
                                  const float* beta, float* y, float* saved_mean,
                                  float* saved_invstd, float* running_mean, float* running_var);

void batchnorm_relu_forward_eval(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                 const float* x, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, float* y);

void batchnorm_relu_backward(const StreamHandle& s, const BatchNormShape& shape, const float* x,
                             const float* y, const float* dy, const float* gamma,
                             const float* saved_mean, const float* saved_invstd, float* dx,
                             float* dgamma, float* dbeta);

// The summed backwards: the backward, then conv2d_backward_bias's reduction over dx (no fused
// kernel on the GPU yet).
void batchnorm_backward_summed(const StreamHandle& s, const BatchNormShape& shape, const float* x,
                               const float* dy, const float* gamma, const float* saved_mean,
                               const float* saved_invstd, float* dx, float* dgamma, float* dbeta,
                               float* dx_sum);
void batchnorm_relu_backward_summed(const StreamHandle& s, const BatchNormShape& shape,
                                    const float* x, const float* y, const float* dy,
                                    const float* gamma, const float* saved_mean,
                                    const float* saved_invstd, float* dx, float* dgamma,
                                    float* dbeta, float* dx_sum);

void batchnorm_relu_coupling_train(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                   double momentum, CouplingDirection direction, const float* z,
                                   const float* gamma, const float* beta, const float* a,
                                   float* out, float* saved_mean, float* saved_invstd,
                                   float* running_mean, float* running_var);
void batchnorm_relu_coupling_eval(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                  CouplingDirection direction, const float* z, const float* gamma,
                                  const float* beta, const float* running_mean,
                                  const float* running_var, const float* a, float* out);

// Whether the training forward and the backward take the one-pass kernels where a channel fits in
// the shared memory of a thread-block cluster (kernels/cuda/batchnorm.cu, "One pass"): one read of
// x (and dy) instead of two. Off by default until a GPU has timed it; benchmarks time both. The
// statistics are summed in another order than the two passes', so the bits may differ in the last
// place (each path is deterministic).
void set_batchnorm_one_pass(bool on);
bool batchnorm_one_pass();
// The blocks per thread-block cluster that batch norm's one pass takes for `shape` on s's device
// (the training forward, or with `backward` the backward; tensors 16-byte aligned), or 0 where
// the two passes run (the setting off, no cluster that fits, kernels compiled below sm_90). For
// tests and benchmarks: that the one pass really ran, and in what clusters.
int batchnorm_one_pass_cluster(const StreamHandle& s, const BatchNormShape& shape, bool backward);

}  // namespace cuda
#endif

}  // namespace petra::kernels
