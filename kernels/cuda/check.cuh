// kernels/cuda/check.cuh: internal helpers for petra's CUDA code (not installed).
//
//   PETRA_CUDA_CHECK(expr)            throws a petra error when a runtime call fails
//   PETRA_CUDA_CHECK_LAUNCH(name)     the same for the kernel launch just made
//   DeviceGuard                       makes a device current for a scope, then restores the old one
//   grid_stride_blocks(n)             launch size of a grid-stride kernel
//   launch_grid_stride(...)           launch + check of a grid-stride kernel (nvcc only)
//
// Outside nvcc only the runtime API header is included, so g++ can compile this too
// (petra/cuda_backend.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "petra/error.hpp"

namespace petra::cuda_detail {

// Throws the petra exception that fits `code`; the message names the failed operation, the CUDA
// error and where it happened. The runtime's "last error" is cleared first, so a later, unrelated
// check does not report this failure again. (Sticky errors, such as a kernel that faulted, cannot
// be cleared: the context is lost and every later call fails too.)
[[noreturn]] inline void throw_cuda_error(cudaError_t code, const std::string& operation,
                                          const char* file, int line) {
  (void)cudaGetLastError();
  const std::string message = detail::concat(operation, " failed: ", cudaGetErrorString(code), " (",
                                             cudaGetErrorName(code), ") at ", file, ":", line);
  switch (code) {
    case cudaErrorMemoryAllocation:
      throw OutOfMemoryError(message);
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorNoKernelImageForDevice:
      throw DeviceError(message);
    default:
      throw Error(message);
  }
}

// Throws when the <<<...>>> launch just made failed (bad configuration, no kernel image for this
// GPU). Errors during the kernel's run surface at the next synchronising call on its stream.
inline void check_launch(const char* kernel_name, const char* file, int line) {
  const cudaError_t code = cudaGetLastError();
  if (code != cudaSuccess)
    throw_cuda_error(code, detail::concat("launch of kernel ", kernel_name), file, line);
}

// Makes `device` current for the calling thread while the guard lives. Kernels must be launched
// on a stream of the current device; switching only when needed keeps the common case to one
// cudaGetDevice (a thread-local read).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      previous_ = -1;
    }
    if (device != previous_) {
      const cudaError_t code = cudaSetDevice(device);
      if (code != cudaSuccess) throw_cuda_error(code, "cudaSetDevice", __FILE__, __LINE__);
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_ && previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

// Threads per block of the elementwise kernels: a multiple of the warp size that lets many blocks
// share a multiprocessor.
inline constexpr int kBlockThreads = 256;

// Blocks for a grid-stride loop over n items. One thread per item up to a cap; past the cap each
// thread loops. 8192 blocks of 256 threads are several waves even on the largest GPUs (an H200
// holds 132 x 8 such blocks at once), so the cap never starves a device, and it keeps the grid
// size far below the 2^31 - 1 limit.
inline unsigned grid_stride_blocks(std::size_t n) {
  const std::size_t wanted = (n + kBlockThreads - 1) / kBlockThreads;
  return static_cast<unsigned>(std::clamp<std::size_t>(wanted, 1, 8192));
}

// True when p may be read or written as float4 (16-byte aligned).
inline bool aligned_16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace petra::cuda_detail

#ifdef __CUDACC__
#include "petra/kernels/common.hpp"

namespace petra::cuda_detail {

inline cudaStream_t stream_of(const kernels::StreamHandle& s) {
  return static_cast<cudaStream_t>(s.cuda_stream);
}

// Launches `kernel` (a grid-stride loop over `items` items) on s's stream, with s's device
// current, and checks the launch. Does nothing when there are no items: an empty grid is an error.
template <class... Params, class... Args>
void launch_grid_stride(const char* name, const kernels::StreamHandle& s, std::int64_t items,
                        void (*kernel)(Params...), Args... args) {
  if (items <= 0) return;
  DeviceGuard guard(s.device_index);
  kernel<<<grid_stride_blocks(static_cast<std::size_t>(items)), kBlockThreads, 0, stream_of(s)>>>(
      static_cast<Params>(args)...);
  check_launch(name, __FILE__, __LINE__);
}

}  // namespace petra::cuda_detail
#endif

// Throws a petra error naming `expr`, the CUDA error and file:line when `expr` is not cudaSuccess.
#define PETRA_CUDA_CHECK(expr)                                                           \
  do {                                                                                   \
    const cudaError_t petra_cuda_status_ = (expr);                                       \
    if (petra_cuda_status_ != cudaSuccess)                                               \
      ::petra::cuda_detail::throw_cuda_error(petra_cuda_status_, #expr, __FILE__, __LINE__); \
  } while (0)

// Call right after a <<<...>>> launch; kernel_name is any const char*.
#define PETRA_CUDA_CHECK_LAUNCH(kernel_name) \
  ::petra::cuda_detail::check_launch((kernel_name), __FILE__, __LINE__)
