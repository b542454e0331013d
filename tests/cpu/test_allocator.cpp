// tests/cpu/test_allocator.cpp: memory accounting per device, tag and owner; the cache.
#include <doctest/doctest.h>

#include <thread>
#include <vector>

#include "petra/tensor.hpp"

using namespace petra;

namespace {
const Device kCpu = Device::cpu();
Allocator& alloc() { return Allocator::instance(); }
}  // namespace

TEST_CASE("tags and owners come from the MemoryScope and are counted exactly") {
  const auto base_total = alloc().stats(kCpu).current;
  const auto base_stash = alloc().stats(kCpu, MemoryTag::param_stash).current;
  {
    MemoryScope scope(MemoryTag::param_stash, 7);
    const Tensor a = Tensor::empty({1000}, DType::f32);  // 4000 bytes
    CHECK(a.storage()->tag() == MemoryTag::param_stash);
    CHECK(a.storage()->owner() == 7);
    CHECK(alloc().stats(kCpu, MemoryTag::param_stash).current - base_stash == 4000);
    CHECK(alloc().stats(kCpu, MemoryTag::param_stash, 7).current == 4000);
    CHECK(alloc().stats_of_owner(kCpu, 7).current == 4000);
    {
      MemoryScope inner(MemoryTag::activations, 8);
      const Tensor b = Tensor::empty({10}, DType::f64);
      CHECK(b.storage()->tag() == MemoryTag::activations);
      CHECK(alloc().stats(kCpu, MemoryTag::activations, 8).current == 80);
    }
    CHECK(MemoryScope::current_tag() == MemoryTag::param_stash);  // the inner scope restored it
    CHECK(alloc().stats(kCpu).current - base_total == 4000);
  }
  CHECK(alloc().stats(kCpu).current == base_total);
  CHECK(alloc().stats(kCpu, MemoryTag::param_stash, 7).current == 0);
  CHECK(alloc().stats(kCpu, MemoryTag::param_stash, 7).peak == 4000);
  CHECK(MemoryScope::current_tag() == MemoryTag::other);
}

TEST_CASE("peaks track the maximum and reset to the current value") {
  MemoryScope scope(MemoryTag::messages, 11);
  alloc().reset_peaks(kCpu);
  {
    const Tensor a = Tensor::empty({256}, DType::f32);
    { const Tensor b = Tensor::empty({512}, DType::f32); }
    CHECK(alloc().stats(kCpu, MemoryTag::messages, 11).current == 1024);
    CHECK(alloc().stats(kCpu, MemoryTag::messages, 11).peak == 1024 + 2048);
    alloc().reset_peaks(kCpu);
    CHECK(alloc().stats(kCpu, MemoryTag::messages, 11).peak == 1024);
  }
}

TEST_CASE("freed blocks are reused instead of asking the system again") {
  { const Tensor warm = Tensor::empty({1 << 20}, DType::f32); }
  const auto before = alloc().system_allocations();
  for (int i = 0; i < 50; ++i) {
    const Tensor t = Tensor::empty({1 << 20}, DType::f32);
    t.data_ptr<float>()[0] = 1.0f;
  }
  CHECK(alloc().system_allocations() == before);
  CHECK(alloc().cached_bytes(kCpu) >= (4 << 20));
}

TEST_CASE("of cached blocks of one size, the one freed last is handed out first") {
  // The block freed last is the likeliest still in the CPU's caches (petra/allocator.cpp).
  // A size no other test uses, so that the cache holds only these three blocks of it.
  const std::int64_t n = 777777;
  std::vector<const void*> freed;
  {
    std::vector<Tensor> blocks;
    for (int i = 0; i < 3; ++i) blocks.push_back(Tensor::empty({n}, DType::f32));
    for (int i : {1, 0, 2}) {  // freed in this order: 2 last, then 0, then 1
      freed.push_back(blocks[std::size_t(i)].raw_data());
      blocks[std::size_t(i)] = Tensor();
    }
  }
  const Tensor first = Tensor::empty({n}, DType::f32);
  CHECK(first.raw_data() == freed[2]);
  const Tensor second = Tensor::empty({n}, DType::f32);
  CHECK(second.raw_data() == freed[1]);
  const Tensor third = Tensor::empty({n}, DType::f32);
  CHECK(third.raw_data() == freed[0]);
}

TEST_CASE("memory is 64-byte aligned and large blocks are released on request") {
  for (std::int64_t n : {1, 3, 100, 5000, 1 << 21}) {
    const Tensor t = Tensor::empty({n}, DType::u8);
    CHECK(reinterpret_cast<std::uintptr_t>(t.raw_data()) % 64 == 0);
  }
  alloc().release_cached(kCpu);
  CHECK(alloc().cached_bytes(kCpu) == 0);
}

TEST_CASE("the allocator is thread-safe and per-owner counters do not mix") {
  const auto base = alloc().stats(kCpu).current;
  std::vector<std::thread> threads;
  for (int owner = 100; owner < 104; ++owner)
    threads.emplace_back([owner] {
      MemoryScope scope(MemoryTag::activations, owner);
      for (int i = 0; i < 200; ++i) {
        const Tensor t = Tensor::empty({(i % 7 + 1) * 100}, DType::f32);
        (void)t;
      }
      const Tensor keep = Tensor::empty({owner}, DType::u8);
      CHECK(Allocator::instance().stats_of_owner(Device::cpu(), owner).current == owner);
    });
  for (auto& t : threads) t.join();
  CHECK(alloc().stats(kCpu).current == base);
  for (int owner = 100; owner < 104; ++owner) CHECK(alloc().stats_of_owner(kCpu, owner).current == 0);
}
