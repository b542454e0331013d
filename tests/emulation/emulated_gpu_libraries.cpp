// tests/emulation/emulated_gpu_libraries.cpp: the emulated device's stand-ins for cuBLAS and cuDNN
// (kernels/cuda_libraries.hpp). petra/ops.cpp's object, taken from petra-core as it is, calls
// kernels::cublas and kernels::cudnn where the build has them; the emulated device has neither
// library (no library call can run on the CPU emulation), so here
//   - kernels::cublas:: runs petra's hand-written linear kernels (kernels::cuda::, emulated): what
//     a build without cuBLAS runs, so the emulated device trains exactly as before;
//   - kernels::cudnn:: throws DeviceError: --conv-impl cudnn on the emulated device is refused at the
//     first convolution or batch norm, as a GPU without cuDNN would be.
#include "petra/config.hpp"
#include "petra/error.hpp"
#include "petra/kernels/cuda_libraries.hpp"

namespace petra::kernels {

#if PETRA_HAVE_CUDA && PETRA_HAVE_CUBLAS
namespace cublas {

void linear_forward(const StreamHandle& s, const LinearShape& shape, const float* x, const float* w,
                    const float* bias, float* y) {
  cuda::linear_forward(s, shape, x, w, bias, y);
}
void linear_backward_data(const StreamHandle& s, const LinearShape& shape, const float* dy, const float* w,
                          float* dx) {
  cuda::linear_backward_data(s, shape, dy, w, dx);
}
void linear_backward_weight(const StreamHandle& s, const LinearShape& shape, const float* x, const float* dy,
                            float* dw) {
  cuda::linear_backward_weight(s, shape, x, dy, dw);
}

}  // namespace cublas
#endif

#if PETRA_HAVE_CUDA && PETRA_HAVE_CUDNN
namespace cudnn {
namespace {
[[noreturn]] void no_cudnn(const char* op) {
  throw DeviceError(detail::concat("cudnn::", op, ": cuDNN cannot run on the emulated GPU (--conv-impl cudnn needs a "
                                   "real one)"));
}
}  // namespace

void conv2d_forward(const StreamHandle&, const Conv2dShape&, const float*, const float*, const float*, float*) {
  no_cudnn("conv2d_forward");
}
void conv2d_backward_data(const StreamHandle&, const Conv2dShape&, const float*, const float*, float*) {
  no_cudnn("conv2d_backward_data");
}
void conv2d_backward_weight(const StreamHandle&, const Conv2dShape&, const float*, const float*, float*) {
  no_cudnn("conv2d_backward_weight");
}
Conv2dAlgorithm conv2d_algorithm(const StreamHandle&, const Conv2dShape&, int) { no_cudnn("conv2d_algorithm"); }
// The setting alone (no algorithm is ever chosen here): the option parses and reads back as on a GPU.
namespace {
bool fastest_algorithms = false;
}  // namespace
void set_conv2d_fastest_algorithms(bool fastest) { fastest_algorithms = fastest; }
bool conv2d_fastest_algorithms() { return fastest_algorithms; }
void batchnorm_forward_train(const StreamHandle&, const BatchNormShape&, double, double, const float*, const float*,
                             const float*, float*, float*, float*, float*, float*) {
  no_cudnn("batchnorm_forward_train");
}
void batchnorm_forward_eval(const StreamHandle&, const BatchNormShape&, double, const float*, const float*,
                            const float*, const float*, const float*, float*) {
  no_cudnn("batchnorm_forward_eval");
}
void batchnorm_backward(const StreamHandle&, const BatchNormShape&, const float*, const float*, const float*,
                        const float*, const float*, float*, float*, float*) {
  no_cudnn("batchnorm_backward");
}
void batchnorm_relu_forward_train(const StreamHandle&, const BatchNormShape&, double, double, const float*,
                                  const float*, const float*, float*, float*, float*, float*, float*) {
  no_cudnn("batchnorm_relu_forward_train");
}
void batchnorm_relu_forward_eval(const StreamHandle&, const BatchNormShape&, double, const float*, const float*,
                                 const float*, const float*, const float*, float*) {
  no_cudnn("batchnorm_relu_forward_eval");
}
void batchnorm_relu_backward(const StreamHandle&, const BatchNormShape&, const float*, const float*, const float*,
                             const float*, const float*, const float*, float*, float*, float*) {
  no_cudnn("batchnorm_relu_backward");
}

}  // namespace cudnn
#endif

}  // namespace petra::kernels
