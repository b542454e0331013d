// kernels/cpu/parallel.hpp: how the CPU kernels split work over threads (internal, not installed).
//
// Every kernels/cpu file that runs on more than one thread does it through this header:
//   threads_above(s, work)            the stream's threads for large work, else 1
//   threads_with_share(s, work, m)    as many of the stream's threads as get m items each
//   share(total, part, parts)         where part `part` of `parts` equal parts of [0, total) starts
//   parallel_for(threads, n, f)       f(i) for i in [0, n), statically split over the threads
//   for_each_range(threads, n, f)     f(begin, end): one contiguous range of [0, n) per thread
//   for_each_row_run(parts, r, l, f)  f(row, begin, end): the same over r rows of l items
//   run_threads(s, f)                 f(thread, threads) once on each of the stream's threads
//   run_parts(parts, f), sync_parts() f(part, parts) on `parts` threads at once, with barriers
//   deterministic_sum(threads, n, f)  a sum over [0, n) whose bits do not depend on the threads
// Static splitting keeps each thread's share, and so any per-thread partial sums, the same from
// run to run: results are deterministic for a given thread count, and deterministic_sum's for
// any thread count.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

#include "petra/kernels/common.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace petra::kernels::cpu {

// Items of work (elements, values) below which waking threads costs more than it saves.
inline constexpr std::int64_t kParallelThreshold = 64 * 1024;

// The least work (values) worth giving one more thread, for kernels that split memory-bound work
// in proportion to its size: smaller parts cost more in threads than they save.
inline constexpr std::int64_t kMinValuesPerThread = 1 << 14;

constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The stream's thread count (at least 1) when work >= threshold, else 1.
inline int threads_above(const StreamHandle& s, std::int64_t work,
                         std::int64_t threshold = kParallelThreshold) {
  return work >= threshold ? std::max(1, s.num_threads) : 1;
}

// The stream's thread count, reduced so that each thread gets at least min_share items of the
// work (and at least 1).
inline int threads_with_share(const StreamHandle& s, std::int64_t work,
                              std::int64_t min_share = kMinValuesPerThread) {
  return int(std::min<std::int64_t>(std::max(s.num_threads, 1),
                                    std::max<std::int64_t>(1, work / min_share)));
}

// Part `part` of [0, total) cut into `parts` near-equal contiguous parts is
// [share(total, part, parts), share(total, part + 1, parts)).
constexpr std::int64_t share(std::int64_t total, std::int64_t part, std::int64_t parts) {
  return total * part / parts;
}

// Calls body(i) for i in [0, count), split statically over `threads` OpenMP threads (in order on
// the calling thread when threads is 1 or OpenMP is off).
template <class Body>
void parallel_for(int threads, std::int64_t count, Body body) {
#ifdef _OPENMP
  if (threads > 1) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (std::int64_t i = 0; i < count; ++i) body(i);
    return;
  }
#endif
  (void)threads;
  for (std::int64_t i = 0; i < count; ++i) body(i);
}

// Calls body(begin, end) on [0, n): in one piece when threads is 1, else in one contiguous piece
// per thread, whose ends are rounded to 16 elements so that two threads never write the same
// 64-byte cache line (of floats).
template <class Body>
void for_each_range(int threads, std::int64_t n, Body body) {
  if (threads == 1) {
    body(std::int64_t{0}, n);
    return;
  }
  auto start = [&](int t) {  // of piece t
    const std::int64_t at = (n / threads * t + 15) / 16 * 16;
    return t == threads ? n : std::min(n, at);
  };
  parallel_for(threads, threads, [&](std::int64_t t) { body(start(int(t)), start(int(t) + 1)); });
}

// For a table of `rows` rows of `row_length` items walked in memory order: cuts [0, rows *
// row_length) into `parts` contiguous parts of near-equal size, one per thread, and calls
// piece(row, begin, end) for each run [begin, end) of one row inside a part. A part may start or
// end inside a row, so even a single row is split over every thread.
template <class Piece>
void for_each_row_run(int parts, std::int64_t rows, std::int64_t row_length, Piece&& piece) {
  const std::int64_t total = rows * row_length;
  parallel_for(parts, parts, [&](std::int64_t p) {
    const std::int64_t begin = share(total, p, parts), end = share(total, p + 1, parts);
    for (std::int64_t at = begin; at < end;) {
      const std::int64_t row = at / row_length, i = at % row_length;
      const std::int64_t length = std::min(row_length - i, end - at);
      piece(row, i, i + length);
      at += length;
    }
  });
}

// Runs body(thread, thread_count) once on each of s.num_threads OpenMP threads (inline, as
// body(0, 1), when that is 1), after use_threads(s): a product Eigen runs inside body is
// single-threaded, so each thread can run its own. Split the work with share(..., thread,
// thread_count).
template <class Body>
void run_threads(const StreamHandle& s, Body&& body) {
  use_threads(s);
#ifdef _OPENMP
  if (s.num_threads > 1) {
#pragma omp parallel num_threads(s.num_threads)
    body(omp_get_thread_num(), omp_get_num_threads());
    return;
  }
#endif
  body(0, 1);
}

// Runs body(part, parts) once on each of `parts` OpenMP threads at the same time (inline, as
// body(0, 1), when parts is 1), so that body may call sync_parts() between the phases of its
// work. `parts` in body is the number of threads actually started: split the work by it.
template <class Body>
void run_parts(int parts, Body&& body) {
#ifdef _OPENMP
  if (parts > 1) {
#pragma omp parallel num_threads(parts)
    body(omp_get_thread_num(), omp_get_num_threads());
    return;
  }
#endif
  (void)parts;
  body(0, 1);
}

// Inside run_parts' body: waits until every part has reached this point (nothing when it runs
// inline).
inline void sync_parts() {
#ifdef _OPENMP
#pragma omp barrier
#endif
}

// The sum over [0, n) of piece_sum(begin, count), a double, for fixed pieces [begin, begin +
// count) of at least kParallelThreshold items (at most 256 pieces): the pieces are summed on
// `threads` threads, then added in order. The pieces depend on n only, so the result has the same
// bits whatever the thread count.
template <class PieceSum>
double deterministic_sum(int threads, std::int64_t n, PieceSum piece_sum) {
  constexpr std::int64_t kMaxPieces = 256;
  const std::int64_t piece = std::max<std::int64_t>(kParallelThreshold, ceil_div(n, kMaxPieces));
  const std::int64_t pieces = ceil_div(n, piece);
  std::array<double, kMaxPieces> partial{};
  parallel_for(threads, pieces, [&](std::int64_t k) {
    const std::int64_t begin = k * piece;
    partial[std::size_t(k)] = piece_sum(begin, std::min(piece, n - begin));
  });
  double total = 0;
  for (std::int64_t k = 0; k < pieces; ++k) total += partial[std::size_t(k)];
  return total;
}

}  // namespace petra::kernels::cpu
