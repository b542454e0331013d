// petra/allocator.hpp: the caching allocator and its memory accounting.
//
// Every allocation carries a device, a tag (what the bytes are for) and an owner (a pipeline stage
// index, or kNoOwner). Current and peak bytes can be read per device, per tag, per owner, and per
// (tag, owner) pair: PETRA's memory claims are measured with these counters, never estimated.
//
// Freed blocks are kept in a per-device cache and handed out again for requests of a similar size.
// Why: on the VMs petra is developed on, touching a fresh page costs ~11.5 us (0.35 GB/s), so a
// training step that mallocs and frees its activations would spend most of its time in page faults.
// The counters count requested bytes of live blocks; cached_bytes() reports what the cache holds.
//
// The tag and owner of an allocation come from the innermost MemoryScope of the calling thread
// (default: MemoryTag::other, kNoOwner), so the pipeline runtime can say "everything allocated
// now is stage 3's activations" without threading tags through every op.
//
// Device memory is stream-ordered. A GPU block is allocated for a stream (its home: the stream the
// op that asked for it runs on, petra/stream.hpp's Stream::for_device) and, once freed, cached for
// that stream: work queued later on the same stream runs after every kernel that used the block,
// so the stream may reuse it at once, but another stream may not. A block also used on other
// streams (record_stream: a message read by the next stage's stream, an upload on the copy stream)
// gets, when it is freed, an event on each of them, and goes back to its home stream's cache only
// once they have completed. Blocks of a destroyed stream (synchronised first) and blocks whose
// events completed are free for any stream. When the device is full, the cache is given back to
// the driver (cudaFree waits for the device) and the allocation is tried once more.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "petra/device.hpp"

namespace petra {

enum class MemoryTag : std::uint8_t {
  parameters,
  gradients,
  optimizer_state,
  activations,
  input_buffer,
  param_stash,
  messages,
  workspace,
  other,
};
inline constexpr int kNumMemoryTags = 9;
std::string_view name_of(MemoryTag tag);

inline constexpr int kNoOwner = -1;

struct MemoryStats {
  std::int64_t current = 0;  // bytes live now
  std::int64_t peak = 0;     // most bytes live at once since the last reset_peaks()
};

// Sets the tag and owner of allocations made by this thread while it is alive (nests).
class MemoryScope {
 public:
  MemoryScope(MemoryTag tag, int owner = kNoOwner);
  ~MemoryScope();
  MemoryScope(const MemoryScope&) = delete;
  MemoryScope& operator=(const MemoryScope&) = delete;

  static MemoryTag current_tag();
  static int current_owner();

 private:
  MemoryTag saved_tag_;
  int saved_owner_;
};

// One allocation: what deallocate() needs back.
struct Allocation {
  void* ptr = nullptr;
  std::size_t bytes = 0;     // requested
  std::size_t capacity = 0;  // size of the underlying block
  Device device;
  MemoryTag tag = MemoryTag::other;
  int owner = kNoOwner;
  void* stream = nullptr;  // GPU: the stream whose order the block follows (its home); see the top
  bool pinned = false;     // page-locked host memory (allocate_pinned)
};

class Allocator {
 public:
  static Allocator& instance();  // the process-wide allocator

  // Thread-safe. Memory is 64-byte aligned (2 MiB for large host blocks, which get huge pages;
  // 256 bytes on a GPU). `stream` (a GPU's cudaStream_t, ignored on the CPU) is the block's home.
  Allocation allocate(std::size_t bytes, Device device, MemoryTag tag, int owner, void* stream = nullptr);
  void deallocate(const Allocation& a) noexcept;
  // Page-locked host memory (cuda_backend::malloc_host), counted on cpu:0 under `tag` and `owner`;
  // not cached (staging buffers live as long as what stages through them). Freed by deallocate.
  Allocation allocate_pinned(std::size_t bytes, MemoryTag tag, int owner);
  // The GPU block of `a` is also used by work queued on `stream`, a GPU stream of `stream_device`
  // (not its home stream; it may be another GPU's): when it is freed it waits for that work before
  // any reuse. Nothing to do on the CPU or for the home stream.
  void record_stream(const Allocation& a, void* stream, Device stream_device);
  // ~Stream calls this once it has synchronised a GPU stream: the blocks cached for it are free for
  // every stream, and blocks still homed on it go to every stream when they are freed.
  void forget_stream(Device device, void* stream) noexcept;
  // Stream's constructor: a new stream (the runtime may hand out a destroyed stream's handle again).
  void stream_created(Device device, void* stream);
  // Moves a live allocation's bytes to another tag and owner (a stage's output becomes the next
  // stage's input buffer once the forward that made it is over).
  void retag(Allocation& a, MemoryTag tag, int owner);

  MemoryStats stats(Device device) const;                            // all tags and owners
  MemoryStats stats(Device device, MemoryTag tag) const;
  MemoryStats stats_of_owner(Device device, int owner) const;
  MemoryStats stats(Device device, MemoryTag tag, int owner) const;
  void reset_peaks(Device device);  // every peak of the device becomes its current value

  std::int64_t cached_bytes(Device device) const;  // held by the cache, not live
  void release_cached(Device device);               // returns the cache to the system
  std::int64_t system_allocations() const;          // blocks obtained from the system so far

  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;
  ~Allocator();

 private:
  Allocator();
  struct Impl;
  Impl* impl_;
};

}  // namespace petra
