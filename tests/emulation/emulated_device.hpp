// tests/emulation/emulated_device.hpp: what the tests can ask the emulated device
// (tests/emulation/emulated_backend.cpp) beyond petra/cuda_backend.hpp.
//
// The emulated device is petra's CUDA runtime layer (petra/cuda_backend.hpp) on host memory, two
// GPUs, with every kernel of kernels/cuda/ compiled by g++ against the CUDA emulation
// (cuda_emulation.hpp) and run on the CPU. It exists only in the test executable
// test-emulated-device (tests/meson.build), which links the very object files of libpetra-core and
// libpetra except the real runtime layer and the nvcc-compiled kernels. By default work is
// synchronous (a launch or a copy is done when the call returns), which cannot show a missing
// event. In asynchronous mode (set_asynchronous, or PETRA_EMULATED_ASYNCHRONOUS=1 for the whole
// process) each stream queues its launches, event records and waits, and runs them only when
// something waits (a stream or event synchronisation, a copy to or from pageable host memory,
// cudaFree), and then only what that wait depends on; a copy or fill submitted to an idle stream
// runs at once (the copy engines overlap the busy compute units). Work that is not ordered by
// events then runs out of order and shows as wrong numbers (as PETRA on two streams of an H200 did,
// before its executor kept its streams: tests/emulation/test_emulated_pipeline.cpp). What it always shows as errors is misuse a GPU would punish: a stream or event used after it was destroyed, the
// null (legacy default) stream, a kernel launched on a stream of another device than the current
// one, an event recorded on a stream of another device, a wait on an event never recorded, device
// memory used after it was freed or past its end, a double free.
#pragma once

#include <cstddef>
#include <cstdint>

namespace petra::emulated_device {

inline constexpr int kDevices = 2;  // cuda:0 and cuda:1

// What is live now on the emulated machine.
struct Live {
  std::int64_t device_blocks = 0, device_bytes = 0;  // malloc_device not yet freed, all devices
  std::int64_t pinned_blocks = 0, pinned_bytes = 0;  // malloc_host not yet freed
  std::int64_t streams = 0, events = 0;              // created, not yet destroyed
  std::int64_t event_records = 0;                    // event_record calls so far (not a live count)
  // Calls so far that make the host wait for a GPU (not a live count): stream synchronisations,
  // synchronisations on an event not yet complete (asynchronous mode), copies to or from pageable
  // host memory, frees of device memory. A training
  // step that makes none lets the host queue the next step while the GPU still works on this one.
  std::int64_t host_waits = 0;
};
Live live();

// Kernel launches so far on streams of `device`.
std::int64_t launches(int device);

// Asynchronous mode on or off (see the top of this file); returns the previous setting. Turning it
// off first runs everything queued.
bool set_asynchronous(bool on);
bool asynchronous();

// Asynchronous mode (or synchronous) for a scope.
class AsynchronousScope {
 public:
  explicit AsynchronousScope(bool on = true) : saved_(set_asynchronous(on)) {}
  ~AsynchronousScope() { set_asynchronous(saved_); }
  AsynchronousScope(const AsynchronousScope&) = delete;
  AsynchronousScope& operator=(const AsynchronousScope&) = delete;

 private:
  bool saved_;
};

// Device memory each emulated GPU holds (default 1 GiB): malloc_device beyond it throws
// OutOfMemoryError, as cudaMalloc on a full GPU does. Returns the previous value.
std::size_t set_capacity(std::size_t bytes_per_device);

}  // namespace petra::emulated_device
