// kernels/cpu/coupling.cpp: the additive coupling on the CPU (see kernels/coupling.hpp).
//
// Pure data movement: per sample, one stream is copied (memcpy) and the other is added to f.
// The tensor is walked in memory order, split into one contiguous range per thread
// (for_each_row_run, kernels/cpu/parallel.hpp), so a batch of 1 still uses every thread.
#include "petra/kernels/coupling.hpp"

#include <algorithm>
#include <cstring>

#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu {

namespace {

// The two streams of sample n of a 2C-channel tensor.
const float* first(const float* t, const CouplingShape& shape, std::int64_t n) {
  return t + 2 * n * shape.stream_size();
}
const float* second(const float* t, const CouplingShape& shape, std::int64_t n) {
  return t + (2 * n + 1) * shape.stream_size();
}
float* first(float* t, const CouplingShape& shape, std::int64_t n) {
  return t + 2 * n * shape.stream_size();
}
float* second(float* t, const CouplingShape& shape, std::int64_t n) {
  return t + (2 * n + 1) * shape.stream_size();
}

}  // namespace

void coupling_forward(const StreamHandle& s, const CouplingShape& shape, const float* x,
                      const float* f, float* y) {
  use_threads(s);
  // one stream's N * stream_size values, in one contiguous part per thread
  for_each_row_run(threads_with_share(s, shape.half_size()), shape.batch, shape.stream_size(),
                   [&](std::int64_t n, std::int64_t begin, std::int64_t end) {
    const float* x2 = second(x, shape, n);
    const float* fn = f + n * shape.stream_size();
    float* y1 = first(y, shape, n);
#pragma omp simd
    for (std::int64_t i = begin; i < end; ++i) y1[i] = x2[i] + fn[i];
    std::memcpy(second(y, shape, n) + begin, first(x, shape, n) + begin,
                sizeof(float) * (end - begin));
  });
}

void coupling_inverse(const StreamHandle& s, const CouplingShape& shape, const float* y,
                      const float* f, float* x) {
  use_threads(s);
  // one stream's N * stream_size values, in one contiguous part per thread
  for_each_row_run(threads_with_share(s, shape.half_size()), shape.batch, shape.stream_size(),
                   [&](std::int64_t n, std::int64_t begin, std::int64_t end) {
    std::memcpy(first(x, shape, n) + begin, second(y, shape, n) + begin,
                sizeof(float) * (end - begin));
    const float* y1 = first(y, shape, n);
    const float* fn = f + n * shape.stream_size();
    float* x2 = second(x, shape, n);
#pragma omp simd
    for (std::int64_t i = begin; i < end; ++i) x2[i] = y1[i] - fn[i];
  });
}

void coupling_backward(const StreamHandle& s, const CouplingShape& shape, const float* dy,
                       const float* g, float* dx) {
  if (g != nullptr) {
    coupling_forward(s, shape, dy, g, dx);  // dx1 = dy2 + g, dx2 = dy1: the forward's map
    return;
  }
  use_threads(s);  // g = 0: the streams swapped, two copies
  for_each_row_run(threads_with_share(s, shape.half_size()), shape.batch, shape.stream_size(),
                   [&](std::int64_t n, std::int64_t begin, std::int64_t end) {
    const auto bytes = sizeof(float) * (end - begin);
    std::memcpy(first(dx, shape, n) + begin, second(dy, shape, n) + begin, bytes);
    std::memcpy(second(dx, shape, n) + begin, first(dy, shape, n) + begin, bytes);
  });
}

}  // namespace petra::kernels::cpu
