// kernels/cuda/cudnn_common.hpp: what petra's cuDNN glue shares (internal, not installed): the
// status check that turns a cuDNN failure into a petra error, the per-(device, stream) handle, and
// owning wrappers of the descriptors, so that an exception between create and destroy leaks none.
//
// Only cuDNN 9's legacy API is used (cudnnConvolutionForward, cudnnBatchNormalization*): it is
// still shipped and documented in cuDNN 9, and needs no graph building for these fixed ops.
#pragma once

#include <cudnn.h>

#include <climits>
#include <cstdint>
#include <string>

#include "petra/error.hpp"
#include "petra/kernels/common.hpp"
#include "petra/kernels/cuda/check.cuh"
#include "petra/kernels/cuda/per_stream_handles.hpp"

namespace petra::cudnn_detail {

[[noreturn]] inline void throw_cudnn_error(cudnnStatus_t status, const char* operation, const char* file,
                                           int line) {
  const std::string message =
      detail::concat(operation, " failed: ", cudnnGetErrorString(status), " at ", file, ":", line);
  switch (status) {
    case CUDNN_STATUS_ALLOC_FAILED:
      throw OutOfMemoryError(message);
    case CUDNN_STATUS_NOT_INITIALIZED:
    case CUDNN_STATUS_ARCH_MISMATCH:
      throw DeviceError(message);
    default:
      throw Error(message);
  }
}

#define PETRA_CUDNN_CHECK(expr)                                                             \
  do {                                                                                      \
    const cudnnStatus_t petra_cudnn_status_ = (expr);                                       \
    if (petra_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                        \
      ::petra::cudnn_detail::throw_cudnn_error(petra_cudnn_status_, #expr, __FILE__, __LINE__); \
  } while (0)

inline cudnnHandle_t make_handle(cudaStream_t stream) {
  cudnnHandle_t handle = nullptr;
  PETRA_CUDNN_CHECK(cudnnCreate(&handle));
  PETRA_CUDNN_CHECK(cudnnSetStream(handle, stream));
  return handle;
}

// The cuDNN handle of s's (device, stream); s's device must be current.
inline cudnnHandle_t handle_for(const kernels::StreamHandle& s) {
  static cuda_detail::PerStreamHandles<cudnnHandle_t> handles(make_handle);
  return handles.get(s);
}

// cuDNN's descriptors take int sizes.
inline int to_int(std::int64_t v, const char* op, const char* what) {
  PETRA_CHECK(v >= 0 && v <= INT_MAX, ShapeError, op, ": ", what, " = ", v, " does not fit cuDNN's int arguments");
  return static_cast<int>(v);
}

// An NCHW float tensor descriptor (fully packed).
class TensorDescriptor {
 public:
  TensorDescriptor(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w, const char* op) {
    PETRA_CUDNN_CHECK(cudnnCreateTensorDescriptor(&desc_));
    try {
      PETRA_CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, to_int(n, op, "N"),
                                                   to_int(c, op, "C"), to_int(h, op, "H"), to_int(w, op, "W")));
    } catch (...) {
      cudnnDestroyTensorDescriptor(desc_);
      throw;
    }
  }
  ~TensorDescriptor() { cudnnDestroyTensorDescriptor(desc_); }
  TensorDescriptor(const TensorDescriptor&) = delete;
  TensorDescriptor& operator=(const TensorDescriptor&) = delete;
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

}  // namespace petra::cudnn_detail
