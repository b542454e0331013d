// kernels/cuda/cudnn_batchnorm.cpp: batch norm on cuDNN (kernels/cuda_libraries.hpp,
// kernels::cudnn::batchnorm_*), the run-time alternative to kernels/cuda/batchnorm.cu
// (--conv-impl cudnn switches both the convolution and the batch norm).
//
// cuDNN's per-channel ("spatial") batch norm over NCHW is petra's (kernels/batchnorm.hpp), term by
// term:
//   petra                                   cuDNN (CUDNN_BATCHNORM_SPATIAL)
//   mean, biased var normalise x            the same
//   running = (1 - momentum) running        exponentialAverageFactor = momentum: the same formula
//             + momentum * batch
//   running_var gets the unbiased variance  the same (n / (n - 1), as PyTorch on cuDNN)
//   saved_invstd = 1 / sqrt(var + eps)      resultSaveInvVariance: the same quantity
//   dgamma +=, dbeta +=, dx =               alphaParamDiff = 1, betaParamDiff = 1; betaDataDiff = 0
// Differences, documented in the header: the running statistics are updated both or neither; the
// backward takes the saved mean and invstd, so cuDNN's epsilon argument there (1e-5) is unused.
// Sums in float inside cuDNN where petra's kernels sum in double: results agree to float rounding of
// an n-term sum, not bit for bit. CUDNN_BATCHNORM_SPATIAL, not _PERSISTENT (which may use atomics).
//
// Batch norm + ReLU (batchnorm_relu_*) is cuDNN's batch norm followed by petra's relu kernels on
// the same stream, not one fused pass: cuDNN's fused BN + activation
// (cudnnBatchNormalizationForwardTrainingEx, CUDNN_BATCHNORM_OPS_BN_ACTIVATION) applies to NHWC
// half-precision tensors with the _PERSISTENT mode, none of which petra uses.
#include <cudnn.h>

#include "petra/error.hpp"
#include "petra/kernels/elementwise.hpp"
#include "petra/kernels/cuda/cudnn_common.hpp"
#include "petra/kernels/cuda_libraries.hpp"

namespace petra::kernels::cudnn {
namespace {

using cudnn_detail::TensorDescriptor;

constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL;
// cuDNN wants the backward's epsilon; with the saved statistics given it does not use it.
constexpr double kBackwardEpsilon = 1e-5;

// x's descriptor and the per-channel one cuDNN derives from it (1, C, 1, 1).
struct BatchNormDescriptors {
  TensorDescriptor data;
  TensorDescriptor per_channel;
  BatchNormDescriptors(const BatchNormShape& k, const char* op)
      : data(k.batch, k.channels, k.height, k.width, op), per_channel(1, k.channels, 1, 1, op) {}
};

}  // namespace

void batchnorm_forward_train(const StreamHandle& s, const BatchNormShape& shape, double eps, double momentum,
                             const float* x, const float* gamma, const float* beta, float* y, float* saved_mean,
                             float* saved_invstd, float* running_mean, float* running_var) {
  const char* op = "cudnn::batchnorm_forward_train";
  PETRA_CHECK((running_mean == nullptr) == (running_var == nullptr), ValueError, op,
              ": cuDNN updates both running statistics or neither; give both or neither");
  PETRA_CHECK(eps >= CUDNN_BN_MIN_EPSILON, ValueError, op, ": eps ", eps, " is below cuDNN's minimum ",
              CUDNN_BN_MIN_EPSILON);
  if (shape.size() == 0) return;
  cuda_detail::DeviceGuard guard(s.device_index);
  const BatchNormDescriptors d(shape, op);
  const float one = 1.0f, zero = 0.0f;
  PETRA_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
      cudnn_detail::handle_for(s), kMode, &one, &zero, d.data.get(), x, d.data.get(), y, d.per_channel.get(), gamma,
      beta, momentum, running_mean, running_var, eps, saved_mean, saved_invstd));
}

void batchnorm_forward_eval(const StreamHandle& s, const BatchNormShape& shape, double eps, const float* x,
                            const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, float* y) {
  const char* op = "cudnn::batchnorm_forward_eval";
  PETRA_CHECK(eps >= CUDNN_BN_MIN_EPSILON, ValueError, op, ": eps ", eps, " is below cuDNN's minimum ",
              CUDNN_BN_MIN_EPSILON);
  if (shape.size() == 0) return;
  cuda_detail::DeviceGuard guard(s.device_index);
  const BatchNormDescriptors d(shape, op);
  const float one = 1.0f, zero = 0.0f;
  PETRA_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(cudnn_detail::handle_for(s), kMode, &one, &zero,
                                                            d.data.get(), x, d.data.get(), y, d.per_channel.get(),
                                                            gamma, beta, running_mean, running_var, eps));
}

void batchnorm_backward(const StreamHandle& s, const BatchNormShape& shape, const float* x, const float* dy,
                        const float* gamma, const float* saved_mean, const float* saved_invstd, float* dx,
                        float* dgamma, float* dbeta) {
  if (shape.size() == 0) return;
  cuda_detail::DeviceGuard guard(s.device_index);
  const BatchNormDescriptors d(shape, "cudnn::batchnorm_backward");
  const float one = 1.0f, zero = 0.0f;
  PETRA_CUDNN_CHECK(cudnnBatchNormalizationBackward(cudnn_detail::handle_for(s), kMode, &one, &zero, &one, &one,
                                                    d.data.get(), x, d.data.get(), dy, d.data.get(), dx,
                                                    d.per_channel.get(), gamma, dgamma, dbeta, kBackwardEpsilon,
                                                    saved_mean, saved_invstd));
}

void batchnorm_relu_forward_train(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                  double momentum, const float* x, const float* gamma,
                                  const float* beta, float* y, float* saved_mean,
                                  float* saved_invstd, float* running_mean, float* running_var) {
  batchnorm_forward_train(s, shape, eps, momentum, x, gamma, beta, y, saved_mean, saved_invstd,
                          running_mean, running_var);
  cuda::relu(s, shape.size(), y, y);
}

void batchnorm_relu_forward_eval(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                 const float* x, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, float* y) {
  batchnorm_forward_eval(s, shape, eps, x, gamma, beta, running_mean, running_var, y);
  cuda::relu(s, shape.size(), y, y);
}

void batchnorm_relu_backward(const StreamHandle& s, const BatchNormShape& shape, const float* x,
                             const float* y, const float* dy, const float* gamma,
                             const float* saved_mean, const float* saved_invstd, float* dx,
                             float* dgamma, float* dbeta) {
  if (shape.size() == 0) return;
  // The masked gradient in the stream's workspace: cuDNN's backward takes no workspace of its own,
  // and the stream runs the two in order.
  auto* dy_masked = static_cast<float*>(s.scratch(std::size_t(shape.size()) * sizeof(float)));
  cuda::relu_backward(s, shape.size(), y, dy, dy_masked);
  batchnorm_backward(s, shape, x, dy_masked, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta);
}

}  // namespace petra::kernels::cudnn
