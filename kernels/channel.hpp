// kernels/channel.hpp: copying a range of channels out of, or into, an NCHW tensor.
//
// `shape` is the full tensor (batch, channels, height, width); the range is channels
// [first_channel, first_channel + count), and the part tensor is (batch, count, height, width).
//   channel_split:  part = full[:, first_channel : first_channel + count]
//   channel_insert: full[:, first_channel : first_channel + count] = part  (other channels untouched)
//   channel_accumulate: full[:, first_channel : first_channel + count] += part  (the same)
// Splitting a tensor into pieces is one channel_split per piece; concatenating pieces is one
// channel_insert per piece, and the inserts together assign every channel of the result.
// Split and insert are memcpy per sample: count*height*width contiguous floats on each side. channel_accumulate
// is how autograd adds the gradient of a channel slice into its input's gradient without building
// the zero-padded full tensor (petra/autograd.cpp, "channel pieces").
#pragma once

#include <cstdint>

#include "petra/kernels/common.hpp"

namespace petra::kernels {

struct ChannelShape {
  std::int64_t batch = 0, channels = 0, height = 0, width = 0;  // the full tensor

  std::int64_t plane() const { return height * width; }
  std::int64_t size() const { return batch * channels * height * width; }
};

namespace ref {

// part = (assigned).
template <class T>
void channel_split(const StreamHandle& s, const ChannelShape& shape, const T* full,
                   std::int64_t first_channel, std::int64_t count, T* part);

// full's channel range = (assigned); the other channels of full are left as they are.
template <class T>
void channel_insert(const StreamHandle& s, const ChannelShape& shape, const T* part,
                    std::int64_t first_channel, std::int64_t count, T* full);

// full's channel range += part; the other channels of full are left as they are.
template <class T>
void channel_accumulate(const StreamHandle& s, const ChannelShape& shape, const T* part,
                        std::int64_t first_channel, std::int64_t count, T* full);

}  // namespace ref

namespace cpu {

void channel_split(const StreamHandle& s, const ChannelShape& shape, const float* full,
                   std::int64_t first_channel, std::int64_t count, float* part);
void channel_insert(const StreamHandle& s, const ChannelShape& shape, const float* part,
                    std::int64_t first_channel, std::int64_t count, float* full);
void channel_accumulate(const StreamHandle& s, const ChannelShape& shape, const float* part,
                        std::int64_t first_channel, std::int64_t count, float* full);

}  // namespace cpu

// Same contracts on the GPU (kernels/cuda/channel.cu): one grid-stride copy over batch * count *
// plane floats, by float4 when every row start and pointer allows; bit for bit ref's (the
// accumulation too: one float addition per element, as ref does).
namespace cuda {

void channel_split(const StreamHandle& s, const ChannelShape& shape, const float* full,
                   std::int64_t first_channel, std::int64_t count, float* part);
void channel_insert(const StreamHandle& s, const ChannelShape& shape, const float* part,
                    std::int64_t first_channel, std::int64_t count, float* full);
void channel_accumulate(const StreamHandle& s, const ChannelShape& shape, const float* part,
                        std::int64_t first_channel, std::int64_t count, float* full);

}  // namespace cuda

}  // namespace petra::kernels
