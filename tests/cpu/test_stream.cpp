// tests/cpu/test_stream.cpp: CPU streams, the current-stream guard, events, workspaces.
#include <doctest/doctest.h>

#include <thread>

#include "petra/stream.hpp"
#include "petra/tensor.hpp"

using namespace petra;

TEST_CASE("a CPU stream carries its thread count into the kernel handle") {
  Stream s(Device::cpu(), 3);
  CHECK(s.num_threads() == 3);
  CHECK(s.handle().num_threads == 3);
  CHECK(s.handle().cuda_stream == nullptr);
  s.set_num_threads(1);
  CHECK(s.handle().num_threads == 1);
  CHECK_THROWS_AS(s.set_num_threads(0), ValueError);
  CHECK(Stream(Device::cpu()).num_threads() == default_cpu_threads());
}

TEST_CASE("StreamGuard sets the current stream per thread and nests") {
  Stream& thread_default = Stream::current();
  Stream a(Device::cpu(), 1), b(Device::cpu(), 2);
  {
    StreamGuard ga(a);
    CHECK(&Stream::current() == &a);
    {
      StreamGuard gb(b);
      CHECK(&Stream::current() == &b);
      Stream* seen_by_other_thread = nullptr;
      std::thread([&] { seen_by_other_thread = &Stream::current(); }).join();
      CHECK(seen_by_other_thread != &b);
    }
    CHECK(&Stream::current() == &a);
  }
  CHECK(&Stream::current() == &thread_default);
}

TEST_CASE("a stream's workspace comes from the allocator, tagged workspace, and grows only") {
  Stream s(Device::cpu(), 1);
  const auto before = Allocator::instance().stats(Device::cpu(), MemoryTag::workspace).current;
  void* p = s.handle().scratch(1000);
  CHECK(p != nullptr);
  CHECK(Allocator::instance().stats(Device::cpu(), MemoryTag::workspace).current - before == 1000);
  CHECK(s.handle().scratch(500) == p);  // smaller request: same buffer
  s.handle().scratch(5000);
  CHECK(Allocator::instance().stats(Device::cpu(), MemoryTag::workspace).current - before == 5000);
}

TEST_CASE("CPU events complete at once; CUDA streams are refused without a GPU") {
  Stream s(Device::cpu(), 1);
  Event e;
  e.record(s);
  CHECK(e.query());
  e.synchronize();
  s.wait(e);
  s.synchronize();
  if (!cuda_available()) CHECK_THROWS_AS(Stream(Device::cuda(0)), DeviceError);
}
