// tests/emulation/test_emulated_device.cpp: the emulated device itself (misuse is an error), and
// Tensors, copies, .npy files, the allocator's accounting and its stream-ordered cache on cuda:0
// and cuda:1 (emulated: tests/emulation/emulated_device.hpp), in the cpu suite.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "petra/kernels/elementwise.hpp"
#include "petra/allocator.hpp"
#include "petra/cuda_backend.hpp"
#include "petra/npy.hpp"
#include "petra/ops.hpp"
#include "petra/stream.hpp"
#include "petra/tensor.hpp"
#include "tests/emulation/emulated_device.hpp"
#include "tests/support/fixtures.hpp"

namespace cb = petra::cuda_backend;
namespace ed = petra::emulated_device;
using namespace petra;
using petra::testing::random_tensor;
using petra::testing::TemporaryDirectory;

namespace {

const Device kGpu0 = Device::cuda(0), kGpu1 = Device::cuda(1);

std::vector<float> values_of(const Tensor& t) { return t.to_vector<float>(); }

}  // namespace

TEST_CASE("emulated device: two GPUs, described as emulated") {
  CHECK(cb::compiled());
  CHECK(cb::device_count() == 2);
  CHECK(cuda_available());
  CHECK(default_device() == kGpu0);
  CHECK(cb::describe().find("emulated") != std::string::npos);
  CHECK_THROWS_AS(cb::malloc_device(16, 2), DeviceError);
  CHECK_THROWS_AS(Tensor::empty({4}, DType::f32, Device::cuda(2)), DeviceError);
}

TEST_CASE("emulated device: misuse of the runtime is an error") {
  void* stream0 = cb::stream_create(0);
  void* stream1 = cb::stream_create(1);
  void* event0 = cb::event_create(0);
  float host[8] = {};
  void* block = cb::malloc_device(sizeof host, 0);

  SUBCASE("the null stream (a CPU stream's handle) is refused") {
    CHECK_THROWS_WITH_AS(cb::memcpy_async(block, host, sizeof host, nullptr), doctest::Contains("null stream"),
                         Error);
  }
  SUBCASE("a copy past the end of a block") {
    CHECK_THROWS_WITH_AS(cb::memcpy_async(block, host, sizeof host + 4, stream0), doctest::Contains("past the end"),
                         Error);
  }
  SUBCASE("device memory of cuda:0 copied on a stream of cuda:1") {
    CHECK_THROWS_AS(cb::memcpy_async(host, block, sizeof host, stream1), DeviceError);
    CHECK_THROWS_AS(cb::memset_async(block, 0, sizeof host, stream1), DeviceError);
  }
  SUBCASE("an event recorded on a stream of another device, a wait for an event never recorded") {
    CHECK_THROWS_AS(cb::event_record(event0, stream1), DeviceError);
    CHECK_THROWS_WITH_AS(cb::stream_wait_event(stream1, event0), doctest::Contains("never recorded"), Error);
    cb::event_record(event0, stream0);
    CHECK_NOTHROW(cb::stream_wait_event(stream1, event0));  // across devices: how GPUs order work
    CHECK(cb::event_query(event0));
  }
  SUBCASE("a kernel launched on a stream of another device than the current one") {
    kernels::StreamHandle s;
    s.cuda_stream = stream1;
    s.device_index = 0;  // the launch makes cuda:0 current, the stream is cuda:1's
    CHECK_THROWS_WITH_AS(kernels::cuda::fill(s, 8, 1.0, static_cast<float*>(block)),
                         doctest::Contains("current device"), DeviceError);
  }
  SUBCASE("streams and memory used after they were destroyed or freed") {
    void* gone = cb::stream_create(0);
    cb::stream_destroy(gone);
    CHECK_THROWS_WITH_AS(cb::stream_synchronize(gone), doctest::Contains("destroyed"), Error);
    void* freed = cb::malloc_device(64, 0);
    cb::free_device(freed, 0);
    CHECK_THROWS_WITH_AS(cb::memcpy_async(host, freed, 16, stream0), doctest::Contains("freed"), Error);
  }
  SUBCASE("a full device") {
    const std::size_t saved = ed::set_capacity(1 << 20);
    CHECK_THROWS_AS(cb::malloc_device(2 << 20, 1), OutOfMemoryError);
    ed::set_capacity(saved);
  }
  cb::free_device(block, 0);
  cb::event_destroy(event0);
  cb::stream_destroy(stream0);
  cb::stream_destroy(stream1);
}

TEST_CASE("emulated device: tensors made, filled, copied and converted on cuda:0 and cuda:1") {
  const Tensor host = random_tensor({2, 6, 3, 5}, 3, DType::f32);
  const Tensor gpu = host.to(kGpu0);
  CHECK(gpu.device() == kGpu0);
  CHECK(values_of(gpu) == values_of(host));

  SUBCASE("full, zeros and fill on the device, every dtype") {
    CHECK(values_of(Tensor::full({7}, 2.5, DType::f32, kGpu0)) == std::vector<float>(7, 2.5f));
    CHECK(values_of(Tensor::zeros({5}, DType::f32, kGpu1)) == std::vector<float>(5, 0.0f));
    CHECK(Tensor::full({3}, -0.0, DType::f32, kGpu0).to_vector<float>() == std::vector<float>(3, -0.0f));
    CHECK(std::signbit(Tensor::full({1}, -0.0, DType::f32, kGpu0).item()));
    CHECK(Tensor::full({4}, 7, DType::i64, kGpu0).to_vector<std::int64_t>() == std::vector<std::int64_t>(4, 7));
    CHECK(Tensor::full({2}, 0.25, DType::f64, kGpu1).to_vector<double>() == std::vector<double>(2, 0.25));
    Tensor t = Tensor::empty({9}, DType::f32, kGpu0);
    t.fill(-1.5);
    CHECK(values_of(t) == std::vector<float>(9, -1.5f));
    CHECK(Tensor::full({1}, 3.0, DType::f32, kGpu0).item() == 3.0);
  }
  SUBCASE("clone, channel slices made contiguous on the device, batch slices") {
    CHECK(values_of(gpu.clone()) == values_of(host));
    const Tensor channels = gpu.slice(1, 2, 5);
    CHECK(!channels.is_contiguous());
    const Tensor packed = channels.contiguous();
    CHECK(packed.device() == kGpu0);
    CHECK(values_of(packed) == values_of(host.slice(1, 2, 5)));
    CHECK(values_of(channels) == values_of(host.slice(1, 2, 5)));  // to the host straight from the view
    CHECK(values_of(gpu.slice(0, 1, 2)) == values_of(host.slice(0, 1, 2)));
    CHECK(values_of(gpu.slice(0, 1, 2).slice(1, 4, 6)) == values_of(host.slice(0, 1, 2).slice(1, 4, 6)));
  }
  SUBCASE("copies between the two devices, both ways, and into a view's packed copy") {
    const Tensor other = gpu.to(kGpu1);
    CHECK(other.device() == kGpu1);
    CHECK(values_of(other) == values_of(host));
    const Tensor back = Tensor::zeros(host.shape(), DType::f32, kGpu0);
    back.copy_from(other);
    CHECK(values_of(back) == values_of(host));
    const Tensor part = Tensor::empty({2, 3, 3, 5}, DType::f32, kGpu1);
    part.copy_from(gpu.slice(1, 1, 4));
    CHECK(values_of(part) == values_of(host.slice(1, 1, 4)));
  }
  SUBCASE("dtype conversion of a device tensor stays on the device") {
    const Tensor wide = gpu.to(DType::f64);
    CHECK(wide.device() == kGpu0);
    CHECK(wide.dtype() == DType::f64);
    const auto expected = host.to(DType::f64).to_vector<double>();
    CHECK(wide.to_vector<double>() == expected);
  }
  SUBCASE(".npy files: written from a device tensor, read onto a device") {
    const TemporaryDirectory dir("emulated-npy");
    save_npy(dir / "x.npy", gpu.slice(1, 1, 3));  // a strided device view
    const Tensor loaded = load_npy(dir / "x.npy", kGpu1);
    CHECK(loaded.device() == kGpu1);
    CHECK(values_of(loaded) == values_of(host.slice(1, 1, 3)));
  }
  SUBCASE("Storage::move_to moves every view of the bytes at once") {
    const Tensor a = host.clone();
    const Tensor view = a.slice(0, 1, 2);
    a.storage()->move_to(kGpu1);
    CHECK(a.device() == kGpu1);
    CHECK(view.device() == kGpu1);
    CHECK(values_of(view) == values_of(host.slice(0, 1, 2)));
    a.storage()->move_to(Device::cpu());
    CHECK(view.device().is_cpu());
    CHECK(values_of(a) == values_of(host));
  }
}

TEST_CASE("emulated device: ops on cuda:0 agree with the CPU's, without a StreamGuard") {
  // No StreamGuard: each op runs on the thread's default stream of cuda:0, as do the copies back.
  const Tensor x = random_tensor({2, 3, 7, 6}, 5, DType::f32);
  const Tensor w = random_tensor({4, 3, 3, 3}, 6, DType::f32);
  const Tensor b = random_tensor({4}, 7, DType::f32);
  const Conv2dOptions o{1, 1};
  const Tensor y_cpu = ops::relu(ops::conv2d_forward(x, w, b, o));
  const Tensor y_gpu = ops::relu(ops::conv2d_forward(x.to(kGpu0), w.to(kGpu0), b.to(kGpu0), o));
  CHECK(y_gpu.device() == kGpu0);
  CHECK(ops::relative_error(y_gpu, y_cpu) < 1e-6);
  const std::int64_t before = ed::launches(1);
  const Tensor s = ops::add(x.to(kGpu1), x.to(kGpu1));
  CHECK(ed::launches(1) > before);  // the kernel ran on a stream of cuda:1
  CHECK(values_of(s) == values_of(ops::add(x, x)));
  // Operands on two devices: refused, naming both.
  CHECK_THROWS_AS(ops::add(x.to(kGpu0), x.to(kGpu1)), DeviceError);
}

TEST_CASE("emulated device: the allocator counts device memory per device, tag and owner") {
  auto& allocator = Allocator::instance();
  allocator.reset_peaks(kGpu1);
  const MemoryStats cpu_before = allocator.stats(Device::cpu());
  const MemoryStats before = allocator.stats(kGpu1, MemoryTag::activations, 3);
  {
    MemoryScope scope(MemoryTag::activations, 3);
    const Tensor t = Tensor::empty({1000}, DType::f32, kGpu1);
    CHECK(allocator.stats(kGpu1, MemoryTag::activations, 3).current == before.current + 4000);
    CHECK(allocator.stats_of_owner(kGpu1, 3).current >= 4000);
    CHECK(allocator.stats(Device::cpu()).current == cpu_before.current);
  }
  CHECK(allocator.stats(kGpu1, MemoryTag::activations, 3).current == before.current);
  CHECK(allocator.stats(kGpu1, MemoryTag::activations, 3).peak >= before.current + 4000);
  CHECK(allocator.cached_bytes(kGpu1) > 0);
  allocator.release_cached(kGpu1);
  CHECK(allocator.cached_bytes(kGpu1) == 0);
}

TEST_CASE("emulated device, asynchronous mode: work runs when waited for, in stream order, events order streams") {
  const ed::AsynchronousScope asynchronous;
  void* a = cb::stream_create(0);
  void* b = cb::stream_create(0);
  void* done = cb::event_create(0);
  auto* x = static_cast<float*>(cb::malloc_device(8 * sizeof(float), 0));
  auto* pinned = static_cast<float*>(cb::malloc_host(8 * sizeof(float)));
  kernels::StreamHandle on_a;
  on_a.cuda_stream = a;
  on_a.device_index = 0;
  std::vector<float> host(8, 0.0f);

  kernels::cuda::fill(on_a, 8, 2.0, x);  // queued on a: nothing waits for it yet
  cb::event_record(done, a);
  CHECK_FALSE(cb::event_query(done));
  // A copy on b that does not wait for a's event reads x before the fill (fresh device memory: NaN).
  cb::memcpy_async(host.data(), x, 8 * sizeof(float), b);  // pageable: done when the call returns
  CHECK(std::isnan(host[0]));
  // A copy to pinned memory on a busy stream is queued behind the fill; on an idle one it runs at once.
  cb::memcpy_async(pinned, x, 8 * sizeof(float), a);
  CHECK(std::isnan(pinned[0]));  // not written yet: still the fresh pinned memory's NaN
  // b waits for the event: its copy now runs after a's fill.
  cb::stream_wait_event(b, done);
  cb::memcpy_async(host.data(), x, 8 * sizeof(float), b);
  CHECK(host == std::vector<float>(8, 2.0f));
  CHECK(cb::event_query(done));
  cb::stream_synchronize(a);
  CHECK(pinned[7] == 2.0f);
  pinned[0] = -1.0f;
  cb::memcpy_async(pinned, x, sizeof(float), b);  // b is idle: at once, no synchronisation
  CHECK(pinned[0] == 2.0f);

  cb::free_host(pinned);
  cb::free_device(x, 0);
  cb::event_destroy(done);
  cb::stream_destroy(b);
  cb::stream_destroy(a);
}

TEST_CASE("emulated device: a freed block goes back to its own stream, and to another only when safe") {
  auto& allocator = Allocator::instance();
  allocator.release_cached(kGpu0);
  Stream a(kGpu0), b(kGpu0);
  void* const sa = a.handle().cuda_stream;
  void* const sb = b.handle().cuda_stream;
  const auto take = [&](void* stream) { return allocator.allocate(3000, kGpu0, MemoryTag::other, kNoOwner, stream); };

  SUBCASE("freed on stream a: stream a may reuse it, stream b may not") {
    Allocation first = take(sa);
    void* const p = first.ptr;
    allocator.deallocate(first);
    Allocation on_b = take(sb);
    CHECK(on_b.ptr != p);
    Allocation on_a = take(sa);
    CHECK(on_a.ptr == p);
    allocator.deallocate(on_a);
    allocator.deallocate(on_b);
  }
  SUBCASE("used on stream b too: back to stream a only after b's event (complete at once here)") {
    Allocation first = take(sa);
    void* const p = first.ptr;
    const ed::Live live_before = ed::live();
    allocator.record_stream(first, sb, kGpu0);
    allocator.deallocate(first);
    CHECK(ed::live().event_records == live_before.event_records + 1);  // an event recorded on b at the free
    Allocation again = take(sa);  // the event has completed: the block is a's again
    CHECK(again.ptr == p);
    allocator.deallocate(again);
  }
  SUBCASE("a destroyed stream's blocks are free for every stream") {
    void* p = nullptr;
    {
      Stream gone(kGpu0);
      Allocation block = take(gone.handle().cuda_stream);
      p = block.ptr;
      allocator.deallocate(block);
    }
    Allocation on_a = take(sa);
    CHECK(on_a.ptr == p);
    allocator.deallocate(on_a);
  }
  SUBCASE("a stream's workspace, grown, frees its old block in the stream's own order") {
    void* const small = a.handle().scratch(1000);
    void* const large = a.handle().scratch(100000);
    CHECK(large != small);
    Allocation on_b = allocator.allocate(1000, kGpu0, MemoryTag::workspace, kNoOwner, sb);
    CHECK(on_b.ptr != small);
    allocator.deallocate(on_b);
  }
}

TEST_CASE("emulated device: a full device gives its cache back and the allocation succeeds") {
  auto& allocator = Allocator::instance();
  allocator.release_cached(kGpu1);
  const std::size_t saved = ed::set_capacity(std::size_t{24} << 20);
  {
    Tensor big = Tensor::empty({2 << 20}, DType::f32, kGpu1);  // 8 MiB
    big = Tensor();                                            // cached, not given back
  }
  CHECK(allocator.cached_bytes(kGpu1) >= (8 << 20));
  const Tensor other = Tensor::empty({5 << 20}, DType::f32, kGpu1);  // 20 MiB: fits only without the cache
  CHECK(allocator.cached_bytes(kGpu1) == 0);
  CHECK(other.device() == kGpu1);
  ed::set_capacity(saved);
}
