// tests/cpu/test_tensor.cpp: shapes, views, copies and their errors.
#include <doctest/doctest.h>

#include "petra/tensor.hpp"

using namespace petra;

TEST_CASE("Shape basics") {
  const Shape s{64, 3, 32, 32};
  CHECK(s.ndim() == 4);
  CHECK(s.numel() == 64 * 3 * 32 * 32);
  CHECK(s[-1] == 32);
  CHECK(s.str() == "[64, 3, 32, 32]");
  CHECK(Shape{}.numel() == 1);
  CHECK_THROWS_AS(Shape({1, 2, 3, 4, 5, 6, 7}), ShapeError);
  CHECK_THROWS_AS(Shape({2, -1}), ShapeError);
  CHECK_THROWS_AS(s[4], ShapeError);
}

TEST_CASE("from_vector, to_vector, item, fill") {
  const Tensor t = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  CHECK(t.is_contiguous());
  CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(Tensor::full({1}, 2.5).item() == 2.5);
  CHECK_THROWS_AS(Tensor::from_vector<float>({2, 2}, {1, 2, 3}), ShapeError);
  CHECK_THROWS_AS(t.item(), ShapeError);
  CHECK_THROWS_AS(t.data_ptr<double>(), ShapeError);
  t.fill(7);
  CHECK(t.to_vector<float>() == std::vector<float>(6, 7.0f));
}

TEST_CASE("reshape shares storage; wrong sizes are refused") {
  const Tensor t = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor r = t.reshape({3, 2});
  CHECK(r.storage() == t.storage());
  r.data_ptr<float>()[0] = 42;
  CHECK(t.to_vector<float>()[0] == 42);
  CHECK_THROWS_AS(t.reshape({4, 2}), ShapeError);
}

TEST_CASE("batch slices are contiguous views, channel slices are strided views") {
  std::vector<float> v(2 * 4 * 3);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  const Tensor x = Tensor::from_vector<float>({2, 4, 3}, v);  // N=2, C=4, HW=3

  const Tensor b = x.slice(0, 1, 2);
  CHECK(b.is_contiguous());
  CHECK(b.storage() == x.storage());
  CHECK(b.to_vector<float>()[0] == 12);

  const Tensor upper = x.slice(1, 2, 4);  // second stream: channels 2, 3
  CHECK_FALSE(upper.is_contiguous());
  CHECK(upper.storage() == x.storage());
  const std::vector<float> expected{6, 7, 8, 9, 10, 11, 18, 19, 20, 21, 22, 23};
  CHECK(upper.to_vector<float>() == expected);
  const Tensor packed = upper.contiguous();
  CHECK(packed.is_contiguous());
  CHECK(packed.storage() != x.storage());
  CHECK(packed.to_vector<float>() == expected);
  CHECK_THROWS_AS(upper.reshape({12}), ShapeError);
  CHECK_THROWS_AS(x.slice(1, 3, 5), ShapeError);
  CHECK_THROWS_AS(x.slice(2, 0, 1), ShapeError);
}

TEST_CASE("clone is a deep copy; copy_from packs strided sources") {
  const Tensor x = Tensor::from_vector<double>({2, 2, 1}, {1, 2, 3, 4});
  const Tensor c = x.clone();
  c.fill(0);
  CHECK(x.to_vector<double>() == std::vector<double>{1, 2, 3, 4});
  const Tensor dst = Tensor::empty({2, 1, 1}, DType::f64);
  dst.copy_from(x.slice(1, 1, 2));
  CHECK(dst.to_vector<double>() == std::vector<double>{2, 4});
  CHECK_THROWS_AS(dst.copy_from(x), ShapeError);
}

TEST_CASE("dtype conversion") {
  const Tensor x = Tensor::from_vector<std::int64_t>({3}, {1, -2, 300});
  CHECK(x.to(DType::f32).to_vector<float>() == std::vector<float>{1, -2, 300});
  CHECK(x.slice(0, 2, 3).to(DType::f64).item() == 300.0);
  CHECK_THROWS_AS(x.item(), ShapeError);
}

TEST_CASE("devices") {
  CHECK(Device::parse("cpu") == Device::cpu(0));
  CHECK(Device::parse("cuda:1") == Device::cuda(1));
  CHECK(Device::parse("cpu:3").str() == "cpu:3");
  CHECK_THROWS_AS(Device::parse("tpu:0"), ValueError);
  CHECK_THROWS_AS(Device::parse("cuda:x"), ValueError);
  if (!cuda_available()) {
    MESSAGE("no GPU: checking that CUDA tensors are refused cleanly");
    CHECK_THROWS_AS(Tensor::empty({2}, DType::f32, Device::cuda(0)), DeviceError);
  }
}

// A shape whose element count or byte size does not fit 64 bits is refused, not wrapped: [2^31,
// 2^31, 4] once made a tensor of 0 bytes (2^64 wraps to 0) that claimed 2^64 elements.
TEST_CASE("sizes that overflow are refused with the shape in the message") {
  const std::int64_t big = std::int64_t{1} << 31;
  CHECK_THROWS_WITH_AS(Shape({big, big, 4}), doctest::Contains("[2147483648, 2147483648, 4]"), ShapeError);
  CHECK_THROWS_WITH_AS(Shape({std::int64_t{1} << 32, std::int64_t{1} << 32}), doctest::Contains("overflows"), ShapeError);
  // As in NumPy, a zero dim does not excuse the others: their product must fit too.
  CHECK_THROWS_AS(Shape({0, std::int64_t{1} << 40, std::int64_t{1} << 40}), ShapeError);
  CHECK_THROWS_AS(Shape({2, 3}).with(1, std::int64_t{1} << 62), ShapeError);
  CHECK_THROWS_AS(Shape({2, 3}).with(1, -1), ShapeError);
  CHECK(Shape({0, std::int64_t{1} << 40, 1}).numel() == 0);
  // The element count fits, the bytes do not (2^61 doubles are 2^64 bytes).
  CHECK_THROWS_WITH_AS(Tensor::empty({std::int64_t{1} << 61}, DType::f64), doctest::Contains("[2305843009213693952]"),
                       ShapeError);
  CHECK_THROWS_AS(Tensor::zeros({std::int64_t{1} << 30, std::int64_t{1} << 31}, DType::f32), ShapeError);
  CHECK(Tensor::empty({0, std::int64_t{1} << 40}, DType::f64).nbytes() == 0);
}
