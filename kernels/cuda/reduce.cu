// kernels/cuda/reduce.cu: the cuda:: reductions of kernels/reduce.hpp (sum and mean over a mask of
// dims, and their backward, a broadcast).
//
// The dims are first simplified as kernels/cpu/reduce.cpp does, by the same make_reduce_plan
// (kernels/reduce_plan.hpp): size-1 dims dropped, neighbours of the same kind merged, so what is
// left alternates kept / reduced groups. The innermost group
// chooses the kernel:
//   - inner reduced (a per-row sum, per-channel sums of NCHW, everything): each output is the sum
//     of R = runs * inner elements, read as contiguous runs. A block of 256 threads owns one
//     output at a time: each thread adds, in double, the elements t, t + 256, ... of it
//     (consecutive threads read consecutive floats: coalesced), then the block adds its 256
//     partials by a fixed tree (warp shuffles, then the 8 warp sums in shared memory). When there
//     are few outputs and long sums (fewer than kSplitOutputs outputs, R > kChunk) one block per
//     output would leave most of the GPU idle, so each sum is cut into fixed chunks of kChunk
//     elements: a first pass writes one double partial per (output, chunk) to the stream's
//     scratch, a second pass adds each output's partials by the same tree.
//   - inner kept (the bias gradient of [batch, features], sums over the batch): one thread per
//     output, adding its R elements in order in double; consecutive threads take consecutive
//     columns, so each step of the loop is a coalesced row read.
// Determinism: the chunking depends on the shape only, a block's partition of a sum on the block
// size only (fixed, 256), never on the grid, and every addition order is fixed, so the same input
// gives the same bits whatever the grid (the grid-stride cap changes only which block does which
// output). No atomics. Sums are in double, as in ref:: and cpu::, and rounded to float once
// (after the division for the mean); the mean of zero elements is 0/0 = NaN, as in ref::.
//
// The backward is a grid-stride broadcast: dx[i] = dy[index of i's output] / divisor, the index
// computed from i through the simplified groups (at most three divisions for NCHW per channel).
#include <algorithm>
#include <cstdint>

#include "petra/kernels/cuda/block_reduce.cuh"
#include "petra/kernels/cuda/fast_divide.cuh"
#include "petra/kernels/cuda/launch.cuh"
#include "petra/kernels/reduce.hpp"
#include "petra/kernels/reduce_plan.hpp"

namespace petra::kernels::cuda {
namespace {

using cuda_detail::block_stride_blocks;
using cuda_detail::block_sum;
using cuda_detail::kBlockThreads;
using cuda_detail::launch_blocks;
using cuda_detail::launch_grid_stride;

constexpr std::int64_t kChunk = 16 * 1024;     // elements per partial sum of the split path
constexpr std::int64_t kSplitOutputs = 1024;   // fewer outputs than this: split long sums
constexpr std::int64_t kMaxChunks = 1024;      // partials per output at most


// The sum, in double, of elements [begin, end) of output p's R elements (inner reduced), this
// thread taking every kBlockThreads-th.
__device__ inline double thread_part(const ReducePlan& plan, std::int64_t p, std::int64_t begin,
                                     std::int64_t end, const float* x) {
  const float* xp = x + plan.kept.offset_of(p);
  double sum = 0;
  for (std::int64_t e = begin + threadIdx.x; e < end; e += kBlockThreads) {
    const std::int64_t run = e / plan.inner, i = e - run * plan.inner;
    sum += double(xp[plan.reduced.offset_of(run) + i]);
  }
  return sum;
}

// Inner reduced, one block per output (block-stride over outputs): y[p] = sum / divisor.
__global__ void __launch_bounds__(kBlockThreads)
    sum_rows(ReducePlan plan, std::int64_t outputs, double divisor, const float* x, float* y) {
  const std::int64_t count = plan.per_output();
  for (std::int64_t p = blockIdx.x; p < outputs; p += gridDim.x) {
    const double total = block_sum(thread_part(plan, p, 0, count, x));
    if (threadIdx.x == 0) y[p] = float(total / divisor);
  }
}

// Split path, first pass: partial[p * chunks + c] = sum of chunk c of output p.
// (chunks is a FastDivide: a 64-bit division in this loop made ptxas spill 8 bytes.)
__global__ void __launch_bounds__(kBlockThreads)
    sum_chunks(ReducePlan plan, std::int64_t outputs, FastDivide chunks, std::int64_t chunk,
               const float* x, double* partial) {
  const std::int64_t count = plan.per_output();
  for (std::int64_t k = blockIdx.x; k < outputs * chunks.divisor(); k += gridDim.x) {
    const std::int64_t p = chunks.quotient(k), c = k - p * chunks.divisor();
    const std::int64_t begin = c * chunk, end = begin + chunk < count ? begin + chunk : count;
    const double total = block_sum(thread_part(plan, p, begin, end, x));
    if (threadIdx.x == 0) partial[k] = total;
  }
}

// Split path, second pass: y[p] = (sum of output p's partials) / divisor.
__global__ void __launch_bounds__(kBlockThreads)
    sum_partials(std::int64_t outputs, std::int64_t chunks, double divisor, const double* partial,
                 float* y) {
  for (std::int64_t p = blockIdx.x; p < outputs; p += gridDim.x) {
    double sum = 0;
    for (std::int64_t c = threadIdx.x; c < chunks; c += kBlockThreads) sum += partial[p * chunks + c];
    const double total = block_sum(sum);
    if (threadIdx.x == 0) y[p] = float(total / divisor);
  }
}

// Inner kept: y[p] = (sum over q of x[kept(p / inner) + reduced(q) + p % inner]) / divisor, one
// thread per output, q in order.
__global__ void sum_columns(ReducePlan plan, std::int64_t outputs, double divisor, const float* x,
                            float* y) {
  const std::int64_t runs = plan.reduced.total();
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t p = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < outputs;
       p += stride) {
    const std::int64_t row = p / plan.inner, column = p - row * plan.inner;
    const float* xp = x + plan.kept.offset_of(row) + column;
    double sum = 0;
    for (std::int64_t q = 0; q < runs; ++q) sum += double(xp[plan.reduced.offset_of(q)]);
    y[p] = float(sum / divisor);
  }
}

// dx[i] = dy[output of i] / divisor over the n elements of x.
__global__ void broadcast(ReducePlan plan, std::int64_t n, double divisor, const float* dy, float* dx) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    // i = (outer index) * inner + j; the outer index walks the kept and reduced groups, which
    // interleave, so decompose it over both lists by their strides (largest first).
    const std::int64_t j = i % plan.inner;
    std::int64_t rest = i - j;
    std::int64_t kept_flat = 0;
    // kept groups' strides in x are decreasing; peel each one off `rest` in that order, the
    // reduced groups in between contributing nothing to the output index.
    int k = 0, r = 0;
    while (k < plan.kept.count || r < plan.reduced.count) {
      const bool take_kept = r >= plan.reduced.count ||
                             (k < plan.kept.count && plan.kept.stride[k] > plan.reduced.stride[r]);
      if (take_kept) {
        const std::int64_t coordinate = rest / plan.kept.stride[k];
        rest -= coordinate * plan.kept.stride[k];
        kept_flat = kept_flat * plan.kept.size[k] + coordinate;
        ++k;
      } else {
        rest -= rest / plan.reduced.stride[r] * plan.reduced.stride[r];
        ++r;
      }
    }
    const std::int64_t out = plan.inner_reduced ? kept_flat : kept_flat * plan.inner + j;
    dx[i] = float(double(dy[out]) / divisor);
  }
}

std::int64_t element_count(std::span<const std::int64_t> dims) {
  std::int64_t n = 1;
  for (const std::int64_t d : dims) n *= d;
  return n;
}

void sum_and_divide(const char* name, const StreamHandle& s, std::span<const std::int64_t> dims,
                    std::uint32_t reduce_mask, double divisor, const float* x, float* y) {
  const ReducePlan plan = make_reduce_plan(dims, reduce_mask);
  const std::int64_t outputs = plan.outputs(), count = plan.per_output();
  if (outputs <= 0) return;
  if (!plan.inner_reduced) {
    launch_grid_stride(name, s, outputs, sum_columns, plan, outputs, divisor, x, y);
    return;
  }
  const std::int64_t chunk = std::max(kChunk, (count + kMaxChunks - 1) / kMaxChunks);
  const std::int64_t chunks = (count + chunk - 1) / chunk;
  if (outputs < kSplitOutputs && chunks > 1) {
    auto* partial = static_cast<double*>(s.scratch(std::size_t(outputs * chunks) * sizeof(double)));
    launch_blocks(name, s, block_stride_blocks(outputs * chunks), kBlockThreads, sum_chunks, plan,
                  outputs, FastDivide(chunks), chunk, x, partial);
    launch_blocks(name, s, block_stride_blocks(outputs), kBlockThreads, sum_partials, outputs,
                  chunks, divisor, partial, y);
  } else {
    launch_blocks(name, s, block_stride_blocks(outputs), kBlockThreads, sum_rows, plan, outputs,
                  divisor, x, y);
  }
}

void broadcast_and_divide(const char* name, const StreamHandle& s,
                          std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                          double divisor, const float* dy, float* dx) {
  const std::int64_t n = element_count(dims);
  launch_grid_stride(name, s, n, broadcast, make_reduce_plan(dims, reduce_mask), n, divisor, dy, dx);
}

}  // namespace

void reduce_sum(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                const float* x, float* y) {
  sum_and_divide("reduce_sum", s, dims, reduce_mask, 1.0, x, y);
}

void reduce_mean(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                 const float* x, float* y) {
  sum_and_divide("reduce_mean", s, dims, reduce_mask, double(reduced_count(dims, reduce_mask)), x, y);
}

void reduce_sum_backward(const StreamHandle& s, std::span<const std::int64_t> dims,
                         std::uint32_t reduce_mask, const float* dy, float* dx) {
  broadcast_and_divide("reduce_sum_backward", s, dims, reduce_mask, 1.0, dy, dx);
}

void reduce_mean_backward(const StreamHandle& s, std::span<const std::int64_t> dims,
                          std::uint32_t reduce_mask, const float* dy, float* dx) {
  broadcast_and_divide("reduce_mean_backward", s, dims, reduce_mask,
                       double(reduced_count(dims, reduce_mask)), dy, dx);
}

}  // namespace petra::kernels::cuda
