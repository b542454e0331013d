// tests/cpu/test_coupling.cpp: the additive coupling: a hand-worked example, cpu:: against
// ref::, inverse(forward(x)) == x, the backward against finite differences, and the "=" contract.
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "petra/kernels/coupling.hpp"
#include "tests/support/testing.hpp"

namespace pk = petra::kernels;
using petra::testing::check_gradient;
using petra::testing::random_values;
using petra::testing::relative_error;

namespace {

// Odd sizes, batch 1 (also big enough for the threaded path, which then splits one sample).
const std::vector<pk::CouplingShape> kShapes = {
    {1, 3, 5, 7}, {2, 1, 1, 1}, {3, 5, 4, 4}, {5, 7, 3, 9}, {4, 16, 16, 16}, {1, 64, 32, 32}};

// Stream k (0 or 1) of a 2C-channel tensor, as one vector.
template <class T>
std::vector<T> stream(const std::vector<T>& t, const pk::CouplingShape& shape, int k) {
  std::vector<T> out;
  for (std::int64_t n = 0; n < shape.batch; ++n) {
    const auto start = t.begin() + (2 * n + k) * shape.stream_size();
    out.insert(out.end(), start, start + shape.stream_size());
  }
  return out;
}

}  // namespace

TEST_CASE("coupling: hand-worked example") {
  // Two samples, C = 1 channel of 1x2 pixels: x = [x1 | x2] per sample.
  const pk::CouplingShape shape{2, 1, 1, 2};
  const std::vector<float> x = {1, 2, 10, 20, /* sample 1 */ 3, 4, 30, 40};
  const std::vector<float> f = {0.5f, 0.25f, -1, -2};
  std::vector<float> y(8, 777.f), back(8, 777.f);
  pk::StreamHandle s;
  pk::cpu::coupling_forward(s, shape, x.data(), f.data(), y.data());
  CHECK(y == std::vector<float>{10.5f, 20.25f, 1, 2, 29, 38, 3, 4});
  pk::cpu::coupling_inverse(s, shape, y.data(), f.data(), back.data());
  CHECK(back == x);
  // backward: dx1 = dy2 + g, dx2 = dy1.
  const std::vector<float> dy = {1, 2, 3, 4, 5, 6, 7, 8}, g = {10, 20, 30, 40};
  std::vector<float> dx(8, 777.f);
  pk::cpu::coupling_backward(s, shape, dy.data(), g.data(), dx.data());
  CHECK(dx == std::vector<float>{13, 24, 1, 2, 37, 48, 5, 6});
}

TEST_CASE("coupling: cpu matches ref, outputs assigned, inverse undoes forward") {
  pk::StreamHandle s;
  s.num_threads = 2;
  std::uint64_t seed = 1;
  for (const auto& shape : kShapes) {
    CAPTURE(shape.batch);
    CAPTURE(shape.channels);
    CAPTURE(shape.height);
    CAPTURE(shape.width);
    const std::int64_t full = 2 * shape.half_size();
    const auto x = random_values<float>(full, seed++);
    const auto f = random_values<float>(shape.half_size(), seed++);

    std::vector<float> y_cpu(full, 777.f), y_ref(full, -777.f);
    pk::cpu::coupling_forward(s, shape, x.data(), f.data(), y_cpu.data());
    pk::ref::coupling_forward(s, shape, x.data(), f.data(), y_ref.data());
    CHECK(y_cpu == y_ref);  // the same float operations: bit for bit

    std::vector<float> x_cpu(full, 777.f), x_ref(full, -777.f);
    pk::cpu::coupling_inverse(s, shape, y_cpu.data(), f.data(), x_cpu.data());
    pk::ref::coupling_inverse(s, shape, y_ref.data(), f.data(), x_ref.data());
    CHECK(x_cpu == x_ref);
    CHECK(stream(x_cpu, shape, 0) == stream(x, shape, 0));  // the first stream: exact
    CHECK(relative_error(stream(x_cpu, shape, 1), stream(x, shape, 1)) < 1e-6);

    const auto dy = random_values<float>(full, seed++);
    const auto g = random_values<float>(shape.half_size(), seed++);
    std::vector<float> dx_cpu(full, 777.f), dx_ref(full, -777.f);
    pk::cpu::coupling_backward(s, shape, dy.data(), g.data(), dx_cpu.data());
    pk::ref::coupling_backward(s, shape, dy.data(), g.data(), dx_ref.data());
    CHECK(dx_cpu == dx_ref);
    CHECK(stream(dx_cpu, shape, 1) == stream(dy, shape, 0));  // dx2 = dy1

    // g null (zero): the streams swapped, exactly, in both backends.
    std::vector<float> swap_cpu(full, 777.f), swap_ref(full, -777.f);
    pk::cpu::coupling_backward(s, shape, dy.data(), nullptr, swap_cpu.data());
    pk::ref::coupling_backward<float>(s, shape, dy.data(), nullptr, swap_ref.data());
    CHECK(swap_cpu == swap_ref);
    CHECK(stream(swap_cpu, shape, 0) == stream(dy, shape, 1));
    CHECK(stream(swap_cpu, shape, 1) == stream(dy, shape, 0));
  }
}

TEST_CASE("coupling: a null g swaps the streams, negative zeros kept") {
  const pk::CouplingShape shape{2, 1, 1, 2};  // streams of 2 values, 2 samples
  const std::vector<float> dy = {1, -0.0f, 3, 4, 5, 6, -0.0f, 8};
  std::vector<float> dx(8, 777.f);
  pk::StreamHandle s;
  pk::cpu::coupling_backward(s, shape, dy.data(), nullptr, dx.data());
  CHECK(dx == std::vector<float>{3, 4, 1, -0.0f, -0.0f, 8, 5, 6});
  CHECK(std::signbit(dx[3]));
  CHECK(std::signbit(dx[4]));
}

TEST_CASE("coupling: ref backward matches finite differences through F = tanh") {
  // L(x) = <w, coupling_forward(x, tanh(x1))>: the backward gets g = w1 * (1 - tanh(x1)^2).
  const pk::CouplingShape shape{2, 3, 2, 3};
  const std::int64_t full = 2 * shape.half_size();
  const auto x0 = random_values<double>(full, 40);
  const auto w = random_values<double>(full, 41);
  pk::StreamHandle s;

  auto F = [&](const std::vector<double>& x) {
    auto f = stream(x, shape, 0);
    for (auto& v : f) v = std::tanh(v);
    return f;
  };
  auto loss = [&](const std::vector<double>& x) {
    std::vector<double> y(full);
    pk::ref::coupling_forward(s, shape, x.data(), F(x).data(), y.data());
    return std::inner_product(w.begin(), w.end(), y.begin(), 0.0);
  };

  auto g = stream(w, shape, 0);  // dy1 = w1, times F'(x1)
  const auto f0 = F(x0);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] *= 1 - f0[i] * f0[i];
  std::vector<double> dx(full);
  pk::ref::coupling_backward(s, shape, w.data(), g.data(), dx.data());
  const auto r = check_gradient(loss, x0, dx);
  CHECK_MESSAGE(r.ok, r.worst);
}
