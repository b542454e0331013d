// kernels/cuda/fast_divide.cuh: division by a divisor fixed for a whole launch (a plane's size, a
// channel count) as a multiply and a shift (internal, not installed). An element-wise kernel over
// an NCHW tensor needs the channel of each value, c = (k / plane) % channels: two divisions per
// value, which a GPU does in a long subroutine (about 20 instructions in 32 bits, several times more
// in 64), so that a kernel moving 8 bytes per value becomes bound by integer work (batch norm ran at
// a quarter of the copy bandwidth on an H200 with them). FastDivide precomputes the divisor's
// magic number on the host, once per launch.
//
// The method (Granlund and Montgomery, "Division by invariant integers using multiplication",
// 1994, theorem 4.2, with N = 31): for 1 <= d < 2^31, l = ceil(log2 d) and m = ceil(2^(31 + l) / d)
// (at most 2^32), floor(n / d) = (n * m) >> (31 + l) for every 0 <= n < 2^31; the product fits in
// 64 bits. Dividends of 2^31 and more take the plain division (tensors that large are rare, and the
// branch is the same for a whole warp in practice). tests/cpu/test_fast_divide.cpp checks it
// against / on edge cases and random values.
#pragma once
#include <algorithm>
#include <cstdint>

#include "petra/kernels/host_device.hpp"

namespace petra::kernels::cuda {

class FastDivide {
 public:
  FastDivide() = default;
  // divisor in [1, 2^31) (a shape's extent always is). 0 is accepted for an empty launch's
  // arguments (a kernel over no values divides by nothing).
  explicit FastDivide(std::int64_t divisor) : divisor_(divisor) {
    if (divisor < 1) return;
    unsigned l = 0;
    while ((std::int64_t(1) << l) < divisor) ++l;
    shift_ = 31 + l;
    magic_ = ((std::uint64_t(1) << shift_) + std::uint64_t(divisor) - 1) / std::uint64_t(divisor);
  }
  PETRA_HOST_DEVICE std::int64_t divisor() const { return divisor_; }
  // n / divisor for n >= 0.
  PETRA_HOST_DEVICE std::int64_t quotient(std::int64_t n) const {
    if ((n >> 31) != 0) return n / divisor_;
    return std::int64_t((std::uint64_t(n) * magic_) >> shift_);
  }

 private:
  std::int64_t divisor_ = 1;
  std::uint64_t magic_ = std::uint64_t(1) << 31;
  unsigned shift_ = 31;
};

// The channel of value k of an NCHW tensor: (k / plane) % channels, with two FastDivides.
struct ChannelOf {
  FastDivide plane, channels;
  ChannelOf() = default;
  ChannelOf(std::int64_t plane_size, std::int64_t channel_count) : plane(plane_size), channels(channel_count) {}
  PETRA_HOST_DEVICE std::int64_t operator()(std::int64_t k) const {
    const std::int64_t row = plane.quotient(k);  // n * channels + c
    return row - channels.quotient(row) * channels.divisor();
  }
};

// One channel's values of an (N, channels, plane) tensor, walked by a reduction's thread: the
// channel's j-th value (j = n * plane + i, j < N * plane) is at tensor offset
// (n * channels + c) * plane + i. A thread visits j = start, start + step, ...; (n, i) advance by
// the step without a division per value. Batch norm's sums and the convolution's bias gradient
// walk their channels so.
struct ChannelWalk {
  std::int64_t channels, c, size, step_n, step_i, n, i;

  PETRA_HOST_DEVICE ChannelWalk(const FastDivide& plane, std::int64_t channel_count, std::int64_t channel,
                                std::int64_t start, std::int64_t step)
      : channels(channel_count), c(channel), size(plane.divisor()) {
    step_n = plane.quotient(step);
    step_i = step - step_n * size;
    n = plane.quotient(start);
    i = start - n * size;
  }
  PETRA_HOST_DEVICE std::int64_t offset() const { return (n * channels + c) * size + i; }
  PETRA_HOST_DEVICE void advance() {
    i += step_i;
    n += step_n;
    if (i >= size) {
      i -= size;
      ++n;
    }
  }
};

// A thread's part of a channel reduction: ChannelWalk's values from j = start (step apart, below
// count), read kBatch at a time: load(offset) for up to kBatch offsets, then add(item) for each in
// the same order. The additions are the one-at-a-time walk's, in its order (the same bits), but
// kBatch loads are in flight per thread instead of one: a reduction moves no bytes but the loads,
// and with one 16-byte load per thread a multiprocessor had too few bytes in flight to approach
// the memory's bandwidth (docs/gpu-kernels.md, "Bytes in flight").
template <int kBatch, class Load, class Add>
PETRA_HOST_DEVICE void walk_channel(ChannelWalk walk, std::int64_t start, std::int64_t step, std::int64_t count,
                                    Load load, Add add) {
  using Item = decltype(load(std::int64_t(0)));
  for (std::int64_t j = start; j < count; j += kBatch * step) {
    Item items[kBatch]{};
    for (int u = 0; u < kBatch; ++u)
      if (j + u * step < count) {
        items[u] = load(walk.offset());
        walk.advance();
      }
    for (int u = 0; u < kBatch; ++u)
      if (j + u * step < count) add(items[u]);
  }
}

// How many blocks share one channel's sum (each then adds about kChannelValuesPerSlice values, 32
// per thread of a 256-thread block: 8 float4s, two batches of 4 in flight), from the channel's
// value count alone, so that the order of the additions never depends on the device: enough
// blocks to fill a GPU when the channels are few (64 channels of (128, 64, 32, 32): 1024 blocks,
// one wave on an H200), at most kMaxChannelSlices partial sums per channel (one warp adds them).
// 2048 values a slice and 64 slices before 2026-12-04: blocks of 8 values per thread spent more
// time starting, reducing and ending than reading.
inline constexpr std::int64_t kChannelValuesPerSlice = 32 * 256;
inline constexpr std::int64_t kMaxChannelSlices = 32;
inline std::int64_t channel_slices(std::int64_t values_per_channel) {
  return std::clamp<std::int64_t>((values_per_channel + kChannelValuesPerSlice - 1) / kChannelValuesPerSlice, 1,
                                  kMaxChannelSlices);
}

}  // namespace petra::kernels::cuda
