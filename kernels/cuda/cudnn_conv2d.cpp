// kernels/cuda/cudnn_conv2d.cpp: the convolution on cuDNN (kernels/cuda_libraries.hpp,
// kernels::cudnn::conv2d_*), the run-time alternative to petra's implicit GEMM (--conv-impl cudnn).
//
// Layout: petra's tensors are NCHW, contiguous, float, and its weights (O, C, R, S): exactly cuDNN's
// CUDNN_TENSOR_NCHW tensors and filters, so descriptors describe petra's memory as it is. The
// convolution is a cross-correlation (CUDNN_CROSS_CORRELATION, as PyTorch's), symmetric zero padding,
// dilation 1, one group, FP32 compute type.
//
// Passes and petra's "=" / "+=": forward y = conv (beta 0), then the bias added by cudnnAddTensor;
// backward data dx = (beta 0); backward weight dw += (beta 1).
//
// Choosing the algorithm, deterministically. cudnnFind* times every algorithm and keeps the fastest,
// so two runs may pick different algorithms (different bits). petra asks cuDNN's heuristics instead
// (cudnnGet*Algorithm_v7: a ranked list, nothing timed), walks the list in cuDNN's order and keeps
// the first algorithm that (1) cuDNN reports as CUDNN_DETERMINISTIC (for backward data ALGO_0 and for
// backward weight ALGO_0 and ALGO_3 are not: they add with atomics), (2) is supported for the shape,
// and (3) needs no more workspace than kMaxWorkspaceBytes (none when the stream has no workspace).
// The choice is cached per (device, shape, pass, math): the same shape gets the same algorithm for
// the whole run, and in every run on the same GPU model with the same cuDNN.
//
// The fastest algorithms instead (set_conv2d_fastest_algorithms(true); petra-train
// --cudnn-algorithms fastest): cudnnFind* runs every algorithm on the shape's first call and ranks
// them by time; the first that succeeded within the workspace limit is kept, deterministic or not,
// as PyTorch's cudnn.benchmark does. It measures what determinism costs; results may then differ
// from run to run in the last bits (the algorithm may change, and ALGO_0 / ALGO_3 of the backward
// passes add with atomics).
//
// Math: every pass follows cuda::conv2d_math(), as petra's kernels do: fp32 sets CUDNN_FMA_MATH (no
// tensor cores, no TF32 rounding), tf32 lets cuDNN use the tensor cores (the algorithm's math type
// as the heuristics rank it, as PyTorch does).
#include <cudnn.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <map>
#include <mutex>
#include <vector>

#include "petra/error.hpp"
#include "petra/kernels/cuda/cudnn_common.hpp"
#include "petra/kernels/cuda_libraries.hpp"

namespace petra::kernels::cudnn {
namespace {

using cudnn_detail::TensorDescriptor;
using cudnn_detail::to_int;

// The most workspace one convolution may take from the stream's workspace. cuDNN's fastest
// algorithms for the ResNet shapes at batch 128-256 ask for tens of MiB; FFT ones can ask for GiBs.
constexpr std::size_t kMaxWorkspaceBytes = std::size_t(512) << 20;

enum Pass { kForward = 0, kData = 1, kWeight = 2 };

class FilterDescriptor {
 public:
  explicit FilterDescriptor(const Conv2dShape& k, const char* op) {
    PETRA_CUDNN_CHECK(cudnnCreateFilterDescriptor(&desc_));
    try {
      PETRA_CUDNN_CHECK(cudnnSetFilter4dDescriptor(desc_, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                                   to_int(k.out_channels, op, "out_channels"),
                                                   to_int(k.in_channels, op, "in_channels"),
                                                   to_int(k.kernel_h, op, "kernel_h"), to_int(k.kernel_w, op, "kernel_w")));
    } catch (...) {
      cudnnDestroyFilterDescriptor(desc_);
      throw;
    }
  }
  ~FilterDescriptor() { cudnnDestroyFilterDescriptor(desc_); }
  FilterDescriptor(const FilterDescriptor&) = delete;
  FilterDescriptor& operator=(const FilterDescriptor&) = delete;
  cudnnFilterDescriptor_t get() const { return desc_; }

 private:
  cudnnFilterDescriptor_t desc_ = nullptr;
};

class ConvolutionDescriptor {
 public:
  ConvolutionDescriptor(const Conv2dShape& k, cudnnMathType_t math, const char* op) {
    PETRA_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&desc_));
    try {
      PETRA_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(desc_, to_int(k.pad_h, op, "pad_h"), to_int(k.pad_w, op, "pad_w"),
                                                        to_int(k.stride_h, op, "stride_h"),
                                                        to_int(k.stride_w, op, "stride_w"), 1, 1,
                                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
      set_math(math);
    } catch (...) {
      cudnnDestroyConvolutionDescriptor(desc_);
      throw;
    }
  }
  ~ConvolutionDescriptor() { cudnnDestroyConvolutionDescriptor(desc_); }
  ConvolutionDescriptor(const ConvolutionDescriptor&) = delete;
  ConvolutionDescriptor& operator=(const ConvolutionDescriptor&) = delete;
  void set_math(cudnnMathType_t math) { PETRA_CUDNN_CHECK(cudnnSetConvolutionMathType(desc_, math)); }
  cudnnConvolutionDescriptor_t get() const { return desc_; }

 private:
  cudnnConvolutionDescriptor_t desc_ = nullptr;
};

// Everything cuDNN needs to know about one convolution call.
struct Descriptors {
  TensorDescriptor input, output;
  FilterDescriptor filter;
  ConvolutionDescriptor convolution;
  Descriptors(const Conv2dShape& k, cudnnMathType_t math, const char* op)
      : input(k.batch, k.in_channels, k.in_h, k.in_w, op),
        output(k.batch, k.out_channels, k.out_h(), k.out_w(), op),
        filter(k, op),
        convolution(k, math, op) {}
};

// The math a pass asks for: the process's setting (cuda::conv2d_math), the same for the three passes.
cudnnMathType_t requested_math() {
  return cuda::conv2d_math() == cuda::Conv2dMath::tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

// One candidate of cuDNN's heuristics or of its timing, whatever the pass.
struct Candidate {
  int algorithm;
  cudnnStatus_t status;
  cudnnDeterminism_t determinism;
  cudnnMathType_t math;
};

// cuDNN's ranked candidates for `pass`: query is cudnnGet*Algorithm_v7 (the heuristics' order) or
// cudnnFind*Algorithm (every algorithm run, fastest first); the two share their signature.
template <class Perf, class Query>
std::vector<Candidate> ranked(Query query, int count) {
  std::vector<Perf> perf(static_cast<std::size_t>(count));
  int returned = 0;
  PETRA_CUDNN_CHECK(query(count, &returned, perf.data()));
  std::vector<Candidate> out;
  for (int i = 0; i < returned; ++i)
    out.push_back({int(perf[i].algo), perf[i].status, perf[i].determinism, perf[i].mathType});
  return out;
}

// set_conv2d_fastest_algorithms: process-wide, deterministic (false) unless asked.
std::atomic<bool> fastest_setting{false};

// The candidates for `pass`: by cuDNN's heuristics, or timed when `timed` (cuDNN allocates the
// buffers it times with itself; the descriptor's math is the requested one, FMA under FP32).
std::vector<Candidate> candidates(cudnnHandle_t h, const Descriptors& d, Pass pass, bool timed) {
  switch (pass) {
    case kForward:
      return ranked<cudnnConvolutionFwdAlgoPerf_t>(
          [&](int n, int* got, cudnnConvolutionFwdAlgoPerf_t* p) {
            return (timed ? cudnnFindConvolutionForwardAlgorithm : cudnnGetConvolutionForwardAlgorithm_v7)(
                h, d.input.get(), d.filter.get(), d.convolution.get(), d.output.get(), n, got, p);
          },
          CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
    case kData:
      return ranked<cudnnConvolutionBwdDataAlgoPerf_t>(
          [&](int n, int* got, cudnnConvolutionBwdDataAlgoPerf_t* p) {
            return (timed ? cudnnFindConvolutionBackwardDataAlgorithm : cudnnGetConvolutionBackwardDataAlgorithm_v7)(
                h, d.filter.get(), d.output.get(), d.convolution.get(), d.input.get(), n, got, p);
          },
          CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
    case kWeight:
      return ranked<cudnnConvolutionBwdFilterAlgoPerf_t>(
          [&](int n, int* got, cudnnConvolutionBwdFilterAlgoPerf_t* p) {
            return (timed ? cudnnFindConvolutionBackwardFilterAlgorithm
                          : cudnnGetConvolutionBackwardFilterAlgorithm_v7)(
                h, d.input.get(), d.output.get(), d.convolution.get(), d.filter.get(), n, got, p);
          },
          CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
  }
  return {};
}

// Workspace of `algorithm` for `pass` under the descriptor's current math, or false if unsupported.
bool workspace_of(cudnnHandle_t h, const Descriptors& d, Pass pass, int algorithm, std::size_t* bytes) {
  cudnnStatus_t status = CUDNN_STATUS_NOT_SUPPORTED;
  switch (pass) {
    case kForward:
      status = cudnnGetConvolutionForwardWorkspaceSize(h, d.input.get(), d.filter.get(), d.convolution.get(),
                                                       d.output.get(), cudnnConvolutionFwdAlgo_t(algorithm), bytes);
      break;
    case kData:
      status = cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.filter.get(), d.output.get(), d.convolution.get(),
                                                            d.input.get(), cudnnConvolutionBwdDataAlgo_t(algorithm),
                                                            bytes);
      break;
    case kWeight:
      status = cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.input.get(), d.output.get(), d.convolution.get(),
                                                              d.filter.get(),
                                                              cudnnConvolutionBwdFilterAlgo_t(algorithm), bytes);
      break;
  }
  return status == CUDNN_STATUS_SUCCESS;
}

const char* pass_name(Pass pass) {
  return pass == kForward ? "cudnn::conv2d_forward" : pass == kData ? "cudnn::conv2d_backward_data"
                                                                    : "cudnn::conv2d_backward_weight";
}

// The first candidate that is supported, within the workspace limit and deterministic (cuDNN's
// heuristics, in their order), or the fastest supported one within the limit whatever its
// determinism (set_conv2d_fastest_algorithms); sets d's math to it.
Conv2dAlgorithm choose(cudnnHandle_t h, Descriptors& d, const Conv2dShape& k, Pass pass, cudnnMathType_t math,
                       std::size_t max_workspace) {
  const bool fastest = fastest_setting.load();
  for (const Candidate& c : candidates(h, d, pass, fastest)) {
    if (c.status != CUDNN_STATUS_SUCCESS || (!fastest && c.determinism != CUDNN_DETERMINISTIC)) continue;
    // Under FP32 the descriptor stays CUDNN_FMA_MATH whatever the ranking says; under TF32 the
    // candidate's own math type (tensor cores where it has them).
    const cudnnMathType_t run_math = math == CUDNN_FMA_MATH ? CUDNN_FMA_MATH : c.math;
    d.convolution.set_math(run_math);
    std::size_t bytes = 0;
    if (!workspace_of(h, d, pass, c.algorithm, &bytes) || bytes > max_workspace) continue;
    return {c.algorithm, bytes, int(run_math)};
  }
  throw DeviceError(detail::concat(pass_name(pass), ": cuDNN offers no ", fastest ? "" : "deterministic ",
                                   "algorithm within ", max_workspace >> 20, " MiB of workspace for x (", k.batch,
                                   ", ", k.in_channels, ", ", k.in_h, ", ", k.in_w, "), w (", k.out_channels, ", ",
                                   k.in_channels, ", ", k.kernel_h, ", ", k.kernel_w, "), stride ", k.stride_h, "x",
                                   k.stride_w, ", padding ", k.pad_h, "x", k.pad_w));
}

// The cache of choices: the key is everything the choice depends on.
using Key = std::array<std::int64_t, 16>;
Key key_of(const StreamHandle& s, const Conv2dShape& k, Pass pass, cudnnMathType_t math, std::size_t max_workspace) {
  return {s.device_index, k.batch,    k.in_channels, k.in_h,     k.in_w,   k.out_channels, k.kernel_h, k.kernel_w,
          k.stride_h,     k.stride_w, k.pad_h,       k.pad_w,    pass,     int(math),      std::int64_t(max_workspace),
          fastest_setting.load() ? 1 : 0};
}

// The (cached) algorithm for this call, with d's math set to run it.
Conv2dAlgorithm algorithm_for(const StreamHandle& s, cudnnHandle_t h, Descriptors& d, const Conv2dShape& k, Pass pass) {
  static std::mutex mutex;
  static std::map<Key, Conv2dAlgorithm> cache;
  const cudnnMathType_t math = requested_math();
  const std::size_t max_workspace = s.workspace != nullptr ? kMaxWorkspaceBytes : 0;
  const Key key = key_of(s, k, pass, math, max_workspace);
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto found = cache.find(key);
    if (found != cache.end()) {
      d.convolution.set_math(cudnnMathType_t(found->second.math_type));
      return found->second;
    }
  }
  const Conv2dAlgorithm chosen = choose(h, d, k, pass, math, max_workspace);
  const std::lock_guard<std::mutex> lock(mutex);
  cache.emplace(key, chosen);  // another thread may have chosen first: the same choice
  return chosen;
}

void* workspace(const StreamHandle& s, std::size_t bytes) { return bytes == 0 ? nullptr : s.scratch(bytes); }

}  // namespace

void set_conv2d_fastest_algorithms(bool fastest) { fastest_setting.store(fastest); }
bool conv2d_fastest_algorithms() { return fastest_setting.load(); }

Conv2dAlgorithm conv2d_algorithm(const StreamHandle& s, const Conv2dShape& shape, int pass) {
  PETRA_CHECK(pass >= 0 && pass <= 2, ValueError, "cudnn::conv2d_algorithm: pass ", pass, " is not 0, 1 or 2");
  cuda_detail::DeviceGuard guard(s.device_index);
  const Pass p = Pass(pass);
  Descriptors d(shape, requested_math(), pass_name(p));
  return algorithm_for(s, cudnn_detail::handle_for(s), d, shape, p);
}

void conv2d_forward(const StreamHandle& s, const Conv2dShape& shape, const float* x, const float* w,
                    const float* bias, float* y) {
  if (shape.output_size() == 0) return;
  cuda_detail::DeviceGuard guard(s.device_index);
  const cudnnHandle_t h = cudnn_detail::handle_for(s);
  Descriptors d(shape, requested_math(), pass_name(kForward));
  const Conv2dAlgorithm a = algorithm_for(s, h, d, shape, kForward);
  const float one = 1.0f, zero = 0.0f;
  PETRA_CUDNN_CHECK(cudnnConvolutionForward(h, &one, d.input.get(), x, d.filter.get(), w, d.convolution.get(),
                                            cudnnConvolutionFwdAlgo_t(a.algorithm), workspace(s, a.workspace_bytes),
                                            a.workspace_bytes, &zero, d.output.get(), y));
  if (bias != nullptr) {
    const TensorDescriptor bias_desc(1, shape.out_channels, 1, 1, pass_name(kForward));
    PETRA_CUDNN_CHECK(cudnnAddTensor(h, &one, bias_desc.get(), bias, &one, d.output.get(), y));
  }
}

void conv2d_backward_data(const StreamHandle& s, const Conv2dShape& shape, const float* dy, const float* w,
                          float* dx) {
  if (shape.input_size() == 0) return;
  cuda_detail::DeviceGuard guard(s.device_index);
  const cudnnHandle_t h = cudnn_detail::handle_for(s);
  Descriptors d(shape, requested_math(), pass_name(kData));
  const Conv2dAlgorithm a = algorithm_for(s, h, d, shape, kData);
  const float one = 1.0f, zero = 0.0f;
  PETRA_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, d.filter.get(), w, d.output.get(), dy, d.convolution.get(),
                                                 cudnnConvolutionBwdDataAlgo_t(a.algorithm),
                                                 workspace(s, a.workspace_bytes), a.workspace_bytes, &zero,
                                                 d.input.get(), dx));
}

void conv2d_backward_weight(const StreamHandle& s, const Conv2dShape& shape, const float* x, const float* dy,
                            float* dw) {
  if (shape.output_size() == 0 || shape.weight_size() == 0) return;  // dw += 0
  cuda_detail::DeviceGuard guard(s.device_index);
  const cudnnHandle_t h = cudnn_detail::handle_for(s);
  Descriptors d(shape, requested_math(), pass_name(kWeight));
  const Conv2dAlgorithm a = algorithm_for(s, h, d, shape, kWeight);
  const float one = 1.0f;
  PETRA_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, d.input.get(), x, d.output.get(), dy, d.convolution.get(),
                                                   cudnnConvolutionBwdFilterAlgo_t(a.algorithm),
                                                   workspace(s, a.workspace_bytes), a.workspace_bytes, &one,
                                                   d.filter.get(), dw));
}

}  // namespace petra::kernels::cudnn
