// petra/cuda_backend.hpp: the thin layer between petra and the CUDA runtime.
//
// Everything petra needs from a GPU outside the kernels goes through these functions: is there a
// device, raw device memory, streams, events and asynchronous copies. The header holds no CUDA
// types (streams and events are void*, really cudaStream_t / cudaEvent_t), so every file may
// include it, and a build without CUDA provides the same functions (petra/cuda_backend_none.cpp):
// it reports no device and throws DeviceError("... petra was built without CUDA") from anything
// that needs a GPU.
//
// A third implementation, tests/emulation/emulated_backend.cpp, runs it on host memory for the
// emulated device of the tests (two GPUs, every misuse an error).
//
// Errors: every failing CUDA call becomes a petra exception whose message names the operation,
// the CUDA error and the file:line (OutOfMemoryError for allocations, DeviceError when there is no
// such device, Error otherwise). The *_destroy / free_device functions run in destructors, so they
// never throw: they report failures on stderr.
#pragma once

#include <cstddef>
#include <string>

namespace petra::cuda_backend {

// True when petra was built with the CUDA backend (even if this machine has no GPU).
bool compiled();

// Number of usable CUDA devices; 0 when there is no GPU or no driver (any error from the runtime
// counts as "none" and is cleared). Queried once per process.
int device_count();

// device_count() > 0.
bool available();

// `device`'s compute capability as 10 * major + minor (90: an H100 or H200). DeviceError when there
// is no such device. (The emulated devices of the tests answer 90: they emulate clusters.)
int compute_capability(int device);

// One line for logs: runtime and driver versions, cuDNN, cuBLAS and NCCL versions, and the devices
// (name, compute capability, memory), or why there are none.
std::string describe();

// Device memory on `device` (at least 256-byte aligned); nullptr for 0 bytes.
// Throws OutOfMemoryError when the device is full, DeviceError when there is no such device.
void* malloc_device(std::size_t bytes, int device);
// Frees memory from malloc_device (nullptr is ignored). Blocks until the device is idle.
void free_device(void* p, int device) noexcept;

// Pinned (page-locked) host memory: a copy from it to a device is truly asynchronous (from pageable
// memory the runtime stages it and may return only after it). For staging buffers such as the
// trainer's batch uploads (pipeline/batch_upload.hpp); nullptr for 0 bytes.
void* malloc_host(std::size_t bytes);
// Frees memory from malloc_host (nullptr is ignored). Blocks until the device is idle.
void free_host(void* p) noexcept;

// A stream on `device` that does not synchronise with the legacy default stream: ordering between
// streams comes only from events (docs/architecture.md, "Streams are explicit").
void* stream_create(int device);
void stream_destroy(void* stream) noexcept;
// Blocks the calling thread until all work queued on `stream` has finished.
void stream_synchronize(void* stream);

// An event for ordering only (no timing, which makes record/wait cheaper).
void* event_create(int device);
void event_destroy(void* event) noexcept;
// Captures the work queued on `stream` so far; `event` and `stream` must be on the same device.
void event_record(void* event, void* stream);
// Work queued on `stream` after this call waits for the last record of `event` (no host block).
void stream_wait_event(void* stream, void* event);
// Blocks the calling thread until the last record of `event` has completed.
void event_synchronize(void* event);
// True when the last record of `event` has completed (or it was never recorded); never blocks.
bool event_query(void* event);

// Asynchronous copy in any direction (cudaMemcpyDefault: host or device pointers, found from the
// unified address space). With pageable host memory the runtime may return only after the copy.
void memcpy_async(void* dst, const void* src, std::size_t bytes, void* stream);
// `rows` copies of `width` bytes, row r from src + r * src_pitch to dst + r * dst_pitch, on `stream`
// (cudaMemcpy2DAsync, any direction): a strided view (a channel slice of NCHW) in one call.
void memcpy_2d_async(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                     std::size_t width, std::size_t rows, void* stream);
// Sets `bytes` bytes at device pointer `dst` to the byte `value`, on `stream`.
void memset_async(void* dst, int value, std::size_t bytes, void* stream);

}  // namespace petra::cuda_backend
