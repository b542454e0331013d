// tests/cpu/test_fast_divide.cpp: kernels/cuda/fast_divide.cuh on the host, against / and %: every
// divisor up to 4096 with the dividends around each multiple of it that matters (0, d - 1, d, d + 1,
// the largest below 2^31), powers of two and their neighbours up to 2^31 - 1, random pairs, and
// dividends past 2^31 (the plain-division path); ChannelOf, ChannelWalk, walk_channel and channel_slices against
// their definitions. Runs in every build (the header needs no CUDA).
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "petra/kernels/cuda/fast_divide.cuh"

namespace {

using petra::kernels::cuda::ChannelOf;
using petra::kernels::cuda::ChannelWalk;
using petra::kernels::cuda::FastDivide;

constexpr std::int64_t kLimit = (std::int64_t(1) << 31) - 1;  // the largest fast dividend

std::vector<std::int64_t> dividends_for(std::int64_t d) {
  std::vector<std::int64_t> n{0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, kLimit, kLimit - 1, kLimit - d};
  const std::int64_t top = kLimit / d * d;  // the largest multiple of d that is a fast dividend
  for (std::int64_t v : {top - 1, top, top + 1}) n.push_back(v);
  return n;
}

}  // namespace

TEST_CASE("fast divide: quotient equals / for small divisors, power-of-two neighbours and the largest ones") {
  std::vector<std::int64_t> divisors;
  for (std::int64_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int b = 1; b <= 31; ++b) {
    const std::int64_t p = std::int64_t(1) << b;
    for (std::int64_t d : {p - 1, p, p + 1})
      if (d >= 1 && d <= kLimit) divisors.push_back(d);
  }
  std::size_t checked = 0;
  for (const std::int64_t d : divisors) {
    const FastDivide fast(d);
    REQUIRE(fast.divisor() == d);
    for (const std::int64_t n : dividends_for(d)) {
      if (n < 0 || n > kLimit) continue;
      INFO("n = ", n, ", d = ", d);
      REQUIRE(fast.quotient(n) == n / d);
      ++checked;
    }
  }
  MESSAGE(checked, " quotients checked");
}

TEST_CASE("fast divide: random divisors and dividends, and dividends past 2^31") {
  std::mt19937_64 random(7);
  for (int trial = 0; trial < 200000; ++trial) {
    const std::int64_t d = std::int64_t(random() % std::uint64_t(kLimit)) + 1;
    const std::int64_t n = std::int64_t(random() % std::uint64_t(kLimit + 1));
    REQUIRE(FastDivide(d).quotient(n) == n / d);
  }
  for (const std::int64_t n : {std::int64_t(1) << 31, (std::int64_t(1) << 40) + 12345, std::int64_t(1) << 62})
    for (const std::int64_t d : {std::int64_t(1), std::int64_t(3), std::int64_t(1024), kLimit})
      REQUIRE(FastDivide(d).quotient(n) == n / d);
}

TEST_CASE("fast divide: ChannelOf is (k / plane) % channels") {
  for (const std::int64_t plane : {1, 3, 16, 64, 1024, 3136})
    for (const std::int64_t channels : {1, 2, 3, 64, 513}) {
      const ChannelOf channel_of(plane, channels);
      for (std::int64_t k = 0; k < 5 * plane * channels; k += 1 + k / 7) REQUIRE(channel_of(k) == k / plane % channels);
      const std::int64_t big = (std::int64_t(1) << 33) + 77;
      REQUIRE(channel_of(big) == big / plane % channels);
    }
}

TEST_CASE("fast divide: ChannelWalk visits a channel's values j = start, start + step, ... at their tensor offsets") {
  struct Case {
    std::int64_t batch, channels, plane, start, step;
  };
  // steps below, equal to and above the plane (the walk then skips whole samples), plane 1
  for (const Case k : {Case{3, 4, 7, 2, 5}, Case{5, 2, 7, 0, 7}, Case{6, 3, 5, 4, 13}, Case{4, 1, 1, 0, 3},
                       Case{2, 5, 300, 255, 256}}) {
    for (std::int64_t c = 0; c < k.channels; ++c) {
      CAPTURE(k.plane);
      CAPTURE(k.step);
      CAPTURE(c);
      ChannelWalk walk(FastDivide(k.plane), k.channels, c, k.start, k.step);
      for (std::int64_t j = k.start; j < k.batch * k.plane; j += k.step, walk.advance()) {
        const std::int64_t n = j / k.plane, i = j % k.plane;
        REQUIRE(walk.offset() == (n * k.channels + c) * k.plane + i);
      }
    }
  }
}

TEST_CASE("fast divide: walk_channel loads in batches and adds in the one-at-a-time walk's order") {
  using petra::kernels::cuda::walk_channel;
  const std::int64_t batch = 5, channels = 3, plane = 7, c = 1;
  for (const std::int64_t start : {0, 2, 6})
    for (const std::int64_t step : {1, 3, 8, 40}) {
      CAPTURE(start);
      CAPTURE(step);
      std::vector<std::int64_t> expected;  // the plain walk's offsets
      ChannelWalk plain(FastDivide(plane), channels, c, start, step);
      for (std::int64_t j = start; j < batch * plane; j += step, plain.advance()) expected.push_back(plain.offset());
      std::vector<std::int64_t> batch1, batch4;
      walk_channel<1>(ChannelWalk(FastDivide(plane), channels, c, start, step), start, step, batch * plane,
                      [](std::int64_t k) { return k; }, [&](std::int64_t k) { batch1.push_back(k); });
      // Every load of a batch before any of its additions: the loads run ahead by up to 4.
      std::int64_t loaded = 0;
      walk_channel<4>(
          ChannelWalk(FastDivide(plane), channels, c, start, step), start, step, batch * plane,
          [&](std::int64_t k) { return ++loaded, k; },
          [&](std::int64_t k) {
            REQUIRE(loaded - std::int64_t(batch4.size()) >= 1);
            REQUIRE(loaded - std::int64_t(batch4.size()) <= 4);
            batch4.push_back(k);
          });
      CHECK(batch1 == expected);
      CHECK(batch4 == expected);
      CHECK(loaded == std::int64_t(expected.size()));
    }
}

TEST_CASE("fast divide: channel_slices gives about 8192 values per slice, 1 to 32 slices") {
  using petra::kernels::cuda::channel_slices;
  CHECK(channel_slices(0) == 1);
  CHECK(channel_slices(1) == 1);
  CHECK(channel_slices(8192) == 1);
  CHECK(channel_slices(8193) == 2);
  CHECK(channel_slices(12000) == 2);
  CHECK(channel_slices(128 * 16) == 1);     // (128, 512, 4, 4)
  CHECK(channel_slices(128 * 64) == 1);     // (128, 256, 8, 8)
  CHECK(channel_slices(128 * 1024) == 16);  // (128, 64, 32, 32)
  CHECK(channel_slices(std::int64_t(1) << 40) == 32);
}
