// kernels/cuda/per_stream_handles.hpp: one library handle (cuBLAS, cuDNN) per (device, stream),
// made on first use and bound to its stream (internal, not installed).
//
// Why per stream: a handle carries its stream and its scratch; sharing one between streams would
// mean re-binding it before every call, racing with other threads, and cuBLAS documents one handle
// per stream as the way to keep results bit-reproducible when several streams run concurrently.
// The map is guarded by a mutex (pipeline workers look up their handles from their own threads);
// the handle itself is then used only for its stream, whose work one worker submits in order.
// Handles live as long as the process: destroying them from a static destructor could run after
// the CUDA runtime was torn down. Their number is the number of streams that ever ran a library
// call (a handful per training run).
#pragma once

#include <map>
#include <mutex>
#include <utility>

#include "petra/kernels/common.hpp"
#include "petra/kernels/cuda/check.cuh"

namespace petra::cuda_detail {

template <class Handle>
class PerStreamHandles {
 public:
  // make(stream) creates a handle on the current device bound to `stream` (a cudaStream_t).
  using Make = Handle (*)(cudaStream_t stream);
  explicit PerStreamHandles(Make make) : make_(make) {}

  // The handle of s's (device, stream); the device must be current (callers hold a DeviceGuard).
  Handle get(const kernels::StreamHandle& s) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto key = std::make_pair(s.device_index, s.cuda_stream);
    const auto found = handles_.find(key);
    if (found != handles_.end()) return found->second;
    const Handle handle = make_(static_cast<cudaStream_t>(s.cuda_stream));
    handles_.emplace(key, handle);
    return handle;
  }

 private:
  Make make_;
  std::mutex mutex_;
  std::map<std::pair<int, void*>, Handle> handles_;
};

}  // namespace petra::cuda_detail
