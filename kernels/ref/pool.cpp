// kernels/ref/pool.cpp: the oracle for kernels/pool.hpp, plain loops in double.
#include "petra/kernels/pool.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace petra::kernels::ref {

template <class T>
void max_pool2d_forward(const StreamHandle&, const Pool2dShape& shape, const T* x, T* y,
                        std::int32_t* indices) {
  const std::int64_t oh = shape.out_height(), ow = shape.out_width();
  for (std::int64_t plane = 0; plane < shape.batch * shape.channels; ++plane) {
    const T* in = x + plane * shape.height * shape.width;
    for (std::int64_t i = 0; i < oh; ++i)
      for (std::int64_t j = 0; j < ow; ++j) {
        // The window clipped to the input; padding never wins.
        const std::int64_t h0 = std::max<std::int64_t>(i * shape.stride - shape.padding, 0);
        const std::int64_t w0 = std::max<std::int64_t>(j * shape.stride - shape.padding, 0);
        const std::int64_t h1 = std::min(i * shape.stride - shape.padding + shape.kernel, shape.height);
        const std::int64_t w1 = std::min(j * shape.stride - shape.padding + shape.kernel, shape.width);
        double best = -INFINITY;
        std::int64_t best_at = h0 * shape.width + w0;
        for (std::int64_t h = h0; h < h1; ++h)
          for (std::int64_t w = w0; w < w1; ++w) {
            const double v = in[h * shape.width + w];
            if (v > best || std::isnan(v)) {
              best = v;
              best_at = h * shape.width + w;
            }
          }
        const std::int64_t o = (plane * oh + i) * ow + j;
        y[o] = T(best);
        if (indices) indices[o] = std::int32_t(best_at);
      }
  }
}

template <class T>
void max_pool2d_backward(const StreamHandle&, const Pool2dShape& shape, const T* dy,
                         const std::int32_t* indices, T* dx) {
  const std::int64_t in_plane = shape.height * shape.width;
  const std::int64_t out_plane = shape.out_height() * shape.out_width();
  std::vector<double> grad(in_plane);
  for (std::int64_t plane = 0; plane < shape.batch * shape.channels; ++plane) {
    std::fill(grad.begin(), grad.end(), 0.0);
    for (std::int64_t o = 0; o < out_plane; ++o)
      grad[indices[plane * out_plane + o]] += dy[plane * out_plane + o];
    for (std::int64_t k = 0; k < in_plane; ++k) dx[plane * in_plane + k] = T(grad[k]);
  }
}

template <class T>
void avg_pool2d_forward(const StreamHandle&, const Pool2dShape& shape, const T* x, T* y) {
  const std::int64_t oh = shape.out_height(), ow = shape.out_width();
  const double area = double(shape.kernel * shape.kernel);
  for (std::int64_t plane = 0; plane < shape.batch * shape.channels; ++plane) {
    const T* in = x + plane * shape.height * shape.width;
    for (std::int64_t i = 0; i < oh; ++i)
      for (std::int64_t j = 0; j < ow; ++j) {
        double sum = 0;
        for (std::int64_t ki = 0; ki < shape.kernel; ++ki)
          for (std::int64_t kj = 0; kj < shape.kernel; ++kj) {
            const std::int64_t h = i * shape.stride - shape.padding + ki;
            const std::int64_t w = j * shape.stride - shape.padding + kj;
            if (h >= 0 && h < shape.height && w >= 0 && w < shape.width) sum += in[h * shape.width + w];
          }
        y[(plane * oh + i) * ow + j] = T(sum / area);
      }
  }
}

template <class T>
void avg_pool2d_backward(const StreamHandle&, const Pool2dShape& shape, const T* dy, T* dx) {
  const std::int64_t oh = shape.out_height(), ow = shape.out_width();
  const double area = double(shape.kernel * shape.kernel);
  const std::int64_t in_plane = shape.height * shape.width;
  std::vector<double> grad(in_plane);
  for (std::int64_t plane = 0; plane < shape.batch * shape.channels; ++plane) {
    std::fill(grad.begin(), grad.end(), 0.0);
    for (std::int64_t i = 0; i < oh; ++i)
      for (std::int64_t j = 0; j < ow; ++j) {
        const double share = dy[(plane * oh + i) * ow + j] / area;
        for (std::int64_t ki = 0; ki < shape.kernel; ++ki)
          for (std::int64_t kj = 0; kj < shape.kernel; ++kj) {
            const std::int64_t h = i * shape.stride - shape.padding + ki;
            const std::int64_t w = j * shape.stride - shape.padding + kj;
            if (h >= 0 && h < shape.height && w >= 0 && w < shape.width) grad[h * shape.width + w] += share;
          }
      }
    for (std::int64_t k = 0; k < in_plane; ++k) dx[plane * in_plane + k] = T(grad[k]);
  }
}

template <class T>
void global_avg_pool_forward(const StreamHandle&, const GlobalPoolShape& shape, const T* x, T* y) {
  const std::int64_t plane = shape.height * shape.width;
  for (std::int64_t p = 0; p < shape.batch * shape.channels; ++p) {
    double sum = 0;
    for (std::int64_t k = 0; k < plane; ++k) sum += x[p * plane + k];
    y[p] = T(sum / double(plane));
  }
}

template <class T>
void global_avg_pool_backward(const StreamHandle&, const GlobalPoolShape& shape, const T* dy, T* dx) {
  const std::int64_t plane = shape.height * shape.width;
  for (std::int64_t p = 0; p < shape.batch * shape.channels; ++p)
    for (std::int64_t k = 0; k < plane; ++k) dx[p * plane + k] = T(double(dy[p]) / double(plane));
}

#define PETRA_INSTANTIATE(T)                                                                       \
  template void max_pool2d_forward<T>(const StreamHandle&, const Pool2dShape&, const T*, T*,      \
                                      std::int32_t*);                                              \
  template void max_pool2d_backward<T>(const StreamHandle&, const Pool2dShape&, const T*,         \
                                       const std::int32_t*, T*);                                   \
  template void avg_pool2d_forward<T>(const StreamHandle&, const Pool2dShape&, const T*, T*);     \
  template void avg_pool2d_backward<T>(const StreamHandle&, const Pool2dShape&, const T*, T*);    \
  template void global_avg_pool_forward<T>(const StreamHandle&, const GlobalPoolShape&, const T*, \
                                           T*);                                                    \
  template void global_avg_pool_backward<T>(const StreamHandle&, const GlobalPoolShape&, const T*, \
                                            T*);
PETRA_INSTANTIATE(float)
PETRA_INSTANTIATE(double)
#undef PETRA_INSTANTIATE

}  // namespace petra::kernels::ref
