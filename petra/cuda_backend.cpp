// petra/cuda_backend.cpp: petra/cuda_backend.hpp on the CUDA runtime API (built with CUDA).
//
// Only the runtime API is used, never the driver API: cudart loads libcuda lazily, so this build
// starts and runs on machines without a GPU or driver, where device_count() is simply 0.
#include "petra/cuda_backend.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>

#include <cstdio>
#include <sstream>

#include "petra/kernels/cuda/check.cuh"
#include "petra/config.hpp"
#include "petra/error.hpp"

namespace petra::cuda_backend {
namespace {

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }
cudaEvent_t as_event(void* event) { return static_cast<cudaEvent_t>(event); }

struct DeviceQuery {
  int count = 0;
  cudaError_t error = cudaSuccess;
};

// Without a driver the runtime answers cudaErrorInsufficientDriver, with the stub libcuda
// cudaErrorStubLibrary, with a driver but no GPU cudaErrorNoDevice: every error means "no GPU".
DeviceQuery query_devices() {
  DeviceQuery q;
  q.error = cudaGetDeviceCount(&q.count);
  if (q.error != cudaSuccess) {
    (void)cudaGetLastError();
    q.count = 0;
  }
  return q;
}

// The device set of a process does not change, so it is asked once (thread-safe static).
const DeviceQuery& devices() {
  static const DeviceQuery q = query_devices();
  return q;
}

// Throws DeviceError naming `operation` unless `device` is a usable device index.
void require_device(int device, const char* operation) {
  const DeviceQuery& q = devices();
  PETRA_CHECK(q.count > 0, DeviceError, "cuda_backend::", operation, ": no CUDA device (",
              q.error == cudaSuccess ? "the runtime reports 0 devices" : cudaGetErrorName(q.error),
              ")");
  PETRA_CHECK(device >= 0 && device < q.count, DeviceError, "cuda_backend::", operation,
              ": device ", device, " does not exist (", q.count, " CUDA device(s))");
}

// "13.0" from 13000; CUDA encodes versions as 1000 * major + 10 * minor.
std::string cuda_version_string(int v) {
  return detail::concat(v / 1000, ".", (v % 1000) / 10);
}

// The CUDA libraries this build found. Each is linked only into the code that calls it, and none
// is needed for the backend to build: their kernels come with their own families.
std::string libraries_found() {
  std::string found;
  for (const auto& [name, have] : {std::pair{"cuBLAS", PETRA_HAVE_CUBLAS}, std::pair{"cuDNN", PETRA_HAVE_CUDNN},
                                   std::pair{"NCCL", PETRA_HAVE_NCCL}})
    if (have) found += found.empty() ? name : detail::concat(", ", name);
  return found.empty() ? "none" : found;
}

// "[0] NVIDIA H200 sm_90 139.8 GiB" for each device.
std::string devices_string() {
  const DeviceQuery& q = devices();
  if (q.count == 0)
    return detail::concat("no devices (",
                          q.error == cudaSuccess ? "none found" : cudaGetErrorName(q.error), ")");
  std::ostringstream out;
  out << q.count << (q.count == 1 ? " device:" : " devices:");
  for (int d = 0; d < q.count; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
      (void)cudaGetLastError();
      out << " [" << d << "] (properties unavailable)";
      continue;
    }
    char memory[32];
    std::snprintf(memory, sizeof memory, "%.1f GiB", double(prop.totalGlobalMem) / (1u << 30));
    out << " [" << d << "] " << prop.name << " sm_" << prop.major << prop.minor << " " << memory;
  }
  return out.str();
}

}  // namespace

bool compiled() { return true; }

int device_count() { return devices().count; }

bool available() { return device_count() > 0; }

int compute_capability(int device) {
  require_device(device, "compute_capability");
  int major = 0, minor = 0;
  PETRA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  PETRA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return 10 * major + minor;
}

std::string describe() {
  int runtime = 0, driver = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) (void)cudaGetLastError();
  if (cudaDriverGetVersion(&driver) != cudaSuccess) (void)cudaGetLastError();
  return detail::concat("CUDA runtime ", cuda_version_string(runtime), ", driver ",
                        driver == 0 ? std::string("none") : cuda_version_string(driver),
                        ", libraries found at build time: ", libraries_found(), "; ", devices_string());
}

void* malloc_device(std::size_t bytes, int device) {
  require_device(device, "malloc_device");
  if (bytes == 0) return nullptr;
  cuda_detail::DeviceGuard guard(device);
  void* p = nullptr;
  const cudaError_t code = cudaMalloc(&p, bytes);
  if (code == cudaSuccess) return p;
  (void)cudaGetLastError();
  if (code == cudaErrorMemoryAllocation) {
    std::size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
    throw OutOfMemoryError(detail::concat("cuda_backend::malloc_device: out of memory allocating ",
                                          bytes, " bytes on cuda:", device, " (", free_bytes,
                                          " of ", total_bytes, " bytes free)"));
  }
  cuda_detail::throw_cuda_error(code, "cuda_backend::malloc_device: cudaMalloc", __FILE__,
                                __LINE__);
}

void free_device(void* p, int device) noexcept {
  if (p == nullptr) return;
  try {
    cuda_detail::DeviceGuard guard(device);
    const cudaError_t code = cudaFree(p);
    if (code != cudaSuccess) {
      (void)cudaGetLastError();
      std::fprintf(stderr, "petra: cuda_backend::free_device(%p, cuda:%d): cudaFree: %s\n", p,
                   device, cudaGetErrorString(code));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "petra: cuda_backend::free_device(%p, cuda:%d): %s\n", p, device,
                 e.what());
  }
}

void* malloc_host(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t code = cudaMallocHost(&p, bytes);
  if (code == cudaSuccess) return p;
  (void)cudaGetLastError();
  if (code == cudaErrorMemoryAllocation)
    throw OutOfMemoryError(detail::concat("cuda_backend::malloc_host: cannot pin ", bytes, " bytes of host memory"));
  cuda_detail::throw_cuda_error(code, "cuda_backend::malloc_host: cudaMallocHost", __FILE__, __LINE__);
}

void free_host(void* p) noexcept {
  if (p == nullptr) return;
  const cudaError_t code = cudaFreeHost(p);
  if (code != cudaSuccess) {
    (void)cudaGetLastError();
    std::fprintf(stderr, "petra: cuda_backend::free_host(%p): cudaFreeHost: %s\n", p, cudaGetErrorString(code));
  }
}

void* stream_create(int device) {
  require_device(device, "stream_create");
  cuda_detail::DeviceGuard guard(device);
  cudaStream_t stream = nullptr;
  PETRA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return stream;
}

void stream_destroy(void* stream) noexcept {
  if (stream == nullptr) return;  // the legacy default stream is not ours to destroy
  const cudaError_t code = cudaStreamDestroy(as_stream(stream));
  if (code != cudaSuccess) {
    (void)cudaGetLastError();
    std::fprintf(stderr, "petra: cuda_backend::stream_destroy(%p): %s\n", stream,
                 cudaGetErrorString(code));
  }
}

void stream_synchronize(void* stream) {
  PETRA_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream)));
}

void* event_create(int device) {
  require_device(device, "event_create");
  cuda_detail::DeviceGuard guard(device);
  cudaEvent_t event = nullptr;
  PETRA_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

void event_destroy(void* event) noexcept {
  if (event == nullptr) return;
  const cudaError_t code = cudaEventDestroy(as_event(event));
  if (code != cudaSuccess) {
    (void)cudaGetLastError();
    std::fprintf(stderr, "petra: cuda_backend::event_destroy(%p): %s\n", event,
                 cudaGetErrorString(code));
  }
}

void event_record(void* event, void* stream) {
  PETRA_CUDA_CHECK(cudaEventRecord(as_event(event), as_stream(stream)));
}

void stream_wait_event(void* stream, void* event) {
  PETRA_CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream), as_event(event), 0));
}

void event_synchronize(void* event) { PETRA_CUDA_CHECK(cudaEventSynchronize(as_event(event))); }

bool event_query(void* event) {
  const cudaError_t code = cudaEventQuery(as_event(event));
  if (code == cudaSuccess) return true;
  if (code == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error
    return false;
  }
  cuda_detail::throw_cuda_error(code, "cuda_backend::event_query: cudaEventQuery", __FILE__,
                                __LINE__);
}

void memcpy_async(void* dst, const void* src, std::size_t bytes, void* stream) {
  if (bytes == 0) return;
  PETRA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream)));
}

void memcpy_2d_async(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t width,
                     std::size_t rows, void* stream) {
  if (width == 0 || rows == 0) return;
  PETRA_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDefault, as_stream(stream)));
}

void memset_async(void* dst, int value, std::size_t bytes, void* stream) {
  if (bytes == 0) return;
  // from the stream's device: CUDA's programming guide promises that a copy issued to another
  // device's stream succeeds and that a kernel launch fails, and says nothing of a memset
  int device = 0;
  PETRA_CUDA_CHECK(cudaStreamGetDevice(as_stream(stream), &device));
  cuda_detail::DeviceGuard guard(device);
  PETRA_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, as_stream(stream)));
}

}  // namespace petra::cuda_backend
