// tests/cpu/test_pool.cpp: max, average and global average pooling: hand-worked examples,
// cpu:: against ref::, ref::'s backward against finite differences, and the "=" contract.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "petra/kernels/pool.hpp"
#include "tests/support/gradcheck.hpp"
#include "tests/support/testing.hpp"

namespace pk = petra::kernels;
using petra::testing::check_vjp;
using petra::testing::random_values;
using petra::testing::relative_error;

namespace {

// {batch, channels, height, width, kernel, stride, padding}: odd sizes, batch 1, overlapping
// and non-overlapping windows, padding up to kernel/2, and one big enough for the threaded path.
const std::vector<pk::Pool2dShape> kShapes = {
    {1, 3, 7, 5, 3, 2, 1}, {2, 4, 8, 8, 2, 2, 0}, {3, 5, 9, 11, 3, 1, 1},
    {1, 1, 5, 5, 5, 1, 2}, {2, 3, 6, 7, 4, 3, 2}, {4, 16, 32, 32, 3, 2, 1}};

// n distinct values in [-1, 1), shuffled: max pooling has no ties, and finite differences of
// size 1e-6 never change a window's winner.
template <class T>
std::vector<T> distinct_values(std::int64_t n, std::uint64_t seed) {
  std::vector<T> v(n);
  for (std::int64_t i = 0; i < n; ++i) v[i] = T(2.0 * double(i) / double(n) - 1.0);
  std::shuffle(v.begin(), v.end(), std::mt19937_64(seed));
  return v;
}

}  // namespace

TEST_CASE("pool: hand-worked examples") {
  pk::StreamHandle s;
  // 4x4 plane holding 0..15, 2x2 windows, stride 2.
  std::vector<float> x(16);
  std::iota(x.begin(), x.end(), 0.f);
  const pk::Pool2dShape two_by_two{1, 1, 4, 4, 2, 2, 0};
  std::vector<float> y(4, 777.f);
  std::vector<std::int32_t> indices(4, -5);
  pk::cpu::max_pool2d_forward(s, two_by_two, x.data(), y.data(), indices.data());
  CHECK(y == std::vector<float>{5, 7, 13, 15});
  CHECK(indices == std::vector<std::int32_t>{5, 7, 13, 15});
  pk::cpu::avg_pool2d_forward(s, two_by_two, x.data(), y.data());
  CHECK(y == std::vector<float>{2.5f, 4.5f, 10.5f, 12.5f});

  // 2x2 plane, 3x3 windows, padding 1: every window holds all four values. Average pooling
  // counts the padding (divides by 9); max pooling never picks it, even over negative values.
  const pk::Pool2dShape padded{1, 1, 2, 2, 3, 1, 1};
  const std::vector<float> small = {1, 2, 3, 4}, negative = {-1, -2, -3, -4};
  pk::cpu::avg_pool2d_forward(s, padded, small.data(), y.data());
  for (float v : y) CHECK(v == doctest::Approx(10.0 / 9));
  pk::cpu::max_pool2d_forward(s, padded, negative.data(), y.data(), indices.data());
  CHECK(y == std::vector<float>{-1, -1, -1, -1});
  CHECK(indices == std::vector<std::int32_t>{0, 0, 0, 0});
  pk::ref::max_pool2d_forward(s, padded, negative.data(), y.data(), indices.data());
  CHECK(y == std::vector<float>{-1, -1, -1, -1});
  CHECK(indices == std::vector<std::int32_t>{0, 0, 0, 0});

  // Ties go to the first maximum; a NaN propagates.
  std::vector<float> ties(16, 3.f);
  std::vector<float> with_nan = x;
  with_nan[6] = NAN;
  for (auto max_pool : {pk::cpu::max_pool2d_forward, pk::ref::max_pool2d_forward<float>}) {
    max_pool(s, two_by_two, ties.data(), y.data(), indices.data());
    CHECK(indices == std::vector<std::int32_t>{0, 2, 8, 10});
    max_pool(s, two_by_two, with_nan.data(), y.data(), indices.data());
    CHECK(std::isnan(y[1]));
    CHECK(indices[1] == 6);
    CHECK(y[0] == 5);
  }

  // Global average pool: 2 planes of 2x3.
  const pk::GlobalPoolShape global{1, 2, 2, 3};
  const std::vector<float> planes = {1, 2, 3, 4, 5, 6, -6, 0, 0, 0, 0, 0};
  std::vector<float> means(2, 777.f), dx(12, 777.f);
  pk::cpu::global_avg_pool_forward(s, global, planes.data(), means.data());
  CHECK(means[0] == doctest::Approx(3.5));
  CHECK(means[1] == doctest::Approx(-1));
  const std::vector<float> dmeans = {6, -12};
  pk::cpu::global_avg_pool_backward(s, global, dmeans.data(), dx.data());
  for (int k = 0; k < 6; ++k) CHECK(dx[k] == doctest::Approx(1));
  for (int k = 6; k < 12; ++k) CHECK(dx[k] == doctest::Approx(-2));
}

TEST_CASE("pool: cpu max pool matches ref exactly, outputs assigned") {
  pk::StreamHandle s;
  s.num_threads = 2;
  std::uint64_t seed = 1;
  for (const auto& shape : kShapes) {
    CAPTURE(shape.height);
    CAPTURE(shape.kernel);
    CAPTURE(shape.stride);
    CAPTURE(shape.padding);
    const auto x = distinct_values<float>(shape.input_size(), seed++);
    std::vector<float> y_cpu(shape.output_size(), 777.f), y_ref(shape.output_size(), -777.f);
    std::vector<std::int32_t> i_cpu(shape.output_size(), -5), i_ref(shape.output_size(), -7);
    pk::cpu::max_pool2d_forward(s, shape, x.data(), y_cpu.data(), i_cpu.data());
    pk::ref::max_pool2d_forward(s, shape, x.data(), y_ref.data(), i_ref.data());
    CHECK(y_cpu == y_ref);
    CHECK(i_cpu == i_ref);
    // Without indices: same y.
    std::vector<float> y_plain(shape.output_size(), 777.f);
    pk::cpu::max_pool2d_forward(s, shape, x.data(), y_plain.data(), nullptr);
    CHECK(y_plain == y_ref);

    const auto dy = random_values<float>(shape.output_size(), seed++);
    std::vector<float> dx_cpu(shape.input_size(), 777.f), dx_ref(shape.input_size(), -777.f);
    pk::cpu::max_pool2d_backward(s, shape, dy.data(), i_cpu.data(), dx_cpu.data());
    pk::ref::max_pool2d_backward(s, shape, dy.data(), i_ref.data(), dx_ref.data());
    CHECK(relative_error(dx_cpu, dx_ref) < 1e-6);
  }
}

TEST_CASE("pool: cpu average pools match ref, outputs assigned") {
  pk::StreamHandle s;
  s.num_threads = 2;
  std::uint64_t seed = 100;
  for (const auto& shape : kShapes) {
    CAPTURE(shape.height);
    CAPTURE(shape.kernel);
    CAPTURE(shape.stride);
    CAPTURE(shape.padding);
    const auto x = random_values<float>(shape.input_size(), seed++);
    std::vector<float> y_cpu(shape.output_size(), 777.f), y_ref(shape.output_size(), -777.f);
    pk::cpu::avg_pool2d_forward(s, shape, x.data(), y_cpu.data());
    pk::ref::avg_pool2d_forward(s, shape, x.data(), y_ref.data());
    CHECK(relative_error(y_cpu, y_ref) < 1e-6);

    const auto dy = random_values<float>(shape.output_size(), seed++);
    std::vector<float> dx_cpu(shape.input_size(), 777.f), dx_ref(shape.input_size(), -777.f);
    pk::cpu::avg_pool2d_backward(s, shape, dy.data(), dx_cpu.data());
    pk::ref::avg_pool2d_backward(s, shape, dy.data(), dx_ref.data());
    CHECK(relative_error(dx_cpu, dx_ref) < 1e-6);

    const pk::GlobalPoolShape global{shape.batch, shape.channels, shape.height, shape.width};
    std::vector<float> g_cpu(global.output_size(), 777.f), g_ref(global.output_size(), -777.f);
    pk::cpu::global_avg_pool_forward(s, global, x.data(), g_cpu.data());
    pk::ref::global_avg_pool_forward(s, global, x.data(), g_ref.data());
    CHECK(relative_error(g_cpu, g_ref) < 1e-6);
    const auto dg = random_values<float>(global.output_size(), seed++);
    pk::cpu::global_avg_pool_backward(s, global, dg.data(), dx_cpu.data());
    pk::ref::global_avg_pool_backward(s, global, dg.data(), dx_ref.data());
    CHECK(relative_error(dx_cpu, dx_ref) < 1e-6);
  }
}

TEST_CASE("pool: ref backward matches finite differences") {
  pk::StreamHandle s;
  const std::vector<pk::Pool2dShape> shapes = {{1, 2, 5, 6, 3, 2, 1}, {2, 1, 4, 5, 2, 1, 1}};
  std::uint64_t seed = 300;
  for (const auto& shape : shapes) {
    CAPTURE(shape.kernel);
    CAPTURE(shape.stride);
    const auto g = random_values<double>(shape.output_size(), seed++);  // L = <g, y>

    {  // max pool
      const auto x = distinct_values<double>(shape.input_size(), seed++);
      std::vector<double> y(shape.output_size()), dx(shape.input_size());
      std::vector<std::int32_t> indices(shape.output_size());
      pk::ref::max_pool2d_forward(s, shape, x.data(), y.data(), indices.data());
      pk::ref::max_pool2d_backward(s, shape, g.data(), indices.data(), dx.data());
      check_vjp(
          [&](const auto& in) {
            std::vector<double> out(shape.output_size());
            pk::ref::max_pool2d_forward(s, shape, in[0].data(), out.data(), nullptr);
            return out;
          },
          {x}, g, {dx}, {"max pool"});
    }
    {  // average pool
      const auto x = random_values<double>(shape.input_size(), seed++);
      std::vector<double> dx(shape.input_size());
      pk::ref::avg_pool2d_backward(s, shape, g.data(), dx.data());
      check_vjp(
          [&](const auto& in) {
            std::vector<double> out(shape.output_size());
            pk::ref::avg_pool2d_forward(s, shape, in[0].data(), out.data());
            return out;
          },
          {x}, g, {dx}, {"average pool"});
    }
    {  // global average pool
      const pk::GlobalPoolShape global{shape.batch, shape.channels, shape.height, shape.width};
      const auto x = random_values<double>(global.input_size(), seed++);
      const auto gg = random_values<double>(global.output_size(), seed++);
      std::vector<double> dx(global.input_size());
      pk::ref::global_avg_pool_backward(s, global, gg.data(), dx.data());
      check_vjp(
          [&](const auto& in) {
            std::vector<double> out(global.output_size());
            pk::ref::global_avg_pool_forward(s, global, in[0].data(), out.data());
            return out;
          },
          {x}, gg, {dx}, {"global average pool"});
    }
  }
}
