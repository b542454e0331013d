// kernels/cpu/reduce.cpp: the fast reductions.
//
// First the dims are simplified (make_reduce_plan, kernels/reduce_plan.hpp, shared with
// kernels/cuda/reduce.cu): size-1 dims are dropped and neighbours of the same kind (both kept or
// both reduced) merged, so the groups left alternate, e.g. NCHW per channel becomes
// [N: reduced, C: kept, HW: reduced]. The innermost group decides the inner loop:
//   - reduced: each output element is a sum of contiguous runs of x (a dot-product-like loop);
//   - kept: an output row accumulates contiguous rows of x (an axpy-like loop).
// The outer groups become two flat loops: over the kept ones (which output element or row) and
// over the reduced ones (which run of x to add). Threads split the output, never one sum, so
// each output is added in the same order whatever the thread count; a reduction of everything
// to one value is kernels/cpu/parallel.hpp's deterministic_sum (fixed pieces, added in order).
#include <algorithm>
#include <array>

#include "petra/kernels/reduce.hpp"
#include "petra/kernels/reduce_plan.hpp"
#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu {
namespace {

constexpr std::int64_t kColumnBlock = 2048;              // output columns accumulated at once (16 KB of doubles)
constexpr std::int64_t kOutputBlock = 256;               // outputs accumulated at once when the inner dim is reduced
constexpr std::int64_t kBroadcastPiece = 16 * 1024;      // elements of dx written by one work item

// Sum of n contiguous values in double. 32 independent accumulators (four 8-wide vectors) keep
// the adds from waiting on each other, so the loop runs at memory speed; short runs skip them.
template <class T>
double sum_contiguous(const T* x, std::int64_t n) {
  constexpr int kLanes = 32;
  double total = 0;
  std::int64_t i = 0;
  if (n >= kLanes) {
    std::array<double, kLanes> lanes{};
    for (; i + kLanes <= n; i += kLanes)
      for (int j = 0; j < kLanes; ++j) lanes[j] += double(x[i + j]);
    for (double lane : lanes) total += lane;
  }
  for (; i < n; ++i) total += double(x[i]);
  return total;
}

// Everything reduced: fixed pieces summed in parallel, then added in order.
template <class T>
void sum_all(const StreamHandle& s, std::int64_t n, double scale, const T* x, T* y) {
  const double total = deterministic_sum(threads_above(s, n), n, [&](std::int64_t begin, std::int64_t count) {
    return sum_contiguous(x + begin, count);
  });
  y[0] = static_cast<T>(total * scale);
}

// Innermost group reduced: y[p] = scale * sum over q of the contiguous run at kept(p) + reduced(q).
// Work items are blocks of consecutive outputs; a block walks q in the outer loop, so it reads
// its runs of x for one q back to back (for NCHW per channel: one image's block of channels).
template <class T>
void sum_inner_runs(const StreamHandle& s, const ReducePlan& plan, std::int64_t n, double scale, const T* x, T* y) {
  const std::int64_t outputs = plan.kept.total(), runs = plan.reduced.total();
  const int threads = threads_above(s, n);
  const std::int64_t block = std::min(kOutputBlock, ceil_div(outputs, threads));
  parallel_for(threads, ceil_div(outputs, block), [&](std::int64_t item) {
    const std::int64_t first = item * block, count = std::min(block, outputs - first);
    std::array<double, kOutputBlock> acc{};
    for (std::int64_t q = 0; q < runs; ++q) {
      const T* xq = x + plan.reduced.offset_of(q);
      for (std::int64_t j = 0; j < count; ++j)
        acc[std::size_t(j)] += sum_contiguous(xq + plan.kept.offset_of(first + j), plan.inner);
    }
    for (std::int64_t j = 0; j < count; ++j) y[first + j] = static_cast<T>(acc[std::size_t(j)] * scale);
  });
}

// Innermost group kept: row p of y (length inner) = scale * sum over q of the row of x at
// kept(p) + reduced(q). Work items are blocks of at most kColumnBlock columns of one output row,
// narrower when there are fewer rows than threads.
template <class T>
void sum_outer_rows(const StreamHandle& s, const ReducePlan& plan, std::int64_t n, double scale, const T* x, T* y) {
  const std::int64_t rows = plan.kept.total(), terms = plan.reduced.total(), width = plan.inner;
  const int threads = threads_above(s, n);
  const std::int64_t block = std::min(kColumnBlock, ceil_div(ceil_div(width, ceil_div(threads, rows)), 16) * 16);
  const std::int64_t blocks_per_row = ceil_div(width, block);
  parallel_for(threads, rows * blocks_per_row, [&](std::int64_t item) {
    const std::int64_t p = item / blocks_per_row;
    const std::int64_t column = item % blocks_per_row * block;
    const std::int64_t columns = std::min(block, width - column);
    std::array<double, kColumnBlock> acc{};
    const T* xp = x + plan.kept.offset_of(p) + column;
    for (std::int64_t q = 0; q < terms; ++q) {
      const T* row = xp + plan.reduced.offset_of(q);
      for (std::int64_t j = 0; j < columns; ++j) acc[std::size_t(j)] += double(row[j]);
    }
    T* yp = y + p * width + column;
    for (std::int64_t j = 0; j < columns; ++j) yp[j] = static_cast<T>(acc[std::size_t(j)] * scale);
  });
}

template <class T>
void sum_and_scale(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                   double scale, const T* x, T* y) {
  std::int64_t n = 1;
  for (std::int64_t d : dims) n *= d;
  if (n == 0) {  // empty input: every output (if any) is an empty sum
    std::int64_t outputs = 1;
    for (std::size_t d = 0; d < dims.size(); ++d)
      if (!(reduce_mask >> d & 1u)) outputs *= dims[d];
    std::fill(y, y + outputs, static_cast<T>(0.0 * scale));
    return;
  }
  const ReducePlan plan = make_reduce_plan(dims, reduce_mask);
  if (plan.inner_reduced && plan.kept.count == 0 && plan.reduced.count == 0) {
    sum_all(s, n, scale, x, y);
  } else if (plan.inner_reduced) {
    sum_inner_runs(s, plan, n, scale, x, y);
  } else {
    sum_outer_rows(s, plan, n, scale, x, y);
  }
}

// dx at kept(p) + reduced(q) + [0, inner) = scale * (dy[p] if the inner group is reduced, else
// row p of dy). Work items are pieces of at most kBroadcastPiece elements of one such run.
template <class T>
void broadcast_and_scale(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                         double scale, const T* dy, T* dx) {
  std::int64_t n = 1;
  for (std::int64_t d : dims) n *= d;
  if (n == 0) return;
  const ReducePlan plan = make_reduce_plan(dims, reduce_mask);
  const std::int64_t runs = plan.reduced.total(), width = plan.inner;
  const std::int64_t pieces_per_run = ceil_div(width, kBroadcastPiece);
  const std::int64_t items = plan.kept.total() * runs * pieces_per_run;
  const T factor = static_cast<T>(scale);
  parallel_for(threads_above(s, n), items, [&](std::int64_t item) {
    const std::int64_t run = item / pieces_per_run;
    const std::int64_t p = run / runs, q = run % runs;
    const std::int64_t begin = item % pieces_per_run * kBroadcastPiece;
    const std::int64_t end = std::min(width, begin + kBroadcastPiece);
    T* out = dx + plan.kept.offset_of(p) + plan.reduced.offset_of(q);
    if (plan.inner_reduced) {
      const T value = dy[p] * factor;
      for (std::int64_t j = begin; j < end; ++j) out[j] = value;
    } else {
      const T* in = dy + p * width;
      for (std::int64_t j = begin; j < end; ++j) out[j] = in[j] * factor;
    }
  });
}

}  // namespace

template <class T>
void reduce_sum(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask, const T* x, T* y) {
  sum_and_scale(s, dims, reduce_mask, 1.0, x, y);
}

template <class T>
void reduce_mean(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask, const T* x, T* y) {
  sum_and_scale(s, dims, reduce_mask, 1.0 / double(reduced_count(dims, reduce_mask)), x, y);
}

template <class T>
void reduce_sum_backward(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                         const T* dy, T* dx) {
  broadcast_and_scale(s, dims, reduce_mask, 1.0, dy, dx);
}

template <class T>
void reduce_mean_backward(const StreamHandle& s, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                          const T* dy, T* dx) {
  broadcast_and_scale(s, dims, reduce_mask, 1.0 / double(reduced_count(dims, reduce_mask)), dy, dx);
}

#define PETRA_INSTANTIATE(T)                                                                                        \
  template void reduce_sum<T>(const StreamHandle&, std::span<const std::int64_t>, std::uint32_t, const T*, T*);          \
  template void reduce_mean<T>(const StreamHandle&, std::span<const std::int64_t>, std::uint32_t, const T*, T*);         \
  template void reduce_sum_backward<T>(const StreamHandle&, std::span<const std::int64_t>, std::uint32_t, const T*, T*); \
  template void reduce_mean_backward<T>(const StreamHandle&, std::span<const std::int64_t>, std::uint32_t, const T*, T*);
PETRA_INSTANTIATE(float)
PETRA_INSTANTIATE(double)
#undef PETRA_INSTANTIATE

}  // namespace petra::kernels::cpu
