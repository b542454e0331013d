// kernels/cuda/check.cuh: internal helpers for petra's CUDA code (not installed).
//
//   PETRA_CUDA_CHECK(expr)            throws a petra error when a runtime call fails
//   PETRA_CUDA_CHECK_LAUNCH(name)     the same for the kernel launch just made
//   DeviceGuard                       makes a device current for a scope, then restores the old one
//   aligned_16(p)                     whether p may be accessed as float4
//
// Launching a kernel (PETRA_LAUNCH, launch_grid_stride) is kernels/cuda/launch.cuh, which every
// .cu file includes. Only the runtime API header is included here, so g++ can compile this too
// (petra/cuda_backend.cpp, and the .cu files under tests/emulation/, whose runtime calls
// tests/emulation/cuda_emulation.hpp redirects to its CPU stand-ins).
#pragma once

#include <cuda_runtime_api.h>

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

// True when p may be read or written as float4 (16-byte aligned).
inline bool aligned_16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace petra::cuda_detail

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
