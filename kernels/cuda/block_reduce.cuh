// kernels/cuda/block_reduce.cuh: the fixed-shape trees that combine the values of a block's
// threads (internal, not installed). Used by batchnorm.cu, optim.cu, loss.cu (block_tree),
// reduce.cu, conv2d.cu (block_sum) and batchnorm.cu, conv2d.cu, pool.cu (warp_strided_sum).
//
//   warp_sum(value)              the sum of one double per lane over a warp: shuffles down by
//                                offsets 16, 8, 4, 2, 1; valid in lane 0
//   warp_strided_sum(v, n, s)    the sum of v[0], v[s], ..., v[(n - 1) s] by one warp, in double:
//                                lane l adds items l, l + 32, ... in order, then warp_sum; valid in
//                                lane 0 (a warp per channel or per plane: batch norm's and the
//                                bias gradient's partials, global average pooling)
//   block_sum(value)             the sum of one double per thread over a block of kBlockThreads
//                                (256): each warp's warp_sum, lane 0 writes it to shared memory,
//                                then warp 0 adds the 8 warp sums the same way; valid in thread 0
//   block_tree(combine)          combine(i, j) folds slot j into slot i, for the pairs of a fixed
//                                binary tree over blockDim.x slots; the result ends in slot 0
//   block_tree_sum(a, b, ...)    the same adding shared arrays element-wise: totals in a[0], b[0]
//
// Each thread writes its own slot of the shared arrays (slot threadIdx.x), then every thread of
// the block calls the function (it has __syncthreads inside, so none may skip it). The tree
// folds slot t + half into slot t for half = blockDim.x / 2, / 4, ..., 1: its shape depends only
// on the block size, never on the scheduling, so the result is the same bits on every run. That
// is why petra's reductions use it and not floating-point atomics, whose order of arrival (and
// so the rounding) changes from run to run. blockDim.x must be a power of two.
//
// A barrier comes before the first step (the callers' writes to their slots are then visible)
// and after the last (slot 0 may be read by any thread, and the arrays rewritten by the next
// call).
#pragma once

#include <cstdint>

#include "petra/kernels/cuda/launch.cuh"

namespace petra::cuda_detail {

// Every lane of the warp must call it. Lane 0 ends with the warp's total, added by a fixed tree
// (the other lanes hold partial sums).
__device__ inline double warp_sum(double value) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_down_sync(0xffffffffu, value, offset);
  return value;
}

// Every lane of the warp must call it.
template <class T>
__device__ inline double warp_strided_sum(const T* values, std::int64_t count, std::int64_t stride) {
  double part = 0;
  for (std::int64_t i = threadIdx.x % 32; i < count; i += 32) part += double(values[i * stride]);
  return warp_sum(part);
}

// Every thread of the block must call it; blockDim.x must be kBlockThreads.
__device__ inline double block_sum(double value) {
  constexpr int kWarps = kBlockThreads / 32;
  __shared__ double warp_sums[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  value = warp_sum(value);
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  double total = 0;
  if (warp == 0) total = warp_sum(lane < kWarps ? warp_sums[lane] : 0.0);
  __syncthreads();  // warp_sums is free again for the caller's next call
  return total;
}

template <class Combine>
__device__ inline void block_tree(Combine combine) {
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    __syncthreads();
    if (threadIdx.x < half) combine(threadIdx.x, threadIdx.x + half);
  }
  __syncthreads();
}

template <class... T>
__device__ inline void block_tree_sum(T*... arrays) {
  block_tree([=](unsigned into, unsigned from) { ((arrays[into] += arrays[from]), ...); });
}

}  // namespace petra::cuda_detail
