// kernels/cuda/channel.cu: the cuda:: channel_split, channel_insert and channel_accumulate of
// kernels/channel.hpp.
//
// All three are a strided walk (a copy, or an addition into the full tensor): per sample, count * plane contiguous floats on each side, at sample
// strides of count * plane (the part) and channels * plane (the full tensor). One grid-stride
// kernel covers all batch * count * plane items, so small planes and small batches still fill the
// GPU (a cudaMemcpy2DAsync per call would also do, but would not run on the emulation and does
// one row per sample). Consecutive threads copy consecutive floats: coalesced on both sides. When
// count * plane and channels * plane (every row start) are multiples of 4 floats and the pointers
// are 16-byte aligned, a thread moves a float4 instead, as kernels/cuda/coupling.cu does: a quarter
// of the instructions for the same bytes. Copies, and one float addition per element: the result
// is bit for bit ref's.
#include <cstdint>

#include "petra/kernels/channel.hpp"
#include "petra/kernels/cuda/fast_divide.cuh"
#include "petra/kernels/cuda/launch.cuh"

namespace petra::kernels::cuda {
namespace {

using cuda_detail::aligned_16;

enum class Direction { kSplit, kInsert, kAccumulate };

__device__ inline void add_to(float& to, float from) { to += from; }
__device__ inline void add_to(float4& to, float4 from) {
  to.x += from.x;
  to.y += from.y;
  to.z += from.z;
  to.w += from.w;
}

// For every sample n and index i < row (all counted in V): the part's row of sample n starts at
// n * row, the full tensor's at n * full_stride + offset.
template <Direction direction, class V>
__global__ void channel_copy(std::int64_t batch, FastDivide row, std::int64_t full_stride,
                             std::int64_t offset, const V* from, V* to) {
  const std::int64_t items = batch * row.divisor();
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t k = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < items; k += stride) {
    const std::int64_t n = row.quotient(k), i = k - n * row.divisor();  // multiply and shift, no division
    const std::int64_t full_index = n * full_stride + offset + i;
    if constexpr (direction == Direction::kSplit) to[k] = from[full_index];
    else if constexpr (direction == Direction::kInsert) to[full_index] = from[k];
    else add_to(to[full_index], from[k]);
  }
}

template <Direction direction>
void launch_copy(const char* name, const StreamHandle& s, const ChannelShape& shape,
                 std::int64_t first_channel, std::int64_t count, const float* from, float* to) {
  const std::int64_t plane = shape.plane();
  const std::int64_t row = count * plane, full_stride = shape.channels * plane;
  const std::int64_t offset = first_channel * plane;
  if (row % 4 == 0 && full_stride % 4 == 0 && offset % 4 == 0 && aligned_16(from) && aligned_16(to)) {
    cuda_detail::launch_grid_stride(name, s, shape.batch * row / 4, channel_copy<direction, float4>,
                                    shape.batch, FastDivide(row / 4), full_stride / 4, offset / 4,
                                    reinterpret_cast<const float4*>(from), reinterpret_cast<float4*>(to));
  } else {
    cuda_detail::launch_grid_stride(name, s, shape.batch * row, channel_copy<direction, float>,
                                    shape.batch, FastDivide(row), full_stride, offset, from, to);
  }
}

}  // namespace

void channel_split(const StreamHandle& s, const ChannelShape& shape, const float* full,
                   std::int64_t first_channel, std::int64_t count, float* part) {
  launch_copy<Direction::kSplit>("channel_split", s, shape, first_channel, count, full, part);
}

void channel_insert(const StreamHandle& s, const ChannelShape& shape, const float* part,
                    std::int64_t first_channel, std::int64_t count, float* full) {
  launch_copy<Direction::kInsert>("channel_insert", s, shape, first_channel, count, part, full);
}

void channel_accumulate(const StreamHandle& s, const ChannelShape& shape, const float* part,
                        std::int64_t first_channel, std::int64_t count, float* full) {
  launch_copy<Direction::kAccumulate>("channel_accumulate", s, shape, first_channel, count, part, full);
}

}  // namespace petra::kernels::cuda
