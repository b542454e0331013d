// petra/cuda_backend_none.cpp: petra/cuda_backend.hpp for builds without CUDA.
//
// Same functions as petra/cuda_backend.cpp, so no caller needs an #if: there are no devices, and
// everything that needs one throws DeviceError. Nothing can have been created, so the destroy
// functions only complain about a non-null handle, which would be a caller's bug.
#include <cstdio>

#include "petra/cuda_backend.hpp"
#include "petra/error.hpp"

namespace petra::cuda_backend {
namespace {

[[noreturn]] void no_cuda(const char* operation) {
  throw DeviceError(detail::concat("cuda_backend::", operation, ": petra was built without CUDA"));
}

void warn_foreign_handle(const char* operation, const void* handle) noexcept {
  if (handle != nullptr)
    std::fprintf(stderr, "petra: cuda_backend::%s(%p): petra was built without CUDA\n", operation,
                 handle);
}

}  // namespace

bool compiled() { return false; }
int device_count() { return 0; }
bool available() { return false; }
int compute_capability(int) { no_cuda("compute_capability"); }
std::string describe() { return "CUDA: petra was built without CUDA; no devices"; }

void* malloc_device(std::size_t, int) { no_cuda("malloc_device"); }
void free_device(void* p, int) noexcept { warn_foreign_handle("free_device", p); }

void* malloc_host(std::size_t) { no_cuda("malloc_host"); }
void free_host(void* p) noexcept { warn_foreign_handle("free_host", p); }

void* stream_create(int) { no_cuda("stream_create"); }
void stream_destroy(void* stream) noexcept { warn_foreign_handle("stream_destroy", stream); }
void stream_synchronize(void*) { no_cuda("stream_synchronize"); }

void* event_create(int) { no_cuda("event_create"); }
void event_destroy(void* event) noexcept { warn_foreign_handle("event_destroy", event); }
void event_record(void*, void*) { no_cuda("event_record"); }
void stream_wait_event(void*, void*) { no_cuda("stream_wait_event"); }
void event_synchronize(void*) { no_cuda("event_synchronize"); }
bool event_query(void*) { no_cuda("event_query"); }

void memcpy_async(void*, const void*, std::size_t, void*) { no_cuda("memcpy_async"); }
void memcpy_2d_async(void*, std::size_t, const void*, std::size_t, std::size_t, std::size_t, void*) {
  no_cuda("memcpy_2d_async");
}
void memset_async(void*, int, std::size_t, void*) { no_cuda("memset_async"); }

}  // namespace petra::cuda_backend
