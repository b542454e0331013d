// petra/stream.cpp: CPU and CUDA streams, events, and the per-thread current stream.
#include "petra/stream.hpp"

#include <atomic>
#include <cstdio>
#include <map>
#include <thread>

#include "petra/allocator.hpp"
#include "petra/cuda_backend.hpp"
#include "petra/error.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace petra {

namespace {
std::atomic<int> g_default_threads{0};
thread_local Stream* tls_current = nullptr;
}  // namespace

int default_cpu_threads() {
  int n = g_default_threads.load();
  if (n > 0) return n;
#ifdef _OPENMP
  n = omp_get_max_threads();  // honours OMP_NUM_THREADS
#else
  n = static_cast<int>(std::thread::hardware_concurrency());
#endif
  return n > 0 ? n : 1;
}

void set_default_cpu_threads(int n) {
  PETRA_CHECK(n >= 1, ValueError, "set_default_cpu_threads: need at least 1 thread, got ", n);
  g_default_threads = n;
}

// Scratch memory from the caching allocator, tagged "workspace" and owned by whatever scope
// created the stream's first scratch; grows, never shrinks. On a GPU the block's home is this
// stream, so the block a reserve() replaces is freed in the stream's order: the kernels queued
// before it may still read it, and no other stream can be handed it.
struct Stream::Workspace final : kernels::Workspace {
  Device device;
  void* stream = nullptr;  // the GPU stream the scratch is used on
  Allocation block;
  explicit Workspace(Device d) : device(d) {}
  ~Workspace() override { Allocator::instance().deallocate(block); }
  void* reserve(std::size_t bytes) override {
    if (bytes > block.bytes) {
      Allocator::instance().deallocate(block);
      block = {};
      block = Allocator::instance().allocate(bytes, device, MemoryTag::workspace, MemoryScope::current_owner(), stream);
    }
    return block.ptr;
  }
};

Stream::Stream(Device device, int num_threads) : device_(device), workspace_(std::make_unique<Workspace>(device)) {
  PETRA_CHECK(num_threads >= 0, ValueError, "Stream: negative thread count ", num_threads);
  handle_.num_threads = num_threads == 0 ? default_cpu_threads() : num_threads;
  handle_.workspace = workspace_.get();
  handle_.device_index = device.index;
  if (device.is_cuda()) {
    PETRA_CHECK(cuda_available(), DeviceError, "Stream: cannot create a stream on ", device.str(), ": no usable GPU");
    PETRA_CHECK(device.index < cuda_backend::device_count(), DeviceError, "Stream: ", device.str(),
                " does not exist (", cuda_backend::device_count(), " CUDA device(s))");
    handle_.cuda_stream = cuda_backend::stream_create(device.index);
    workspace_->stream = handle_.cuda_stream;
    Allocator::instance().stream_created(device, handle_.cuda_stream);
  }
}

// A GPU stream is synchronised before it goes: then every block cached for it, and every block
// still homed on it, is free for any stream (Allocator::forget_stream).
Stream::~Stream() {
  if (handle_.cuda_stream == nullptr) return;
  try {
    cuda_backend::stream_synchronize(handle_.cuda_stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "petra: ~Stream on %s: %s\n", device_.str().c_str(), e.what());
  }
  workspace_.reset();
  Allocator::instance().forget_stream(device_, handle_.cuda_stream);
  cuda_backend::stream_destroy(handle_.cuda_stream);
}

void Stream::set_num_threads(int n) {
  PETRA_CHECK(n >= 1, ValueError, "Stream::set_num_threads: need at least 1 thread, got ", n);
  handle_.num_threads = n;
}

void Stream::synchronize() {
  if (handle_.cuda_stream != nullptr) cuda_backend::stream_synchronize(handle_.cuda_stream);
}

void Stream::wait(const Event& event) {
  if (handle_.cuda_stream != nullptr && event.native() != nullptr)
    cuda_backend::stream_wait_event(handle_.cuda_stream, event.native());
  // CPU: work ran when it was submitted, so every recorded event is already complete.
}

Stream& Stream::current() {
  if (tls_current != nullptr) return *tls_current;
  thread_local Stream thread_default(Device::cpu());
  return thread_default;
}

Stream& Stream::for_device(Device device) {
  Stream& current = Stream::current();
  if (current.device() == device || (current.device().is_cpu() && device.is_cpu())) return current;
  thread_local std::map<std::pair<int, int>, std::unique_ptr<Stream>> defaults;
  auto& s = defaults[{static_cast<int>(device.type), device.index}];
  if (!s) s = std::make_unique<Stream>(device);
  return *s;
}

StreamGuard::StreamGuard(Stream& stream) : saved_(tls_current) { tls_current = &stream; }
StreamGuard::~StreamGuard() { tls_current = saved_; }

Event::Event(Device device) : device_(device) {
  if (device.is_cuda()) cuda_event_ = cuda_backend::event_create(device.index);
}
Event::~Event() {
  if (cuda_event_ != nullptr) cuda_backend::event_destroy(cuda_event_);
}
void Event::record(Stream& stream) {
  PETRA_CHECK(stream.device() == device_, DeviceError, "Event::record: event on ", device_.str(), " but stream on ",
              stream.device().str());
  if (cuda_event_ != nullptr) cuda_backend::event_record(cuda_event_, stream.handle().cuda_stream);
}
void Event::synchronize() {
  if (cuda_event_ != nullptr) cuda_backend::event_synchronize(cuda_event_);
}
bool Event::query() const { return cuda_event_ == nullptr || cuda_backend::event_query(cuda_event_); }

}  // namespace petra
