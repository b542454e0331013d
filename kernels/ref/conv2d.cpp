// kernels/ref/conv2d.cpp: the reference 2-d convolution: the formulas of kernels/conv2d.hpp as
// plain loops with double accumulation. Slow on purpose; the oracle for cpu:: and cuda::.
#include "petra/kernels/conv2d.hpp"

#include <algorithm>
#include <vector>

namespace petra::kernels::ref {
namespace {

// Calls visit(xi, wi, yi) with the flat offsets into x, w and y of every product
// w[o,c,i,j] * x[b,c,h,w] that the forward pass sums into y[b,o,oh,ow], skipping the taps that
// fall into the zero padding. Offsets are into the NCHW x (image b at b * x_image_stride), the
// contiguous y and the (out, in, kh, kw) weight.
template <class Visit>
void for_each_tap(const Conv2dShape& s, std::int64_t x_image_stride, Visit&& visit) {
  const std::int64_t out_h = s.out_h(), out_w = s.out_w();
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t o = 0; o < s.out_channels; ++o)
      for (std::int64_t oh = 0; oh < out_h; ++oh)
        for (std::int64_t ow = 0; ow < out_w; ++ow) {
          const std::int64_t yi = ((b * s.out_channels + o) * out_h + oh) * out_w + ow;
          for (std::int64_t c = 0; c < s.in_channels; ++c)
            for (std::int64_t i = 0; i < s.kernel_h; ++i) {
              const std::int64_t h = oh * s.stride_h - s.pad_h + i;
              if (h < 0 || h >= s.in_h) continue;
              for (std::int64_t j = 0; j < s.kernel_w; ++j) {
                const std::int64_t w = ow * s.stride_w - s.pad_w + j;
                if (w < 0 || w >= s.in_w) continue;
                const std::int64_t xi = b * x_image_stride + (c * s.in_h + h) * s.in_w + w;
                const std::int64_t wi = ((o * s.in_channels + c) * s.kernel_h + i) * s.kernel_w + j;
                visit(xi, wi, yi);
              }
            }
        }
}

}  // namespace

template <class T>
void conv2d_forward(const StreamHandle&, const Conv2dShape& shape, const T* x, const T* w,
                    const T* bias, T* y) {
  std::vector<double> sum(static_cast<std::size_t>(shape.output_size()), 0.0);
  for_each_tap(shape, shape.x_image_stride(), [&](std::int64_t xi, std::int64_t wi, std::int64_t yi) {
    sum[yi] += double(w[wi]) * double(x[xi]);
  });
  const std::int64_t plane = shape.out_h() * shape.out_w();
  for (std::int64_t n = 0; n < shape.output_size(); ++n) {
    const std::int64_t o = n / plane % shape.out_channels;
    y[n] = static_cast<T>(sum[n] + (bias != nullptr ? double(bias[o]) : 0.0));
  }
}

template <class T>
void conv2d_backward_data(const StreamHandle&, const Conv2dShape& shape, const T* dy, const T* w,
                          T* dx) {
  std::vector<double> sum(static_cast<std::size_t>(shape.input_size()), 0.0);
  const std::int64_t packed = shape.in_channels * shape.in_h * shape.in_w;  // dx is packed
  for_each_tap(shape, packed, [&](std::int64_t xi, std::int64_t wi, std::int64_t yi) {
    sum[xi] += double(w[wi]) * double(dy[yi]);
  });
  std::transform(sum.begin(), sum.end(), dx, [](double v) { return static_cast<T>(v); });
}

template <class T>
void conv2d_backward_weight(const StreamHandle&, const Conv2dShape& shape, const T* x,
                            const T* dy, T* dw) {
  std::vector<double> sum(static_cast<std::size_t>(shape.weight_size()), 0.0);
  for_each_tap(shape, shape.x_image_stride(), [&](std::int64_t xi, std::int64_t wi, std::int64_t yi) {
    sum[wi] += double(dy[yi]) * double(x[xi]);
  });
  for (std::size_t n = 0; n < sum.size(); ++n) dw[n] = static_cast<T>(double(dw[n]) + sum[n]);
}

template <class T>
void conv2d_backward_bias(const StreamHandle&, const Conv2dShape& shape, const T* dy, T* db) {
  const std::int64_t plane = shape.out_h() * shape.out_w();
  for (std::int64_t o = 0; o < shape.out_channels; ++o) {
    double sum = 0;
    for (std::int64_t b = 0; b < shape.batch; ++b) {
      const T* row = dy + (b * shape.out_channels + o) * plane;
      for (std::int64_t p = 0; p < plane; ++p) sum += double(row[p]);
    }
    db[o] = static_cast<T>(double(db[o]) + sum);
  }
}

#define PETRA_INSTANTIATE(T)                                                                  \
  template void conv2d_forward<T>(const StreamHandle&, const Conv2dShape&, const T*, const T*, \
                                  const T*, T*);                                              \
  template void conv2d_backward_data<T>(const StreamHandle&, const Conv2dShape&, const T*,     \
                                        const T*, T*);                                        \
  template void conv2d_backward_weight<T>(const StreamHandle&, const Conv2dShape&, const T*,   \
                                          const T*, T*);                                      \
  template void conv2d_backward_bias<T>(const StreamHandle&, const Conv2dShape&, const T*, T*);
PETRA_INSTANTIATE(float)
PETRA_INSTANTIATE(double)
#undef PETRA_INSTANTIATE

}  // namespace petra::kernels::ref
