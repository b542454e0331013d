// tests/cuda/test_cuda_libraries.cpp: the cuda suite's checks of the cuBLAS and cuDNN glue
// (kernels/cuda_libraries.hpp) against kernels::ref, and of the run-time choice between petra's
// convolution and cuDNN's (petra/conv_impl.hpp).
//
// The GPU cases skip where there is no GPU (or no cuBLAS / cuDNN in the build); the first case, the
// setting's validation, runs everywhere. Tolerances are bounds, element by element, not guesses:
// a float sum of K terms in any order is within (K + 3) 2^-24 sum|terms| of the exact sum (FP32),
// and with TF32 inputs (10-bit mantissa, each product off by up to 2^-10 relative) within
// 2^-10 sum|terms| more; cuDNN's convolutions get 2^-14 sum|terms| more (Winograd and FFT
// algorithms, below). sum|terms| is ref:: run on |x|, |w| (|dy|): the same sum with no
// cancellation. Batch norm compares with a relative (norm-wise) error, stated per check.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "petra/config.hpp"
#include "petra/conv_impl.hpp"
#include "petra/cuda_backend.hpp"
#include "petra/device.hpp"
#include "petra/error.hpp"
#include "petra/kernels/batchnorm.hpp"
#include "petra/kernels/conv2d.hpp"
#include "petra/kernels/cuda/conv2d_tiling.cuh"
#include "petra/kernels/cuda_libraries.hpp"
#include "petra/kernels/linear.hpp"
#include "petra/ops.hpp"
#include "petra/stream.hpp"
#include "petra/tensor.hpp"
#include "tests/support/testing.hpp"

namespace cb = petra::cuda_backend;
using petra::kernels::StreamHandle;
using petra::testing::random_values;
using petra::testing::relative_error;

TEST_CASE("conv impl: the setting is checked and refuses cuDNN where the build has none") {
  CHECK(petra::conv_impl() == petra::ConvImpl::petra);  // the default
  CHECK(petra::parse_conv_impl("petra") == petra::ConvImpl::petra);
  CHECK(petra::parse_conv_impl("cudnn") == petra::ConvImpl::cudnn);
  CHECK_THROWS_WITH_AS(petra::parse_conv_impl("cuDNN"), doctest::Contains("--conv-impl cuDNN: expected petra or cudnn"),
                       petra::ValueError);
  CHECK(std::string(petra::name_of(petra::ConvImpl::cudnn)) == "cudnn");
  CHECK(petra::cudnn_compiled() == bool(PETRA_HAVE_CUDA && PETRA_HAVE_CUDNN));
  if (petra::cudnn_compiled()) {
    petra::set_conv_impl(petra::ConvImpl::cudnn);
    CHECK(petra::conv_impl() == petra::ConvImpl::cudnn);
  } else {
    CHECK_THROWS_WITH_AS(petra::set_conv_impl(petra::ConvImpl::cudnn), doctest::Contains("without cuDNN"),
                         petra::DeviceError);
    CHECK(petra::conv_impl() == petra::ConvImpl::petra);
  }
  petra::set_conv_impl(petra::ConvImpl::petra);
  CHECK(petra::conv_impl() == petra::ConvImpl::petra);
}

TEST_CASE("conv math: fp32 by default, tf32 where CUDA is built, the choice parsed and named") {
  CHECK(petra::conv_math() == petra::ConvMath::fp32);
  CHECK(petra::parse_conv_math("fp32") == petra::ConvMath::fp32);
  CHECK(petra::parse_conv_math("tf32") == petra::ConvMath::tf32);
  CHECK_THROWS_WITH_AS(petra::parse_conv_math("bf16"), doctest::Contains("--conv-math bf16: expected fp32 or tf32"),
                       petra::ValueError);
  CHECK(std::string(petra::name_of(petra::ConvMath::tf32)) == "tf32");
#if PETRA_HAVE_CUDA
  petra::set_conv_math(petra::ConvMath::tf32);
  CHECK(petra::conv_math() == petra::ConvMath::tf32);
  CHECK(petra::kernels::cuda::conv2d_math() == petra::kernels::cuda::Conv2dMath::tf32);  // what the kernels read
#else
  CHECK_THROWS_AS(petra::set_conv_math(petra::ConvMath::tf32), petra::DeviceError);
#endif
  // CPU tensors ignore it: the CPU kernels are FP32 whatever the setting.
  const auto x = petra::Tensor::uniform({1, 2, 4, 4}, 4, -1.0, 1.0), w = petra::Tensor::uniform({3, 2, 3, 3}, 5, -1.0, 1.0);
  const auto bias = petra::Tensor::uniform({3}, 6, -1.0, 1.0);
  const petra::Conv2dOptions o{1, 1};
  const std::vector<float> under_setting = petra::ops::conv2d_forward(x, w, bias, o).to_vector<float>();
  petra::set_conv_math(petra::ConvMath::fp32);
  CHECK(petra::ops::conv2d_forward(x, w, bias, o).to_vector<float>() == under_setting);
  CHECK(petra::conv_math() == petra::ConvMath::fp32);
}

TEST_CASE("conv weight algorithm: auto by default, winograd where CUDA is built, the choice parsed and named") {
  using petra::ConvWeightAlgorithm;
  CHECK(petra::conv_weight_algorithm() == ConvWeightAlgorithm::automatic);
  CHECK(petra::parse_conv_weight_algorithm("auto") == ConvWeightAlgorithm::automatic);
  CHECK(petra::parse_conv_weight_algorithm("direct") == ConvWeightAlgorithm::direct);
  CHECK(petra::parse_conv_weight_algorithm("winograd") == ConvWeightAlgorithm::winograd);
  CHECK_THROWS_WITH_AS(petra::parse_conv_weight_algorithm("fft"),
                       doctest::Contains("--conv-weight fft: expected auto, direct or winograd"), petra::ValueError);
  CHECK(std::string(petra::name_of(ConvWeightAlgorithm::automatic)) == "auto");
  CHECK(std::string(petra::name_of(ConvWeightAlgorithm::direct)) == "direct");
  CHECK(std::string(petra::name_of(ConvWeightAlgorithm::winograd)) == "winograd");
#if PETRA_HAVE_CUDA
  namespace cu = petra::kernels::cuda;
  // what the kernels read, for each choice
  for (const auto& [choice, kernels] : {std::pair{ConvWeightAlgorithm::winograd, cu::Conv2dWeightAlgorithm::winograd},
                                        std::pair{ConvWeightAlgorithm::direct, cu::Conv2dWeightAlgorithm::direct},
                                        std::pair{ConvWeightAlgorithm::automatic, cu::Conv2dWeightAlgorithm::automatic}}) {
    petra::set_conv_weight_algorithm(choice);
    CHECK(petra::conv_weight_algorithm() == choice);
    CHECK(cu::conv2d_weight_algorithm() == kernels);
  }
#else
  CHECK_THROWS_AS(petra::set_conv_weight_algorithm(ConvWeightAlgorithm::winograd), petra::DeviceError);
  petra::set_conv_weight_algorithm(ConvWeightAlgorithm::direct);  // accepted, and nothing to change
  CHECK(petra::conv_weight_algorithm() == ConvWeightAlgorithm::automatic);
#endif
}

TEST_CASE("conv forward algorithm: direct by default, winograd where CUDA is built, the choice parsed and named") {
  using petra::ConvForwardAlgorithm;
  CHECK(petra::conv_forward_algorithm() == ConvForwardAlgorithm::direct);
  CHECK(petra::parse_conv_forward_algorithm("direct") == ConvForwardAlgorithm::direct);
  CHECK(petra::parse_conv_forward_algorithm("winograd") == ConvForwardAlgorithm::winograd);
  CHECK(petra::parse_conv_forward_algorithm("auto") == ConvForwardAlgorithm::automatic);
  CHECK_THROWS_WITH_AS(petra::parse_conv_forward_algorithm("fft"),
                       doctest::Contains("--conv-forward fft: expected direct, winograd or auto"), petra::ValueError);
  CHECK(std::string(petra::name_of(ConvForwardAlgorithm::direct)) == "direct");
  CHECK(std::string(petra::name_of(ConvForwardAlgorithm::winograd)) == "winograd");
  CHECK(std::string(petra::name_of(ConvForwardAlgorithm::automatic)) == "auto");
#if PETRA_HAVE_CUDA
  namespace cu = petra::kernels::cuda;
  for (const auto& [choice, kernels] : {std::pair{ConvForwardAlgorithm::winograd, cu::Conv2dForwardAlgorithm::winograd},
                                        std::pair{ConvForwardAlgorithm::automatic, cu::Conv2dForwardAlgorithm::automatic},
                                        std::pair{ConvForwardAlgorithm::direct, cu::Conv2dForwardAlgorithm::direct}}) {
    petra::set_conv_forward_algorithm(choice);
    CHECK(petra::conv_forward_algorithm() == choice);
    CHECK(cu::conv2d_forward_algorithm() == kernels);
  }
#else
  CHECK_THROWS_AS(petra::set_conv_forward_algorithm(ConvForwardAlgorithm::winograd), petra::DeviceError);
  CHECK_THROWS_AS(petra::set_conv_forward_algorithm(ConvForwardAlgorithm::automatic), petra::DeviceError);
  petra::set_conv_forward_algorithm(ConvForwardAlgorithm::direct);
  CHECK(petra::conv_forward_algorithm() == ConvForwardAlgorithm::direct);
#endif
}

TEST_CASE("cudnn algorithms: deterministic by default, fastest where cuDNN is built, the choice parsed and named") {
  CHECK(petra::cudnn_algorithms() == petra::CudnnAlgorithms::deterministic);
  CHECK(petra::parse_cudnn_algorithms("deterministic") == petra::CudnnAlgorithms::deterministic);
  CHECK(petra::parse_cudnn_algorithms("fastest") == petra::CudnnAlgorithms::fastest);
  CHECK_THROWS_WITH_AS(petra::parse_cudnn_algorithms("fast"),
                       doctest::Contains("--cudnn-algorithms fast: expected deterministic or fastest"), petra::ValueError);
  CHECK(std::string(petra::name_of(petra::CudnnAlgorithms::fastest)) == "fastest");
  if (petra::cudnn_compiled()) {
    petra::set_cudnn_algorithms(petra::CudnnAlgorithms::fastest);
    CHECK(petra::cudnn_algorithms() == petra::CudnnAlgorithms::fastest);
  } else {
    CHECK_THROWS_WITH_AS(petra::set_cudnn_algorithms(petra::CudnnAlgorithms::fastest),
                         doctest::Contains("without cuDNN"), petra::DeviceError);
  }
  petra::set_cudnn_algorithms(petra::CudnnAlgorithms::deterministic);
  CHECK(petra::cudnn_algorithms() == petra::CudnnAlgorithms::deterministic);
}

TEST_CASE("conv impl: CPU tensors ignore the setting (there is no CPU cuDNN)") {
  if (!petra::cudnn_compiled()) return;  // the setting cannot be cudnn in this build
  const auto x = petra::Tensor::uniform({2, 3, 5, 5}, 1, -1.0, 1.0), w = petra::Tensor::uniform({4, 3, 3, 3}, 2, -1.0, 1.0);
  const auto bias = petra::Tensor::uniform({4}, 3, -1.0, 1.0);
  const petra::Conv2dOptions o{1, 1};
  const std::vector<float> with_petra = petra::ops::conv2d_forward(x, w, bias, o).to_vector<float>();
  petra::set_conv_impl(petra::ConvImpl::cudnn);
  const std::vector<float> with_cudnn_set = petra::ops::conv2d_forward(x, w, bias, o).to_vector<float>();
  petra::set_conv_impl(petra::ConvImpl::petra);
  CHECK(with_cudnn_set == with_petra);  // the same CPU kernel, the same bits
  CHECK(with_petra.size() == 2 * 4 * 5 * 5);
}

#if PETRA_HAVE_CUDA && (PETRA_HAVE_CUBLAS || PETRA_HAVE_CUDNN)

namespace {

const bool kNoGpu = !cb::available();

// n floats on device 0, uploaded from and downloaded to host vectors on `stream`.
class Buffer {
 public:
  explicit Buffer(const std::vector<float>& host, void* stream)
      : n_(host.size()), data_(static_cast<float*>(cb::malloc_device(std::max<std::size_t>(n_, 1) * 4, 0))) {
    if (n_ > 0) cb::memcpy_async(data_, host.data(), n_ * 4, stream);
  }
  ~Buffer() { cb::free_device(data_, 0); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* get() const { return data_; }
  std::vector<float> download(void* stream) const {
    std::vector<float> host(n_);
    if (n_ > 0) cb::memcpy_async(host.data(), data_, n_ * 4, stream);
    cb::stream_synchronize(stream);
    return host;
  }

 private:
  std::size_t n_;
  float* data_;
};

std::vector<float> absolute(std::vector<float> v) {
  for (float& e : v) e = std::fabs(e);
  return v;
}

// Elements where |got - expected| > factor * magnitude + 1e-30; magnitude = sum|terms| per element.
std::size_t outside_bound(const std::vector<float>& got, const std::vector<float>& expected,
                          const std::vector<float>& magnitude, double factor) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    bad += std::fabs(double(got[i]) - double(expected[i])) > factor * double(magnitude[i]) + 1e-30;
  return bad;
}

double fp32_factor(std::int64_t terms) { return double(terms + 3) * 0x1p-24; }
constexpr double kTf32Factor = 0x1p-10;
// cuDNN may choose a Winograd or FFT algorithm (deterministic ones are allowed): their transforms
// round intermediate values that a plain sum never forms, so cuDNN's convolutions get 2^-14
// sum|terms| on top of the plain-sum bound (about 6e-5 of the magnitude; a wrong index is off by
// whole terms).
constexpr double kTransformFactor = 0x1p-14;

// A stream of cuda:0 with petra's workspace (the caching allocator), as ops use.
StreamHandle gpu_stream_handle(petra::Stream& stream) { return stream.handle(); }

}  // namespace

#if PETRA_HAVE_CUBLAS

TEST_CASE("cuda: cuBLAS linear matches ref and petra's kernel" * doctest::skip(kNoGpu)) {
  namespace ref = petra::kernels::ref;
  namespace cu = petra::kernels::cuda;
  namespace bl = petra::kernels::cublas;
  petra::Stream stream(petra::Device::cuda(0));
  const StreamHandle s = gpu_stream_handle(stream);
  void* cs = s.cuda_stream;
  const StreamHandle host{};
  // batch, in, out: single elements, odd sizes, tails of every tile, the classifier's shape.
  for (const petra::kernels::LinearShape k : {petra::kernels::LinearShape{1, 1, 1}, {3, 5, 7}, {33, 65, 17},
                                               {128, 512, 10}, {7, 1000, 3}, {0, 4, 5}}) {
    INFO("batch ", k.batch, " in ", k.in_features, " out ", k.out_features);
    const auto nx = std::size_t(k.batch * k.in_features), nw = std::size_t(k.out_features * k.in_features);
    const auto ny = std::size_t(k.batch * k.out_features), nb = std::size_t(k.out_features);
    const auto x = random_values<float>(nx, 1), w = random_values<float>(nw, 2), b = random_values<float>(nb, 3);
    const auto dy = random_values<float>(ny, 4), dw0 = random_values<float>(nw, 5);

    for (const bool with_bias : {true, false}) {
      std::vector<float> expected(ny), magnitude(ny);
      ref::linear_forward<float>(host, k, x.data(), w.data(), with_bias ? b.data() : nullptr, expected.data());
      const auto bias_abs = absolute(b);
      ref::linear_forward<float>(host, k, absolute(x).data(), absolute(w).data(), with_bias ? bias_abs.data() : nullptr,
                                 magnitude.data());
      Buffer dx_(x, cs), dw_(w, cs), db_(b, cs), y_blas(std::vector<float>(ny, 7.0f), cs),
          y_petra(std::vector<float>(ny, 7.0f), cs), y_again(std::vector<float>(ny, 7.0f), cs);
      const float* bias = with_bias ? db_.get() : nullptr;
      bl::linear_forward(s, k, dx_.get(), dw_.get(), bias, y_blas.get());
      bl::linear_forward(s, k, dx_.get(), dw_.get(), bias, y_again.get());
      cu::linear_forward(s, k, dx_.get(), dw_.get(), bias, y_petra.get());
      const auto got = y_blas.download(cs), petra_got = y_petra.download(cs);
      INFO("bias ", with_bias);
      CHECK(outside_bound(got, expected, magnitude, fp32_factor(k.in_features + 1)) == 0);
      CHECK(outside_bound(petra_got, expected, magnitude, fp32_factor(k.in_features + 1)) == 0);
      CHECK(y_again.download(cs) == got);  // the same bits twice
    }

    // dx = dy w, dw += dy^T x.
    std::vector<float> dx_expected(nx), dx_magnitude(nx), dw_expected = dw0, dw_magnitude = absolute(dw0);
    ref::linear_backward_data<float>(host, k, dy.data(), w.data(), dx_expected.data());
    ref::linear_backward_data<float>(host, k, absolute(dy).data(), absolute(w).data(), dx_magnitude.data());
    ref::linear_backward_weight<float>(host, k, x.data(), dy.data(), dw_expected.data());
    ref::linear_backward_weight<float>(host, k, absolute(x).data(), absolute(dy).data(), dw_magnitude.data());
    Buffer xb(x, cs), wb(w, cs), dyb(dy, cs), dxb(std::vector<float>(nx, 7.0f), cs), dwb(dw0, cs);
    bl::linear_backward_data(s, k, dyb.get(), wb.get(), dxb.get());
    bl::linear_backward_weight(s, k, xb.get(), dyb.get(), dwb.get());
    CHECK(outside_bound(dxb.download(cs), dx_expected, dx_magnitude, fp32_factor(k.out_features)) == 0);
    CHECK(outside_bound(dwb.download(cs), dw_expected, dw_magnitude, fp32_factor(k.batch + 1)) == 0);
  }
}

#endif  // PETRA_HAVE_CUBLAS

#if PETRA_HAVE_CUDNN

namespace {

using petra::kernels::Conv2dShape;

// Small and odd shapes: 1x1 and 7x7 stride 2, non-square kernels with unequal paddings, channel counts
// off the tiles, batch 1, a stride larger than the kernel, one pixel.
const std::vector<Conv2dShape> kConvShapes = {
    {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},       {2, 3, 7, 5, 4, 3, 3, 1, 1, 1, 1},
    {3, 17, 9, 11, 33, 3, 3, 2, 2, 1, 1},    {2, 3, 15, 15, 8, 7, 7, 2, 2, 3, 3},
    {4, 16, 8, 8, 32, 1, 1, 2, 2, 0, 0},     {1, 5, 6, 7, 3, 2, 5, 1, 1, 1, 2},
    {2, 4, 10, 9, 6, 1, 1, 3, 3, 0, 0},      {5, 64, 8, 8, 64, 3, 3, 1, 1, 1, 1},
};

struct ConvData {
  std::vector<float> x, w, bias, dy, dw0;
  explicit ConvData(const Conv2dShape& k)
      : x(random_values<float>(std::size_t(k.input_size()), 11)),
        w(random_values<float>(std::size_t(k.weight_size()), 12)),
        bias(random_values<float>(std::size_t(k.out_channels), 13)),
        dy(random_values<float>(std::size_t(k.output_size()), 14)),
        dw0(random_values<float>(std::size_t(k.weight_size()), 15)) {}
};

}  // namespace

TEST_CASE("cuda: cuDNN conv2d forward, backward data and backward weight match ref (and petra's, in TF32; and with the fastest algorithms)" * doctest::skip(kNoGpu)) {
  namespace ref = petra::kernels::ref;
  namespace dnn = petra::kernels::cudnn;
  namespace cu = petra::kernels::cuda;
  petra::Stream stream(petra::Device::cuda(0));
  const StreamHandle s = gpu_stream_handle(stream);
  void* cs = s.cuda_stream;
  const StreamHandle host{};
  for (const Conv2dShape& k : kConvShapes) {
    INFO("x (", k.batch, ", ", k.in_channels, ", ", k.in_h, ", ", k.in_w, ") w (", k.out_channels, ", ",
         k.in_channels, ", ", k.kernel_h, ", ", k.kernel_w, ") stride ", k.stride_h, "x", k.stride_w, " pad ", k.pad_h,
         "x", k.pad_w);
    const ConvData d(k);
    const auto ny = std::size_t(k.output_size()), nx = std::size_t(k.input_size());
    const std::int64_t taps = k.in_channels * k.kernel_h * k.kernel_w;

    std::vector<float> y_expected(ny), y_magnitude(ny);
    ref::conv2d_forward<float>(host, k, d.x.data(), d.w.data(), d.bias.data(), y_expected.data());
    ref::conv2d_forward<float>(host, k, absolute(d.x).data(), absolute(d.w).data(), absolute(d.bias).data(),
                               y_magnitude.data());
    Buffer x(d.x, cs), w(d.w, cs), bias(d.bias, cs), dy(d.dy, cs);

    {  // FP32 forward (the default math), twice: the same bits.
      Buffer y(std::vector<float>(ny, 7.0f), cs), again(std::vector<float>(ny, 7.0f), cs);
      dnn::conv2d_forward(s, k, x.get(), w.get(), bias.get(), y.get());
      dnn::conv2d_forward(s, k, x.get(), w.get(), bias.get(), again.get());
      const auto got = y.download(cs);
      CHECK(outside_bound(got, y_expected, y_magnitude, kTransformFactor + fp32_factor(taps + 1)) == 0);
      CHECK(again.download(cs) == got);
      const auto algorithm = dnn::conv2d_algorithm(s, k, 0);
      MESSAGE("forward algorithm ", algorithm.algorithm, ", workspace ", algorithm.workspace_bytes, " bytes");
    }
    {  // cuDNN's fastest algorithms (timed, deterministic or not), the three passes: the same FP32 bounds.
      struct FastestAlgorithms {  // for this scope, given back even if a call throws
        FastestAlgorithms() { petra::set_cudnn_algorithms(petra::CudnnAlgorithms::fastest); }
        ~FastestAlgorithms() { petra::set_cudnn_algorithms(petra::CudnnAlgorithms::deterministic); }
      } fastest_algorithms;
      Buffer y(std::vector<float>(ny, 7.0f), cs), dx(std::vector<float>(nx, 7.0f), cs), dw(d.dw0, cs);
      dnn::conv2d_forward(s, k, x.get(), w.get(), bias.get(), y.get());
      dnn::conv2d_backward_data(s, k, dy.get(), w.get(), dx.get());
      dnn::conv2d_backward_weight(s, k, x.get(), dy.get(), dw.get());
      const auto forward = dnn::conv2d_algorithm(s, k, 0), data = dnn::conv2d_algorithm(s, k, 1),
                 weight = dnn::conv2d_algorithm(s, k, 2);
      MESSAGE("fastest algorithms: forward ", forward.algorithm, ", data ", data.algorithm, ", weight ",
              weight.algorithm);
      CHECK(outside_bound(y.download(cs), y_expected, y_magnitude, kTransformFactor + fp32_factor(taps + 1)) == 0);
      std::vector<float> dx_expected(nx), dx_magnitude(nx);
      ref::conv2d_backward_data<float>(host, k, d.dy.data(), d.w.data(), dx_expected.data());
      ref::conv2d_backward_data<float>(host, k, absolute(d.dy).data(), absolute(d.w).data(), dx_magnitude.data());
      CHECK(outside_bound(dx.download(cs), dx_expected, dx_magnitude,
                          kTransformFactor + fp32_factor(k.out_channels * k.kernel_h * k.kernel_w)) == 0);
      std::vector<float> dw_expected = d.dw0, dw_magnitude = absolute(d.dw0);
      ref::conv2d_backward_weight<float>(host, k, d.x.data(), d.dy.data(), dw_expected.data());
      ref::conv2d_backward_weight<float>(host, k, absolute(d.x).data(), absolute(d.dy).data(), dw_magnitude.data());
      CHECK(outside_bound(dw.download(cs), dw_expected, dw_magnitude,
                          kTransformFactor + fp32_factor(k.batch * k.out_h() * k.out_w() + 1)) == 0);
    }
    {  // TF32 forward: within the TF32 bound, for both implementations.
      cu::set_conv2d_math(cu::Conv2dMath::tf32);
      Buffer y(std::vector<float>(ny, 7.0f), cs), petra_y(std::vector<float>(ny, 7.0f), cs);
      dnn::conv2d_forward(s, k, x.get(), w.get(), bias.get(), y.get());
      cu::conv2d_forward(s, k, x.get(), w.get(), bias.get(), petra_y.get());
      cu::set_conv2d_math(cu::Conv2dMath::fp32);
      CHECK(outside_bound(y.download(cs), y_expected, y_magnitude,
                          kTransformFactor + kTf32Factor + fp32_factor(taps + 1)) == 0);
      CHECK(outside_bound(petra_y.download(cs), y_expected, y_magnitude, kTf32Factor + fp32_factor(taps + 1)) == 0);
    }
    {  // Backward data: dx =.
      std::vector<float> expected(nx), magnitude(nx);
      ref::conv2d_backward_data<float>(host, k, d.dy.data(), d.w.data(), expected.data());
      ref::conv2d_backward_data<float>(host, k, absolute(d.dy).data(), absolute(d.w).data(), magnitude.data());
      Buffer dx(std::vector<float>(nx, 7.0f), cs), again(std::vector<float>(nx, 7.0f), cs);
      dnn::conv2d_backward_data(s, k, dy.get(), w.get(), dx.get());
      dnn::conv2d_backward_data(s, k, dy.get(), w.get(), again.get());
      const auto got = dx.download(cs);
      CHECK(outside_bound(got, expected, magnitude,
                          kTransformFactor + fp32_factor(k.out_channels * k.kernel_h * k.kernel_w)) == 0);
      CHECK(again.download(cs) == got);
      // TF32: both implementations within the TF32 bound.
      cu::set_conv2d_math(cu::Conv2dMath::tf32);
      Buffer tf32_dx(std::vector<float>(nx, 7.0f), cs), petra_dx(std::vector<float>(nx, 7.0f), cs);
      dnn::conv2d_backward_data(s, k, dy.get(), w.get(), tf32_dx.get());
      cu::conv2d_backward_data(s, k, dy.get(), w.get(), petra_dx.get());
      cu::set_conv2d_math(cu::Conv2dMath::fp32);
      const std::int64_t terms = k.out_channels * k.kernel_h * k.kernel_w;
      CHECK(outside_bound(tf32_dx.download(cs), expected, magnitude,
                          kTransformFactor + kTf32Factor + fp32_factor(terms)) == 0);
      CHECK(outside_bound(petra_dx.download(cs), expected, magnitude, kTf32Factor + fp32_factor(terms)) == 0);
    }
    {  // Backward weight: dw += onto non-zero values.
      std::vector<float> expected = d.dw0, magnitude = absolute(d.dw0);
      ref::conv2d_backward_weight<float>(host, k, d.x.data(), d.dy.data(), expected.data());
      ref::conv2d_backward_weight<float>(host, k, absolute(d.x).data(), absolute(d.dy).data(), magnitude.data());
      Buffer dw(d.dw0, cs), again(d.dw0, cs);
      dnn::conv2d_backward_weight(s, k, x.get(), dy.get(), dw.get());
      dnn::conv2d_backward_weight(s, k, x.get(), dy.get(), again.get());
      const auto got = dw.download(cs);
      CHECK(outside_bound(got, expected, magnitude,
                          kTransformFactor + fp32_factor(k.batch * k.out_h() * k.out_w() + 1)) == 0);
      CHECK(again.download(cs) == got);
      // TF32: both implementations within the TF32 bound.
      cu::set_conv2d_math(cu::Conv2dMath::tf32);
      Buffer tf32_dw(d.dw0, cs), petra_dw(d.dw0, cs);
      dnn::conv2d_backward_weight(s, k, x.get(), dy.get(), tf32_dw.get());
      cu::conv2d_backward_weight(s, k, x.get(), dy.get(), petra_dw.get());
      cu::set_conv2d_math(cu::Conv2dMath::fp32);
      const std::int64_t terms = k.batch * k.out_h() * k.out_w() + 1;
      CHECK(outside_bound(tf32_dw.download(cs), expected, magnitude,
                          kTransformFactor + kTf32Factor + fp32_factor(terms)) == 0);
      CHECK(outside_bound(petra_dw.download(cs), expected, magnitude, kTf32Factor + fp32_factor(terms)) == 0);
    }
  }
}

TEST_CASE("cuda: cuDNN batch norm matches ref (train, eval, backward, running statistics)" * doctest::skip(kNoGpu)) {
  namespace ref = petra::kernels::ref;
  namespace dnn = petra::kernels::cudnn;
  using petra::kernels::BatchNormShape;
  petra::Stream stream(petra::Device::cuda(0));
  const StreamHandle s = gpu_stream_handle(stream);
  void* cs = s.cuda_stream;
  const StreamHandle host{};
  const double eps = 1e-5, momentum = 0.1;
  for (const BatchNormShape k : {BatchNormShape{1, 1, 1, 2}, {2, 3, 5, 7}, {4, 17, 3, 3}, {3, 5, 1, 1},
                                 {8, 64, 16, 16}}) {
    INFO("x (", k.batch, ", ", k.channels, ", ", k.height, ", ", k.width, ")");
    const auto n = std::size_t(k.size()), c = std::size_t(k.channels);
    // An offset mean and a spread other than 1, so that the statistics matter.
    const auto x = random_values<float>(n, 21, 1.0, 4.0), dy = random_values<float>(n, 22);
    const auto gamma = random_values<float>(c, 23, 0.5, 1.5), beta = random_values<float>(c, 24);
    const auto rm0 = random_values<float>(c, 25), rv0 = random_values<float>(c, 26, 0.5, 2.0);
    const auto dgamma0 = random_values<float>(c, 27), dbeta0 = random_values<float>(c, 28);

    std::vector<float> y(n), mean(c), invstd(c), rm = rm0, rv = rv0;
    ref::batchnorm_forward_train<float>(host, k, eps, momentum, x.data(), gamma.data(), beta.data(), y.data(),
                                        mean.data(), invstd.data(), rm.data(), rv.data());
    Buffer xb(x, cs), dyb(dy, cs), g(gamma, cs), b(beta, cs), rmb(rm0, cs), rvb(rv0, cs);
    Buffer yb(std::vector<float>(n, 7.0f), cs), meanb(std::vector<float>(c, 7.0f), cs),
        invstdb(std::vector<float>(c, 7.0f), cs);
    dnn::batchnorm_forward_train(s, k, eps, momentum, xb.get(), g.get(), b.get(), yb.get(), meanb.get(),
                                 invstdb.get(), rmb.get(), rvb.get());
    // Sums of up to 16,384 floats inside cuDNN against ref's doubles.
    CHECK(relative_error(yb.download(cs), y) <= 1e-5);
    CHECK(relative_error(meanb.download(cs), mean) <= 1e-5);
    CHECK(relative_error(invstdb.download(cs), invstd) <= 1e-5);
    CHECK(relative_error(rmb.download(cs), rm) <= 1e-5);
    CHECK(relative_error(rvb.download(cs), rv) <= 1e-5);  // the unbiased variance, as petra's

    std::vector<float> y_eval(n);
    ref::batchnorm_forward_eval<float>(host, k, eps, x.data(), gamma.data(), beta.data(), rm0.data(), rv0.data(),
                                       y_eval.data());
    Buffer rm0b(rm0, cs), rv0b(rv0, cs), y_evalb(std::vector<float>(n, 7.0f), cs);
    dnn::batchnorm_forward_eval(s, k, eps, xb.get(), g.get(), b.get(), rm0b.get(), rv0b.get(), y_evalb.get());
    CHECK(relative_error(y_evalb.download(cs), y_eval) <= 1e-6);

    // Backward with ref's saved statistics on both sides, so only the backward is compared.
    std::vector<float> dx(n), dgamma = dgamma0, dbeta = dbeta0;
    ref::batchnorm_backward<float>(host, k, x.data(), dy.data(), gamma.data(), mean.data(), invstd.data(), dx.data(),
                                   dgamma.data(), dbeta.data());
    Buffer ref_mean(mean, cs), ref_invstd(invstd, cs), dxb(std::vector<float>(n, 7.0f), cs), dgb(dgamma0, cs),
        dbb(dbeta0, cs);
    dnn::batchnorm_backward(s, k, xb.get(), dyb.get(), g.get(), ref_mean.get(), ref_invstd.get(), dxb.get(), dgb.get(),
                            dbb.get());
    // dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)) cancels: with two values per
    // channel the exact dx is about eps / var of its terms (first run on an H200: cuDNN's dx for
    // x (1, 1, 1, 2) was 1.2e-3 off relative to dx, 1e-9 of the terms). So the bound is the float
    // rounding of per-channel sums of `count` terms, scaled by the terms' magnitude
    // |gamma| * invstd * (|dy| + mean|dy| + |xhat| * mean|dy * xhat|), not by dx.
    const auto plane = std::size_t(k.height * k.width), count = std::size_t(k.batch) * plane;
    std::vector<double> mean_abs_dy(c), mean_abs_dy_xhat(c);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t ch = (i / plane) % c;
      const double xhat = (double(x[i]) - mean[ch]) * invstd[ch];
      mean_abs_dy[ch] += std::fabs(dy[i]) / double(count);
      mean_abs_dy_xhat[ch] += std::fabs(dy[i] * xhat) / double(count);
    }
    std::vector<float> dx_magnitude(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t ch = (i / plane) % c;
      const double xhat = (double(x[i]) - mean[ch]) * invstd[ch];
      dx_magnitude[i] = float(std::fabs(gamma[ch]) * invstd[ch] *
                              (std::fabs(dy[i]) + mean_abs_dy[ch] + std::fabs(xhat) * mean_abs_dy_xhat[ch]));
    }
    CHECK(outside_bound(dxb.download(cs), dx, dx_magnitude, fp32_factor(std::int64_t(count) + 1)) == 0);
    CHECK(relative_error(dgb.download(cs), dgamma) <= 1e-5);
    CHECK(relative_error(dbb.download(cs), dbeta) <= 1e-5);
  }
  // Running statistics must be both given or both absent.
  const BatchNormShape k{2, 1, 1, 1};
  CHECK_THROWS_AS(dnn::batchnorm_forward_train(s, k, eps, momentum, nullptr, nullptr, nullptr, nullptr, nullptr,
                                               nullptr, reinterpret_cast<float*>(16), nullptr),
                  petra::ValueError);
}

TEST_CASE("cuda: cuDNN batch norm + ReLU (cuDNN's batch norm, petra's relu) matches ref" * doctest::skip(kNoGpu)) {
  namespace ref = petra::kernels::ref;
  namespace dnn = petra::kernels::cudnn;
  using petra::kernels::BatchNormShape;
  petra::Stream stream(petra::Device::cuda(0));
  const StreamHandle s = gpu_stream_handle(stream);
  void* cs = s.cuda_stream;
  const StreamHandle host{};
  const double eps = 1e-5, momentum = 0.1;
  for (const BatchNormShape k : {BatchNormShape{2, 3, 5, 7}, {1, 17, 7, 7}, {8, 64, 16, 16}}) {
    INFO("x (", k.batch, ", ", k.channels, ", ", k.height, ", ", k.width, ")");
    const auto n = std::size_t(k.size()), c = std::size_t(k.channels);
    const auto x = random_values<float>(n, 31, 1.0, 4.0), dy = random_values<float>(n, 32);
    const auto gamma = random_values<float>(c, 33, 0.5, 1.5), beta = random_values<float>(c, 34);
    const auto rm0 = random_values<float>(c, 35), rv0 = random_values<float>(c, 36, 0.5, 2.0);

    std::vector<float> y(n), mean(c), invstd(c), rm = rm0, rv = rv0;
    ref::batchnorm_relu_forward_train<float>(host, k, eps, momentum, x.data(), gamma.data(), beta.data(), y.data(),
                                             mean.data(), invstd.data(), rm.data(), rv.data());
    Buffer xb(x, cs), dyb(dy, cs), g(gamma, cs), b(beta, cs), rmb(rm0, cs), rvb(rv0, cs);
    Buffer yb(std::vector<float>(n, 7.0f), cs), meanb(std::vector<float>(c, 7.0f), cs),
        invstdb(std::vector<float>(c, 7.0f), cs);
    dnn::batchnorm_relu_forward_train(s, k, eps, momentum, xb.get(), g.get(), b.get(), yb.get(), meanb.get(),
                                      invstdb.get(), rmb.get(), rvb.get());
    CHECK(relative_error(yb.download(cs), y) <= 1e-5);
    CHECK(relative_error(rvb.download(cs), rv) <= 1e-5);

    std::vector<float> y_eval(n);
    ref::batchnorm_relu_forward_eval<float>(host, k, eps, x.data(), gamma.data(), beta.data(), rm0.data(),
                                            rv0.data(), y_eval.data());
    Buffer rm0b(rm0, cs), rv0b(rv0, cs), y_evalb(std::vector<float>(n, 7.0f), cs);
    dnn::batchnorm_relu_forward_eval(s, k, eps, xb.get(), g.get(), b.get(), rm0b.get(), rv0b.get(), y_evalb.get());
    CHECK(relative_error(y_evalb.download(cs), y_eval) <= 1e-6);

    // Backward with ref's y and statistics on both sides: the same mask.
    std::vector<float> dx(n), dgamma(c, 0.f), dbeta(c, 0.f);
    ref::batchnorm_relu_backward<float>(host, k, x.data(), y.data(), dy.data(), gamma.data(), mean.data(),
                                        invstd.data(), dx.data(), dgamma.data(), dbeta.data());
    Buffer ref_y(y, cs), ref_mean(mean, cs), ref_invstd(invstd, cs), dxb(std::vector<float>(n, 7.0f), cs),
        dgb(std::vector<float>(c, 0.f), cs), dbb(std::vector<float>(c, 0.f), cs);
    dnn::batchnorm_relu_backward(s, k, xb.get(), ref_y.get(), dyb.get(), g.get(), ref_mean.get(), ref_invstd.get(),
                                 dxb.get(), dgb.get(), dbb.get());
    CHECK(relative_error(dxb.download(cs), dx) <= 1e-4);
    CHECK(relative_error(dgb.download(cs), dgamma) <= 1e-5);
    CHECK(relative_error(dbb.download(cs), dbeta) <= 1e-5);
  }
}

// petra's convolution with each block tile forced (set_conv2d_tile: 64x64, 64x128, 128x64,
// 128x128, 128x128 at two blocks per multiprocessor (the third shape's channels-last forward and
// weight gradient have kernels of their own there) and 128x128 with a K step of 32 in dynamic
// shared memory (TF32 only)): the same bits as the 64x64 tile in the three passes, FP32 and TF32 (each output is one
// thread's, or one accumulator element's, sum over k in the same order; here the real mma.sync runs,
// where the emulated test runs its twin), and the FP32 results within their bound of ref::. (It
// needs no cuDNN, but shares this section's shapes' data; every build that has CUDA has cuDNN.)
namespace {
// Forces the math and the tile for a scope; gives the defaults back even when a check throws.
class ConvSettings {
 public:
  // (the direct weight gradient: the tile and rounding tests are about the implicit GEMM's
  // kernels, which automatic would replace by Winograd's on their 64-channel shape)
  ConvSettings(petra::kernels::cuda::Conv2dMath math, int tile) {
    petra::kernels::cuda::set_conv2d_math(math);
    petra::kernels::cuda::set_conv2d_tile(tile);
    petra::kernels::cuda::set_conv2d_weight_algorithm(petra::kernels::cuda::Conv2dWeightAlgorithm::direct);
  }
  ~ConvSettings() {
    petra::kernels::cuda::set_conv2d_weight_algorithm(petra::kernels::cuda::Conv2dWeightAlgorithm::automatic);
    petra::kernels::cuda::set_conv2d_tile(-1);
    petra::kernels::cuda::set_conv2d_math(petra::kernels::cuda::Conv2dMath::fp32);
  }
  ConvSettings(const ConvSettings&) = delete;
  ConvSettings& operator=(const ConvSettings&) = delete;
};

// petra's three passes on k (y = forward, dx = backward data, dw += backward weight) under `math`
// and `tile`, set for the calls only.
void three_passes(const StreamHandle& s, const Conv2dShape& k, petra::kernels::cuda::Conv2dMath math, int tile,
                  const Buffer& x, const Buffer& w, const float* bias, const Buffer& dy, const Buffer& y,
                  const Buffer& dx, const Buffer& dw) {
  namespace cu = petra::kernels::cuda;
  const ConvSettings forced(math, tile);
  cu::conv2d_forward(s, k, x.get(), w.get(), bias, y.get());
  cu::conv2d_backward_data(s, k, dy.get(), w.get(), dx.get());
  cu::conv2d_backward_weight(s, k, x.get(), dy.get(), dw.get());
}
}  // namespace

TEST_CASE("cuda: petra's conv2d gives the same bits with every block tile, FP32 and TF32" * doctest::skip(kNoGpu)) {
  namespace ref = petra::kernels::ref;
  namespace cu = petra::kernels::cuda;
  petra::Stream stream(petra::Device::cuda(0));
  const StreamHandle s = gpu_stream_handle(stream);
  void* cs = s.cuda_stream;
  const StreamHandle host{};
  // 128-row and 128-column tiles with tails (M = 130 and 70, N = 198 and 630), stride 2, and one
  // product as large as the ResNet-18 layer2 shapes' at batch 8
  for (const Conv2dShape& k : {Conv2dShape{2, 5, 9, 11, 130, 3, 3, 1, 1, 1, 1},
                               Conv2dShape{2, 70, 7, 9, 6, 3, 3, 2, 2, 1, 1},
                               Conv2dShape{8, 64, 16, 16, 128, 3, 3, 1, 1, 1, 1}}) {
    INFO("x (", k.batch, ", ", k.in_channels, ", ", k.in_h, ", ", k.in_w, ") out ", k.out_channels, " stride ",
         k.stride_h);
    const ConvData d(k);
    const auto ny = std::size_t(k.output_size()), nx = std::size_t(k.input_size());
    const std::int64_t taps = k.kernel_h * k.kernel_w;
    // ref:: and the sums of |terms| of the three passes (FP32 is checked against them)
    std::vector<float> y_expected(ny), y_magnitude(ny), dx_expected(nx), dx_magnitude(nx);
    std::vector<float> dw_expected = d.dw0, dw_magnitude = absolute(d.dw0);
    ref::conv2d_forward<float>(host, k, d.x.data(), d.w.data(), d.bias.data(), y_expected.data());
    ref::conv2d_forward<float>(host, k, absolute(d.x).data(), absolute(d.w).data(), absolute(d.bias).data(),
                               y_magnitude.data());
    ref::conv2d_backward_data<float>(host, k, d.dy.data(), d.w.data(), dx_expected.data());
    ref::conv2d_backward_data<float>(host, k, absolute(d.dy).data(), absolute(d.w).data(), dx_magnitude.data());
    ref::conv2d_backward_weight<float>(host, k, d.x.data(), d.dy.data(), dw_expected.data());
    ref::conv2d_backward_weight<float>(host, k, absolute(d.x).data(), absolute(d.dy).data(), dw_magnitude.data());
    Buffer x(d.x, cs), w(d.w, cs), bias(d.bias, cs), dy(d.dy, cs);
    for (const cu::Conv2dMath math : {cu::Conv2dMath::fp32, cu::Conv2dMath::tf32}) {
      CAPTURE(int(math));
      std::vector<float> y_small, dx_small, dw_small;
      for (const int tile : {0, 1, 2, 3, 4, 5}) {
        CAPTURE(tile);
        Buffer y(std::vector<float>(ny, 7.0f), cs), dx(std::vector<float>(nx, 7.0f), cs), dw(d.dw0, cs);
        three_passes(s, k, math, tile, x, w, bias.get(), dy, y, dx, dw);
        const auto y_got = y.download(cs), dx_got = dx.download(cs), dw_got = dw.download(cs);
        if (math == cu::Conv2dMath::fp32) {
          CHECK(outside_bound(y_got, y_expected, y_magnitude, fp32_factor(k.in_channels * taps + 1)) == 0);
          CHECK(outside_bound(dx_got, dx_expected, dx_magnitude, fp32_factor(k.out_channels * taps)) == 0);
          CHECK(outside_bound(dw_got, dw_expected, dw_magnitude,
                              fp32_factor(k.batch * k.out_h() * k.out_w() + 1)) == 0);
        }
        if (tile == 0) {
          y_small = y_got, dx_small = dx_got, dw_small = dw_got;
          continue;
        }
        CHECK(y_got == y_small);
        CHECK(dx_got == dx_small);
        CHECK(dw_got == dw_small);
      }
      // The TF32 weight gradient from x's channels-last copy (the third shape: in_channels 64) and
      // from x itself sum the same terms in the same order: the same bits (tf32_round in the copy,
      // tf32_operand's add in the tile, the same rounding).
      if (math == cu::Conv2dMath::tf32) {
        cu::set_conv2d_channels_last(false);
        Buffer y(std::vector<float>(ny, 7.0f), cs), dx(std::vector<float>(nx, 7.0f), cs), dw(d.dw0, cs);
        three_passes(s, k, math, 0, x, w, bias.get(), dy, y, dx, dw);
        cu::set_conv2d_channels_last(true);
        CHECK(dw.download(cs) == dw_small);
      }
    }
  }
}

// The TF32 kernels round both operands to nearest, ties away from zero (as cvt.rna.tf32.f32),
// not by the tensor cores' truncation, which tf32_operand relies on to finish its rounding: w is
// 1 + 3 * 2^-12 and x and dy 1 + 2^-11 (a tie), both r = 1 + 2^-10 rounded (1 truncated, and the
// tie 1 rounded to even), so each output is its count n of terms (ref:: on ones) times r^2 (exact
// in FP32), up to the accumulation's error, bounded by (n + 1) 2^-22 of it (a unit in the last
// place per addition, twice over: the tensor cores' internal additions need not round to
// nearest), where one operand truncated would give n r: 2^-10 of it away. Every tile, stride 1
// and 2, the three passes (the first shape's three from channels-last copies, in_channels 32 and
// out_channels 72: docs/gpu-kernels.md steps 16 and 17; the second's from x and dy).
TEST_CASE("cuda: petra's TF32 conv2d rounds its inputs to nearest, ties away, on every tile" * doctest::skip(kNoGpu)) {
  namespace ref = petra::kernels::ref;
  namespace cu = petra::kernels::cuda;
  petra::Stream stream(petra::Device::cuda(0));
  const StreamHandle s = gpu_stream_handle(stream);
  void* cs = s.cuda_stream;
  const StreamHandle host{};
  const float above = 1.0f + 3 * 0x1p-12f, tie = 1.0f + 0x1p-11f;
  const double r = 1.0 + 0x1p-10;
  for (const Conv2dShape& k :
       {Conv2dShape{2, 32, 6, 6, 72, 3, 3, 1, 1, 1, 1}, Conv2dShape{3, 70, 7, 9, 6, 3, 3, 2, 2, 1, 1}}) {
    INFO("x (", k.batch, ", ", k.in_channels, ", ", k.in_h, ", ", k.in_w, ") out ", k.out_channels, " stride ",
         k.stride_h);
    const auto ny = std::size_t(k.output_size()), nx = std::size_t(k.input_size()), nw = std::size_t(k.weight_size());
    // the number of terms of each output of the three passes: ref:: on ones
    const std::vector<float> x_ones(nx, 1.0f), w_ones(nw, 1.0f), y_ones(ny, 1.0f);
    std::vector<float> y_terms(ny), dx_terms(nx), dw_terms(nw, 0.0f);
    ref::conv2d_forward<float>(host, k, x_ones.data(), w_ones.data(), nullptr, y_terms.data());
    ref::conv2d_backward_data<float>(host, k, y_ones.data(), w_ones.data(), dx_terms.data());
    ref::conv2d_backward_weight<float>(host, k, x_ones.data(), y_ones.data(), dw_terms.data());
    // elements off n r^2 by more than the accumulation error; and (so that the check can fail)
    // the elements where truncating one operand would stay within it
    const auto off = [&](const std::vector<float>& got, const std::vector<float>& terms) {
      std::size_t bad = 0, blind = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        const double n = terms[i], expected = n * r * r, bound = (n + 1) * 0x1p-22 * expected;
        bad += std::fabs(double(got[i]) - expected) > bound;
        blind += n > 0 && std::fabs(n * r - expected) <= bound;
      }
      CHECK(blind == 0);
      return bad;
    };
    Buffer x(std::vector<float>(nx, tie), cs), w(std::vector<float>(nw, above), cs),
        dy(std::vector<float>(ny, tie), cs);
    for (const int tile : {0, 1, 2, 3}) {
      CAPTURE(tile);
      Buffer y(std::vector<float>(ny, 7.0f), cs), dx(std::vector<float>(nx, 7.0f), cs),
          dw(std::vector<float>(nw, 0.0f), cs);
      three_passes(s, k, cu::Conv2dMath::tf32, tile, x, w, nullptr, dy, y, dx, dw);
      CHECK(off(y.download(cs), y_terms) == 0);
      CHECK(off(dx.download(cs), dx_terms) == 0);
      CHECK(off(dw.download(cs), dw_terms) == 0);
    }
  }
}

// A layer's forward (with a bias) and backward data under the current settings, against ref::: the
// Winograd and split-K cases. run() fills the outputs with 7s (a value the kernels leave unwritten
// shows), runs each pass twice (the same bits) and checks ref:: within `times` the direct
// product's bound of `math` (FP32's, or TF32's).
class ForwardDataCheck {
 public:
  ForwardDataCheck(const StreamHandle& s, const Conv2dShape& k)
      : s_(s), k_(k), d_(k), x_(d_.x, s.cuda_stream), w_(d_.w, s.cuda_stream), bias_(d_.bias, s.cuda_stream),
        dy_(d_.dy, s.cuda_stream) {
    namespace ref = petra::kernels::ref;
    const StreamHandle host{};
    y_want_.resize(std::size_t(k.output_size()));
    y_magnitude_.resize(y_want_.size());
    ref::conv2d_forward<float>(host, k, d_.x.data(), d_.w.data(), d_.bias.data(), y_want_.data());
    ref::conv2d_forward<float>(host, k, absolute(d_.x).data(), absolute(d_.w).data(), absolute(d_.bias).data(),
                               y_magnitude_.data());
    dx_want_.resize(std::size_t(k.input_size()));
    dx_magnitude_.resize(dx_want_.size());
    ref::conv2d_backward_data<float>(host, k, d_.dy.data(), d_.w.data(), dx_want_.data());
    ref::conv2d_backward_data<float>(host, k, absolute(d_.dy).data(), absolute(d_.w).data(), dx_magnitude_.data());
  }
  void run(petra::kernels::cuda::Conv2dMath math, double times) const {
    namespace cu = petra::kernels::cuda;
    void* cs = s_.cuda_stream;
    const std::vector<float> y_fill(y_want_.size(), 7.0f), dx_fill(dx_want_.size(), 7.0f);
    Buffer y(y_fill, cs), y_again(y_fill, cs), dx(dx_fill, cs), dx_again(dx_fill, cs);
    cu::conv2d_forward(s_, k_, x_.get(), w_.get(), bias_.get(), y.get());
    cu::conv2d_forward(s_, k_, x_.get(), w_.get(), bias_.get(), y_again.get());
    cu::conv2d_backward_data(s_, k_, dy_.get(), w_.get(), dx.get());
    cu::conv2d_backward_data(s_, k_, dy_.get(), w_.get(), dx_again.get());
    const auto factor = [&](std::int64_t terms) {
      return times * (math == cu::Conv2dMath::fp32 ? fp32_factor(terms) : kTf32Factor + fp32_factor(terms));
    };
    const auto y_got = y.download(cs), dx_got = dx.download(cs);
    CHECK(y_got == y_again.download(cs));
    CHECK(dx_got == dx_again.download(cs));
    const std::int64_t taps = k_.kernel_h * k_.kernel_w;
    CHECK(outside_bound(y_got, y_want_, y_magnitude_, factor(k_.in_channels * taps + 1)) == 0);
    CHECK(outside_bound(dx_got, dx_want_, dx_magnitude_, factor(k_.out_channels * taps)) == 0);
  }

 private:
  StreamHandle s_;
  Conv2dShape k_;
  ConvData d_;
  Buffer x_, w_, bias_, dy_;
  std::vector<float> y_want_, y_magnitude_, dx_want_, dx_magnitude_;
};

// The settings the Winograd cases run under: FP32 with its tiles' rule; TF32 with the rule's tiles
// and with the two options of its 128 x 128 tile forced (4: two blocks per multiprocessor, 5: a K
// step of 32).
const std::pair<petra::kernels::cuda::Conv2dMath, int> kWinogradTiles[] = {
    {petra::kernels::cuda::Conv2dMath::fp32, -1},
    {petra::kernels::cuda::Conv2dMath::tf32, -1},
    {petra::kernels::cuda::Conv2dMath::tf32, 4},
    {petra::kernels::cuda::Conv2dMath::tf32, 5}};

// The weight gradient in Winograd's F(2x2, 3x3) domain (set_conv2d_weight_algorithm(winograd)) on
// the tensor cores and the FP32 units: against ref:: within 32 times the direct product's bound
// (FP32) and TF32's (TF32), the same bits twice; the emulated test checks the same arithmetic on
// more shapes, this one the real kernels.
TEST_CASE("cuda: petra's Winograd weight gradient matches ref, FP32 and TF32, the same bits twice" *
          doctest::skip(kNoGpu)) {
  namespace ref = petra::kernels::ref;
  namespace cu = petra::kernels::cuda;
  petra::Stream stream(petra::Device::cuda(0));
  const StreamHandle s = gpu_stream_handle(stream);
  void* cs = s.cuda_stream;
  const StreamHandle host{};
  struct Restore {
    ~Restore() { cu::set_conv2d_weight_algorithm(cu::Conv2dWeightAlgorithm::automatic); }
  } restore;
  // tails of 64 channels, odd planes, a ResNet layer's channels at batch 8, and 2048 tiles (two K
  // slices)
  for (const Conv2dShape& k : {Conv2dShape{3, 17, 9, 9, 5, 3, 3, 1, 1, 1, 1}, Conv2dShape{2, 65, 5, 7, 66, 3, 3, 1, 1, 1, 1},
                               Conv2dShape{8, 64, 16, 16, 128, 3, 3, 1, 1, 1, 1},
                               Conv2dShape{8, 64, 32, 32, 64, 3, 3, 1, 1, 1, 1}}) {
    INFO("x (", k.batch, ", ", k.in_channels, ", ", k.in_h, ", ", k.in_w, ") out ", k.out_channels);
    const ConvData d(k);
    std::vector<float> expected = d.dw0, magnitude = absolute(d.dw0);
    ref::conv2d_backward_weight<float>(host, k, d.x.data(), d.dy.data(), expected.data());
    ref::conv2d_backward_weight<float>(host, k, absolute(d.x).data(), absolute(d.dy).data(), magnitude.data());
    const std::int64_t terms = k.batch * k.out_h() * k.out_w() + 1;
    Buffer x(d.x, cs), dy(d.dy, cs);
    // TF32 also with the 128 x 128 tile's options forced on Winograd's GEMM (two blocks per
    // multiprocessor, the K step of 32 in dynamic shared memory): no other GPU test runs them there
    for (const auto& [math, tile] : kWinogradTiles) {
      CAPTURE(int(math));
      CAPTURE(tile);
      const ConvSettings chosen(math, tile);
      cu::set_conv2d_weight_algorithm(cu::Conv2dWeightAlgorithm::winograd);  // (ConvSettings pins direct)
      Buffer dw(d.dw0, cs), again(d.dw0, cs);
      cu::conv2d_backward_weight(s, k, x.get(), dy.get(), dw.get());
      cu::conv2d_backward_weight(s, k, x.get(), dy.get(), again.get());
      const auto got = dw.download(cs);
      CHECK(got == again.download(cs));
      const double bound = math == cu::Conv2dMath::fp32 ? 32 * fp32_factor(terms) : 32 * (kTf32Factor + fp32_factor(terms));
      CHECK(outside_bound(got, expected, magnitude, bound) == 0);
    }
  }
}

// The forward and backward data in Winograd's F(2x2, 3x3) domain (set_conv2d_forward_algorithm(
// winograd)), on the real kernels: against ref:: within 32 times the direct product's bound (FP32)
// and TF32's (TF32), the same bits twice, on the shapes of the weight case above.
TEST_CASE("cuda: petra's Winograd forward and backward data match ref, FP32 and TF32, the same bits twice" *
          doctest::skip(kNoGpu)) {
  namespace cu = petra::kernels::cuda;
  petra::Stream stream(petra::Device::cuda(0));
  const StreamHandle s = gpu_stream_handle(stream);
  struct Restore {
    ~Restore() { cu::set_conv2d_forward_algorithm(cu::Conv2dForwardAlgorithm::direct); }
  } restore;
  for (const Conv2dShape& k : {Conv2dShape{3, 17, 9, 9, 5, 3, 3, 1, 1, 1, 1}, Conv2dShape{2, 65, 5, 7, 66, 3, 3, 1, 1, 1, 1},
                               Conv2dShape{8, 64, 16, 16, 128, 3, 3, 1, 1, 1, 1},
                               Conv2dShape{8, 64, 32, 32, 64, 3, 3, 1, 1, 1, 1}}) {
    INFO("x (", k.batch, ", ", k.in_channels, ", ", k.in_h, ", ", k.in_w, ") out ", k.out_channels);
    const ForwardDataCheck check(s, k);
    for (const auto& [math, tile] : kWinogradTiles) {
      CAPTURE(int(math));
      CAPTURE(tile);
      const ConvSettings chosen(math, tile);
      cu::set_conv2d_forward_algorithm(cu::Conv2dForwardAlgorithm::winograd);
      check.run(math, 32);
    }
  }
}

// The forward and backward data with K cut into slices (set_conv2d_split_k) on the real kernels,
// on shapes the rule splits (conv2d_tiling::output_split: 128 x 128 tiles fewer than 128, K of
// 1024 and more): against ref:: within the direct product's bound, the same bits twice, outputs
// filled with 7s first. The emulated test holds the slices to their model bit for bit.
TEST_CASE("cuda: petra's split-K forward and backward data match ref, FP32 and TF32, the same bits twice" *
          doctest::skip(kNoGpu)) {
  namespace cu = petra::kernels::cuda;
  namespace tiling = petra::kernels::cuda::conv2d_tiling;
  petra::Stream stream(petra::Device::cuda(0));
  const StreamHandle s = gpu_stream_handle(stream);
  struct Restore {
    ~Restore() { cu::set_conv2d_split_k(false); }
  } restore;
  // 2, 4 and 4 slices; the last at stride 2 (the forward splits, backward data does not)
  for (const Conv2dShape& k : {Conv2dShape{8, 128, 4, 4, 128, 3, 3, 1, 1, 1, 1}, Conv2dShape{16, 512, 4, 4, 512, 3, 3, 1, 1, 1, 1},
                               Conv2dShape{8, 256, 8, 8, 200, 3, 3, 2, 2, 1, 1}}) {
    INFO("x (", k.batch, ", ", k.in_channels, ", ", k.in_h, ", ", k.in_w, ") out ", k.out_channels, " stride ",
         k.stride_h);
    CHECK(tiling::forward_output_split(k).slices > 1);
    const ForwardDataCheck check(s, k);
    for (const cu::Conv2dMath math : {cu::Conv2dMath::fp32, cu::Conv2dMath::tf32}) {
      CAPTURE(int(math));
      const ConvSettings chosen(math, -1);
      cu::set_conv2d_split_k(true);
      check.run(math, 1);
      cu::set_conv2d_split_k(false);
    }
  }
}

#endif  // PETRA_HAVE_CUDNN

// Batch norm's training passes on the GPU, in every variant (float and float4 walks, ReLU's mask,
// the coupling's output): the two passes against ref:: and their own bits run to run (no atomics
// in the sums); the one pass (thread-block clusters, which the emulation runs one block at a time)
// against the two and its own bits.
TEST_CASE("cuda: petra's batch norm matches ref and repeats its bits, in two passes and in one" *
          doctest::skip(kNoGpu)) {
  namespace ref = petra::kernels::ref;
  namespace cu = petra::kernels::cuda;
  using petra::kernels::BatchNormShape;
  petra::Stream stream(petra::Device::cuda(0));
  const StreamHandle s = gpu_stream_handle(stream);
  void* cs = s.cuda_stream;
  const StreamHandle host{};
  const double eps = 1e-5, momentum = 0.1;
  struct Restore {
    ~Restore() { cu::set_batchnorm_one_pass(false); }
  } restore;
  // float4 walks (plane % 4 == 0), float walks, tensors of 4 MiB and one of 32 MiB. The one pass
  // (set_batchnorm_one_pass) keeps a channel in clusters of 1 block (the first two shapes), of 4
  // (the first 4 MiB tensor: its one block, 64 channels for 132 multiprocessors, doubled twice),
  // 2 (the second, 128 channels, on a GPU of more than 128 multiprocessors), and 8 (the 32 MiB
  // tensor, as RevNet18's first stage: 512 KiB a channel) where the GPU has clusters (sm_90).
  const int capability = petra::cuda_backend::compute_capability(0);
  for (const BatchNormShape k : {BatchNormShape{3, 5, 7, 7}, {8, 16, 8, 8}, {64, 64, 16, 16}, {32, 128, 16, 16},
                                 {128, 64, 32, 32}}) {
    INFO("x (", k.batch, ", ", k.channels, ", ", k.height, ", ", k.width, ")");
    {  // the one pass really runs (a plan refused by the GPU falls back to the two passes silently)
      cu::set_batchnorm_one_pass(true);
      const int forward = cu::batchnorm_one_pass_cluster(s, k, false), backward = cu::batchnorm_one_pass_cluster(s, k, true);
      cu::set_batchnorm_one_pass(false);
      MESSAGE("one pass at (", k.batch, ", ", k.channels, ", ", k.height, ", ", k.width, "): clusters of ", forward,
              " (forward) and ", backward, " (backward) on sm_", capability);
      // (the 4 MiB tensors' clusters depend on the multiprocessors: 4 and 2 on 132 of them)
      if (k.size() < (std::int64_t(1) << 22)) {
        CHECK(forward >= 1);
        CHECK(backward >= 1);
      } else if (capability >= 90) {  // 512 KiB a channel: only a cluster of 8 holds it
        CHECK(forward == 8);
        CHECK(backward == 8);
      }
    }
    const auto n = std::size_t(k.size()), c = std::size_t(k.channels);
    const auto x = random_values<float>(n, 31, 1.0, 4.0), dy = random_values<float>(n, 32);
    const auto gamma = random_values<float>(c, 33, 0.5, 1.5), beta = random_values<float>(c, 34);
    const auto streams = random_values<float>(2 * n, 35);
    std::vector<float> y_ref(n), mean_ref(c), invstd_ref(c), rm_ref(c, 0.0f), rv_ref(c, 1.0f);
    ref::batchnorm_forward_train<float>(host, k, eps, momentum, x.data(), gamma.data(), beta.data(), y_ref.data(),
                                        mean_ref.data(), invstd_ref.data(), rm_ref.data(), rv_ref.data());
    Buffer xb(x, cs), dyb(dy, cs), g(gamma, cs), b(beta, cs), a(streams, cs);
    // Every output of the five passes, in one vector per setting.
    auto run_all = [&](bool one_pass) {
      cu::set_batchnorm_one_pass(one_pass);
      Buffer y(std::vector<float>(n, 7.0f), cs), y_relu(std::vector<float>(n, 7.0f), cs),
          mean(std::vector<float>(c, 7.0f), cs), invstd(std::vector<float>(c, 7.0f), cs),
          rm(std::vector<float>(c, 0.0f), cs), rv(std::vector<float>(c, 1.0f), cs),
          dx(std::vector<float>(n, 7.0f), cs), dx_relu(std::vector<float>(n, 7.0f), cs),
          dgamma(std::vector<float>(c, 0.0f), cs), dbeta(std::vector<float>(c, 0.0f), cs),
          out(std::vector<float>(2 * n, 7.0f), cs);
      cu::batchnorm_forward_train(s, k, eps, momentum, xb.get(), g.get(), b.get(), y.get(), mean.get(), invstd.get(),
                                  rm.get(), rv.get());
      cu::batchnorm_relu_forward_train(s, k, eps, momentum, xb.get(), g.get(), b.get(), y_relu.get(), mean.get(),
                                       invstd.get(), rm.get(), rv.get());
      cu::batchnorm_backward(s, k, xb.get(), dyb.get(), g.get(), mean.get(), invstd.get(), dx.get(), dgamma.get(),
                             dbeta.get());
      cu::batchnorm_relu_backward(s, k, xb.get(), y_relu.get(), dyb.get(), g.get(), mean.get(), invstd.get(),
                                  dx_relu.get(), dgamma.get(), dbeta.get());
      cu::batchnorm_relu_coupling_train(s, k, eps, momentum, petra::kernels::CouplingDirection::forward, xb.get(),
                                        g.get(), b.get(), a.get(), out.get(), mean.get(), invstd.get(), rm.get(),
                                        rv.get());
      std::vector<std::vector<float>> outputs{y.download(cs),  y_relu.download(cs), mean.download(cs),
                                              invstd.download(cs), rm.download(cs), rv.download(cs),
                                              dx.download(cs), dx_relu.download(cs), dgamma.download(cs),
                                              dbeta.download(cs), out.download(cs)};
      return outputs;
    };
    const auto two_passes = run_all(false), two_passes_again = run_all(false);
    const auto one_pass = run_all(true), one_pass_again = run_all(true);
    CHECK(relative_error(two_passes[0], y_ref) <= 1e-5);
    CHECK(relative_error(two_passes[2], mean_ref) <= 1e-5);
    CHECK(relative_error(one_pass[0], y_ref) <= 1e-5);
    CHECK(relative_error(one_pass[2], mean_ref) <= 1e-5);
    for (std::size_t i = 0; i < two_passes.size(); ++i) {
      CAPTURE(i);
      CHECK(two_passes[i] == two_passes_again[i]);
      CHECK(relative_error(one_pass[i], two_passes[i]) <= 1e-5);
      CHECK(one_pass[i] == one_pass_again[i]);
    }
  }
}

#endif  // PETRA_HAVE_CUDA && (PETRA_HAVE_CUBLAS || PETRA_HAVE_CUDNN)
