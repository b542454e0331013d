// petra/rng.hpp: petra's random numbers: the counter-based generator Philox 4x32-10.
//
// Philox (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3") is a keyed bijection
// of a 128-bit counter: block = philox4x32_10(counter, key) gives four 32-bit words, and any block
// can be computed without computing the ones before it. That is what makes it parallel: a CUDA
// thread computes its own elements from its index, and gets exactly the words the CPU gets. The
// constants are those of Random123, cuRAND and PyTorch's CUDA generator.
//
// How a generator maps onto counters (the layout cuRAND's curand_init(seed, subsequence, offset)
// uses for its Philox4_32_10 state, so the raw 32-bit words should equal curand()'s; not yet
// checked on a GPU):
//   key     = (seed bits 0..31, seed bits 32..63)
//   counter = (block bits 0..31, block bits 32..63, stream bits 0..31, stream bits 32..63)
//   word w of the stream (w = 0, 1, 2, ...) is word w % 4 of block w / 4.
// A generator's position is its `offset`, the index of the next word it will use.
//
// Bulk fills start at a block boundary (the offset is first rounded up to a multiple of 4), so a
// fill of n elements from block b0 = ceil(offset / 4) is defined element by element:
//   fill_uniform: element i = UniformFloat(lo, hi)(word i % 4 of block b0 + i / 4)
//   fill_normal:  elements 4k..4k+3 come from block b0 + k: box_muller(words 0, 1) gives z for
//                 4k and 4k+1, box_muller(words 2, 3) for 4k+2 and 4k+3; element = fmaf(std, z, mean)
// and the offset then moves to the start of the block after the last one used. A CUDA kernel that
// is told b0 (see Philox::block_for_fill) gets the same uniforms bit for bit (integer math and one
// correctly rounded fmaf); its normals can differ by a few ulps, because logf/cosf/sinf are not
// correctly rounded on either side.
#pragma once

#include <cstddef>
#include <cstdint>
#include <math.h>  // logf, sqrtf, cosf, sinf, fmaf, nextafterf: the same global names on host and device
#include <vector>

#include "petra/kernels/host_device.hpp"

namespace petra {

// ---- The Philox 4x32-10 bijection: plain functions shared by host and device ----

struct PhiloxCounter {
  std::uint32_t word[4];
};
struct PhiloxKey {
  std::uint32_t word[2];
};

inline constexpr std::uint32_t kPhiloxMultiplier0 = 0xD2511F53u;
inline constexpr std::uint32_t kPhiloxMultiplier1 = 0xCD9E8D57u;
inline constexpr std::uint32_t kPhiloxWeyl0 = 0x9E3779B9u;  // golden ratio
inline constexpr std::uint32_t kPhiloxWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

// One Philox round: two 32x32 -> 64-bit multiplications, whose high halves are mixed with the
// other two words and the key.
PETRA_HOST_DEVICE constexpr PhiloxCounter philox_round(PhiloxCounter c, PhiloxKey k) {
  const std::uint64_t product0 = std::uint64_t{kPhiloxMultiplier0} * c.word[0];
  const std::uint64_t product1 = std::uint64_t{kPhiloxMultiplier1} * c.word[2];
  const auto hi0 = static_cast<std::uint32_t>(product0 >> 32), lo0 = static_cast<std::uint32_t>(product0);
  const auto hi1 = static_cast<std::uint32_t>(product1 >> 32), lo1 = static_cast<std::uint32_t>(product1);
  return PhiloxCounter{{hi1 ^ c.word[1] ^ k.word[0], lo1, hi0 ^ c.word[3] ^ k.word[1], lo0}};
}

// Ten rounds; the key is bumped by the Weyl constants between rounds.
PETRA_HOST_DEVICE constexpr PhiloxCounter philox4x32_10(PhiloxCounter c, PhiloxKey k) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k.word[0] += kPhiloxWeyl0;
      k.word[1] += kPhiloxWeyl1;
    }
    c = philox_round(c, k);
  }
  return c;
}

PETRA_HOST_DEVICE constexpr PhiloxKey philox_key(std::uint64_t seed) {
  return PhiloxKey{{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
}

PETRA_HOST_DEVICE constexpr PhiloxCounter philox_counter(std::uint64_t block, std::uint64_t stream) {
  return PhiloxCounter{{static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
                        static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)}};
}

// The top 24 bits of u as a float in [0, 1): every value is exact, 1 is never reached.
PETRA_HOST_DEVICE constexpr float unit_float(std::uint32_t u) {
  return static_cast<float>(u >> 8) * (1.0f / 16777216.0f);
}

// unit_float(u) scaled to [lo, hi), as fmaf(hi - lo, unit_float(u), lo): the explicit fma rounds
// once on host and device alike (nvcc contracts a * b + c into an fma on its own, g++ in ISO mode
// does not). That rounding can land on hi when |lo| is much larger than hi - lo, so the result is
// capped at the largest float below hi. Built once per fill, applied per word.
struct UniformFloat {
  float lo, span, below_hi;
  PETRA_HOST_DEVICE UniformFloat(float lo_, float hi_) : lo(lo_), span(hi_ - lo_), below_hi(nextafterf(hi_, lo_)) {}
  PETRA_HOST_DEVICE float operator()(std::uint32_t u) const {
    const float x = fmaf(span, unit_float(u), lo);
    return x < below_hi ? x : below_hi;
  }
};

// Box-Muller: two independent uniforms give two independent standard normals,
//   r = sqrt(-2 ln u1), z0 = r cos(2 pi u2), z1 = r sin(2 pi u2).
// u1 is taken in (0, 1] (one 2^-24 step above unit_float) so that ln u1 is finite; |z| <= 5.77.
PETRA_HOST_DEVICE inline void box_muller(std::uint32_t a, std::uint32_t b, float& z0, float& z1) {
  const float u1 = static_cast<float>((a >> 8) + 1) * (1.0f / 16777216.0f);
  const float angle = 6.28318530717958647692f * unit_float(b);
  const float r = sqrtf(-2.0f * logf(u1));
  z0 = r * cosf(angle);
  z1 = r * sinf(angle);
}

// ---- The host generator ----

class Philox {
 public:
  // Different seeds give unrelated generators; different streams of one seed give disjoint
  // sequences (a stream is the upper 64 bits of the counter), e.g. one stream per worker.
  explicit Philox(std::uint64_t seed, std::uint64_t stream = 0) : seed_(seed), stream_(stream) {}

  std::uint64_t seed() const { return seed_; }
  std::uint64_t stream() const { return stream_; }

  // Skip-ahead: the position is the index of the next 32-bit word; any position is O(1) away.
  std::uint64_t offset() const { return offset_; }
  void set_offset(std::uint64_t word_offset) { offset_ = word_offset; }
  void skip(std::uint64_t words) { offset_ += words; }

  // The four words of counter block `block` of this generator's stream (stateless).
  PhiloxCounter block(std::uint64_t block) const {
    return philox4x32_10(philox_counter(block, stream_), philox_key(seed_));
  }
  // The block a fill would start at now (what a CUDA kernel needs to reproduce that fill).
  std::uint64_t block_for_fill() const { return (offset_ + 3) / 4; }

  // ---- One value at a time (each consumes words at the current offset) ----
  std::uint32_t next_u32();
  std::uint64_t next_u64();                       // two words, the first is the low half
  float uniform() { return unit_float(next_u32()); }  // [0, 1), 24 random bits
  float uniform(float lo, float hi);              // [lo, hi); needs lo < hi, hi - lo finite
  float normal(float mean = 0.0f, float std = 1.0f);  // Box-Muller on two words (uses z0 only)
  // Uniform integer in [0, n), n >= 1, without modulo bias (bit-mask rejection: draw
  // ceil(log2 n) bits, retry when the draw is >= n; fewer than two tries on average).
  std::int64_t randint(std::int64_t n);
  // A uniformly random permutation of 0..n-1 (Fisher-Yates), e.g. to shuffle a data set.
  std::vector<std::int64_t> permutation(std::int64_t n);

  // ---- Bulk fills (see the file comment for exactly which words element i uses) ----
  void fill_uniform(float* out, std::size_t n, float lo = 0.0f, float hi = 1.0f);
  void fill_normal(float* out, std::size_t n, float mean = 0.0f, float std = 1.0f);

 private:
  std::uint64_t seed_;
  std::uint64_t stream_;
  std::uint64_t offset_ = 0;
  // The last block computed by next_u32, so sequential draws cost one block per four words.
  bool has_cached_block_ = false;
  std::uint64_t cached_block_index_ = 0;
  PhiloxCounter cached_block_{};
};

}  // namespace petra
