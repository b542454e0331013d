// petra/ops.cpp: the Tensor-level ops: validate, allocate, dispatch to kernels/.
//
// Dispatch rule: float32 on the CPU runs kernels::cpu, float64 on the CPU runs kernels::ref (the
// oracle, used by the gradient checks), float32 on a GPU runs kernels::cuda, except for three
// library-backed choices (kernels/cuda_libraries.hpp): the linear layer's products run on cuBLAS
// wherever petra is built with it, and conv2d and batch norm run on cuDNN when set_conv_impl asks.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "petra/kernels/batchnorm.hpp"
#include "petra/kernels/channel.hpp"
#include "petra/kernels/conv2d.hpp"
#include "petra/kernels/conv_batchnorm.hpp"
#include "petra/kernels/coupling.hpp"
#include "petra/kernels/cuda_libraries.hpp"
#include "petra/kernels/elementwise.hpp"
#include "petra/kernels/linear.hpp"
#include "petra/kernels/loss.hpp"
#include "petra/kernels/optim.hpp"
#include "petra/kernels/pool.hpp"
#include "petra/kernels/reduce.hpp"
#include "petra/config.hpp"
#include "petra/conv_impl.hpp"
#include "petra/cuda_backend.hpp"
#include "petra/ops.hpp"
#include "petra/optimizer_steps.hpp"
#include "petra/profile.hpp"
#include "petra/stream.hpp"

namespace petra::ops {

namespace {

// The stream an op on tensors of `device` runs on: Stream::for_device's (petra/stream.hpp), the
// same rule by which its output was allocated and by which copies choose theirs.
const kernels::StreamHandle& stream_for(Device device) { return Stream::for_device(device).handle(); }

// float32 or float64 (float32 on a GPU), any layout.
void check_float_dtype(const Tensor& t, const char* op, const char* what) {
  PETRA_CHECK(t.defined(), ShapeError, op, ": ", what, " is undefined");
  PETRA_CHECK(is_floating(t.dtype()), ShapeError, op, ": ", what, " must be float32 or float64, got ", t.str());
  PETRA_CHECK(t.device().is_cpu() || t.dtype() == DType::f32, ShapeError, op, ": ", what,
              " on a GPU must be float32, got ", t.str());
}

void check_float(const Tensor& t, const char* op, const char* what) {
  require_contiguous(t, op, what);
  check_float_dtype(t, op, what);
}

// b is defined, contiguous, and has a's dtype and device.
void check_like(const Tensor& a, const Tensor& b, const char* op, const char* what) {
  require_contiguous(b, op, what);
  PETRA_CHECK(b.dtype() == a.dtype(), ShapeError, op, ": ", what, " is ", b.str(), " but expected dtype ", name_of(a.dtype()));
  PETRA_CHECK(b.device() == a.device(), DeviceError, op, ": ", what, " is on ", b.device().str(), ", expected ",
              a.device().str());
}

void check_shape(const Tensor& t, const Shape& expected, const char* op, const char* what) {
  PETRA_CHECK(t.shape() == expected, ShapeError, op, ": ", what, " has shape ", t.shape().str(), ", expected ",
              expected.str());
}

[[noreturn, maybe_unused]] void no_cuda_kernel(const char* op) {  // unused while every family has a kernel
  throw DeviceError(detail::concat(op, ": no CUDA kernel yet (this op runs on the CPU only)"));
}

}  // namespace

// Runs kernels::cpu::NAME (float32) or kernels::ref::NAME<double> (float64); the arguments may
// use the alias T for the element type.
#define PETRA_CPU_CALL(tensor, NAME, ...) \
  do {                                    \
    if ((tensor).dtype() == DType::f32) { \
      using T = float;                    \
      kernels::cpu::NAME(__VA_ARGS__);    \
    } else {                              \
      using T = double;                   \
      kernels::ref::NAME<T>(__VA_ARGS__); \
    }                                     \
  } while (0)

// Runs kernels::cuda::NAME (T = float) when the op's family has a CUDA kernel in this build, else
// raises DeviceError naming the op. PETRA_CUDA_<FAMILY> comes from the family table in
// kernels/meson.build (1 where the family has kernels/cuda/<family>.cu and petra is built with CUDA).
#define PETRA_CUDA_CALL_1(NAME, ...)  \
  do {                                \
    using T = float;                  \
    kernels::cuda::NAME(__VA_ARGS__); \
  } while (0)
#define PETRA_CUDA_CALL_0(NAME, ...) no_cuda_kernel(#NAME)
#define PETRA_PASTE_(a, b) a##b
#define PETRA_PASTE(a, b) PETRA_PASTE_(a, b)

// The one dispatch point of every op: family FAMILY's kernel NAME for `tensor`'s device and dtype.
// It is also the profiler's one hook (petra/profile.hpp): the kernel's wall time goes to its op
// family; with profiling off the timer costs one relaxed atomic load.
#define PETRA_CALL(FAMILY, tensor, NAME, ...)                                          \
  do {                                                                                 \
    static constexpr profile::Family kProfileFamily = profile::family_of(#FAMILY, #NAME); \
    const profile::OpTimer profile_timer(kProfileFamily);                              \
    if ((tensor).device().is_cuda())                                                   \
      PETRA_PASTE(PETRA_CUDA_CALL_, PETRA_CUDA_##FAMILY)(NAME, __VA_ARGS__);           \
    else                                                                               \
      PETRA_CPU_CALL(tensor, NAME, __VA_ARGS__);                                       \
  } while (0)

// A kernel that only kernels::cpu has, in float (the caller has checked the device and dtype),
// timed as PETRA_CALL times every kernel.
#define PETRA_CPU_FLOAT_CALL(FAMILY, NAME, ...)                                            \
  do {                                                                                    \
    static constexpr profile::Family kProfileFamily = profile::family_of(#FAMILY, #NAME); \
    const profile::OpTimer profile_timer(kProfileFamily);                                 \
    kernels::cpu::NAME(__VA_ARGS__);                                                      \
  } while (0)

// Conv2d and batch norm: on a GPU with set_conv_impl(ConvImpl::cudnn), kernels::cudnn::NAME (same
// arguments as kernels::cuda::NAME); otherwise PETRA_CALL. cuDNN exists only in builds with it, and
// set_conv_impl refuses cudnn elsewhere, so use_cudnn is then always false.
#if PETRA_HAVE_CUDA && PETRA_HAVE_CUDNN
#define PETRA_CUDNN_CALL(NAME, ...) \
  do {                              \
    using T = float;                \
    kernels::cudnn::NAME(__VA_ARGS__); \
  } while (0)
#else
#define PETRA_CUDNN_CALL(NAME, ...) no_cuda_kernel("cudnn::" #NAME)
#endif
#define PETRA_CALL_CONV_IMPL(FAMILY, tensor, NAME, ...)                                     \
  do {                                                                                      \
    if (use_cudnn(tensor)) {                                                                \
      static constexpr profile::Family kProfileFamily = profile::family_of(#FAMILY, #NAME); \
      const profile::OpTimer profile_timer(kProfileFamily);                                 \
      PETRA_CUDNN_CALL(NAME, __VA_ARGS__);                                                  \
    } else {                                                                                \
      PETRA_CALL(FAMILY, tensor, NAME, __VA_ARGS__);                                        \
    }                                                                                       \
  } while (0)

// The linear layer's products on a GPU: kernels::cublas where petra is built with cuBLAS, else the
// hand-written kernels::cuda (through PETRA_CALL).
#if PETRA_HAVE_CUDA && PETRA_HAVE_CUBLAS
#define PETRA_CALL_LINEAR(tensor, NAME, ...)                                                 \
  do {                                                                                       \
    if ((tensor).device().is_cuda()) {                                                       \
      using T = float;                                                                       \
      static constexpr profile::Family kProfileFamily = profile::family_of("LINEAR", #NAME); \
      const profile::OpTimer profile_timer(kProfileFamily);                                  \
      kernels::cublas::NAME(__VA_ARGS__);                                                    \
    } else {                                                                                 \
      PETRA_CALL(LINEAR, tensor, NAME, __VA_ARGS__);                                         \
    }                                                                                        \
  } while (0)
#else
#define PETRA_CALL_LINEAR(tensor, NAME, ...) PETRA_CALL(LINEAR, tensor, NAME, __VA_ARGS__)
#endif

// ---------------------------------------------------------------- the convolution implementation
namespace {
std::atomic<int> conv_impl_setting{int(ConvImpl::petra)};

bool use_cudnn(const Tensor& t) {
  return t.device().is_cuda() && ConvImpl(conv_impl_setting.load(std::memory_order_relaxed)) == ConvImpl::cudnn;
}
}  // namespace

}  // namespace petra::ops

namespace petra {

bool cudnn_compiled() { return PETRA_HAVE_CUDA && PETRA_HAVE_CUDNN; }

void set_conv_impl(ConvImpl impl) {
  PETRA_CHECK(impl != ConvImpl::cudnn || cudnn_compiled(), DeviceError,
              "set_conv_impl(cudnn): this petra was built without cuDNN (",
              PETRA_HAVE_CUDA ? "meson found no cudnn.h and libcudnn" : "no CUDA at all", ")");
  ops::conv_impl_setting.store(int(impl));
}

ConvImpl conv_impl() { return ConvImpl(ops::conv_impl_setting.load()); }

const char* name_of(ConvImpl impl) { return impl == ConvImpl::cudnn ? "cudnn" : "petra"; }

namespace {
// `text` as one of the named choices, or a ValueError naming `flag` and every name ("expected a,
// b or c").
template <class E, class... More>
E parse_choice(std::string_view text, std::string_view flag, std::pair<const char*, E> first, More... more) {
  const std::pair<const char*, E> choices[] = {first, more...};
  std::string names;
  for (std::size_t i = 0; i < std::size(choices); ++i) {
    if (text == choices[i].first) return choices[i].second;
    names += (i == 0 ? "" : i + 1 == std::size(choices) ? " or " : ", ") + std::string(choices[i].first);
  }
  throw ValueError(detail::concat(flag, " ", std::string(text), ": expected ", names));
}
}  // namespace

ConvImpl parse_conv_impl(std::string_view text, std::string_view flag) {
  return parse_choice(text, flag, std::pair{"petra", ConvImpl::petra}, std::pair{"cudnn", ConvImpl::cudnn});
}

void set_conv_math(ConvMath math) {
#if PETRA_HAVE_CUDA
  kernels::cuda::set_conv2d_math(math == ConvMath::tf32 ? kernels::cuda::Conv2dMath::tf32 : kernels::cuda::Conv2dMath::fp32);
#else
  PETRA_CHECK(math == ConvMath::fp32, DeviceError, "set_conv_math(tf32): this petra was built without CUDA");
#endif
}

ConvMath conv_math() {
#if PETRA_HAVE_CUDA
  return kernels::cuda::conv2d_math() == kernels::cuda::Conv2dMath::tf32 ? ConvMath::tf32 : ConvMath::fp32;
#else
  return ConvMath::fp32;
#endif
}

ConvMath parse_conv_math(std::string_view text, std::string_view flag) {
  return parse_choice(text, flag, std::pair{"fp32", ConvMath::fp32}, std::pair{"tf32", ConvMath::tf32});
}

const char* name_of(ConvMath math) { return math == ConvMath::tf32 ? "tf32" : "fp32"; }

void set_cudnn_algorithms(CudnnAlgorithms choice) {
#if PETRA_HAVE_CUDA && PETRA_HAVE_CUDNN
  kernels::cudnn::set_conv2d_fastest_algorithms(choice == CudnnAlgorithms::fastest);
#else
  PETRA_CHECK(choice == CudnnAlgorithms::deterministic, DeviceError,
              "set_cudnn_algorithms(fastest): this petra was built without cuDNN");
#endif
}

CudnnAlgorithms cudnn_algorithms() {
#if PETRA_HAVE_CUDA && PETRA_HAVE_CUDNN
  return kernels::cudnn::conv2d_fastest_algorithms() ? CudnnAlgorithms::fastest : CudnnAlgorithms::deterministic;
#else
  return CudnnAlgorithms::deterministic;
#endif
}

CudnnAlgorithms parse_cudnn_algorithms(std::string_view text, std::string_view flag) {
  return parse_choice(text, flag, std::pair{"deterministic", CudnnAlgorithms::deterministic},
                      std::pair{"fastest", CudnnAlgorithms::fastest});
}

const char* name_of(CudnnAlgorithms choice) {
  return choice == CudnnAlgorithms::fastest ? "fastest" : "deterministic";
}

#if PETRA_HAVE_CUDA
namespace {
// The two enums name the same three choices, in the same order.
kernels::cuda::Conv2dWeightAlgorithm to_kernels(ConvWeightAlgorithm algorithm) {
  switch (algorithm) {
    case ConvWeightAlgorithm::direct: return kernels::cuda::Conv2dWeightAlgorithm::direct;
    case ConvWeightAlgorithm::winograd: return kernels::cuda::Conv2dWeightAlgorithm::winograd;
    case ConvWeightAlgorithm::automatic: break;
  }
  return kernels::cuda::Conv2dWeightAlgorithm::automatic;
}
}  // namespace
#endif

void set_conv_weight_algorithm(ConvWeightAlgorithm algorithm) {
#if PETRA_HAVE_CUDA
  kernels::cuda::set_conv2d_weight_algorithm(to_kernels(algorithm));
#else
  PETRA_CHECK(algorithm != ConvWeightAlgorithm::winograd, DeviceError,
              "set_conv_weight_algorithm(winograd): this petra was built without CUDA");
#endif
}

ConvWeightAlgorithm conv_weight_algorithm() {
#if PETRA_HAVE_CUDA
  switch (kernels::cuda::conv2d_weight_algorithm()) {
    case kernels::cuda::Conv2dWeightAlgorithm::direct: return ConvWeightAlgorithm::direct;
    case kernels::cuda::Conv2dWeightAlgorithm::winograd: return ConvWeightAlgorithm::winograd;
    case kernels::cuda::Conv2dWeightAlgorithm::automatic: break;
  }
#endif
  return ConvWeightAlgorithm::automatic;
}

#if PETRA_HAVE_CUDA
// The two enums name the same three choices, in the same order (the conversions below cast).
static_assert(int(ConvForwardAlgorithm::direct) == int(kernels::cuda::Conv2dForwardAlgorithm::direct) &&
              int(ConvForwardAlgorithm::winograd) == int(kernels::cuda::Conv2dForwardAlgorithm::winograd) &&
              int(ConvForwardAlgorithm::automatic) == int(kernels::cuda::Conv2dForwardAlgorithm::automatic));
#endif
void set_conv_forward_algorithm(ConvForwardAlgorithm algorithm) {
#if PETRA_HAVE_CUDA
  kernels::cuda::set_conv2d_forward_algorithm(kernels::cuda::Conv2dForwardAlgorithm(int(algorithm)));
#else
  PETRA_CHECK(algorithm == ConvForwardAlgorithm::direct, DeviceError,
              "set_conv_forward_algorithm(", name_of(algorithm), "): this petra was built without CUDA");
#endif
}

ConvForwardAlgorithm conv_forward_algorithm() {
#if PETRA_HAVE_CUDA
  return ConvForwardAlgorithm(int(kernels::cuda::conv2d_forward_algorithm()));
#else
  return ConvForwardAlgorithm::direct;
#endif
}

ConvForwardAlgorithm parse_conv_forward_algorithm(std::string_view text, std::string_view flag) {
  return parse_choice(text, flag, std::pair{"direct", ConvForwardAlgorithm::direct},
                      std::pair{"winograd", ConvForwardAlgorithm::winograd},
                      std::pair{"auto", ConvForwardAlgorithm::automatic});
}

const char* name_of(ConvForwardAlgorithm algorithm) {
  switch (algorithm) {
    case ConvForwardAlgorithm::winograd: return "winograd";
    case ConvForwardAlgorithm::automatic: return "auto";
    case ConvForwardAlgorithm::direct: break;
  }
  return "direct";
}

void set_batchnorm_one_pass(bool on) {
#if PETRA_HAVE_CUDA
  kernels::cuda::set_batchnorm_one_pass(on);
#else
  PETRA_CHECK(!on, DeviceError, "set_batchnorm_one_pass(true): this petra was built without CUDA");
#endif
}

bool batchnorm_one_pass() {
#if PETRA_HAVE_CUDA
  return kernels::cuda::batchnorm_one_pass();
#else
  return false;
#endif
}

void set_conv_split_k(bool on) {
#if PETRA_HAVE_CUDA
  kernels::cuda::set_conv2d_split_k(on);
#else
  PETRA_CHECK(!on, DeviceError, "set_conv_split_k(true): this petra was built without CUDA");
#endif
}

bool conv_split_k() {
#if PETRA_HAVE_CUDA
  return kernels::cuda::conv2d_split_k();
#else
  return false;
#endif
}

ConvWeightAlgorithm parse_conv_weight_algorithm(std::string_view text, std::string_view flag) {
  return parse_choice(text, flag, std::pair{"auto", ConvWeightAlgorithm::automatic},
                      std::pair{"direct", ConvWeightAlgorithm::direct},
                      std::pair{"winograd", ConvWeightAlgorithm::winograd});
}

const char* name_of(ConvWeightAlgorithm algorithm) {
  switch (algorithm) {
    case ConvWeightAlgorithm::direct: return "direct";
    case ConvWeightAlgorithm::winograd: return "winograd";
    case ConvWeightAlgorithm::automatic: break;
  }
  return "auto";
}

}  // namespace petra

namespace petra::ops {

// ---------------------------------------------------------------- element-wise
namespace {
Tensor binary(const Tensor& a, const Tensor& b, const char* op) {
  check_float(a, op, "a");
  check_like(a, b, op, "b");
  require_same_shape(a, b, op);
  return Tensor::empty(a.shape(), a.dtype(), a.device());
}
}  // namespace

namespace {
// add, sub, mul on operands of different shapes: both expanded to the broadcast shape (a copy for
// each operand not already of that shape), then the same-shape op.
Tensor broadcast_binary(const Tensor& a, const Tensor& b, const char* op, Tensor (*same_shape)(const Tensor&, const Tensor&)) {
  check_float(a, op, "a");
  check_like(a, b, op, "b");
  const Shape shape = broadcast_shape(a.shape(), b.shape(), op);
  PETRA_CHECK(!a.device().is_cuda() || PETRA_CUDA_REDUCE, DeviceError, op, ": broadcasting ", a.shape().str(), " and ",
              b.shape().str(), " has no CUDA kernel yet (equal shapes do)");
  return same_shape(a.shape() == shape ? a : broadcast_to(a, shape), b.shape() == shape ? b : broadcast_to(b, shape));
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return broadcast_binary(a, b, "add", &add);
  Tensor z = binary(a, b, "add");
  const auto& s = stream_for(a.device());
  PETRA_CALL(ELEMENTWISE, a, add, s, a.numel(), a.data_ptr<T>(), b.data_ptr<T>(), z.data_ptr<T>());
  return z;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return broadcast_binary(a, b, "sub", &sub);
  Tensor z = binary(a, b, "sub");
  const auto& s = stream_for(a.device());
  PETRA_CALL(ELEMENTWISE, a, sub, s, a.numel(), a.data_ptr<T>(), b.data_ptr<T>(), z.data_ptr<T>());
  return z;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return broadcast_binary(a, b, "mul", &mul);
  Tensor z = binary(a, b, "mul");
  const auto& s = stream_for(a.device());
  PETRA_CALL(ELEMENTWISE, a, mul, s, a.numel(), a.data_ptr<T>(), b.data_ptr<T>(), z.data_ptr<T>());
  return z;
}

Tensor scale(const Tensor& a, double factor) {
  check_float(a, "scale", "a");
  Tensor y = Tensor::empty(a.shape(), a.dtype(), a.device());
  const auto& s = stream_for(a.device());
  PETRA_CALL(ELEMENTWISE, a, scale, s, a.numel(), factor, a.data_ptr<T>(), y.data_ptr<T>());
  return y;
}

void add_into(const Tensor& dst, const Tensor& src) {
  check_float(dst, "add_into", "dst");
  check_like(dst, src, "add_into", "src");
  require_same_shape(dst, src, "add_into");
  const auto& s = stream_for(dst.device());
  PETRA_CALL(ELEMENTWISE, dst, add_inplace, s, dst.numel(), src.data_ptr<T>(), dst.data_ptr<T>());
}

void axpy_into(const Tensor& dst, double a, const Tensor& x) {
  check_float(dst, "axpy_into", "dst");
  check_like(dst, x, "axpy_into", "x");
  require_same_shape(dst, x, "axpy_into");
  const auto& s = stream_for(dst.device());
  PETRA_CALL(ELEMENTWISE, dst, axpy, s, dst.numel(), a, x.data_ptr<T>(), dst.data_ptr<T>());
}

Tensor relu(const Tensor& x) {
  check_float(x, "relu", "x");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  const auto& s = stream_for(x.device());
  PETRA_CALL(ELEMENTWISE, x, relu, s, x.numel(), x.data_ptr<T>(), y.data_ptr<T>());
  return y;
}

Tensor relu_backward(const Tensor& y, const Tensor& dy) {
  Tensor dx = binary(y, dy, "relu_backward");
  const auto& s = stream_for(y.device());
  PETRA_CALL(ELEMENTWISE, y, relu_backward, s, y.numel(), y.data_ptr<T>(), dy.data_ptr<T>(), dx.data_ptr<T>());
  return dx;
}

// ---------------------------------------------------------------- conv2d
namespace {
kernels::Conv2dShape conv_shape(const Shape& x, const Shape& w, const Conv2dOptions& o, const char* op) {
  PETRA_CHECK(x.ndim() == 4 && w.ndim() == 4, ShapeError, op, ": x ", x.str(), " and w ", w.str(), " must be 4-d (NCHW, KCHW)");
  PETRA_CHECK(x[1] == w[1], ShapeError, op, ": x ", x.str(), " has ", x[1], " channels but w ", w.str(), " expects ", w[1]);
  PETRA_CHECK(o.stride >= 1 && o.padding >= 0, ValueError, op, ": stride ", o.stride, " padding ", o.padding);
  kernels::Conv2dShape k{x[0], x[1], x[2], x[3], w[0], w[2], w[3], o.stride, o.stride, o.padding, o.padding};
  PETRA_CHECK(x[2] + 2 * o.padding >= w[2] && x[3] + 2 * o.padding >= w[3], ShapeError, op, ": kernel ", w.str(),
              " larger than the padded input ", x.str());
  return k;
}
Shape conv_out_shape(const kernels::Conv2dShape& k) { return {k.batch, k.out_channels, k.out_h(), k.out_w()}; }

// A tensor whose images are packed but lie further apart: a channel slice (Tensor::slice(1, ..)),
// such as one stream of a reversible block.
bool is_channel_slice(const Tensor& x) {
  return x.ndim() == 4 && x.stride(3) == 1 && x.stride(2) == x.size(3) && x.stride(1) == x.size(2) * x.size(3) &&
         x.stride(0) >= x.size(1) * x.stride(1);
}

// t as a CPU kernel that takes an image stride reads it: contiguous (image_stride stays 0), or a
// channel slice of a wider tensor, read in place (image_stride = its stride from image to image) so
// that a stream is not copied out of its block's tensor first; packed on a GPU. Any other layout is
// a ShapeError naming `op` and `name`.
Tensor readable_in_place(const Tensor& t, std::int64_t& image_stride, const char* op, const char* name) {
  if (t.is_contiguous()) return t;
  PETRA_CHECK(is_channel_slice(t), ShapeError, op, ": ", name, " ", t.str(), " must be contiguous or a channel slice");
  if (!t.device().is_cpu()) return t.contiguous();
  image_stride = t.stride(0);
  return t;
}

// x as a convolution's forward and backward-weight passes read it (k.in_image_stride, kernels/conv2d.hpp).
Tensor conv_input(const Tensor& x, kernels::Conv2dShape& k, const char* op) {
  return readable_in_place(x, k.in_image_stride, op, "x");
}

// The detail row of one convolution pass in petra-train --profile's table, labelled as
// bench-conv-shapes labels its cases ("3x3 16->32 @28 s2 fwd"; "slice" where x is read in place as
// a channel slice of a wider tensor, as bench-conv-shapes --slice), and the pass's flops.
profile::DetailTimer conv_pass_timer(const kernels::Conv2dShape& k, const char* pass) {
  return profile::DetailTimer([&] {
    std::string label = std::to_string(k.kernel_h) + "x" + std::to_string(k.kernel_w) + " " +
                        std::to_string(k.in_channels) + "->" + std::to_string(k.out_channels) + " @" +
                        std::to_string(k.in_h);
    if (k.stride_h != 1) label += " s" + std::to_string(k.stride_h);
    if (k.x_image_stride() != k.in_channels * k.in_h * k.in_w) label += " slice";
    return profile::DetailCost{label + " " + pass, double(k.flops()), 0};
  });
}
}  // namespace

Tensor conv2d_forward(const Tensor& input, const Tensor& w, const Tensor& bias, const Conv2dOptions& o) {
  check_float_dtype(input, "conv2d", "x");
  auto k = conv_shape(input.shape(), w.shape(), o, "conv2d");
  const Tensor x = conv_input(input, k, "conv2d");
  check_like(x, w, "conv2d", "w");
  if (bias.defined()) {
    check_like(x, bias, "conv2d", "bias");
    check_shape(bias, {k.out_channels}, "conv2d", "bias");
  }
  Tensor y = Tensor::empty(conv_out_shape(k), x.dtype(), x.device());
  const auto& s = stream_for(x.device());
  const auto timer = conv_pass_timer(k, "fwd");
  PETRA_CALL_CONV_IMPL(CONV2D, x, conv2d_forward, s, k, x.data_ptr<T>(), w.data_ptr<T>(), bias.defined() ? bias.data_ptr<T>() : nullptr, y.data_ptr<T>());
  return y;
}

Tensor conv2d_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape, const Conv2dOptions& o) {
  check_float(dy, "conv2d_backward_data", "dy");
  check_like(dy, w, "conv2d_backward_data", "w");
  const auto k = conv_shape(x_shape, w.shape(), o, "conv2d_backward_data");
  check_shape(dy, conv_out_shape(k), "conv2d_backward_data", "dy");
  Tensor dx = Tensor::empty(x_shape, dy.dtype(), dy.device());
  const auto& s = stream_for(dy.device());
  const auto timer = conv_pass_timer(k, "bwd-data");
  PETRA_CALL_CONV_IMPL(CONV2D, dy, conv2d_backward_data, s, k, dy.data_ptr<T>(), w.data_ptr<T>(), dx.data_ptr<T>());
  return dx;
}

void conv2d_backward_weight(const Tensor& input, const Tensor& dy, const Tensor& dw, const Conv2dOptions& o) {
  check_float_dtype(input, "conv2d_backward_weight", "x");
  auto k = conv_shape(input.shape(), dw.shape(), o, "conv2d_backward_weight");
  const Tensor x = conv_input(input, k, "conv2d_backward_weight");
  check_like(x, dy, "conv2d_backward_weight", "dy");
  check_like(x, dw, "conv2d_backward_weight", "dw");
  check_shape(dy, conv_out_shape(k), "conv2d_backward_weight", "dy");
  const auto& s = stream_for(x.device());
  const auto timer = conv_pass_timer(k, "bwd-weight");
  PETRA_CALL_CONV_IMPL(CONV2D, x, conv2d_backward_weight, s, k, x.data_ptr<T>(), dy.data_ptr<T>(), dw.data_ptr<T>());
}

void conv2d_backward_bias(const Tensor& dy, const Tensor& db) {
  check_float(dy, "conv2d_backward_bias", "dy");
  check_like(dy, db, "conv2d_backward_bias", "db");
  PETRA_CHECK(dy.ndim() == 4, ShapeError, "conv2d_backward_bias: dy ", dy.str(), " must be 4-d");
  check_shape(db, {dy.size(1)}, "conv2d_backward_bias", "db");
  kernels::Conv2dShape k{dy.size(0), 1, dy.size(2), dy.size(3), dy.size(1), 1, 1, 1, 1, 0, 0};
  const auto& s = stream_for(dy.device());
  PETRA_CALL(CONV2D, dy, conv2d_backward_bias, s, k, dy.data_ptr<T>(), db.data_ptr<T>());
}

// ---------------------------------------------------------------- batch norm
// batch_norm and batch_norm_relu (the fused batch norm + ReLU) share their checks, their
// allocations and their running-statistics rule; they differ only in the kernels they dispatch to.
namespace {
kernels::BatchNormShape bn_shape(const Tensor& x, const char* op) {
  PETRA_CHECK(x.ndim() == 4, ShapeError, op, ": x ", x.str(), " must be 4-d (NCHW)");
  return {x.size(0), x.size(1), x.size(2), x.size(3)};
}

// The forward's checks; in training mode also allocates saved's statistics.
kernels::BatchNormShape check_batchnorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                                const Tensor& running_mean, const Tensor& running_var,
                                                const BatchNormOptions& o, BatchNormSaved* saved, const char* op) {
  check_float(x, op, "x");
  const auto k = bn_shape(x, op);
  const Shape per_channel{k.channels};
  for (const Tensor* t : {&gamma, &beta}) {
    check_like(x, *t, op, "gamma/beta");
    check_shape(*t, per_channel, op, "gamma/beta");
  }
  PETRA_CHECK(running_mean.defined() == running_var.defined(), ValueError, op, ": give both running statistics or neither");
  if (running_mean.defined()) {
    check_like(x, running_mean, op, "running_mean");
    check_like(x, running_var, op, "running_var");
    check_shape(running_mean, per_channel, op, "running_mean");
    check_shape(running_var, per_channel, op, "running_var");
  }
  if (o.training) {
    PETRA_CHECK(k.values_per_channel() > 1, ShapeError, op, ": training needs more than one value per channel, got ", x.str());
    PETRA_CHECK(saved != nullptr, ValueError, op, ": training mode needs somewhere to save the statistics");
    saved->mean = Tensor::empty(per_channel, x.dtype(), x.device());
    saved->invstd = Tensor::empty(per_channel, x.dtype(), x.device());
  } else {
    PETRA_CHECK(running_mean.defined(), ValueError, op, ": evaluation mode needs the running statistics");
  }
  return k;
}

// dy as batch norm's backward kernels read it (k.dy_image_stride): the coupling hands F its stream of
// the gradient as a channel slice.
Tensor bn_gradient(const Tensor& dy, kernels::BatchNormShape& k, const char* op) {
  return readable_in_place(dy, k.dy_image_stride, op, "dy");
}

// The backward's checks (y: the fused op's output, checked when given), and dy as the kernels read it.
std::pair<kernels::BatchNormShape, Tensor> check_batchnorm_backward(const Tensor& x, const Tensor& y,
                                                                    const Tensor& dy_given, const Tensor& gamma,
                                                                    const BatchNormSaved& saved, const Tensor& dgamma,
                                                                    const Tensor& dbeta, const Tensor& dx_sum,
                                                                    const char* op) {
  check_float(x, op, "x");
  auto k = bn_shape(x, op);
  check_float_dtype(dy_given, op, "dy");
  const Tensor dy = bn_gradient(dy_given, k, op);
  PETRA_CHECK(dy.dtype() == x.dtype(), ShapeError, op, ": dy is ", dy.str(), " but expected dtype ", name_of(x.dtype()));
  PETRA_CHECK(dy.device() == x.device(), DeviceError, op, ": dy is on ", dy.device().str(), ", expected ",
              x.device().str());
  require_same_shape(x, dy, op);
  if (y.defined()) {
    check_like(x, y, op, "y");
    require_same_shape(x, y, op);
  }
  const Shape per_channel{k.channels};
  for (const Tensor* t : {&gamma, &saved.mean, &saved.invstd, &dgamma, &dbeta}) {
    check_like(x, *t, op, "per-channel tensor");
    check_shape(*t, per_channel, op, "per-channel tensor");
  }
  if (dx_sum.defined()) {
    check_like(x, dx_sum, op, "dx_sum");
    check_shape(dx_sum, per_channel, op, "dx_sum");
  }
  return {k, dy};
}
}  // namespace

namespace {
// Whether the fused batch norm + ReLU keeps its forward's map and takes the backward's mask from x
// (kernels::cpu::batchnorm_relu_*_mapped): the CPU kernels in float. The GPUs and double (ref::)
// read y.
bool maps_relu_mask(const Tensor& x) { return x.device().is_cpu() && x.dtype() == DType::f32; }

// The detail row of one batch norm in petra-train --profile's second table ("bn+relu 16 @28 fwd"),
// with the bytes its kernel's passes move: `streams` tensors of the batch norm's size read or written
// (training forward: x twice and y; backward: x and dy twice and dx, and y twice with the ReLU).
profile::DetailTimer batchnorm_timer(const kernels::BatchNormShape& k, const char* kind, const char* pass,
                                     int streams) {
  return profile::DetailTimer([&] {
    const std::string label = std::string(kind) + " " + std::to_string(k.channels) + " @" + std::to_string(k.height) +
                              " " + pass;
    return profile::DetailCost{label, 0, double(streams) * double(k.size()) * sizeof(float)};
  });
}
}  // namespace

Tensor batchnorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                         const Tensor& running_var, const BatchNormOptions& o, BatchNormSaved* saved) {
  const auto k = check_batchnorm_forward(x, gamma, beta, running_mean, running_var, o, saved, "batch_norm");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  const auto& s = stream_for(x.device());
  const auto timer = batchnorm_timer(k, "bn", o.training ? "fwd" : "eval", o.training ? 3 : 2);
  if (o.training) {
    PETRA_CALL_CONV_IMPL(BATCHNORM, x, batchnorm_forward_train, s, k, o.eps, o.momentum, x.data_ptr<T>(), gamma.data_ptr<T>(), beta.data_ptr<T>(),
               y.data_ptr<T>(), saved->mean.data_ptr<T>(), saved->invstd.data_ptr<T>(),
               running_mean.defined() ? running_mean.data_ptr<T>() : nullptr,
               running_var.defined() ? running_var.data_ptr<T>() : nullptr);
  } else {
    PETRA_CALL_CONV_IMPL(BATCHNORM, x, batchnorm_forward_eval, s, k, o.eps, x.data_ptr<T>(), gamma.data_ptr<T>(), beta.data_ptr<T>(),
               running_mean.data_ptr<T>(), running_var.data_ptr<T>(), y.data_ptr<T>());
  }
  return y;
}

Tensor batchnorm_backward(const Tensor& x, const Tensor& dy_given, const Tensor& gamma, const BatchNormSaved& saved,
                          const Tensor& dgamma, const Tensor& dbeta, const Tensor& dx_sum) {
  const auto [k, dy] =
      check_batchnorm_backward(x, Tensor(), dy_given, gamma, saved, dgamma, dbeta, dx_sum, "batch_norm_backward");
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  const auto& s = stream_for(x.device());
  const auto timer = batchnorm_timer(k, "bn", "bwd", 5);
  if (dx_sum.defined() && !use_cudnn(x)) {
    PETRA_CALL(BATCHNORM, x, batchnorm_backward_summed, s, k, x.data_ptr<T>(), dy.data_ptr<T>(), gamma.data_ptr<T>(),
               saved.mean.data_ptr<T>(), saved.invstd.data_ptr<T>(), dx.data_ptr<T>(), dgamma.data_ptr<T>(),
               dbeta.data_ptr<T>(), dx_sum.data_ptr<T>());
    return dx;
  }
  PETRA_CALL_CONV_IMPL(BATCHNORM, x, batchnorm_backward, s, k, x.data_ptr<T>(), dy.data_ptr<T>(), gamma.data_ptr<T>(), saved.mean.data_ptr<T>(),
             saved.invstd.data_ptr<T>(), dx.data_ptr<T>(), dgamma.data_ptr<T>(), dbeta.data_ptr<T>());
  if (dx_sum.defined()) conv2d_backward_bias(dx, dx_sum);  // cuDNN: the sum in a pass of its own
  return dx;
}

Tensor batchnorm_relu_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                              const Tensor& running_var, const BatchNormOptions& o, BatchNormSaved* saved) {
  const auto k = check_batchnorm_forward(x, gamma, beta, running_mean, running_var, o, saved, "batch_norm_relu");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  const auto& s = stream_for(x.device());
  const auto timer = batchnorm_timer(k, "bn+relu", o.training ? "fwd" : "eval", o.training ? 3 : 2);
  if (o.training && maps_relu_mask(x)) {
    saved->affine = Tensor::empty({3 * k.channels}, x.dtype(), x.device());
    PETRA_CPU_FLOAT_CALL(BATCHNORM, batchnorm_relu_forward_train_mapped, s, k, o.eps, o.momentum, x.data_ptr<float>(),
               gamma.data_ptr<float>(), beta.data_ptr<float>(), y.data_ptr<float>(), saved->mean.data_ptr<float>(),
               saved->invstd.data_ptr<float>(), running_mean.defined() ? running_mean.data_ptr<float>() : nullptr,
               running_var.defined() ? running_var.data_ptr<float>() : nullptr, saved->affine.data_ptr<float>());
    return y;
  }
  if (o.training) {
    PETRA_CALL_CONV_IMPL(BATCHNORM, x, batchnorm_relu_forward_train, s, k, o.eps, o.momentum, x.data_ptr<T>(), gamma.data_ptr<T>(),
                         beta.data_ptr<T>(), y.data_ptr<T>(), saved->mean.data_ptr<T>(), saved->invstd.data_ptr<T>(),
                         running_mean.defined() ? running_mean.data_ptr<T>() : nullptr,
                         running_var.defined() ? running_var.data_ptr<T>() : nullptr);
  } else {
    PETRA_CALL_CONV_IMPL(BATCHNORM, x, batchnorm_relu_forward_eval, s, k, o.eps, x.data_ptr<T>(), gamma.data_ptr<T>(),
                         beta.data_ptr<T>(), running_mean.data_ptr<T>(), running_var.data_ptr<T>(), y.data_ptr<T>());
  }
  return y;
}

Tensor batchnorm_relu_backward(const Tensor& x, const Tensor& y, const Tensor& dy_given, const Tensor& gamma,
                               const BatchNormSaved& saved, const Tensor& dgamma, const Tensor& dbeta,
                               const Tensor& dx_sum, bool dy_given_up) {
  const char* op = "batch_norm_relu_backward";
  PETRA_CHECK(y.defined() || (saved.affine.defined() && maps_relu_mask(x)), ValueError, op,
              ": needs y, the fused forward's output (the ReLU mask), or the CPU forward's saved.affine");
  const auto [k, dy] = check_batchnorm_backward(x, y, dy_given, gamma, saved, dgamma, dbeta, dx_sum, op);
  const auto& s = stream_for(x.device());
  if (saved.affine.defined() && maps_relu_mask(x)) {
    check_like(x, saved.affine, op, "saved.affine");
    check_shape(saved.affine, {3 * k.channels}, op, "saved.affine");
    // The mapped kernel reads dy[i] before it writes dx[i] and never again after: dx may be dy
    // (dy: what the kernel reads, dy_given itself where that is contiguous).
    const bool over_dy = dy_given_up && dy_given.is_contiguous() && dy.raw_data() == dy_given.raw_data();
    Tensor dx = over_dy ? dy_given : Tensor::empty(x.shape(), x.dtype(), x.device());
    const auto timer = batchnorm_timer(k, "bn+relu", "bwd", 5);  // y is not read
    PETRA_CPU_FLOAT_CALL(BATCHNORM, batchnorm_relu_backward_mapped, s, k, x.data_ptr<float>(),
               saved.affine.data_ptr<float>(), dy.data_ptr<float>(), gamma.data_ptr<float>(),
               saved.mean.data_ptr<float>(), saved.invstd.data_ptr<float>(), dx.data_ptr<float>(),
               dgamma.data_ptr<float>(), dbeta.data_ptr<float>(),
               dx_sum.defined() ? dx_sum.data_ptr<float>() : nullptr);
    return dx;
  }
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  const auto timer = batchnorm_timer(k, "bn+relu", "bwd", 7);
  if (dx_sum.defined() && !use_cudnn(x)) {
    PETRA_CALL(BATCHNORM, x, batchnorm_relu_backward_summed, s, k, x.data_ptr<T>(), y.data_ptr<T>(), dy.data_ptr<T>(),
               gamma.data_ptr<T>(), saved.mean.data_ptr<T>(), saved.invstd.data_ptr<T>(), dx.data_ptr<T>(),
               dgamma.data_ptr<T>(), dbeta.data_ptr<T>(), dx_sum.data_ptr<T>());
    return dx;
  }
  PETRA_CALL_CONV_IMPL(BATCHNORM, x, batchnorm_relu_backward, s, k, x.data_ptr<T>(), y.data_ptr<T>(), dy.data_ptr<T>(),
                       gamma.data_ptr<T>(), saved.mean.data_ptr<T>(), saved.invstd.data_ptr<T>(), dx.data_ptr<T>(),
                       dgamma.data_ptr<T>(), dbeta.data_ptr<T>());
  if (dx_sum.defined()) conv2d_backward_bias(dx, dx_sum);  // cuDNN: the sum in a pass of its own
  return dx;
}

// ---------------------------------------------------------------- conv2d + batch norm + ReLU
// kernels/conv_batchnorm.hpp: the stem's convolution fused with its batch norm and ReLU, the
// convolution's output recomputed in each pass instead of stored. CPU, float, training only.
namespace {
// The convolution's shape where the fused op takes x and w (CPU float tensors of a shape that
// kernels::cpu::conv_batchnorm_relu_fits accepts); nullopt elsewhere.
std::optional<kernels::Conv2dShape> fused_stem_shape(const Tensor& x, const Tensor& w, const Conv2dOptions& o) {
  if (!x.defined() || !w.defined() || !x.device().is_cpu() || x.dtype() != DType::f32 || w.dtype() != DType::f32 ||
      !w.device().is_cpu() || !w.is_contiguous() || x.ndim() != 4 || w.ndim() != 4 || x.size(1) != w.size(1) ||
      !(x.is_contiguous() || is_channel_slice(x)) || o.stride < 1 || o.padding < 0)
    return std::nullopt;
  kernels::Conv2dShape k{x.size(0), x.size(1), x.size(2), x.size(3), w.size(0), w.size(2), w.size(3), o.stride, o.stride,
                         o.padding, o.padding};
  if (!kernels::cpu::conv_batchnorm_relu_fits(k)) return std::nullopt;
  return k;
}

// The per-channel tensors of the fused op: shape {C} and like x.
void check_stem_per_channel(const Tensor& x, std::int64_t channels, std::initializer_list<const Tensor*> tensors,
                            const char* op) {
  for (const Tensor* t : tensors)
    if (t->defined()) {
      check_like(x, *t, op, "per-channel tensor");
      check_shape(*t, {channels}, op, "per-channel tensor");
    }
}
}  // namespace

bool conv_batchnorm_relu_fits(const Tensor& x, const Tensor& w, const Conv2dOptions& o) {
  return fused_stem_shape(x, w, o).has_value();
}

Tensor conv_batchnorm_relu_forward(const Tensor& input, const Tensor& w, const Tensor& bias, const Tensor& gamma,
                                   const Tensor& beta, const Tensor& running_mean, const Tensor& running_var,
                                   const Conv2dOptions& co, const BatchNormOptions& o, BatchNormSaved* saved) {
  const char* op = "conv_batch_norm_relu";
  auto fits = fused_stem_shape(input, w, co);
  PETRA_CHECK(fits.has_value(), ShapeError, op, ": x ", input.str(), " and w ", w.str(), " (stride ", co.stride,
              ", padding ", co.padding, ") are not a CPU float convolution it takes (ops::conv_batchnorm_relu_fits)");
  PETRA_CHECK(o.training, ValueError, op, ": training mode only (evaluation runs conv2d and batch_norm_relu)");
  PETRA_CHECK(saved != nullptr, ValueError, op, ": needs somewhere to save the statistics");
  kernels::Conv2dShape k = *fits;
  const Tensor x = conv_input(input, k, op);
  PETRA_CHECK(running_mean.defined() == running_var.defined(), ValueError, op,
              ": give both running statistics or neither");
  check_stem_per_channel(x, k.out_channels, {&bias, &gamma, &beta, &running_mean, &running_var}, op);
  PETRA_CHECK(gamma.defined() && beta.defined(), ValueError, op, ": needs gamma and beta");
  PETRA_CHECK(k.batch * k.in_h * k.in_w > 1, ShapeError, op, ": training needs more than one value per channel, got ",
              input.str());
  const Shape per_channel{k.out_channels};
  saved->mean = Tensor::empty(per_channel, x.dtype(), x.device());
  saved->invstd = Tensor::empty(per_channel, x.dtype(), x.device());
  saved->affine = Tensor::empty({3 * k.out_channels}, x.dtype(), x.device());
  Tensor y = Tensor::empty(conv_out_shape(k), x.dtype(), x.device());
  const auto& s = stream_for(x.device());
  const auto timer = batchnorm_timer(bn_shape(y, op), "conv+bn+relu", "fwd", 1);  // y: its only tensor pass
  PETRA_CPU_FLOAT_CALL(BATCHNORM, conv_batchnorm_relu_forward_train, s, k, o.eps, o.momentum, x.data_ptr<float>(),
                       w.data_ptr<float>(), bias.defined() ? bias.data_ptr<float>() : nullptr, gamma.data_ptr<float>(),
                       beta.data_ptr<float>(), y.data_ptr<float>(), saved->mean.data_ptr<float>(),
                       saved->invstd.data_ptr<float>(), running_mean.defined() ? running_mean.data_ptr<float>() : nullptr,
                       running_var.defined() ? running_var.data_ptr<float>() : nullptr, saved->affine.data_ptr<float>());
  return y;
}

void conv_batchnorm_relu_backward(const Tensor& input, const Tensor& w, const Tensor& bias, const Tensor& dy_given,
                                  const Tensor& gamma, const BatchNormSaved& saved, const Conv2dOptions& co,
                                  const Tensor& dw, const Tensor& dbias, const Tensor& dgamma, const Tensor& dbeta) {
  const char* op = "conv_batch_norm_relu_backward";
  auto fits = fused_stem_shape(input, w, co);
  PETRA_CHECK(fits.has_value(), ShapeError, op, ": x ", input.str(), " and w ", w.str(),
              " are not a convolution the fused op takes");
  kernels::Conv2dShape k = *fits;
  const Tensor x = conv_input(input, k, op);
  check_float_dtype(dy_given, op, "dy");
  check_like(x, dy_given, op, "dy");
  check_shape(dy_given, conv_out_shape(k), op, "dy");
  const Tensor dy = dy_given.contiguous();
  PETRA_CHECK(dw.defined() && gamma.defined() && dgamma.defined() && dbeta.defined(), ValueError, op,
              ": needs gamma and somewhere to add dw, dgamma and dbeta (dbias alone may be undefined)");
  check_like(x, dw, op, "dw");
  check_shape(dw, w.shape(), op, "dw");
  check_stem_per_channel(x, k.out_channels, {&bias, &dbias, &gamma, &saved.mean, &saved.invstd, &dgamma, &dbeta}, op);
  PETRA_CHECK(saved.affine.defined(), ValueError, op, ": needs the forward's saved.affine");
  check_like(x, saved.affine, op, "saved.affine");
  check_shape(saved.affine, {3 * k.out_channels}, op, "saved.affine");
  const auto& s = stream_for(x.device());
  const auto timer = batchnorm_timer(bn_shape(dy, op), "conv+bn+relu", "bwd", 2);  // dy, read twice
  PETRA_CPU_FLOAT_CALL(BATCHNORM, conv_batchnorm_relu_backward, s, k, x.data_ptr<float>(), w.data_ptr<float>(),
                       bias.defined() ? bias.data_ptr<float>() : nullptr, saved.affine.data_ptr<float>(),
                       dy.data_ptr<float>(), gamma.data_ptr<float>(), saved.mean.data_ptr<float>(),
                       saved.invstd.data_ptr<float>(), dw.data_ptr<float>(),
                       dbias.defined() ? dbias.data_ptr<float>() : nullptr, dgamma.data_ptr<float>(),
                       dbeta.data_ptr<float>());
}

// ---------------------------------------------------------------- reductions
namespace {
// The reduce kernels' description of "reduce these dims of this shape": the dims and a bit mask.
std::uint32_t reduce_mask(const Shape& shape, std::span<const int> dims, const char* op) {
  std::uint32_t mask = 0;
  for (int d : dims) {
    const int k = d < 0 ? d + shape.ndim() : d;
    PETRA_CHECK(k >= 0 && k < shape.ndim(), ShapeError, op, ": dim ", d, " out of range for ", shape.str());
    mask |= 1u << k;
  }
  return mask;
}
Shape reduced_shape(const Shape& shape, std::uint32_t mask) {
  std::vector<std::int64_t> dims(shape.dims().begin(), shape.dims().end());
  for (std::size_t d = 0; d < dims.size(); ++d)
    if (mask & (1u << d)) dims[d] = 1;
  return Shape(std::span<const std::int64_t>(dims));
}
}  // namespace

Tensor sum(const Tensor& x, std::span<const int> dims) {
  check_float(x, "sum", "x");
  const std::uint32_t mask = reduce_mask(x.shape(), dims, "sum");
  Tensor y = Tensor::empty(reduced_shape(x.shape(), mask), x.dtype(), x.device());
  const auto& s = stream_for(x.device());
  PETRA_CALL(REDUCE, x, reduce_sum, s, x.shape().dims(), mask, x.data_ptr<T>(), y.data_ptr<T>());
  return y;
}

double relative_error(const Tensor& approx, const Tensor& exact) {
  PETRA_CHECK(approx.shape() == exact.shape(), ShapeError, "relative_error: shapes ", approx.shape().str(), " and ",
              exact.shape().str());
  const auto as_doubles = [](const Tensor& t) {
    if (t.dtype() == DType::f64) return t.to_vector<double>();
    const auto f = t.to_vector<float>();
    return std::vector<double>(f.begin(), f.end());
  };
  const auto a = as_doubles(approx), e = as_doubles(exact);
  double difference = 0, reference = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    difference += (a[i] - e[i]) * (a[i] - e[i]);
    reference += e[i] * e[i];
  }
  return reference > 0 ? std::sqrt(difference / reference) : std::sqrt(difference);
}

Tensor mean(const Tensor& x, std::span<const int> dims) {
  check_float(x, "mean", "x");
  const std::uint32_t mask = reduce_mask(x.shape(), dims, "mean");
  Tensor y = Tensor::empty(reduced_shape(x.shape(), mask), x.dtype(), x.device());
  const auto& s = stream_for(x.device());
  PETRA_CALL(REDUCE, x, reduce_mean, s, x.shape().dims(), mask, x.data_ptr<T>(), y.data_ptr<T>());
  return y;
}

Shape broadcast_shape(const Shape& a, const Shape& b, const char* op) {
  const int ndim = std::max(a.ndim(), b.ndim());
  std::vector<std::int64_t> dims(static_cast<std::size_t>(ndim));
  for (int i = 1; i <= ndim; ++i) {  // from the right
    const std::int64_t da = i <= a.ndim() ? a[-i] : 1, db = i <= b.ndim() ? b[-i] : 1;
    PETRA_CHECK(da == db || da == 1 || db == 1, ShapeError, op, ": shapes ", a.str(), " and ", b.str(),
                " cannot be broadcast together (dim ", ndim - i, " from the left of the result: ", da, " vs ", db, ")");
    dims[static_cast<std::size_t>(ndim - i)] = da == 1 ? db : da;
  }
  return Shape(std::span<const std::int64_t>(dims));
}

namespace {
// The dims of `full` that `shape` stretches: the leading dims `shape` lacks, and those where it has
// size 1 and full does not. ShapeError naming `op` unless `shape` broadcasts to exactly `full`.
std::uint32_t stretched_dims(const Shape& shape, const Shape& full, const char* op) {
  PETRA_CHECK(shape.ndim() <= full.ndim(), ShapeError, op, ": ", shape.str(), " has more dims than ", full.str());
  const int missing = full.ndim() - shape.ndim();
  std::uint32_t mask = 0;
  for (int d = 0; d < full.ndim(); ++d) {
    const std::int64_t size = d < missing ? 1 : shape[d - missing];
    PETRA_CHECK(size == full[d] || size == 1, ShapeError, op, ": ", shape.str(), " does not broadcast to ", full.str());
    if (size != full[d]) mask |= 1u << d;
  }
  return mask;
}
}  // namespace

Tensor broadcast_to(const Tensor& small, const Shape& shape) {
  check_float(small, "broadcast_to", "small");
  const std::uint32_t mask = stretched_dims(small.shape(), shape, "broadcast_to");
  Tensor big = Tensor::empty(shape, small.dtype(), small.device());
  const auto& s = stream_for(small.device());
  // The kernel reads `small` as the full rank with size-1 dims where the mask is set, which is
  // also the layout of a tensor missing leading dims.
  PETRA_CALL(REDUCE, small, reduce_sum_backward, s, shape.dims(), mask, small.data_ptr<T>(), big.data_ptr<T>());
  return big;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  check_float(x, "sum_to", "x");
  const std::uint32_t mask = stretched_dims(shape, x.shape(), "sum_to");
  std::vector<int> dims;
  for (int d = 0; d < x.ndim(); ++d)
    if (mask & (1u << d)) dims.push_back(d);
  return (dims.empty() ? x : sum(x, dims)).reshape(shape);
}

// ---------------------------------------------------------------- loss
namespace {
// Element i of an int64 tensor, read on the host: directly on the CPU; from a GPU by a copy on s, the
// stream whose kernels wrote it, which is then synchronised.
std::int64_t read_int64(const Tensor& t, std::int64_t i, const kernels::StreamHandle& s) {
  const std::int64_t* p = t.data_ptr<std::int64_t>() + i;
  if (!t.device().is_cuda()) return *p;
  std::int64_t value = 0;
  cuda_backend::memcpy_async(&value, p, sizeof value, s.cuda_stream);
  cuda_backend::stream_synchronize(s.cuda_stream);
  return value;
}

// Logits [batch, classes] and int64 labels [batch], contiguous, on the same device (on a GPU the
// kernels read the labels there: they must be copied to the device with the images).
kernels::CrossEntropyShape loss_shape(const Tensor& logits, const Tensor& labels, const char* op) {
  check_float(logits, op, "logits");
  PETRA_CHECK(logits.ndim() == 2, ShapeError, op, ": logits ", logits.str(), " must be [batch, classes]");
  require_contiguous(labels, op, "labels");
  PETRA_CHECK(labels.dtype() == DType::i64 && labels.shape() == Shape{logits.size(0)}, ShapeError, op, ": labels ",
              labels.str(), " must be int64 [", logits.size(0), "]");
  PETRA_CHECK(labels.device() == logits.device(), DeviceError, op, ": labels on ", labels.device().str(),
              ", logits on ", logits.device().str());
  return {logits.size(0), logits.size(1)};
}
}  // namespace

Tensor cross_entropy_forward(const Tensor& logits, const Tensor& labels, CrossEntropySaved* saved,
                             LabelCheck check) {
  const auto k = loss_shape(logits, labels, "cross_entropy");
  PETRA_CHECK(saved != nullptr, ValueError, "cross_entropy: needs somewhere to save the probabilities");
  Tensor loss = Tensor::empty({1}, logits.dtype(), logits.device());
  saved->probs = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  saved->first_bad = Tensor::empty({1}, DType::i64, logits.device());
  const auto& s = stream_for(logits.device());
  PETRA_CALL(LOSS, logits, cross_entropy_forward, s, k, logits.data_ptr<T>(), labels.data_ptr<std::int64_t>(),
             loss.data_ptr<T>(), saved->probs.data_ptr<T>(), saved->first_bad.data_ptr<std::int64_t>());
  if (check == LabelCheck::now) check_labels(saved->first_bad, labels, k.classes);
  return loss;
}

void check_labels(const Tensor& first_bad, const Tensor& labels, std::int64_t classes) {
  PETRA_CHECK(first_bad.dtype() == DType::i64 && first_bad.numel() == 1 && first_bad.device() == labels.device(),
              ShapeError, "check_labels: first_bad ", first_bad.str(), " must be int64 [1] on the labels' device ",
              labels.device().str());
  const auto& s = stream_for(labels.device());
  const std::int64_t bad = read_int64(first_bad, 0, s);
  if (bad >= 0)
    throw ValueError(detail::concat("cross_entropy: label ", read_int64(labels, bad, s), " of sample ", bad,
                                    " is outside [0, ", classes, ")"));
}

Tensor cross_entropy_backward(const CrossEntropySaved& saved, const Tensor& labels, const Tensor& dloss) {
  const auto k = loss_shape(saved.probs, labels, "cross_entropy_backward");
  check_like(saved.probs, dloss, "cross_entropy_backward", "dloss");
  PETRA_CHECK(dloss.numel() == 1, ShapeError, "cross_entropy_backward: dloss ", dloss.str(), " must be a scalar");
  Tensor dlogits = Tensor::empty(saved.probs.shape(), saved.probs.dtype(), saved.probs.device());
  const auto& s = stream_for(dlogits.device());
  PETRA_CALL(LOSS, dlogits, cross_entropy_backward, s, k, saved.probs.data_ptr<T>(), labels.data_ptr<std::int64_t>(),
                      dloss.data_ptr<T>(), dlogits.data_ptr<T>());
  return dlogits;
}

Tensor argmax(const Tensor& logits) {
  check_float(logits, "argmax", "logits");
  PETRA_CHECK(logits.ndim() == 2, ShapeError, "argmax: logits ", logits.str(), " must be [batch, classes]");
  Tensor predicted = Tensor::empty({logits.size(0)}, DType::i64, logits.device());
  const auto& s = stream_for(logits.device());
  const kernels::CrossEntropyShape k{logits.size(0), logits.size(1)};
  PETRA_CALL(LOSS, logits, argmax, s, k, logits.data_ptr<T>(), predicted.data_ptr<std::int64_t>());
  return predicted;
}

Tensor correct_predictions(const Tensor& logits, const Tensor& labels) {
  const auto k = loss_shape(logits, labels, "count_correct");
  Tensor correct = Tensor::empty({1}, DType::i64, logits.device());
  const auto& s = stream_for(logits.device());
  PETRA_CALL(LOSS, logits, count_correct, s, k, logits.data_ptr<T>(), labels.data_ptr<std::int64_t>(),
             correct.data_ptr<std::int64_t>());
  return correct;
}

std::int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  return read_int64(correct_predictions(logits, labels), 0, stream_for(logits.device()));
}

// ---------------------------------------------------------------- optimizer steps
namespace {
void check_state(const Tensor& param, std::initializer_list<const Tensor*> others, const char* op) {
  check_float(param, op, "param");
  for (const Tensor* t : others) {
    check_like(param, *t, op, "gradient/state");
    require_same_shape(param, *t, op);
  }
}
}  // namespace

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, const SgdOptions& o,
              bool first_step) {
  PETRA_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), ValueError,
              "sgd: Nesterov momentum needs momentum > 0 and dampening 0");
  const bool uses_buffer = o.momentum != 0;
  if (uses_buffer)
    check_state(param, {&grad, &momentum_buffer}, "sgd");
  else
    check_state(param, {&grad}, "sgd");
  const auto& s = stream_for(param.device());
  PETRA_CALL(OPTIM, param, sgd_step, s, param.numel(), o, first_step, param.data_ptr<T>(), grad.data_ptr<T>(),
                      uses_buffer ? momentum_buffer.data_ptr<T>() : nullptr);
}

void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
               const AdamOptions& o, std::int64_t step) {
  PETRA_CHECK(step >= 1, ValueError, "adam: steps count from 1, got ", step);
  check_state(param, {&grad, &exp_avg, &exp_avg_sq}, "adam");
  const auto& s = stream_for(param.device());
  PETRA_CALL(OPTIM, param, adam_step, s, param.numel(), o, step, param.data_ptr<T>(), grad.data_ptr<T>(),
                      exp_avg.data_ptr<T>(), exp_avg_sq.data_ptr<T>());
}

void lars_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, const LarsOptions& o) {
  check_state(param, {&grad, &momentum_buffer}, "lars");
  const auto& s = stream_for(param.device());
  PETRA_CALL(OPTIM, param, lars_step, s, param.numel(), o, param.data_ptr<T>(), grad.data_ptr<T>(), momentum_buffer.data_ptr<T>());
}

// ---------------------------------------------------------------- linear
namespace {
kernels::LinearShape linear_shape(const Shape& x, const Shape& w, const char* op) {
  PETRA_CHECK(x.ndim() == 2 && w.ndim() == 2 && x[1] == w[1], ShapeError, op, ": x ", x.str(), " and w ", w.str(),
              " must be [batch, in] and [out, in]");
  return {x[0], x[1], w[0]};
}
}  // namespace

Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias) {
  check_float(x, "linear", "x");
  check_like(x, w, "linear", "w");
  const auto k = linear_shape(x.shape(), w.shape(), "linear");
  if (bias.defined()) {
    check_like(x, bias, "linear", "bias");
    check_shape(bias, {k.out_features}, "linear", "bias");
  }
  Tensor y = Tensor::empty({k.batch, k.out_features}, x.dtype(), x.device());
  const auto& s = stream_for(x.device());
  PETRA_CALL_LINEAR(x, linear_forward, s, k, x.data_ptr<T>(), w.data_ptr<T>(), bias.defined() ? bias.data_ptr<T>() : nullptr,
                      y.data_ptr<T>());
  return y;
}

Tensor linear_backward_data(const Tensor& dy, const Tensor& w) {
  check_float(dy, "linear_backward_data", "dy");
  check_like(dy, w, "linear_backward_data", "w");
  PETRA_CHECK(dy.ndim() == 2, ShapeError, "linear_backward_data: dy ", dy.str(), " must be [batch, out]");
  const auto k = linear_shape({dy.size(0), w.size(1)}, w.shape(), "linear_backward_data");
  check_shape(dy, {k.batch, k.out_features}, "linear_backward_data", "dy");
  Tensor dx = Tensor::empty({k.batch, k.in_features}, dy.dtype(), dy.device());
  const auto& s = stream_for(dy.device());
  PETRA_CALL_LINEAR(dy, linear_backward_data, s, k, dy.data_ptr<T>(), w.data_ptr<T>(), dx.data_ptr<T>());
  return dx;
}

void linear_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw) {
  check_float(x, "linear_backward_weight", "x");
  check_like(x, dy, "linear_backward_weight", "dy");
  check_like(x, dw, "linear_backward_weight", "dw");
  const auto k = linear_shape(x.shape(), dw.shape(), "linear_backward_weight");
  check_shape(dy, {k.batch, k.out_features}, "linear_backward_weight", "dy");
  const auto& s = stream_for(x.device());
  PETRA_CALL_LINEAR(x, linear_backward_weight, s, k, x.data_ptr<T>(), dy.data_ptr<T>(), dw.data_ptr<T>());
}

void linear_backward_bias(const Tensor& dy, const Tensor& db) {
  check_float(dy, "linear_backward_bias", "dy");
  check_like(dy, db, "linear_backward_bias", "db");
  PETRA_CHECK(dy.ndim() == 2, ShapeError, "linear_backward_bias: dy ", dy.str(), " must be [batch, out]");
  check_shape(db, {dy.size(1)}, "linear_backward_bias", "db");
  const kernels::LinearShape k{dy.size(0), 1, dy.size(1)};
  const auto& s = stream_for(dy.device());
  PETRA_CALL(LINEAR, dy, linear_backward_bias, s, k, dy.data_ptr<T>(), db.data_ptr<T>());
}

// ---------------------------------------------------------------- pooling
namespace {
kernels::Pool2dShape pool_shape(const Shape& x, const Pool2dOptions& o, const char* op) {
  PETRA_CHECK(x.ndim() == 4, ShapeError, op, ": x ", x.str(), " must be 4-d (NCHW)");
  PETRA_CHECK(o.kernel >= 1 && o.stride >= 1 && o.padding >= 0 && 2 * o.padding <= o.kernel, ValueError, op,
              ": kernel ", o.kernel, " stride ", o.stride, " padding ", o.padding,
              " (need kernel, stride >= 1 and padding <= kernel / 2)");
  PETRA_CHECK(x[2] + 2 * o.padding >= o.kernel && x[3] + 2 * o.padding >= o.kernel, ShapeError, op, ": window ",
              o.kernel, " larger than the padded input ", x.str());
  return {x[0], x[1], x[2], x[3], o.kernel, o.stride, o.padding};
}
Shape pool_out_shape(const kernels::Pool2dShape& k) { return {k.batch, k.channels, k.out_height(), k.out_width()}; }
kernels::GlobalPoolShape global_pool_shape(const Shape& x, const char* op) {
  PETRA_CHECK(x.ndim() == 4, ShapeError, op, ": x ", x.str(), " must be 4-d (NCHW)");
  return {x[0], x[1], x[2], x[3]};
}
}  // namespace

Tensor max_pool2d_forward(const Tensor& x, const Pool2dOptions& o, Tensor* argmax) {
  check_float(x, "max_pool2d", "x");
  const auto k = pool_shape(x.shape(), o, "max_pool2d");
  Tensor y = Tensor::empty(pool_out_shape(k), x.dtype(), x.device());
  std::int32_t* indices = nullptr;
  if (argmax != nullptr) {
    *argmax = Tensor::empty(y.shape(), DType::i32, x.device());
    indices = argmax->data_ptr<std::int32_t>();
  }
  const auto& s = stream_for(x.device());
  PETRA_CALL(POOL, x, max_pool2d_forward, s, k, x.data_ptr<T>(), y.data_ptr<T>(), indices);
  return y;
}

Tensor max_pool2d_backward(const Tensor& dy, const Tensor& argmax, const Shape& x_shape, const Pool2dOptions& o) {
  check_float(dy, "max_pool2d_backward", "dy");
  const auto k = pool_shape(x_shape, o, "max_pool2d_backward");
  check_shape(dy, pool_out_shape(k), "max_pool2d_backward", "dy");
  require_contiguous(argmax, "max_pool2d_backward", "argmax");
  PETRA_CHECK(argmax.dtype() == DType::i32 && argmax.shape() == dy.shape(), ShapeError,
              "max_pool2d_backward: argmax ", argmax.str(), " must be int32 of dy's shape ", dy.shape().str());
  Tensor dx = Tensor::empty(x_shape, dy.dtype(), dy.device());
  const auto& s = stream_for(dy.device());
  PETRA_CALL(POOL, dy, max_pool2d_backward, s, k, dy.data_ptr<T>(), argmax.data_ptr<std::int32_t>(), dx.data_ptr<T>());
  return dx;
}

Tensor avg_pool2d_forward(const Tensor& x, const Pool2dOptions& o) {
  check_float(x, "avg_pool2d", "x");
  const auto k = pool_shape(x.shape(), o, "avg_pool2d");
  Tensor y = Tensor::empty(pool_out_shape(k), x.dtype(), x.device());
  const auto& s = stream_for(x.device());
  PETRA_CALL(POOL, x, avg_pool2d_forward, s, k, x.data_ptr<T>(), y.data_ptr<T>());
  return y;
}

Tensor avg_pool2d_backward(const Tensor& dy, const Shape& x_shape, const Pool2dOptions& o) {
  check_float(dy, "avg_pool2d_backward", "dy");
  const auto k = pool_shape(x_shape, o, "avg_pool2d_backward");
  check_shape(dy, pool_out_shape(k), "avg_pool2d_backward", "dy");
  Tensor dx = Tensor::empty(x_shape, dy.dtype(), dy.device());
  const auto& s = stream_for(dy.device());
  PETRA_CALL(POOL, dy, avg_pool2d_backward, s, k, dy.data_ptr<T>(), dx.data_ptr<T>());
  return dx;
}

Tensor global_avg_pool_forward(const Tensor& x) {
  check_float(x, "global_avg_pool", "x");
  const auto k = global_pool_shape(x.shape(), "global_avg_pool");
  Tensor y = Tensor::empty({k.batch, k.channels}, x.dtype(), x.device());
  const auto& s = stream_for(x.device());
  PETRA_CALL(POOL, x, global_avg_pool_forward, s, k, x.data_ptr<T>(), y.data_ptr<T>());
  return y;
}

Tensor global_avg_pool_backward(const Tensor& dy, const Shape& x_shape) {
  check_float(dy, "global_avg_pool_backward", "dy");
  const auto k = global_pool_shape(x_shape, "global_avg_pool_backward");
  check_shape(dy, {k.batch, k.channels}, "global_avg_pool_backward", "dy");
  Tensor dx = Tensor::empty(x_shape, dy.dtype(), dy.device());
  const auto& s = stream_for(dy.device());
  PETRA_CALL(POOL, dy, global_avg_pool_backward, s, k, dy.data_ptr<T>(), dx.data_ptr<T>());
  return dx;
}

// ---------------------------------------------------------------- channels
namespace {
// (batch, channels, everything after the channels flattened into one plane).
kernels::ChannelShape channel_shape(const Shape& x, const char* op) {
  PETRA_CHECK(x.ndim() >= 2, ShapeError, op, ": ", x.str(), " has no channel dim");
  return {x[0], x[1], x.numel() / std::max<std::int64_t>(x[0] * x[1], 1), 1};
}
}  // namespace

Tensor channel_slice(const Tensor& x, std::int64_t first, std::int64_t count) {
  check_float(x, "channel_slice", "x");
  const auto k = channel_shape(x.shape(), "channel_slice");
  PETRA_CHECK(first >= 0 && count >= 0 && first + count <= k.channels, ShapeError, "channel_slice: channels [", first,
              ", ", first + count, ") of ", x.str());
  Tensor part = Tensor::empty(x.shape().with(1, count), x.dtype(), x.device());
  const auto& s = stream_for(x.device());
  PETRA_CALL(CHANNEL, x, channel_split, s, k, x.data_ptr<T>(), first, count, part.data_ptr<T>());
  return part;
}

Tensor channel_concat(std::span<const Tensor> parts) {
  PETRA_CHECK(!parts.empty(), ValueError, "channel_concat: no tensors");
  const Tensor& first = parts[0];
  check_float(first, "channel_concat", "parts[0]");
  std::int64_t channels = 0;
  for (const Tensor& p : parts) {
    check_like(first, p, "channel_concat", "part");
    PETRA_CHECK(p.shape().with(1, first.size(1)) == first.shape(), ShapeError, "channel_concat: ", p.str(),
                " does not match ", first.str(), " outside the channel dim");
    channels += p.size(1);
  }
  Tensor full = Tensor::empty(first.shape().with(1, channels), first.dtype(), first.device());
  const auto k = channel_shape(full.shape(), "channel_concat");
  const auto& s = stream_for(first.device());
  std::int64_t at = 0;
  for (const Tensor& p : parts) {
    PETRA_CALL(CHANNEL, p, channel_insert, s, k, p.data_ptr<T>(), at, p.size(1), full.data_ptr<T>());
    at += p.size(1);
  }
  return full;
}

namespace {
// The channel shape of `full` for writing `part` into its channels from `first` (op: the caller).
kernels::ChannelShape channel_piece_shape(const Tensor& full, const Tensor& part, std::int64_t first, const char* op) {
  check_float(full, op, "full");
  check_like(full, part, op, "part");
  const auto k = channel_shape(full.shape(), op);
  PETRA_CHECK(part.ndim() == full.ndim() && first >= 0 && first + part.size(1) <= k.channels &&
                  part.shape().with(1, k.channels) == full.shape(),
              ShapeError, op, ": ", part.str(), " does not fit channels from ", first, " of ", full.str());
  return k;
}
}  // namespace

void channel_accumulate_into(const Tensor& full, const Tensor& part, std::int64_t first) {
  const auto k = channel_piece_shape(full, part, first, "channel_accumulate_into");
  const auto& s = stream_for(full.device());
  PETRA_CALL(CHANNEL, full, channel_accumulate, s, k, part.data_ptr<T>(), first, part.size(1), full.data_ptr<T>());
}

void channel_copy_into(const Tensor& full, const Tensor& part, std::int64_t first) {
  const auto k = channel_piece_shape(full, part, first, "channel_copy_into");
  const auto& s = stream_for(full.device());
  PETRA_CALL(CHANNEL, part, channel_insert, s, k, part.data_ptr<T>(), first, part.size(1), full.data_ptr<T>());
}

// ---------------------------------------------------------------- coupling
namespace {
// The shape of a two-stream tensor (channels: C per stream).
kernels::CouplingShape two_stream_shape(const Tensor& two_streams, const char* op) {
  check_float(two_streams, op, "x");
  const Shape& x = two_streams.shape();
  PETRA_CHECK(x.ndim() == 4 && x[1] % 2 == 0, ShapeError, op, ": ", x.str(),
              " must be NCHW with an even number of channels (two streams)");
  return {x[0], x[1] / 2, x[2], x[3]};
}

kernels::CouplingShape coupling_shape(const Tensor& two_streams, const Tensor& f, const char* op) {
  const kernels::CouplingShape k = two_stream_shape(two_streams, op);
  check_like(two_streams, f, op, "f");
  check_shape(f, two_streams.shape().with(1, k.channels), op, "f");
  return k;
}
}  // namespace

Tensor coupling_forward(const Tensor& x, const Tensor& f) {
  const auto k = coupling_shape(x, f, "coupling_forward");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  const auto& s = stream_for(x.device());
  PETRA_CALL(COUPLING, x, coupling_forward, s, k, x.data_ptr<T>(), f.data_ptr<T>(), y.data_ptr<T>());
  return y;
}

Tensor coupling_inverse(const Tensor& y, const Tensor& f) {
  const auto k = coupling_shape(y, f, "coupling_inverse");
  Tensor x = Tensor::empty(y.shape(), y.dtype(), y.device());
  const auto& s = stream_for(y.device());
  PETRA_CALL(COUPLING, y, coupling_inverse, s, k, y.data_ptr<T>(), f.data_ptr<T>(), x.data_ptr<T>());
  return x;
}

Tensor coupling_backward(const Tensor& dy, const Tensor& g) {
  const auto k = coupling_shape(dy, g, "coupling_backward");
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
  const auto& s = stream_for(dy.device());
  PETRA_CALL(COUPLING, dy, coupling_backward, s, k, dy.data_ptr<T>(), g.data_ptr<T>(), dx.data_ptr<T>());
  return dx;
}

Tensor swap_streams(const Tensor& dy) {
  const auto k = two_stream_shape(dy, "swap_streams");
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
  const auto& s = stream_for(dy.device());
  PETRA_CALL(COUPLING, dy, coupling_backward, s, k, dy.data_ptr<T>(), static_cast<const T*>(nullptr),
             dx.data_ptr<T>());
  return dx;
}

namespace {
// The fused batch norm + ReLU + coupling in `direction`, a: the coupling's input (x or y).
// `keep`, when given (training on the CPU in float only), receives what the backward of
// batchnorm_relu_backward needs: the statistics and the map applied (saved.affine).
Tensor batchnorm_relu_coupling(kernels::CouplingDirection direction, const Tensor& a, const Tensor& z,
                               const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                               const Tensor& running_var, const BatchNormOptions& o, const char* op,
                               BatchNormSaved* keep = nullptr) {
  BatchNormSaved local;
  BatchNormSaved& saved = keep != nullptr ? *keep : local;
  const auto k = check_batchnorm_forward(z, gamma, beta, running_mean, running_var, o, &saved, op);
  coupling_shape(a, z, op);
  PETRA_CHECK(keep == nullptr || batchnorm_relu_coupling_keeps_map(z, o), ValueError, op,
              ": keeps the map for a backward only in training, on the CPU in float; got ", z.str());
  if (keep != nullptr) {
    Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
    const auto timer = batchnorm_timer(k, "bn+relu+coupling", "fwd", 6);
    saved.affine = Tensor::empty({3 * k.channels}, z.dtype(), z.device());
    PETRA_CPU_FLOAT_CALL(BATCHNORM, batchnorm_relu_coupling_train_mapped, stream_for(z.device()), k, o.eps,
                         o.momentum, direction, z.data_ptr<float>(), gamma.data_ptr<float>(), beta.data_ptr<float>(),
                         a.data_ptr<float>(), out.data_ptr<float>(), saved.mean.data_ptr<float>(),
                         saved.invstd.data_ptr<float>(),
                         running_mean.defined() ? running_mean.data_ptr<float>() : nullptr,
                         running_var.defined() ? running_var.data_ptr<float>() : nullptr,
                         saved.affine.data_ptr<float>());
    return out;
  }
  if (use_cudnn(z)) {  // cuDNN's batch norm (--conv-impl cudnn) has no such epilogue: the pair, unfused
    const Tensor f = batchnorm_relu_forward(z, gamma, beta, running_mean, running_var, o, &saved);
    return direction == kernels::CouplingDirection::forward ? coupling_forward(a, f) : coupling_inverse(a, f);
  }
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  const auto& s = stream_for(z.device());
  // z twice (training) or once, the other stream read and written, the moved stream copied
  const char* kind =
      direction == kernels::CouplingDirection::forward ? "bn+relu+coupling" : "bn+relu+coupling-inverse";
  const auto timer = batchnorm_timer(k, kind, o.training ? "fwd" : "eval", o.training ? 6 : 5);
  if (o.training) {
    PETRA_CALL(BATCHNORM, z, batchnorm_relu_coupling_train, s, k, o.eps, o.momentum, direction, z.data_ptr<T>(),
               gamma.data_ptr<T>(), beta.data_ptr<T>(), a.data_ptr<T>(), out.data_ptr<T>(),
               saved.mean.data_ptr<T>(), saved.invstd.data_ptr<T>(),
               running_mean.defined() ? running_mean.data_ptr<T>() : nullptr,
               running_var.defined() ? running_var.data_ptr<T>() : nullptr);
  } else {
    PETRA_CALL(BATCHNORM, z, batchnorm_relu_coupling_eval, s, k, o.eps, direction, z.data_ptr<T>(),
               gamma.data_ptr<T>(), beta.data_ptr<T>(), running_mean.data_ptr<T>(), running_var.data_ptr<T>(),
               a.data_ptr<T>(), out.data_ptr<T>());
  }
  return out;
}
}  // namespace

Tensor batchnorm_relu_coupling_forward(const Tensor& x, const Tensor& z, const Tensor& gamma, const Tensor& beta,
                                       const Tensor& running_mean, const Tensor& running_var,
                                       const BatchNormOptions& o, BatchNormSaved* saved) {
  return batchnorm_relu_coupling(kernels::CouplingDirection::forward, x, z, gamma, beta, running_mean, running_var, o,
                                 "batchnorm_relu_coupling_forward", saved);
}

bool batchnorm_relu_coupling_keeps_map(const Tensor& z, const BatchNormOptions& o) {
  return o.training && maps_relu_mask(z);
}

Tensor batchnorm_relu_coupling_inverse(const Tensor& y, const Tensor& z, const Tensor& gamma, const Tensor& beta,
                                       const Tensor& running_mean, const Tensor& running_var,
                                       const BatchNormOptions& o) {
  return batchnorm_relu_coupling(kernels::CouplingDirection::inverse, y, z, gamma, beta, running_mean, running_var, o,
                                 "batchnorm_relu_coupling_inverse");
}

}  // namespace petra::ops
