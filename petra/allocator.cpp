// petra/allocator.cpp: the caching allocator (see allocator.hpp for why it caches).
//
// One mutex guards everything: allocations happen once per op, not per element, so an
// uncontended lock (~20 ns) is noise next to the op itself.
#include "petra/allocator.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <mutex>
#include <utility>
#include <vector>

#include "petra/cuda_backend.hpp"
#include "petra/error.hpp"

namespace petra {

std::string_view name_of(MemoryTag tag) {
  switch (tag) {
    case MemoryTag::parameters: return "parameters";
    case MemoryTag::gradients: return "gradients";
    case MemoryTag::optimizer_state: return "optimizer_state";
    case MemoryTag::activations: return "activations";
    case MemoryTag::input_buffer: return "input_buffer";
    case MemoryTag::param_stash: return "param_stash";
    case MemoryTag::messages: return "messages";
    case MemoryTag::workspace: return "workspace";
    case MemoryTag::other: return "other";
  }
  return "?";
}

// ---- MemoryScope: a per-thread stack of (tag, owner), kept as saved values on the C++ stack.
namespace {
thread_local MemoryTag tls_tag = MemoryTag::other;
thread_local int tls_owner = kNoOwner;
}  // namespace

MemoryScope::MemoryScope(MemoryTag tag, int owner) : saved_tag_(tls_tag), saved_owner_(tls_owner) {
  tls_tag = tag;
  tls_owner = owner;
}
MemoryScope::~MemoryScope() {
  tls_tag = saved_tag_;
  tls_owner = saved_owner_;
}
MemoryTag MemoryScope::current_tag() { return tls_tag; }
int MemoryScope::current_owner() { return tls_owner; }

// ---- the allocator
namespace {

constexpr std::size_t kSmallRound = 512;
constexpr std::size_t kHugePage = std::size_t{2} << 20;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// Block sizes: multiples of 512 B, and whole huge pages from 2 MiB on.
std::size_t block_capacity(std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(bytes, 64);
  return n >= kHugePage ? round_up(n, kHugePage) : round_up(n, kSmallRound);
}

struct Counter {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  void add(std::int64_t b) {
    current += b;
    peak = std::max(peak, current);
  }
  void remove(std::int64_t b) { current -= b; }
  void reset_peak() { peak = current; }
  MemoryStats stats() const { return {current, peak}; }
};

using FreeBlocks = std::multimap<std::size_t, void*>;  // capacity -> free block

// Caches a free block in front of the others of its capacity, so that take() hands out the one
// freed last (a multimap's plain emplace puts it behind them: the one freed first, long since
// evicted from the caches). A training step's tensors come and go in the same sizes; the block
// freed last is the likeliest still in L2 or L3, and writing a tensor into lines that are not in
// any cache first reads them from DRAM (docs/results-cpu.md §1, "The allocator hands out the
// block freed last").
void cache_block(FreeBlocks& blocks, std::size_t capacity, void* p) {
  blocks.emplace_hint(blocks.lower_bound(capacity), capacity, p);
}

// A GPU block freed while other streams may still use it: it waits for their events.
struct PendingBlock {
  void* ptr;
  std::size_t capacity;
  void* home;                                 // the stream whose cache it returns to
  std::vector<std::pair<void*, int>> events;  // recorded on the other streams at the free, with their GPU
};

struct DeviceState {
  Counter total;
  std::array<Counter, kNumMemoryTags> by_tag;
  std::map<int, Counter> by_owner;
  std::map<std::pair<int, int>, Counter> by_tag_owner;
  FreeBlocks cache;  // CPU: every free block; GPU: blocks free for every stream
  // GPU only (allocator.hpp, "stream-ordered"):
  std::map<void*, FreeBlocks> stream_cache;             // free in the order of one stream
  std::vector<PendingBlock> pending;                    // waiting for other streams' events
  // live block -> the other streams using it, with their devices (a copy stream of another GPU
  // reads a message's block: its event is made on that GPU)
  std::map<void*, std::vector<std::pair<void*, int>>> other_streams;
  std::int64_t cached = 0;  // bytes in cache, stream_cache and pending
};

int device_key(Device d) { return static_cast<int>(d.type) * 4096 + d.index; }

// nullptr when the memory is not there (a full GPU: `why` says what the runtime said).
void* system_allocate(std::size_t capacity, Device device, std::string& why) {
  if (device.is_cuda()) {
    try {
      return cuda_backend::malloc_device(capacity, device.index);
    } catch (const OutOfMemoryError& e) {
      why = e.what();
      return nullptr;
    }
  }
  const std::size_t alignment = capacity >= kHugePage ? kHugePage : 64;
  void* p = std::aligned_alloc(alignment, capacity);
  if (p != nullptr && capacity >= kHugePage) madvise(p, capacity, MADV_HUGEPAGE);  // 7x faster first touch here
  return p;
}

void system_free(void* p, Device device) noexcept {
  if (device.is_cuda())
    cuda_backend::free_device(p, device.index);
  else
    std::free(p);
}

}  // namespace

struct Allocator::Impl {
  mutable std::mutex mutex;
  std::set<void*> forgotten_streams;                 // destroyed (synchronised) GPU streams
  std::map<int, std::vector<void*>> spare_events;    // by GPU index, completed and reusable
  std::map<int, DeviceState> devices;
  std::map<int, Device> device_of_key;
  std::int64_t system_allocations = 0;

  DeviceState& state(Device d) {
    device_of_key[device_key(d)] = d;
    return devices[device_key(d)];
  }
  const DeviceState* find(Device d) const {
    auto it = devices.find(device_key(d));
    return it == devices.end() ? nullptr : &it->second;
  }

  // A block of `blocks` of at least `capacity` and less than twice it, or nullptr.
  static void* take(DeviceState& s, FreeBlocks& blocks, std::size_t capacity, std::size_t& got) {
    auto it = blocks.lower_bound(capacity);
    if (it == blocks.end() || it->first >= 2 * capacity) return nullptr;
    got = it->first;
    void* p = it->second;
    blocks.erase(it);
    s.cached -= static_cast<std::int64_t>(got);
    return p;
  }

  // A cached block for `stream`: one freed in its own order, else one free for every stream.
  void* take_from_cache(DeviceState& s, Device d, std::size_t capacity, void* stream, std::size_t& got) {
    if (d.is_cuda()) {
      collect_pending(s);
      auto it = s.stream_cache.find(stream);
      if (it != s.stream_cache.end())
        if (void* p = take(s, it->second, capacity, got)) return p;
    }
    return take(s, s.cache, capacity, got);
  }

  // Where a freed GPU block of home stream `home` is cached: that stream's cache, or every
  // stream's when the stream is gone.
  FreeBlocks& cache_of(DeviceState& s, void* home) {
    return forgotten_streams.count(home) ? s.cache : s.stream_cache[home];
  }

  // Pending blocks whose events have all completed go back to their home stream's cache.
  void collect_pending(DeviceState& s) {
    std::erase_if(s.pending, [&](PendingBlock& b) {
      for (const auto& [e, device] : b.events)
        if (!cuda_backend::event_query(e)) return false;
      for (const auto& [e, device] : b.events) spare_events[device].push_back(e);
      cache_block(cache_of(s, b.home), b.capacity, b.ptr);
      return true;
    });
  }

  // Everything cached goes back to the system. On a GPU the pending blocks' events are waited for
  // first, and cudaFree itself waits for the device, so no queued kernel still uses a block freed.
  void release(DeviceState& s, Device d) {
    for (PendingBlock& b : s.pending) {
      for (const auto& [e, device] : b.events) {
        cuda_backend::event_synchronize(e);
        spare_events[device].push_back(e);
      }
      system_free(b.ptr, d);
    }
    s.pending.clear();
    for (auto& [capacity, p] : s.cache) system_free(p, d);
    s.cache.clear();
    for (auto& [stream, blocks] : s.stream_cache)
      for (auto& [capacity, p] : blocks) system_free(p, d);
    s.stream_cache.clear();
    s.cached = 0;
  }

  // A GPU block freed by its last user: cached for its home stream, or, if other streams used it,
  // pending until events recorded on them now have completed.
  void free_gpu_block(DeviceState& s, const Allocation& a) noexcept {
    const auto uses = s.other_streams.find(a.ptr);
    if (uses == s.other_streams.end()) {
      cache_block(cache_of(s, a.stream), a.capacity, a.ptr);
      return;
    }
    PendingBlock pending{a.ptr, a.capacity, a.stream, {}};
    try {
      for (const auto& [stream, device] : uses->second) {
        if (forgotten_streams.count(stream)) continue;  // synchronised before it was destroyed
        auto& spare = spare_events[device];
        void* e = nullptr;
        if (spare.empty()) {
          e = cuda_backend::event_create(device);
        } else {
          e = spare.back();
          spare.pop_back();
        }
        pending.events.emplace_back(e, device);
        cuda_backend::event_record(e, stream);
      }
    } catch (const std::exception& error) {
      // No event, no proof the other streams are done: the block goes back to the driver, whose
      // cudaFree waits for the device.
      std::fprintf(stderr, "petra: Allocator: freeing a block used on several streams: %s\n", error.what());
      for (const auto& [e, device] : pending.events) spare_events[device].push_back(e);
      s.other_streams.erase(uses);
      s.cached -= static_cast<std::int64_t>(a.capacity);
      system_free(a.ptr, a.device);
      return;
    }
    s.other_streams.erase(uses);
    s.pending.push_back(std::move(pending));
  }

  void count(DeviceState& s, const Allocation& a, bool add) {
    const auto b = static_cast<std::int64_t>(a.bytes);
    Counter* counters[] = {&s.total, &s.by_tag[static_cast<int>(a.tag)], &s.by_owner[a.owner],
                           &s.by_tag_owner[{static_cast<int>(a.tag), a.owner}]};
    for (Counter* c : counters) add ? c->add(b) : c->remove(b);
  }
};

Allocator::Allocator() : impl_(new Impl) {}
Allocator::~Allocator() {
  for (auto& [key, s] : impl_->devices) impl_->release(s, impl_->device_of_key[key]);
  delete impl_;
}

Allocator& Allocator::instance() {
  static Allocator* allocator = new Allocator;  // never destroyed: tensors may outlive static destruction
  return *allocator;
}

Allocation Allocator::allocate(std::size_t bytes, Device device, MemoryTag tag, int owner, void* stream) {
  Allocation a;
  a.bytes = bytes;
  a.device = device;
  a.tag = tag;
  a.owner = owner;
  a.stream = device.is_cuda() ? stream : nullptr;
  const std::size_t capacity = block_capacity(bytes);
  std::lock_guard lock(impl_->mutex);
  DeviceState& s = impl_->state(device);
  a.ptr = impl_->take_from_cache(s, device, capacity, a.stream, a.capacity);
  if (a.ptr == nullptr) {
    a.capacity = capacity;
    std::string why;  // the driver's words when a GPU is full
    a.ptr = system_allocate(capacity, device, why);
    if (a.ptr == nullptr && s.cached > 0) {  // give the cache back and try once more
      impl_->release(s, device);
      a.ptr = system_allocate(capacity, device, why);
    }
    PETRA_CHECK(a.ptr != nullptr, OutOfMemoryError, "Allocator: cannot allocate ", bytes, " bytes on ",
                device.str(), " for ", name_of(tag), " (", s.total.current, " bytes live)",
                why.empty() ? "" : ": ", why);
    ++impl_->system_allocations;
  }
  impl_->count(s, a, true);
  return a;
}

void Allocator::deallocate(const Allocation& a) noexcept {
  if (a.ptr == nullptr) return;
  std::lock_guard lock(impl_->mutex);
  DeviceState& s = impl_->state(a.device);
  impl_->count(s, a, false);
  if (a.pinned) {
    cuda_backend::free_host(a.ptr);
    return;
  }
  s.cached += static_cast<std::int64_t>(a.capacity);
  if (a.device.is_cuda())
    impl_->free_gpu_block(s, a);
  else
    cache_block(s.cache, a.capacity, a.ptr);
}

Allocation Allocator::allocate_pinned(std::size_t bytes, MemoryTag tag, int owner) {
  Allocation a;
  a.bytes = bytes;
  a.capacity = bytes;
  a.device = Device::cpu();
  a.tag = tag;
  a.owner = owner;
  a.pinned = true;
  a.ptr = cuda_backend::malloc_host(bytes);  // throws when there is no CUDA runtime to pin with
  std::lock_guard lock(impl_->mutex);
  ++impl_->system_allocations;
  impl_->count(impl_->state(a.device), a, true);
  return a;
}

void Allocator::record_stream(const Allocation& a, void* stream, Device stream_device) {
  if (a.ptr == nullptr || !a.device.is_cuda() || stream == a.stream) return;
  PETRA_CHECK(stream != nullptr && stream_device.is_cuda(), DeviceError, "Allocator::record_stream: a block of ",
              a.device.str(), " used on a stream that is not a GPU stream (", stream_device.str(), ")");
  std::lock_guard lock(impl_->mutex);
  auto& streams = impl_->state(a.device).other_streams[a.ptr];
  const std::pair<void*, int> use{stream, stream_device.index};
  if (std::find(streams.begin(), streams.end(), use) == streams.end()) streams.push_back(use);
}

void Allocator::forget_stream(Device device, void* stream) noexcept {
  if (!device.is_cuda() || stream == nullptr) return;
  std::lock_guard lock(impl_->mutex);
  impl_->forgotten_streams.insert(stream);
  // Its blocks, on whichever GPU, are free for every stream.
  for (auto& [key, s] : impl_->devices) {
    const auto it = s.stream_cache.find(stream);
    if (it == s.stream_cache.end()) continue;
    s.cache.merge(it->second);
    s.stream_cache.erase(it);
  }
}

void Allocator::stream_created(Device device, void* stream) {
  if (!device.is_cuda()) return;
  std::lock_guard lock(impl_->mutex);
  impl_->forgotten_streams.erase(stream);
}

void Allocator::retag(Allocation& a, MemoryTag tag, int owner) {
  if (a.ptr == nullptr) return;
  std::lock_guard lock(impl_->mutex);
  DeviceState& s = impl_->state(a.device);
  impl_->count(s, a, false);
  a.tag = tag;
  a.owner = owner;
  impl_->count(s, a, true);
}

MemoryStats Allocator::stats(Device device) const {
  std::lock_guard lock(impl_->mutex);
  const DeviceState* s = impl_->find(device);
  return s ? s->total.stats() : MemoryStats{};
}

MemoryStats Allocator::stats(Device device, MemoryTag tag) const {
  std::lock_guard lock(impl_->mutex);
  const DeviceState* s = impl_->find(device);
  return s ? s->by_tag[static_cast<int>(tag)].stats() : MemoryStats{};
}

MemoryStats Allocator::stats_of_owner(Device device, int owner) const {
  std::lock_guard lock(impl_->mutex);
  const DeviceState* s = impl_->find(device);
  if (!s) return {};
  auto it = s->by_owner.find(owner);
  return it == s->by_owner.end() ? MemoryStats{} : it->second.stats();
}

MemoryStats Allocator::stats(Device device, MemoryTag tag, int owner) const {
  std::lock_guard lock(impl_->mutex);
  const DeviceState* s = impl_->find(device);
  if (!s) return {};
  auto it = s->by_tag_owner.find({static_cast<int>(tag), owner});
  return it == s->by_tag_owner.end() ? MemoryStats{} : it->second.stats();
}

void Allocator::reset_peaks(Device device) {
  std::lock_guard lock(impl_->mutex);
  DeviceState& s = impl_->state(device);
  s.total.reset_peak();
  for (auto& c : s.by_tag) c.reset_peak();
  for (auto& [owner, c] : s.by_owner) c.reset_peak();
  for (auto& [key, c] : s.by_tag_owner) c.reset_peak();
}

std::int64_t Allocator::cached_bytes(Device device) const {
  std::lock_guard lock(impl_->mutex);
  const DeviceState* s = impl_->find(device);
  return s ? s->cached : 0;
}

void Allocator::release_cached(Device device) {
  std::lock_guard lock(impl_->mutex);
  impl_->release(impl_->state(device), device);
}

std::int64_t Allocator::system_allocations() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->system_allocations;
}

}  // namespace petra
