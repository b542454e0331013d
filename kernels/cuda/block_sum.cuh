// kernels/cuda/block_sum.cuh: the deterministic sum of one double per thread over a block of
// cuda_detail::kBlockThreads (256) threads (internal, not installed). Used by reduce.cu (its row
// sums) and conv2d.cu (the bias gradient).
//
// A fixed tree: each warp adds its 32 values by shuffles (offsets 16, 8, 4, 2, 1), lane 0 writes
// the warp's sum to shared memory, then warp 0 adds the 8 warp sums the same way. The order of the
// additions depends only on the block size, never on the grid or on scheduling, so the same values
// give the same bits on every run.
#pragma once

#include "petra/kernels/cuda/launch.cuh"

namespace petra::cuda_detail {

// The sum of every thread's `value` over the block (kBlockThreads threads, blockDim.x), by the
// fixed tree above; the result is valid in thread 0. Every thread of the block must call it.
__device__ inline double block_sum(double value) {
  constexpr int kWarps = kBlockThreads / 32;
  __shared__ double warp_sums[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_down_sync(0xffffffffu, value, offset);
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  double total = 0;
  if (warp == 0) {
    total = lane < kWarps ? warp_sums[lane] : 0.0;
    for (int offset = 16; offset > 0; offset /= 2) total += __shfl_down_sync(0xffffffffu, total, offset);
  }
  __syncthreads();  // warp_sums is free again for the caller's next call
  return total;
}

// Blocks of a block-per-item kernel: one per item, at most grid_stride_block_cap() (8192, plenty
// of waves; the emulation lowers it so that the blocks go round their loop).
inline unsigned capped_blocks(std::int64_t items) {
  return unsigned(std::clamp<std::int64_t>(items, 1, std::int64_t(grid_stride_block_cap())));
}

}  // namespace petra::cuda_detail
