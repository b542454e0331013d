// petra/stream.hpp: streams and events, the only way work is ordered.
//
// A Stream is an in-order queue of work on one device. Every op runs on a stream: the one passed
// explicitly, or the calling thread's current stream (StreamGuard sets it for a scope).
//   - CUDA stream: wraps a cudaStream_t; kernels are launched asynchronously, in order.
//   - CPU stream: runs each kernel inline, in the calling thread, so it is trivially in order and
//     the same code runs with no GPU. It carries the number of threads its kernels may use: two
//     pipeline workers on one machine each own a CPU stream with its own thread count.
// Each stream owns a workspace (scratch memory for kernels, allocator tag "workspace"); a stream
// runs one kernel at a time, so one grow-only scratch buffer per stream is enough. When it grows,
// the old block is freed in the stream's order (petra/allocator.hpp): kernels still queued on the
// stream may use it, and only later work on the same stream can get it again.
// Ordering across streams is only by events: record an Event on one stream, wait for it on another.
//
// Which stream work on a device runs on, in a given thread: Stream::for_device(device), the one
// rule that ops (petra/ops.cpp), copies (Tensor::copy_from), fills and allocations (the block's home
// stream) all follow. Without a StreamGuard on that device it is the thread's own default stream of
// the device, so everything one thread does on one device is in one stream's order.
//
// A tensor made on one stream and used on another (a pipeline message, an upload on a copy stream)
// needs two things from whoever hands it over: the consumer's stream waits for an event recorded
// after the producer's work (Stream::wait), and the allocator learns of the other stream
// (Storage::record_stream), so that the block is not reused before that stream is done with it.
#pragma once

#include <memory>

#include "petra/kernels/common.hpp"
#include "petra/device.hpp"

namespace petra {

class Event;

class Stream {
 public:
  // A new stream on `device`; num_threads is used by CPU kernels (0 = default_cpu_threads()).
  explicit Stream(Device device = Device::cpu(), int num_threads = 0);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  Device device() const { return device_; }
  int num_threads() const { return handle_.num_threads; }
  void set_num_threads(int n);

  // What kernels receive: thread count, cudaStream_t, workspace.
  const kernels::StreamHandle& handle() const { return handle_; }

  void synchronize();            // blocks until all work submitted so far is done (CPU: no-op)
  void wait(const Event& event); // work submitted after this starts after `event` completed

  // The calling thread's current stream: the innermost StreamGuard's, else a per-thread CPU stream.
  static Stream& current();
  // The stream the calling thread runs work on `device` on: the current stream if it is on
  // `device` (for a CPU device any CPU stream: CPU devices share one memory, "cpu:1" names a
  // pipeline worker), else the thread's own default stream of `device`, made on first use.
  static Stream& for_device(Device device);

 private:
  struct Workspace;
  Device device_;
  kernels::StreamHandle handle_;
  std::unique_ptr<Workspace> workspace_;
};

// Makes `stream` the calling thread's current stream for the guard's lifetime (nests).
class StreamGuard {
 public:
  explicit StreamGuard(Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream* saved_;
};

// A marker in a stream's work. On the CPU work is done when submitted, so events complete at once.
class Event {
 public:
  explicit Event(Device device = Device::cpu());
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  Device device() const { return device_; }
  void record(Stream& stream);  // marks the work submitted to `stream` so far
  void synchronize();           // blocks until that work is done
  bool query() const;           // done yet?
  void* native() const { return cuda_event_; }

 private:
  Device device_;
  void* cuda_event_ = nullptr;
};

// Threads a new CPU stream uses by default: OMP_NUM_THREADS / the machine's cores, or what
// set_default_cpu_threads() set.
int default_cpu_threads();
void set_default_cpu_threads(int n);

}  // namespace petra
