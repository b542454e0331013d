// tests/emulation/emulated_backend.cpp: petra/cuda_backend.hpp on host memory, the runtime layer of
// the emulated device (tests/emulation/emulated_device.hpp says what it is and what it checks).
//
// Two emulated GPUs. Device memory is 256-byte aligned host memory that remembers its device; it is
// filled with 0xff bytes when allocated and when freed (a float read from it is NaN, as
// uninitialised or stale memory would give garbage on a GPU), and freed blocks stay in a
// quarantine of 64 MiB before they go back to the system, so that a use after free is recognised
// as one. Streams and events are small objects that are never deleted (a destroyed one is marked,
// so its handle can never come back as a new one). Work is synchronous (a copy or a launch is done
// when the call returns, so every event is complete), or, in asynchronous mode, queued per stream
// and run when something waits for it (emulated_device.hpp; run_stream_until below).
//
// Misuse is an error: the calls that may throw throw (petra::DeviceError for a device mismatch,
// petra::Error otherwise); the ones that must not (free_device, stream_destroy, event_destroy,
// free_host run in destructors) print the misuse and abort, as a sanitizer would.
//
// The CUDA emulation (cuda_emulation.hpp) calls back here for every kernel launch and for the
// runtime calls the .cu files make themselves (settings().check_stream, check_memory), and learns
// that cudaSetDevice accepts devices 0 and 1 (settings().device_count).
#include "tests/emulation/cuda_emulation.hpp"
#include "tests/emulation/emulated_device.hpp"

#include <algorithm>
#include <utility>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "petra/cuda_backend.hpp"
#include "petra/error.hpp"

namespace petra::emulated_device {
namespace {

using detail::concat;

constexpr std::uint64_t kStreamMagic = 0x7065747261537472ull;  // "petraStr"
constexpr std::uint64_t kEventMagic = 0x7065747261457674ull;   // "petraEvt"
constexpr std::size_t kAlignment = 256;                        // cudaMalloc's guarantee
constexpr std::size_t kQuarantineBytes = std::size_t{64} << 20;
constexpr unsigned char kPoison = 0xff;                        // NaN as float

struct EmulatedStream;

struct EmulatedEvent {
  std::uint64_t magic = kEventMagic;
  int device = 0;
  bool live = true;
  // The number of event_record calls so far (0: never recorded), and of the latest record whose
  // place in its stream's queue was reached (the event is complete when they are equal; at once in
  // synchronous mode), and the stream of the latest record.
  std::uint64_t records = 0, completed = 0;
  EmulatedStream* recorded_on = nullptr;
};

// A unit of a stream's queue in asynchronous mode: work to run (a grid, a copy, a fill), an event
// record to complete, or a wait for an event's record number (queued on `source`).
struct Work {
  enum Kind { kRun, kRecord, kWait } kind = kRun;
  std::function<void()> run;
  EmulatedEvent* event = nullptr;
  std::uint64_t record = 0;
  EmulatedStream* source = nullptr;
};

struct EmulatedStream {
  std::uint64_t magic = kStreamMagic;
  int device = 0;
  bool live = true;
  std::deque<Work> queue;  // asynchronous mode: submitted, not yet run
  bool running = false;    // a thread runs its head now
};

struct Block {
  std::size_t bytes;
  int device;  // -1: pinned host memory
  bool freed = false;
};

struct State {
  std::mutex mutex;
  std::map<std::uintptr_t, Block> blocks;  // by start address: live ones, and freed ones in quarantine
  std::deque<std::uintptr_t> quarantine;   // freed blocks, oldest first
  std::size_t quarantined_bytes = 0;
  std::set<const void*> streams, events;   // every handle made here, destroyed ones included
  Live live;
  std::int64_t launches[kDevices] = {};
  std::size_t device_bytes[kDevices] = {};
  std::size_t capacity = std::size_t{1} << 30;
  bool asynchronous = false;         // set_asynchronous
  std::condition_variable progress;  // a stream's head finished running
};

State& state() {
  static State* s = new State;  // never destroyed: tensors may be freed during static destruction
  return *s;
}

[[noreturn]] void fatal(const std::string& message) noexcept {
  std::fprintf(stderr, "petra emulated device: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

std::string device_name(int device) { return device < 0 ? "host memory" : concat("cuda:", device); }

void require_device(int device, const char* operation) {
  PETRA_CHECK(device >= 0 && device < kDevices, DeviceError, "cuda_backend::", operation, ": device ", device,
              " does not exist (", kDevices, " CUDA device(s), emulated)");
}

// The stream behind a handle, or an error naming `what`. Caller holds the mutex.
EmulatedStream& stream_of(void* handle, const char* what) {
  State& s = state();
  PETRA_CHECK(handle != nullptr, Error, what,
              ": the null stream (CUDA's legacy default stream); petra orders device work only on its own "
              "streams (a CPU stream's handle, or a StreamHandle with no stream, was used for device work)");
  PETRA_CHECK(s.streams.count(handle) != 0, Error, what, ": ", handle, " is not a stream");
  auto& stream = *static_cast<EmulatedStream*>(handle);
  PETRA_CHECK(stream.live, Error, what, ": stream ", handle, " (", device_name(stream.device),
              ") was destroyed");
  return stream;
}

EmulatedEvent& event_of(void* handle, const char* what) {
  State& s = state();
  PETRA_CHECK(handle != nullptr && s.events.count(handle) != 0, Error, what, ": ", handle, " is not an event");
  auto& event = *static_cast<EmulatedEvent*>(handle);
  PETRA_CHECK(event.live, Error, what, ": event ", handle, " (", device_name(event.device), ") was destroyed");
  return event;
}

// The block holding [p, p + bytes), or nullptr for memory that is not the emulated device's (plain
// host memory). Errors for freed memory and for a range that runs past its block. Caller holds
// the mutex.
const Block* block_of(const void* p, std::size_t bytes, const char* what) {
  State& s = state();
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  auto it = s.blocks.upper_bound(address);
  if (it == s.blocks.begin()) return nullptr;
  --it;
  const Block& b = it->second;
  const std::uintptr_t start = it->first;
  if (address >= start + std::max<std::size_t>(b.bytes, 1)) return nullptr;
  PETRA_CHECK(!b.freed, Error, what, ": ", p, " is in ", device_name(b.device), " memory that was freed (",
              b.bytes, " bytes at ", reinterpret_cast<const void*>(start), ")");
  PETRA_CHECK(address + bytes <= start + b.bytes, Error, what, ": ", bytes, " bytes at ", p, " run past the end of ",
              device_name(b.device), " block of ", b.bytes, " bytes at ", reinterpret_cast<const void*>(start));
  return &b;
}

// The device a copy's pointer is on (-1: host memory, pinned or not).
int device_of(const Block* b) { return b == nullptr ? -1 : b->device; }

void* allocate_block(std::size_t bytes, int device) {
  const std::size_t capacity = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, capacity);
  if (p == nullptr)
    throw OutOfMemoryError(concat("cuda_backend: the host has no ", capacity, " bytes for ", device_name(device)));
  std::memset(p, kPoison, capacity);
  State& s = state();
  s.blocks[reinterpret_cast<std::uintptr_t>(p)] = Block{bytes, device};
  return p;
}

// Marks the block at p freed and poisons it; the oldest blocks leave the quarantine. Caller holds
// the mutex.
void release_block(void* p, int device, const char* what) noexcept {
  State& s = state();
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  auto it = s.blocks.find(address);
  if (it == s.blocks.end())
    fatal(concat(what, "(", p, ", ", device_name(device), "): not a pointer this device allocated"));
  Block& b = it->second;
  if (b.freed) fatal(concat(what, "(", p, ", ", device_name(device), "): freed twice"));
  if (b.device != device)
    fatal(concat(what, "(", p, ", ", device_name(device), "): the block belongs to ", device_name(b.device)));
  std::memset(p, kPoison, b.bytes);
  b.freed = true;
  s.quarantine.push_back(address);
  s.quarantined_bytes += b.bytes;
  while (s.quarantined_bytes > kQuarantineBytes) {
    const auto oldest = s.blocks.find(s.quarantine.front());
    s.quarantined_bytes -= oldest->second.bytes;
    std::free(reinterpret_cast<void*>(oldest->first));
    s.blocks.erase(oldest);
    s.quarantine.pop_front();
  }
}

// ---- asynchronous mode: each stream's queue, run when something waits for it -------------------
//
// The emulated GPU is as far behind as it may be: a grid runs only when something waits for it (a
// stream or event synchronisation, a copy to or from pageable memory, cudaFree), and then only
// what that wait depends on: the stream's queue up to the point waited for, and, for each event
// wait met on the way, the other stream's queue up to that record. A copy or fill of petra's
// (cuda_backend::memcpy_async, memset_async) submitted to an idle stream runs at once, as the
// copy engines do while the compute units are busy. So an upload into a block that a queued kernel
// still reads, or a copy out of a block that a queued kernel has yet to write, lands in the wrong
// order exactly when no event orders the two: a missing event shows as wrong numbers.

// Runs `s`'s queue in order until done() (called with the mutex held) holds or the queue is empty;
// a wait at its head first runs the stream holding the awaited record. `lock` holds state().mutex;
// it is released while a unit runs (a grid may take long; other threads submit meanwhile).
void run_stream_until(std::unique_lock<std::mutex>& lock, EmulatedStream& s, const std::function<bool()>& done,
                      const char* what, int depth = 0) {
  State& st = state();
  if (depth > 64) throw Error(concat(what, ": event waits nest more than 64 streams deep (a cycle: on a GPU, a hang)"));
  while (!done()) {
    if (s.running) {  // another thread runs its head
      st.progress.wait(lock);
      continue;
    }
    if (s.queue.empty()) return;
    Work& head = s.queue.front();
    if (head.kind == Work::kWait) {
      EmulatedEvent* event = head.event;
      const std::uint64_t record = head.record;
      if (event->completed < record) {
        if (head.source == nullptr || head.source == &s)
          throw Error(concat(what, ": a stream waits for an event recorded after the wait on the same stream (on a "
                                   "GPU: a hang)"));
        run_stream_until(lock, *head.source, [event, record] { return event->completed >= record; }, what, depth + 1);
        if (event->completed < record)
          throw Error(concat(what, ": the emulated device cannot make progress: a wait's event record is in no queue"));
        continue;
      }
      s.queue.pop_front();
      continue;
    }
    Work work = std::move(head);
    s.queue.pop_front();
    if (work.kind == Work::kRecord) {
      work.event->completed = std::max(work.event->completed, work.record);
      continue;
    }
    s.running = true;
    lock.unlock();
    try {
      work.run();
    } catch (...) {
      lock.lock();
      s.running = false;
      st.progress.notify_all();
      throw;
    }
    lock.lock();
    s.running = false;
    st.progress.notify_all();
  }
}

// One stream's queue run to its end (with what it waits for). Caller holds `lock`.
void run_stream(std::unique_lock<std::mutex>& lock, EmulatedStream& s, const char* what) {
  run_stream_until(lock, s, [&s] { return s.queue.empty() && !s.running; }, what);
}

// Every stream's queue run to its end. Caller holds `lock`.
void run_everything(std::unique_lock<std::mutex>& lock, const char* what) {
  for (bool again = true; again;) {
    again = false;
    for (const void* handle : state().streams) {
      auto* s = static_cast<EmulatedStream*>(const_cast<void*>(handle));
      if (s->queue.empty() && !s->running) continue;
      run_stream(lock, *s, what);
      again = true;  // the set may have grown meanwhile (another thread made a stream)
    }
  }
}

// Queues `work` on `stream`, or, in synchronous mode, runs it now (without the mutex).
void submit_work(void* stream, Work work) {
  std::unique_lock lock(state().mutex);
  if (!state().asynchronous) {
    lock.unlock();
    if (work.run) work.run();
    return;
  }
  stream_of(stream, "emulated device: submit").queue.push_back(std::move(work));
}

// ---- the hooks of the CUDA emulation (cuda_emulation.hpp, Settings)
void submit_hook(cudaStream_t stream, std::function<void()> work) {
  submit_work(stream, Work{Work::kRun, std::move(work), nullptr, 0, nullptr});
}

void synchronize_hook(cudaStream_t stream) {
  std::unique_lock lock(state().mutex);
  if (stream == nullptr)
    run_everything(lock, "cudaDeviceSynchronize");
  else
    run_stream(lock, stream_of(stream, "cudaStreamSynchronize"), "cudaStreamSynchronize");
}

void check_stream(cudaStream_t handle, bool launch, const char* what) {
  std::lock_guard lock(state().mutex);
  const EmulatedStream& stream = stream_of(handle, what);
  if (!launch) return;
  int current = 0;
  (void)cuda_emulation::runtime::get_device(&current);
  PETRA_CHECK(stream.device == current, DeviceError, what, ": launched on a stream of cuda:", stream.device,
              " while cuda:", current, " is the calling thread's current device (CUDA refuses it; "
              "kernels/cuda/launch.cuh's DeviceGuard makes the stream's device current)");
  ++state().launches[stream.device];
}

void check_memory(const void* p, std::size_t bytes, const char* what) {
  std::lock_guard lock(state().mutex);
  (void)block_of(p, bytes, what);
}

void install_hooks() {
  static std::once_flag once;
  std::call_once(once, [] {
    cuda_emulation::Settings& settings = cuda_emulation::settings();
    settings.device_count = kDevices;
    settings.cooperative = true;  // whole training steps: fibers, not a std::thread per CUDA thread
    settings.check_stream = &check_stream;
    settings.check_memory = &check_memory;
    settings.submit = &submit_hook;
    settings.synchronize = &synchronize_hook;
    // PETRA_EMULATED_ASYNCHRONOUS=1: the whole process in asynchronous mode (the suite runs the
    // emulated-device tests once each way, tests/meson.build).
    const char* asynchronous = std::getenv("PETRA_EMULATED_ASYNCHRONOUS");
    state().asynchronous = asynchronous != nullptr && std::string(asynchronous) == "1";
  });
}

// Installed before main(), and again (once) by every entry point in case a static initializer of
// another file gets here first.
const bool hooks_installed = (install_hooks(), true);

}  // namespace

Live live() {
  std::lock_guard lock(state().mutex);
  return state().live;
}

std::int64_t launches(int device) {
  require_device(device, "launches");
  std::lock_guard lock(state().mutex);
  return state().launches[device];
}

bool set_asynchronous(bool on) {
  install_hooks();
  std::unique_lock lock(state().mutex);
  const bool previous = state().asynchronous;
  if (previous && !on) run_everything(lock, "set_asynchronous(false)");
  state().asynchronous = on;
  return previous;
}

bool asynchronous() {
  install_hooks();
  std::lock_guard lock(state().mutex);
  return state().asynchronous;
}

std::size_t set_capacity(std::size_t bytes_per_device) {
  std::lock_guard lock(state().mutex);
  const std::size_t previous = state().capacity;
  state().capacity = bytes_per_device;
  return previous;
}

}  // namespace petra::emulated_device

namespace petra::cuda_backend {

namespace ed = petra::emulated_device;
using detail::concat;

bool compiled() { return true; }

int device_count() {
  ed::install_hooks();
  return ed::kDevices;
}

bool available() { return device_count() > 0; }

int compute_capability(int device) {
  PETRA_CHECK(device >= 0 && device < ed::kDevices, DeviceError, "cuda_backend::compute_capability: no device cuda:",
              device);
  return 90;
}

std::string describe() {
  ed::install_hooks();
  std::lock_guard lock(ed::state().mutex);
  return concat("CUDA emulated on the host (tests/emulation/emulated_backend.cpp): ", ed::kDevices,
                " devices: [0] emulated GPU, [1] emulated GPU, ", double(ed::state().capacity) / (1u << 30),
                " GiB each");
}

void* malloc_device(std::size_t bytes, int device) {
  ed::install_hooks();
  ed::require_device(device, "malloc_device");
  if (bytes == 0) return nullptr;
  std::lock_guard lock(ed::state().mutex);
  ed::State& s = ed::state();
  if (bytes > s.capacity || s.device_bytes[device] > s.capacity - bytes)
    throw OutOfMemoryError(concat("cuda_backend::malloc_device: out of memory allocating ", bytes, " bytes on cuda:",
                                  device, " (", s.capacity - s.device_bytes[device], " of ", s.capacity,
                                  " bytes free, emulated)"));
  void* p = ed::allocate_block(bytes, device);
  s.device_bytes[device] += bytes;
  ++s.live.device_blocks;
  s.live.device_bytes += static_cast<std::int64_t>(bytes);
  return p;
}

void free_device(void* p, int device) noexcept {
  if (p == nullptr) return;
  std::unique_lock lock(ed::state().mutex);
  ed::State& s = ed::state();
  ++s.live.host_waits;
  if (s.asynchronous) {  // cudaFree waits for the device
    try {
      ed::run_everything(lock, "cuda_backend::free_device");
    } catch (const std::exception& e) {
      ed::fatal(e.what());
    }
  }
  const auto it = s.blocks.find(reinterpret_cast<std::uintptr_t>(p));
  const std::size_t bytes = it == s.blocks.end() ? 0 : it->second.bytes;
  ed::release_block(p, device, "cuda_backend::free_device");
  s.device_bytes[device] -= bytes;
  --s.live.device_blocks;
  s.live.device_bytes -= static_cast<std::int64_t>(bytes);
}

void* malloc_host(std::size_t bytes) {
  ed::install_hooks();
  if (bytes == 0) return nullptr;
  std::lock_guard lock(ed::state().mutex);
  void* p = ed::allocate_block(bytes, -1);
  ++ed::state().live.pinned_blocks;
  ed::state().live.pinned_bytes += static_cast<std::int64_t>(bytes);
  return p;
}

void free_host(void* p) noexcept {
  if (p == nullptr) return;
  std::lock_guard lock(ed::state().mutex);
  ed::State& s = ed::state();
  const auto it = s.blocks.find(reinterpret_cast<std::uintptr_t>(p));
  const std::size_t bytes = it == s.blocks.end() ? 0 : it->second.bytes;
  ed::release_block(p, -1, "cuda_backend::free_host");
  --s.live.pinned_blocks;
  s.live.pinned_bytes -= static_cast<std::int64_t>(bytes);
}

namespace {

// A new stream or event of `device`, registered in `all` and counted in `live`; never deleted (see
// the top of this file).
template <class Handle>
void* make_handle(int device, const char* operation, std::set<const void*>& all, std::int64_t& live) {
  ed::install_hooks();
  ed::require_device(device, operation);
  auto* handle = new Handle{};
  handle->device = device;
  all.insert(handle);
  ++live;
  return handle;
}

// Marks a stream or event destroyed (`lookup` checks it is a live one; misuse aborts: this runs in
// destructors).
template <class Handle>
void end_handle(void* handle, Handle& (*lookup)(void*, const char*), const char* operation,
                std::int64_t& live) noexcept {
  if (handle == nullptr) return;
  try {
    lookup(handle, operation).live = false;
  } catch (const std::exception& e) {
    ed::fatal(e.what());
  }
  --live;
}

}  // namespace

void* stream_create(int device) {
  std::lock_guard lock(ed::state().mutex);
  return make_handle<ed::EmulatedStream>(device, "stream_create", ed::state().streams, ed::state().live.streams);
}

void stream_destroy(void* stream) noexcept {
  std::unique_lock lock(ed::state().mutex);
  if (stream != nullptr && ed::state().asynchronous) {  // its queued work still runs, as on a GPU
    try {
      ed::run_stream(lock, ed::stream_of(stream, "cuda_backend::stream_destroy"), "cuda_backend::stream_destroy");
    } catch (const std::exception& e) {
      ed::fatal(e.what());
    }
  }
  end_handle(stream, &ed::stream_of, "cuda_backend::stream_destroy", ed::state().live.streams);
}

void stream_synchronize(void* stream) {
  std::unique_lock lock(ed::state().mutex);
  ed::EmulatedStream& s = ed::stream_of(stream, "cuda_backend::stream_synchronize");
  ++ed::state().live.host_waits;
  ed::run_stream(lock, s, "cuda_backend::stream_synchronize");
}

void* event_create(int device) {
  std::lock_guard lock(ed::state().mutex);
  return make_handle<ed::EmulatedEvent>(device, "event_create", ed::state().events, ed::state().live.events);
}

void event_destroy(void* event) noexcept {
  std::lock_guard lock(ed::state().mutex);
  end_handle(event, &ed::event_of, "cuda_backend::event_destroy", ed::state().live.events);
}

void event_record(void* event, void* stream) {
  std::lock_guard lock(ed::state().mutex);
  ed::EmulatedEvent& e = ed::event_of(event, "cuda_backend::event_record");
  ed::EmulatedStream& on = ed::stream_of(stream, "cuda_backend::event_record");
  PETRA_CHECK(e.device == on.device, DeviceError, "cuda_backend::event_record: an event of cuda:", e.device,
              " recorded on a stream of cuda:", on.device, " (CUDA: cudaErrorInvalidResourceHandle)");
  ++ed::state().live.event_records;
  ++e.records;
  e.recorded_on = &on;
  if (!ed::state().asynchronous) {
    e.completed = e.records;
    return;
  }
  if (on.queue.empty() && !on.running) {  // nothing before it: complete at once
    e.completed = e.records;
    return;
  }
  on.queue.push_back(ed::Work{ed::Work::kRecord, {}, &e, e.records, nullptr});
}

void stream_wait_event(void* stream, void* event) {
  std::lock_guard lock(ed::state().mutex);
  ed::EmulatedStream& s = ed::stream_of(stream, "cuda_backend::stream_wait_event");
  ed::EmulatedEvent& e = ed::event_of(event, "cuda_backend::stream_wait_event");
  // A stream may wait for an event of another device (that is how GPUs order work between them),
  // but not for one that was never recorded: CUDA would not wait at all.
  PETRA_CHECK(e.records > 0, Error, "cuda_backend::stream_wait_event: event ", event, " (cuda:", e.device,
              ") was never recorded; CUDA would not wait at all, leaving the work it should order unordered");
  if (!ed::state().asynchronous || e.completed >= e.records) return;
  s.queue.push_back(ed::Work{ed::Work::kWait, {}, &e, e.records, e.recorded_on});
}

void event_synchronize(void* event) {
  std::unique_lock lock(ed::state().mutex);
  const ed::EmulatedEvent& e = ed::event_of(event, "cuda_backend::event_synchronize");
  if (e.completed >= e.records) return;
  ++ed::state().live.host_waits;
  ed::run_stream_until(lock, *e.recorded_on, [&e] { return e.completed >= e.records; },
                       "cuda_backend::event_synchronize");
}

bool event_query(void* event) {
  std::lock_guard lock(ed::state().mutex);
  const ed::EmulatedEvent& e = ed::event_of(event, "cuda_backend::event_query");
  // Synchronous mode: work is done when it is submitted. Asynchronous: done once a wait ran the
  // queue past the record (nothing runs by itself: the emulated GPU is as far behind as it can be).
  return e.completed >= e.records;
}

namespace {

// Checks a copy of `bytes` between dst and src on `stream`: live memory, and every device pointer
// on the stream's device, except a copy between two devices, which one of them must be on.
void check_copy(void* dst, const void* src, std::size_t bytes, void* stream, const char* what) {
  const ed::EmulatedStream& s = ed::stream_of(stream, what);
  if (bytes == 0) return;
  PETRA_CHECK(dst != nullptr && src != nullptr, Error, what, ": null pointer (dst ", dst, ", src ", src, ")");
  const int to = ed::device_of(ed::block_of(dst, bytes, what));
  const int from = ed::device_of(ed::block_of(src, bytes, what));
  const bool peer = to >= 0 && from >= 0 && to != from;
  PETRA_CHECK(peer ? (to == s.device || from == s.device) : ((to < 0 || to == s.device) && (from < 0 || from == s.device)),
              DeviceError, what, ": a copy from ", ed::device_name(from), " to ", ed::device_name(to),
              " on a stream of cuda:", s.device);
}

// A copy's or fill's work. In asynchronous mode: where it reads or writes pageable host memory (not
// malloc_host's), CUDA copies before the call returns, so the stream's earlier work runs first and
// the copy now; on an idle stream it runs at once (the copy engines' speed); else it is queued.
// Caller holds `lock`.
void copy_work(std::unique_lock<std::mutex>& lock, void* stream, bool pageable, std::function<void()> copy,
               const char* what) {
  if (pageable) ++ed::state().live.host_waits;
  if (!ed::state().asynchronous) {
    copy();
    return;
  }
  ed::EmulatedStream& s = ed::stream_of(stream, what);
  if (pageable) ed::run_stream(lock, s, what);
  if (s.queue.empty() && !s.running) {
    copy();
    return;
  }
  s.queue.push_back(ed::Work{ed::Work::kRun, std::move(copy), nullptr, 0, nullptr});
}

// Whether p is plain host memory (neither the emulated device's nor malloc_host's). Caller holds the mutex.
bool pageable(const void* p, std::size_t bytes, const char* what) { return ed::block_of(p, bytes, what) == nullptr; }

}  // namespace

void memcpy_async(void* dst, const void* src, std::size_t bytes, void* stream) {
  std::unique_lock lock(ed::state().mutex);
  const char* what = "cuda_backend::memcpy_async";
  check_copy(dst, src, bytes, stream, what);
  if (bytes == 0) return;
  copy_work(lock, stream, pageable(dst, bytes, what) || pageable(src, bytes, what),
            [=] { std::memmove(dst, src, bytes); }, what);
}

void memcpy_2d_async(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t width,
                     std::size_t rows, void* stream) {
  std::unique_lock lock(ed::state().mutex);
  const char* what = "cuda_backend::memcpy_2d_async";
  PETRA_CHECK(width <= dst_pitch && width <= src_pitch, ValueError, what, ": rows of ", width,
              " bytes wider than the pitches ", dst_pitch, " and ", src_pitch);
  (void)ed::stream_of(stream, what);
  if (width == 0 || rows == 0) return;
  // The first and the last row bound the whole copy: both must be in the same live blocks.
  check_copy(dst, src, width, stream, what);
  auto* d = static_cast<unsigned char*>(dst);
  const auto* f = static_cast<const unsigned char*>(src);
  check_copy(d + (rows - 1) * dst_pitch, f + (rows - 1) * src_pitch, width, stream, what);
  copy_work(lock, stream, pageable(dst, width, what) || pageable(src, width, what), [=] {
    for (std::size_t r = 0; r < rows; ++r) std::memmove(d + r * dst_pitch, f + r * src_pitch, width);
  }, what);
}

void memset_async(void* dst, int value, std::size_t bytes, void* stream) {
  std::unique_lock lock(ed::state().mutex);
  const ed::EmulatedStream& s = ed::stream_of(stream, "cuda_backend::memset_async");
  if (bytes == 0) return;
  const int device = ed::device_of(ed::block_of(dst, bytes, "cuda_backend::memset_async"));
  PETRA_CHECK(device == s.device, DeviceError, "cuda_backend::memset_async: ", bytes, " bytes of ",
              ed::device_name(device), " at ", dst, " set on a stream of cuda:", s.device);
  copy_work(lock, stream, false, [=] { std::memset(dst, value, bytes); }, "cuda_backend::memset_async");
}

}  // namespace petra::cuda_backend
