// petra/rng.cpp: the host Philox generator: single draws, integers, permutations and bulk fills.
// The word layout (which counter block and word each value uses) is documented in petra/rng.hpp.
#include "petra/rng.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <utility>

#include "petra/error.hpp"

namespace petra {

namespace {

void check_range(const char* op, float lo, float hi) {
  PETRA_CHECK(lo < hi && std::isfinite(hi - lo), ValueError, "Philox::", op, ": needs lo < hi with a finite hi - lo, got lo = ", lo,
              ", hi = ", hi);
}

void check_std(const char* op, float mean, float std) {
  PETRA_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0.0f, ValueError, "Philox::", op,
              ": needs a finite mean and a finite std >= 0, got mean = ", mean, ", std = ", std);
}

}  // namespace

std::uint32_t Philox::next_u32() {
  const std::uint64_t index = offset_ / 4;
  if (!has_cached_block_ || cached_block_index_ != index) {
    cached_block_ = block(index);
    cached_block_index_ = index;
    has_cached_block_ = true;
  }
  return cached_block_.word[offset_++ % 4];
}

std::uint64_t Philox::next_u64() {
  const std::uint64_t low = next_u32();
  return low | (std::uint64_t{next_u32()} << 32);
}

float Philox::uniform(float lo, float hi) {
  check_range("uniform", lo, hi);
  return UniformFloat(lo, hi)(next_u32());
}

float Philox::normal(float mean, float std) {
  check_std("normal", mean, std);
  const std::uint32_t a = next_u32();
  const std::uint32_t b = next_u32();
  float z0 = 0.0f, z1 = 0.0f;
  box_muller(a, b, z0, z1);
  return fmaf(std, z0, mean);
}

std::int64_t Philox::randint(std::int64_t n) {
  PETRA_CHECK(n >= 1, ValueError, "Philox::randint: needs n >= 1, got ", n);
  const auto limit = static_cast<std::uint64_t>(n);
  // The smallest all-ones mask covering n - 1: a masked draw is uniform on [0, mask], and
  // mask < 2n, so a draw is accepted with probability > 1/2.
  const std::uint64_t mask = limit == 1 ? 0 : (~std::uint64_t{0} >> std::countl_zero(limit - 1));
  const bool needs_64_bits = mask > 0xFFFFFFFFu;
  while (true) {
    const std::uint64_t draw = (needs_64_bits ? next_u64() : next_u32()) & mask;
    if (draw < limit) return static_cast<std::int64_t>(draw);
  }
}

std::vector<std::int64_t> Philox::permutation(std::int64_t n) {
  PETRA_CHECK(n >= 0, ValueError, "Philox::permutation: needs n >= 0, got ", n);
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  // Fisher-Yates: position i takes a uniformly chosen element among those not yet placed.
  for (std::int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[randint(i + 1)]);
  return order;
}

void Philox::fill_uniform(float* out, std::size_t n, float lo, float hi) {
  check_range("fill_uniform", lo, hi);
  const std::uint64_t first_block = block_for_fill();
  const PhiloxKey key = philox_key(seed_);
  const UniformFloat to_range(lo, hi);
  const std::size_t full_blocks = n / 4;
  for (std::size_t b = 0; b < full_blocks; ++b) {
    const PhiloxCounter words = philox4x32_10(philox_counter(first_block + b, stream_), key);
    for (int w = 0; w < 4; ++w) out[4 * b + w] = to_range(words.word[w]);
  }
  if (n % 4 != 0) {
    const PhiloxCounter words = philox4x32_10(philox_counter(first_block + full_blocks, stream_), key);
    for (std::size_t i = 4 * full_blocks; i < n; ++i) out[i] = to_range(words.word[i % 4]);
  }
  offset_ = 4 * (first_block + (n + 3) / 4);
}

void Philox::fill_normal(float* out, std::size_t n, float mean, float std) {
  check_std("fill_normal", mean, std);
  const std::uint64_t first_block = block_for_fill();
  const PhiloxKey key = philox_key(seed_);
  const std::size_t blocks = (n + 3) / 4;
  for (std::size_t b = 0; b < blocks; ++b) {
    const PhiloxCounter words = philox4x32_10(philox_counter(first_block + b, stream_), key);
    float z[4];
    box_muller(words.word[0], words.word[1], z[0], z[1]);
    box_muller(words.word[2], words.word[3], z[2], z[3]);
    const std::size_t count = std::min<std::size_t>(4, n - 4 * b);
    for (std::size_t w = 0; w < count; ++w) out[4 * b + w] = fmaf(std, z[w], mean);
  }
  offset_ = 4 * (first_block + blocks);
}

}  // namespace petra
