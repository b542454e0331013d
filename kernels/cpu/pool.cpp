// kernels/cpu/pool.cpp: pooling on the CPU (see kernels/pool.hpp).
//
// Every (sample, channel) plane is independent, so the planes are split over the stream's
// threads; inside a plane the loops run over windows clipped to the input once, instead of
// testing every tap against the borders. Pooling is a small part of a ResNet step, so the
// code stays plain.
#include "petra/kernels/pool.hpp"

#include <algorithm>
#include <cmath>

#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu {

namespace {

// Below this many input values the threads cost more than they save.
constexpr std::int64_t kPoolParallelThreshold = 1 << 15;

// Rows [h0, h1) and columns [w0, w1) of the input that window (i, j) covers.
struct Window {
  std::int64_t h0, h1, w0, w1;
};

Window window_at(const Pool2dShape& shape, std::int64_t i, std::int64_t j) {
  const std::int64_t top = i * shape.stride - shape.padding;
  const std::int64_t left = j * shape.stride - shape.padding;
  return {std::max<std::int64_t>(top, 0), std::min(top + shape.kernel, shape.height),
          std::max<std::int64_t>(left, 0), std::min(left + shape.kernel, shape.width)};
}

}  // namespace

void max_pool2d_forward(const StreamHandle& s, const Pool2dShape& shape, const float* x, float* y,
                        std::int32_t* indices) {
  use_threads(s);
  const std::int64_t oh = shape.out_height(), ow = shape.out_width();
  const std::int64_t in_plane = shape.height * shape.width;
  parallel_for(threads_above(s, shape.input_size(), kPoolParallelThreshold), shape.batch * shape.channels,
               [&](std::int64_t plane) {
    const float* in = x + plane * in_plane;
    for (std::int64_t i = 0; i < oh; ++i)
      for (std::int64_t j = 0; j < ow; ++j) {
        const Window win = window_at(shape, i, j);
        float best = -INFINITY;
        std::int64_t best_at = win.h0 * shape.width + win.w0;
        for (std::int64_t h = win.h0; h < win.h1; ++h)
          for (std::int64_t w = win.w0; w < win.w1; ++w) {
            const float v = in[h * shape.width + w];
            if (v > best || std::isnan(v)) {
              best = v;
              best_at = h * shape.width + w;
            }
          }
        const std::int64_t o = (plane * oh + i) * ow + j;
        y[o] = best;
        if (indices) indices[o] = std::int32_t(best_at);
      }
  });
}

void max_pool2d_backward(const StreamHandle& s, const Pool2dShape& shape, const float* dy,
                         const std::int32_t* indices, float* dx) {
  use_threads(s);
  const std::int64_t in_plane = shape.height * shape.width;
  const std::int64_t out_plane = shape.out_height() * shape.out_width();
  parallel_for(threads_above(s, shape.input_size(), kPoolParallelThreshold), shape.batch * shape.channels,
               [&](std::int64_t plane) {
    float* grad = dx + plane * in_plane;
    std::fill(grad, grad + in_plane, 0.f);
    for (std::int64_t o = 0; o < out_plane; ++o)
      grad[indices[plane * out_plane + o]] += dy[plane * out_plane + o];
  });
}

void avg_pool2d_forward(const StreamHandle& s, const Pool2dShape& shape, const float* x, float* y) {
  use_threads(s);
  const std::int64_t oh = shape.out_height(), ow = shape.out_width();
  const std::int64_t in_plane = shape.height * shape.width;
  const float inv_area = 1.f / float(shape.kernel * shape.kernel);
  parallel_for(threads_above(s, shape.input_size(), kPoolParallelThreshold), shape.batch * shape.channels,
               [&](std::int64_t plane) {
    const float* in = x + plane * in_plane;
    for (std::int64_t i = 0; i < oh; ++i)
      for (std::int64_t j = 0; j < ow; ++j) {
        const Window win = window_at(shape, i, j);
        float sum = 0;
        for (std::int64_t h = win.h0; h < win.h1; ++h)
          for (std::int64_t w = win.w0; w < win.w1; ++w) sum += in[h * shape.width + w];
        y[(plane * oh + i) * ow + j] = sum * inv_area;
      }
  });
}

void avg_pool2d_backward(const StreamHandle& s, const Pool2dShape& shape, const float* dy, float* dx) {
  use_threads(s);
  const std::int64_t oh = shape.out_height(), ow = shape.out_width();
  const std::int64_t in_plane = shape.height * shape.width;
  const float inv_area = 1.f / float(shape.kernel * shape.kernel);
  parallel_for(threads_above(s, shape.input_size(), kPoolParallelThreshold), shape.batch * shape.channels,
               [&](std::int64_t plane) {
    float* grad = dx + plane * in_plane;
    std::fill(grad, grad + in_plane, 0.f);
    for (std::int64_t i = 0; i < oh; ++i)
      for (std::int64_t j = 0; j < ow; ++j) {
        const Window win = window_at(shape, i, j);
        const float share = dy[(plane * oh + i) * ow + j] * inv_area;
        for (std::int64_t h = win.h0; h < win.h1; ++h)
          for (std::int64_t w = win.w0; w < win.w1; ++w) grad[h * shape.width + w] += share;
      }
  });
}

void global_avg_pool_forward(const StreamHandle& s, const GlobalPoolShape& shape, const float* x,
                             float* y) {
  use_threads(s);
  const std::int64_t plane = shape.height * shape.width;
  const double inv_plane = 1.0 / double(plane);
  parallel_for(threads_above(s, shape.input_size(), kPoolParallelThreshold), shape.batch * shape.channels,
               [&](std::int64_t p) {
    const float* in = x + p * plane;
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t k = 0; k < plane; ++k) sum += in[k];
    y[p] = float(sum * inv_plane);
  });
}

void global_avg_pool_backward(const StreamHandle& s, const GlobalPoolShape& shape, const float* dy,
                              float* dx) {
  use_threads(s);
  const std::int64_t plane = shape.height * shape.width;
  const float inv_plane = float(1.0 / double(plane));
  parallel_for(threads_above(s, shape.input_size(), kPoolParallelThreshold), shape.batch * shape.channels,
               [&](std::int64_t p) {
    const float share = dy[p] * inv_plane;
    std::fill(dx + p * plane, dx + (p + 1) * plane, share);
  });
}

}  // namespace petra::kernels::cpu
