// tests/cpu/test_channel.cpp: channel split and insert: a hand-worked example, cpu:: against
// ref::, split-then-insert round trips, what insert leaves alone, and the gradient of split.
#include <doctest/doctest.h>

#include <numeric>
#include <vector>

#include "petra/kernels/channel.hpp"
#include "tests/support/testing.hpp"

namespace pk = petra::kernels;
using petra::testing::check_gradient;
using petra::testing::random_values;

namespace {

struct Case {
  pk::ChannelShape shape;
  std::int64_t first, count;
};

// Odd sizes, batch 1, whole-tensor and one-channel ranges, and big ones (threaded path).
const std::vector<Case> kCases = {
    {{1, 3, 5, 7}, 1, 2},    {{2, 1, 1, 1}, 0, 1},     {{3, 6, 4, 4}, 0, 3},
    {{3, 6, 4, 4}, 3, 3},    {{5, 7, 3, 9}, 2, 4},     {{4, 64, 16, 16}, 32, 32},
    {{1, 64, 32, 32}, 0, 32}, {{8, 9, 15, 15}, 8, 1}};

}  // namespace

TEST_CASE("channel: hand-worked example") {
  const pk::ChannelShape shape{2, 3, 1, 2};
  std::vector<float> full(12);
  std::iota(full.begin(), full.end(), 0.f);
  std::vector<float> part(8, 777.f);
  pk::StreamHandle s;
  pk::cpu::channel_split(s, shape, full.data(), 1, 2, part.data());
  CHECK(part == std::vector<float>{2, 3, 4, 5, 8, 9, 10, 11});
  std::vector<float> target(12, -1.f);
  pk::cpu::channel_insert(s, shape, part.data(), 1, 2, target.data());
  CHECK(target == std::vector<float>{-1, -1, 2, 3, 4, 5, -1, -1, 8, 9, 10, 11});
}

// Inside the range, full == expected_inside(background value, part value); outside, untouched.
template <class Inside>
void check_range(const pk::ChannelShape& shape, std::int64_t first, std::int64_t count, const std::vector<float>& full,
                 const std::vector<float>& background, const std::vector<float>& part, Inside expected_inside) {
  bool inside_ok = true, outside_ok = true;
  for (std::int64_t n = 0; n < shape.batch; ++n)
    for (std::int64_t c = 0; c < shape.channels; ++c)
      for (std::int64_t i = 0; i < shape.plane(); ++i) {
        const std::int64_t k = (n * shape.channels + c) * shape.plane() + i;
        if (c >= first && c < first + count)
          inside_ok &= full[k] == expected_inside(background[k], part[(n * count + c - first) * shape.plane() + i]);
        else
          outside_ok &= full[k] == background[k];
      }
  CHECK(inside_ok);
  CHECK(outside_ok);
}

TEST_CASE("channel: cpu matches ref; split assigns, insert assigns only its range, accumulate adds only into it") {
  pk::StreamHandle s;
  s.num_threads = 2;
  std::uint64_t seed = 1;
  for (const auto& [shape, first, count] : kCases) {
    CAPTURE(shape.batch);
    CAPTURE(shape.channels);
    CAPTURE(first);
    CAPTURE(count);
    const std::int64_t part_size = shape.batch * count * shape.plane();
    const auto full = random_values<float>(shape.size(), seed++);
    std::vector<float> part_cpu(part_size, 777.f), part_ref(part_size, -777.f);
    pk::cpu::channel_split(s, shape, full.data(), first, count, part_cpu.data());
    pk::ref::channel_split(s, shape, full.data(), first, count, part_ref.data());
    CHECK(part_cpu == part_ref);

    const auto part = random_values<float>(part_size, seed++);
    const auto background = random_values<float>(shape.size(), seed++);
    std::vector<float> full_cpu = background, full_ref = background;
    pk::cpu::channel_insert(s, shape, part.data(), first, count, full_cpu.data());
    pk::ref::channel_insert(s, shape, part.data(), first, count, full_ref.data());
    CHECK(full_cpu == full_ref);
    check_range(shape, first, count, full_cpu, background, part, [](float, float p) { return p; });

    std::vector<float> sum_cpu = background, sum_ref = background;
    pk::cpu::channel_accumulate(s, shape, part.data(), first, count, sum_cpu.data());
    pk::ref::channel_accumulate(s, shape, part.data(), first, count, sum_ref.data());
    CHECK(sum_cpu == sum_ref);
    check_range(shape, first, count, sum_cpu, background, part, [](float b, float p) { return b + p; });
  }
}

TEST_CASE("channel: split into uneven pieces, then insert them back, gives the tensor back") {
  pk::StreamHandle s;
  s.num_threads = 2;
  const pk::ChannelShape shape{3, 10, 7, 5};
  const auto full = random_values<float>(shape.size(), 77);
  std::vector<float> rebuilt(shape.size(), 777.f);
  const std::int64_t bounds[] = {0, 3, 4, 10};  // pieces of 3, 1 and 6 channels
  for (int piece = 0; piece < 3; ++piece) {
    const std::int64_t first = bounds[piece], count = bounds[piece + 1] - bounds[piece];
    std::vector<float> part(shape.batch * count * shape.plane());
    pk::cpu::channel_split(s, shape, full.data(), first, count, part.data());
    pk::cpu::channel_insert(s, shape, part.data(), first, count, rebuilt.data());
  }
  CHECK(rebuilt == full);
}

TEST_CASE("channel: the gradient of split is insert into zeros (finite differences)") {
  const pk::ChannelShape shape{2, 5, 2, 3};
  const std::int64_t first = 1, count = 3, part_size = shape.batch * count * shape.plane();
  const auto x = random_values<double>(shape.size(), 5);
  const auto g = random_values<double>(part_size, 6);  // L = <g, split(x)>
  pk::StreamHandle s;
  auto loss = [&](const std::vector<double>& v) {
    std::vector<double> part(part_size);
    pk::ref::channel_split(s, shape, v.data(), first, count, part.data());
    return std::inner_product(g.begin(), g.end(), part.begin(), 0.0);
  };
  std::vector<double> dx(shape.size(), 0.0);
  pk::ref::channel_insert(s, shape, g.data(), first, count, dx.data());
  const auto r = check_gradient(loss, x, dx);
  CHECK_MESSAGE(r.ok, r.worst);
}
