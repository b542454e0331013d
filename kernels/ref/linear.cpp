// kernels/ref/linear.cpp: the reference fully connected layer: the formulas of
// kernels/linear.hpp as plain loops with double accumulation (the oracle for cpu:: and cuda::).
#include "petra/kernels/linear.hpp"

namespace petra::kernels::ref {

template <class T>
void linear_forward(const StreamHandle&, const LinearShape& shape, const T* x, const T* w,
                    const T* bias, T* y) {
  const std::int64_t in = shape.in_features, out = shape.out_features;
  for (std::int64_t b = 0; b < shape.batch; ++b)
    for (std::int64_t o = 0; o < out; ++o) {
      double sum = bias != nullptr ? double(bias[o]) : 0.0;
      for (std::int64_t i = 0; i < in; ++i) sum += double(x[b * in + i]) * double(w[o * in + i]);
      y[b * out + o] = static_cast<T>(sum);
    }
}

template <class T>
void linear_backward_data(const StreamHandle&, const LinearShape& shape, const T* dy, const T* w,
                          T* dx) {
  const std::int64_t in = shape.in_features, out = shape.out_features;
  for (std::int64_t b = 0; b < shape.batch; ++b)
    for (std::int64_t i = 0; i < in; ++i) {
      double sum = 0;
      for (std::int64_t o = 0; o < out; ++o) sum += double(dy[b * out + o]) * double(w[o * in + i]);
      dx[b * in + i] = static_cast<T>(sum);
    }
}

template <class T>
void linear_backward_weight(const StreamHandle&, const LinearShape& shape, const T* x,
                            const T* dy, T* dw) {
  const std::int64_t in = shape.in_features, out = shape.out_features;
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t i = 0; i < in; ++i) {
      double sum = 0;
      for (std::int64_t b = 0; b < shape.batch; ++b)
        sum += double(dy[b * out + o]) * double(x[b * in + i]);
      dw[o * in + i] = static_cast<T>(double(dw[o * in + i]) + sum);
    }
}

template <class T>
void linear_backward_bias(const StreamHandle&, const LinearShape& shape, const T* dy, T* db) {
  const std::int64_t out = shape.out_features;
  for (std::int64_t o = 0; o < out; ++o) {
    double sum = 0;
    for (std::int64_t b = 0; b < shape.batch; ++b) sum += double(dy[b * out + o]);
    db[o] = static_cast<T>(double(db[o]) + sum);
  }
}

#define PETRA_INSTANTIATE(T)                                                                  \
  template void linear_forward<T>(const StreamHandle&, const LinearShape&, const T*, const T*, \
                                  const T*, T*);                                              \
  template void linear_backward_data<T>(const StreamHandle&, const LinearShape&, const T*,     \
                                        const T*, T*);                                        \
  template void linear_backward_weight<T>(const StreamHandle&, const LinearShape&, const T*,   \
                                          const T*, T*);                                      \
  template void linear_backward_bias<T>(const StreamHandle&, const LinearShape&, const T*, T*);
PETRA_INSTANTIATE(float)
PETRA_INSTANTIATE(double)
#undef PETRA_INSTANTIATE

}  // namespace petra::kernels::ref
