// kernels/cuda_libraries.hpp: NVIDIA's libraries as alternatives to three of petra's CUDA families:
// the linear layer's three matrix products on cuBLAS (kernels::cublas), and the convolution and
// batch norm on cuDNN (kernels::cudnn). Same contracts as the families' ref:: (kernels/linear.hpp,
// kernels/conv2d.hpp, kernels/batchnorm.hpp: which outputs are "=" and which "+="), float, device
// pointers, launched on s.cuda_stream of device s.device_index.
//
// Who calls them: petra/ops.cpp, the one dispatch point. With cuBLAS in the build, linear layers on
// a GPU always run on cuBLAS (the hand-written kernel stays for builds without it and for the CPU
// emulation, which cannot run a library). cuDNN runs only when asked at run time
// (petra::set_conv_impl(ConvImpl::cudnn), petra-train --conv-impl cudnn): it is a fallback and the
// speed anchor of bench-cuda.
//
// Handles: one cuBLAS and one cuDNN handle per (device, stream), made on first use under a mutex,
// bound to their stream once (cublasSetStream / cudnnSetStream) and kept for the life of the process
// (destroying them at exit could run after the CUDA runtime has gone). One handle per stream is
// what cuBLAS documents for bit-reproducible results when several streams run at once.
//
// Determinism (docs/gpu-kernels.md, "cuBLAS and cuDNN"): cuBLAS's GEMMs give the same bits on every
// run on one GPU model and one library version (atomics are left off, its default). cuDNN's
// convolution algorithms are chosen by cuDNN's heuristics (cudnnGet*Algorithm_v7, which times
// nothing), keeping the first one that cuDNN reports CUDNN_DETERMINISTIC and that fits the workspace,
// then cached per shape: the same shape gets the same algorithm in every run. Batch norm uses
// CUDNN_BATCHNORM_SPATIAL (not the _PERSISTENT variant, which may use atomics).
//
// Checked only by the cuda test suite on a GPU (tests/cuda/test_cuda_libraries.cpp): no library
// call can run under the CPU emulation. Compiled here without a GPU: compile-checked only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "petra/config.hpp"
#include "petra/kernels/batchnorm.hpp"
#include "petra/kernels/common.hpp"
#include "petra/kernels/conv2d.hpp"
#include "petra/kernels/linear.hpp"

namespace petra::kernels {

#if PETRA_HAVE_CUDA && PETRA_HAVE_CUBLAS
// kernels/cuda/cublas_linear.cpp. The bias gradient has no cuBLAS version: cuda::linear_backward_bias
// (a column sum) is already deterministic and memory-bound. Sizes beyond cuBLAS's int arguments run
// the hand-written kernel instead.
namespace cublas {

void linear_forward(const StreamHandle& s, const LinearShape& shape, const float* x,
                    const float* w, const float* bias, float* y);
void linear_backward_data(const StreamHandle& s, const LinearShape& shape, const float* dy,
                          const float* w, float* dx);
void linear_backward_weight(const StreamHandle& s, const LinearShape& shape, const float* x,
                            const float* dy, float* dw);

}  // namespace cublas
#endif

#if PETRA_HAVE_CUDA && PETRA_HAVE_CUDNN
// kernels/cuda/cudnn_conv2d.cpp and cudnn_batchnorm.cpp. The convolution's workspace comes from
// s.workspace (petra's allocator, tag "workspace", on the op's stream) when the stream has one; with
// none, only algorithms that need no workspace are considered. The three passes follow
// cuda::conv2d_math() as petra's kernels do (TF32 on the tensor cores when tf32, else FP32
// multiply-adds only: CUDNN_FMA_MATH).
// The bias gradient stays cuda::conv2d_backward_bias (petra's deterministic column sum).
namespace cudnn {

void conv2d_forward(const StreamHandle& s, const Conv2dShape& shape, const float* x,
                    const float* w, const float* bias, float* y);
void conv2d_backward_data(const StreamHandle& s, const Conv2dShape& shape, const float* dy,
                          const float* w, float* dx);
void conv2d_backward_weight(const StreamHandle& s, const Conv2dShape& shape, const float* x,
                            const float* dy, float* dw);

// The algorithm conv2d_<pass> uses for `shape` (cuDNN's enum value) and the workspace bytes it
// asks, as cached: for the benchmark's table and the tests. pass: 0 forward, 1 data, 2 weight.
struct Conv2dAlgorithm {
  int algorithm = -1;
  std::size_t workspace_bytes = 0;
  int math_type = 0;          // cudnnMathType_t the call runs under (CUDNN_FMA_MATH: no TF32)
};
Conv2dAlgorithm conv2d_algorithm(const StreamHandle& s, const Conv2dShape& shape, int pass);

// How the three passes choose their algorithm, for the whole process (petra::set_cudnn_algorithms):
// false (the default): cuDNN's heuristics, the first deterministic algorithm, nothing timed;
// true: cudnnFind* times every algorithm on a shape's first call and the fastest is kept,
// deterministic or not (PyTorch's cudnn.benchmark). A choice is cached under the mode it was made in.
void set_conv2d_fastest_algorithms(bool fastest);
bool conv2d_fastest_algorithms();

// Batch norm, with petra's semantics (kernels/batchnorm.hpp) mapped onto cuDNN's:
//   momentum -> exponentialAverageFactor (both: new = (1 - m) old + m batch);
//   the running variance is updated with the unbiased batch variance by both;
//   saved_invstd is cuDNN's resultSaveInvVariance, which is 1 / sqrt(var + eps);
//   dgamma and dbeta accumulate (betaParamDiff = 1), dx is assigned (betaDataDiff = 0).
// Differences: running_mean and running_var must both be given or both be nullptr (cuDNN updates
// both or neither; petra's ops always pass both or neither), else ValueError; the backward uses the
// saved mean and invstd, so it needs no epsilon (cuDNN's argument gets 1e-5, unused).
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

// Batch norm + ReLU (kernels/batchnorm.hpp's batchnorm_relu_*): cuDNN's batch norm, then petra's
// element-wise relu in place (kernels::cuda::relu); the backward masks dy with petra's
// relu_backward into s.workspace (4 bytes per value) and runs cuDNN's backward on it. Not fused:
// cuDNN's own BN + activation (cudnnBatchNormalizationForwardTrainingEx with
// CUDNN_BATCHNORM_OPS_BN_ACTIVATION) is documented for NHWC half-precision tensors with
// CUDNN_BATCHNORM_SPATIAL_PERSISTENT only, and petra's are NCHW float (docs/decisions.md).
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

}  // namespace cudnn
#endif

}  // namespace petra::kernels
