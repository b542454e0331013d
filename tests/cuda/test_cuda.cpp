// tests/cuda/test_cuda.cpp: the cuda suite: petra::cuda_backend, and cuda:: kernels against ref::.
//
// Every GPU case is registered with doctest::skip(!available()), so on a machine without a GPU,
// and in a build without CUDA, the suite still runs and passes. The first case always runs: it
// checks what the backend does when there is no GPU, and says why the other cases are skipped.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "petra/kernels/common.hpp"
#include "petra/kernels/coupling.hpp"
#include "petra/kernels/elementwise.hpp"
#include "petra/config.hpp"
#include "petra/cuda_backend.hpp"
#include "petra/error.hpp"
#include "tests/support/testing.hpp"

namespace cb = petra::cuda_backend;
using petra::kernels::StreamHandle;
using petra::testing::random_values;
using petra::testing::relative_error;

namespace {

const bool kNoGpu = !cb::available();

// Device memory for n values of T on device 0, freed when the array goes out of scope.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n)
      : n_(n), data_(static_cast<T*>(cb::malloc_device(n * sizeof(T), 0))) {}
  ~DeviceArray() { cb::free_device(data_, 0); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return data_; }
  std::size_t bytes() const { return n_ * sizeof(T); }

  void upload(const std::vector<T>& host, void* stream) {
    REQUIRE(host.size() == n_);
    cb::memcpy_async(data_, host.data(), bytes(), stream);
  }
  // Waits for everything queued on `stream`, then returns the array's contents.
  std::vector<T> download(void* stream) const {
    std::vector<T> host(n_);
    cb::memcpy_async(host.data(), data_, bytes(), stream);
    cb::stream_synchronize(stream);
    return host;
  }

 private:
  std::size_t n_;
  T* data_;
};

// A stream on device 0 for the length of one test.
class TestStream {
 public:
  TestStream() : stream_(cb::stream_create(0)) {}
  ~TestStream() { cb::stream_destroy(stream_); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;

  void* get() const { return stream_; }
  StreamHandle handle() const {
    StreamHandle s;
    s.cuda_stream = stream_;
    s.device_index = 0;
    return s;
  }

 private:
  void* stream_;
};

// RAII event on device 0.
class TestEvent {
 public:
  TestEvent() : event_(cb::event_create(0)) {}
  ~TestEvent() { cb::event_destroy(event_); }
  TestEvent(const TestEvent&) = delete;
  TestEvent& operator=(const TestEvent&) = delete;
  void* get() const { return event_; }

 private:
  void* event_;
};

// Sizes for the kernel comparisons: a single element, odd sizes, and one larger than a full grid
// (8192 blocks x 256 threads), so that the grid-stride loops go round more than once.
const std::vector<std::int64_t> kSizes = {1, 7, 1000, 65537, 3 * 8192 * 256 + 13};

}  // namespace

TEST_CASE("cuda: the backend describes itself and reports no device without throwing") {
  const std::string description = cb::describe();
  MESSAGE("cuda backend: ", description);
  CHECK(!description.empty());
  CHECK(cb::compiled() == bool(PETRA_HAVE_CUDA));

  int count = -1;
  CHECK_NOTHROW(count = cb::device_count());
  CHECK(count >= 0);
  CHECK(cb::available() == (count > 0));
  CHECK(cb::device_count() == count);  // asked once, answered the same every time

  if (!cb::available()) {
    const std::string why = cb::compiled() ? "no usable CUDA device on this machine"
                                           : "petra was built without CUDA";
    MESSAGE(why, ": the GPU test cases of this suite are skipped");
    // Everything that needs a GPU throws DeviceError naming the operation, nothing crashes.
    CHECK_THROWS_AS(cb::malloc_device(1024, 0), petra::DeviceError);
    CHECK_THROWS_WITH_AS(cb::malloc_device(1024, 0), doctest::Contains("malloc_device"),
                         petra::DeviceError);
    CHECK_THROWS_AS(cb::stream_create(0), petra::DeviceError);
    CHECK_THROWS_AS(cb::event_create(0), petra::DeviceError);
    float source[4] = {1, 2, 3, 4}, target[4] = {};
    CHECK_THROWS_AS(cb::memcpy_async(target, source, sizeof source, nullptr), petra::DeviceError);
    // Destroying "nothing" is fine.
    CHECK_NOTHROW(cb::free_device(nullptr, 0));
    CHECK_NOTHROW(cb::stream_destroy(nullptr));
    CHECK_NOTHROW(cb::event_destroy(nullptr));
  }
}

TEST_CASE("cuda: device memory round trip, memset, errors" * doctest::skip(kNoGpu)) {
  TestStream stream;
  const std::size_t n = (1 << 20) + 5;
  const std::vector<float> host = random_values(n, 11);
  DeviceArray<float> a(n), b(n);

  a.upload(host, stream.get());
  cb::memcpy_async(b.get(), a.get(), a.bytes(), stream.get());  // device to device
  cb::memset_async(a.get(), 0, a.bytes(), stream.get());
  CHECK(b.download(stream.get()) == host);
  const std::vector<float> zeros = a.download(stream.get());
  CHECK(zeros == std::vector<float>(n, 0.0f));

  CHECK(cb::malloc_device(0, 0) == nullptr);
  CHECK_THROWS_AS(cb::malloc_device(std::size_t(1) << 60, 0), petra::OutOfMemoryError);
  CHECK_THROWS_AS(cb::malloc_device(16, cb::device_count()), petra::DeviceError);
  CHECK_THROWS_AS(cb::malloc_device(16, -1), petra::DeviceError);
  // A failed allocation leaves the device usable.
  DeviceArray<float> after(16);
  CHECK(after.get() != nullptr);
}

TEST_CASE("cuda: an event orders work across streams" * doctest::skip(kNoGpu)) {
  TestStream producer, consumer;
  TestEvent done;
  CHECK(cb::event_query(done.get()));  // never recorded: complete

  // The producer rewrites a 256 MB buffer 16 times (the last pass writes bytes of value 16) while
  // the consumer, once the event allows it, copies the buffer. Without the wait the copy would
  // run concurrently and see earlier passes.
  const std::size_t bytes = std::size_t(256) << 20;
  DeviceArray<std::uint8_t> buffer(bytes), snapshot(bytes);
  cb::memset_async(snapshot.get(), 0, bytes, consumer.get());
  for (int pass = 1; pass <= 16; ++pass)
    cb::memset_async(buffer.get(), pass, bytes, producer.get());
  cb::event_record(done.get(), producer.get());
  cb::stream_wait_event(consumer.get(), done.get());
  cb::memcpy_async(snapshot.get(), buffer.get(), bytes, consumer.get());

  const std::vector<std::uint8_t> seen = snapshot.download(consumer.get());
  std::size_t wrong = 0;
  for (std::uint8_t v : seen) wrong += v != 16;
  CHECK(wrong == 0);

  cb::event_synchronize(done.get());
  CHECK(cb::event_query(done.get()));
}

#if PETRA_HAVE_CUDA

namespace {

// One element-wise op as (stream, n, a, b, out): a and b are inputs (b unused by unary ops), out
// is the output, pre-filled so that "=" and "+=" are both checked by comparing with ref::.
using ElementwiseOp =
    std::function<void(const StreamHandle&, std::int64_t, const float*, const float*, float*)>;

// Offset 0 runs the float4 path (the allocator's pointers are 256-byte aligned), offset 1 float
// pointers that are not 16-byte aligned, which must take the float path.
void check_elementwise(const char* name, const ElementwiseOp& ref_op,
                       const ElementwiseOp& cuda_op) {
  TestStream stream;
  for (std::int64_t n : kSizes)
    for (std::size_t offset : {0, 1}) {
      const auto count = static_cast<std::size_t>(n);
      const std::vector<float> a = random_values(count + offset, 100 + n);
      const std::vector<float> b = random_values(count + offset, 200 + n);
      const std::vector<float> before = random_values(count + offset, 300 + n, 5.0, 6.0);

      std::vector<float> expected = before;
      ref_op(StreamHandle{}, n, a.data() + offset, b.data() + offset, expected.data() + offset);

      DeviceArray<float> da(count + offset), db(count + offset), dout(count + offset);
      da.upload(a, stream.get());
      db.upload(b, stream.get());
      dout.upload(before, stream.get());
      cuda_op(stream.handle(), n, da.get() + offset, db.get() + offset, dout.get() + offset);
      const std::vector<float> got = dout.download(stream.get());

      INFO(name, " n=", n, " offset=", offset);
      CHECK(relative_error(got, expected) <= 1e-6);  // the element before the output included
    }
}

}  // namespace

TEST_CASE("cuda: element-wise kernels match ref" * doctest::skip(kNoGpu)) {
  namespace ref = petra::kernels::ref;
  namespace cu = petra::kernels::cuda;
  using S = const StreamHandle&;
  using I = std::int64_t;
  using P = const float*;
  check_elementwise("add", [](S s, I n, P a, P b, float* o) { ref::add<float>(s, n, a, b, o); },
                    [](S s, I n, P a, P b, float* o) { cu::add(s, n, a, b, o); });
  check_elementwise("sub", [](S s, I n, P a, P b, float* o) { ref::sub<float>(s, n, a, b, o); },
                    [](S s, I n, P a, P b, float* o) { cu::sub(s, n, a, b, o); });
  check_elementwise("mul", [](S s, I n, P a, P b, float* o) { ref::mul<float>(s, n, a, b, o); },
                    [](S s, I n, P a, P b, float* o) { cu::mul(s, n, a, b, o); });
  check_elementwise("scale",
                    [](S s, I n, P a, P, float* o) { ref::scale<float>(s, n, -0.3, a, o); },
                    [](S s, I n, P a, P, float* o) { cu::scale(s, n, -0.3, a, o); });
  check_elementwise("axpy", [](S s, I n, P a, P, float* o) { ref::axpy<float>(s, n, 1.7, a, o); },
                    [](S s, I n, P a, P, float* o) { cu::axpy(s, n, 1.7, a, o); });
  check_elementwise("add_inplace",
                    [](S s, I n, P a, P, float* o) { ref::add_inplace<float>(s, n, a, o); },
                    [](S s, I n, P a, P, float* o) { cu::add_inplace(s, n, a, o); });
  check_elementwise("relu", [](S s, I n, P a, P, float* o) { ref::relu<float>(s, n, a, o); },
                    [](S s, I n, P a, P, float* o) { cu::relu(s, n, a, o); });
  check_elementwise("relu_backward",
                    [](S s, I n, P a, P b, float* o) { ref::relu_backward<float>(s, n, a, b, o); },
                    [](S s, I n, P a, P b, float* o) { cu::relu_backward(s, n, a, b, o); });
  check_elementwise("copy", [](S s, I n, P a, P, float* o) { ref::copy<float>(s, n, a, o); },
                    [](S s, I n, P a, P, float* o) { cu::copy(s, n, a, o); });
  check_elementwise("fill", [](S s, I n, P, P, float* o) { ref::fill<float>(s, n, 2.5, o); },
                    [](S s, I n, P, P, float* o) { cu::fill(s, n, 2.5, o); });
}

TEST_CASE("cuda: element-wise kernels work in place" * doctest::skip(kNoGpu)) {
  TestStream stream;
  const std::size_t n = 100003;
  const std::vector<float> x = random_values(n, 5), z = random_values(n, 6);
  std::vector<float> expected_sum = z, expected_relu = x;
  petra::kernels::ref::add<float>(StreamHandle{}, std::int64_t(n), x.data(), z.data(),
                                  expected_sum.data());
  petra::kernels::ref::relu<float>(StreamHandle{}, std::int64_t(n), x.data(), expected_relu.data());

  DeviceArray<float> dx(n), dz(n);
  dx.upload(x, stream.get());
  dz.upload(z, stream.get());
  const std::int64_t count = std::int64_t(n);
  petra::kernels::cuda::add(stream.handle(), count, dx.get(), dz.get(), dz.get());  // z = x + z
  petra::kernels::cuda::relu(stream.handle(), count, dx.get(), dx.get());           // x = relu(x)
  CHECK(relative_error(dz.download(stream.get()), expected_sum) <= 1e-6);
  CHECK(dx.download(stream.get()) == expected_relu);
}

TEST_CASE("cuda: kernels with n = 0 launch nothing" * doctest::skip(kNoGpu)) {
  TestStream stream;
  CHECK_NOTHROW(petra::kernels::cuda::add(stream.handle(), 0, nullptr, nullptr, nullptr));
  CHECK_NOTHROW(petra::kernels::cuda::copy(stream.handle(), 0, nullptr, nullptr));
  CHECK_NOTHROW(petra::kernels::cuda::fill(stream.handle(), 0, 1.0, nullptr));
  CHECK_NOTHROW(cb::stream_synchronize(stream.get()));
}

namespace {

using petra::kernels::CouplingShape;
using CouplingOp = std::function<void(const StreamHandle&, const CouplingShape&, const float*,
                                      const float*, float*)>;

// Runs one coupling op on random data with ref:: and with cuda:: and compares. `offset` shifts
// every device pointer by that many floats: with an odd offset the kernel must take its scalar
// path even where the stream size would allow float4.
void check_coupling(const char* name, const CouplingOp& ref_op, const CouplingOp& cuda_op,
                    const CouplingShape& shape, std::size_t offset) {
  const auto half = static_cast<std::size_t>(shape.half_size());
  const std::vector<float> in = random_values(2 * half, 400 + half);
  const std::vector<float> h = random_values(half, 500 + half);
  const std::vector<float> before = random_values(2 * half, 600 + half, 5.0, 6.0);
  std::vector<float> expected = before;
  ref_op(StreamHandle{}, shape, in.data(), h.data(), expected.data());

  TestStream stream;
  DeviceArray<float> din(2 * half + offset), dh(half + offset), dout(2 * half + offset);
  cb::memcpy_async(din.get() + offset, in.data(), in.size() * sizeof(float), stream.get());
  cb::memcpy_async(dh.get() + offset, h.data(), h.size() * sizeof(float), stream.get());
  cb::memcpy_async(dout.get() + offset, before.data(), before.size() * sizeof(float), stream.get());
  cuda_op(stream.handle(), shape, din.get() + offset, dh.get() + offset, dout.get() + offset);
  std::vector<float> got(2 * half);
  cb::memcpy_async(got.data(), dout.get() + offset, got.size() * sizeof(float), stream.get());
  cb::stream_synchronize(stream.get());

  INFO(name, " shape N=", shape.batch, " C=", shape.channels, " H=", shape.height,
       " W=", shape.width, " offset=", offset);
  CHECK(relative_error(got, expected) <= 1e-6);
}

// Odd stream sizes (scalar path), sizes divisible by 4 (float4 path), batch 1.
const std::vector<CouplingShape> kCouplingShapes = {{1, 1, 1, 1}, {2, 3, 5, 7},  {1, 16, 32, 32},
                                                   {4, 8, 8, 8}, {3, 5, 4, 4},  {7, 3, 3, 3},
                                                   {64, 32, 28, 28}};

}  // namespace

TEST_CASE("cuda: coupling kernels match ref" * doctest::skip(kNoGpu)) {
  namespace ref = petra::kernels::ref;
  namespace cu = petra::kernels::cuda;
  using S = const StreamHandle&;
  using Sh = const CouplingShape&;
  using P = const float*;
  const CouplingOp ref_forward = [](S s, Sh sh, P in, P h, float* out) {
    ref::coupling_forward<float>(s, sh, in, h, out);
  };
  const CouplingOp ref_inverse = [](S s, Sh sh, P in, P h, float* out) {
    ref::coupling_inverse<float>(s, sh, in, h, out);
  };
  const CouplingOp ref_backward = [](S s, Sh sh, P in, P h, float* out) {
    ref::coupling_backward<float>(s, sh, in, h, out);
  };
  for (const CouplingShape& shape : kCouplingShapes)
    for (std::size_t offset : {0, 1}) {
      check_coupling("coupling_forward", ref_forward, cu::coupling_forward, shape, offset);
      check_coupling("coupling_inverse", ref_inverse, cu::coupling_inverse, shape, offset);
      check_coupling("coupling_backward", ref_backward, cu::coupling_backward, shape, offset);
    }
}

TEST_CASE("cuda: coupling inverse(forward(x)) gives x1 back exactly" * doctest::skip(kNoGpu)) {
  TestStream stream;
  for (const CouplingShape shape : {CouplingShape{8, 16, 14, 14}, CouplingShape{3, 3, 5, 7}}) {
    const auto half = static_cast<std::size_t>(shape.half_size());
    const auto size = static_cast<std::size_t>(shape.stream_size());
    const std::vector<float> x = random_values(2 * half, 700 + half);
    const std::vector<float> f = random_values(half, 800 + half, -3.0, 3.0);
    DeviceArray<float> dx(2 * half), df(half), dy(2 * half), dback(2 * half);
    dx.upload(x, stream.get());
    df.upload(f, stream.get());
    petra::kernels::cuda::coupling_forward(stream.handle(), shape, dx.get(), df.get(), dy.get());
    petra::kernels::cuda::coupling_inverse(stream.handle(), shape, dy.get(), df.get(), dback.get());
    const std::vector<float> back = dback.download(stream.get());

    std::size_t first_stream_mismatches = 0;
    std::vector<float> x2, back2;
    for (std::size_t n = 0; n < static_cast<std::size_t>(shape.batch); ++n)
      for (std::size_t i = 0; i < size; ++i) {
        first_stream_mismatches += back[2 * n * size + i] != x[2 * n * size + i];
        x2.push_back(x[(2 * n + 1) * size + i]);
        back2.push_back(back[(2 * n + 1) * size + i]);
      }
    INFO("shape N=", shape.batch, " C=", shape.channels, " H=", shape.height, " W=", shape.width);
    CHECK(first_stream_mismatches == 0);  // moved, never computed: bit for bit
    // (x2 + f) - f: x2 + f (|.| < 4) rounds by at most 2^-23, the subtraction is nearly exact.
    CHECK(petra::testing::max_abs_diff(back2, x2) <= 0x1p-22);
    CHECK(relative_error(back2, x2) <= 1e-6);
  }
}

#endif  // PETRA_HAVE_CUDA
