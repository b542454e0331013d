// kernels/reduce.hpp: sum and mean over chosen dimensions, and their backward (a broadcast).
//
// The "shape" of a reduction is the input's dims (contiguous, row-major, at most
// kMaxReduceDims) plus a bit mask: bit d set means dim d is reduced. The output keeps every dim,
// the reduced ones with size 1, so it is contiguous with dims[d] replaced by 1 where bit d is
// set. Examples for an NCHW tensor: mask 0b1101 gives the per-channel sums [1, C, 1, 1]; for a
// [batch, features] tensor, mask 0b01 gives the bias gradient [1, features].
//
// All outputs are assigned (=). Sums accumulate in double in both ref:: and cpu::, and cpu::
// adds in an order that does not depend on the thread count (same input, same bits). The mean of zero elements is NaN, as in
// PyTorch. Bits of the mask at or above dims.size() are ignored.
//
// cpu:: is fast for the common patterns: reducing the leading dims, the trailing dims, the N, H, W
// dims of NCHW (per channel), and everything.
#pragma once

#include <cstdint>
#include <span>

#include "petra/kernels/common.hpp"

namespace petra::kernels {

inline constexpr int kMaxReduceDims = 6;

// How many input elements fold into each output element (the product of the reduced dims).
inline std::int64_t reduced_count(std::span<const std::int64_t> dims, std::uint32_t reduce_mask) {
  std::int64_t count = 1;
  for (std::size_t d = 0; d < dims.size(); ++d)
    if (reduce_mask >> d & 1u) count *= dims[d];
  return count;
}

namespace ref {

// y = sum of x over the dims in reduce_mask
template <class T>
void reduce_sum(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                const T* x, T* y);
// y = mean of x over the dims in reduce_mask
template <class T>
void reduce_mean(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                 const T* x, T* y);
// dx = dy broadcast back over the reduced dims (the backward of reduce_sum). dims and mask are
// those of the forward: dy has the reduced shape, dx the full one.
template <class T>
void reduce_sum_backward(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                         const T* dy, T* dx);
// dx = dy / reduced_count broadcast back over the reduced dims (the backward of reduce_mean)
template <class T>
void reduce_mean_backward(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                          const T* dy, T* dx);

}  // namespace ref

// Same contracts as ref::, for float and double.
namespace cpu {

template <class T>
void reduce_sum(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                const T* x, T* y);
template <class T>
void reduce_mean(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                 const T* x, T* y);
template <class T>
void reduce_sum_backward(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                         const T* dy, T* dx);
template <class T>
void reduce_mean_backward(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                          const T* dy, T* dx);

}  // namespace cpu

// Same contracts, float, on the GPU (kernels/cuda/reduce.cu): a block per output adds its elements
// in double by a fixed tree (long sums with few outputs in fixed chunks, then a second pass over the
// chunks' partials), or a thread per output when the innermost dim is kept; no atomics, so the same
// input gives the same bits whatever the launch. The long sums with few outputs need
// s.workspace (device memory).
namespace cuda {

void reduce_sum(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                const float* x, float* y);
void reduce_mean(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                 const float* x, float* y);
void reduce_sum_backward(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                         const float* dy, float* dx);
void reduce_mean_backward(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                          const float* dy, float* dx);

}  // namespace cuda

}  // namespace petra::kernels
