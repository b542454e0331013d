// kernels/ref/elementwise.cpp: the reference element-wise kernels (plain loops, double math).
#include "petra/kernels/elementwise.hpp"

namespace petra::kernels::ref {

template <class T>
void add(const StreamHandle&, std::int64_t n, const T* x, const T* y, T* z) {
  for (std::int64_t i = 0; i < n; ++i) z[i] = static_cast<T>(double(x[i]) + double(y[i]));
}

template <class T>
void sub(const StreamHandle&, std::int64_t n, const T* x, const T* y, T* z) {
  for (std::int64_t i = 0; i < n; ++i) z[i] = static_cast<T>(double(x[i]) - double(y[i]));
}

template <class T>
void mul(const StreamHandle&, std::int64_t n, const T* x, const T* y, T* z) {
  for (std::int64_t i = 0; i < n; ++i) z[i] = static_cast<T>(double(x[i]) * double(y[i]));
}

template <class T>
void scale(const StreamHandle&, std::int64_t n, double a, const T* x, T* y) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(a * double(x[i]));
}

template <class T>
void axpy(const StreamHandle&, std::int64_t n, double a, const T* x, T* y) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(double(y[i]) + a * double(x[i]));
}

template <class T>
void add_inplace(const StreamHandle&, std::int64_t n, const T* x, T* y) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(double(y[i]) + double(x[i]));
}

// Written as "x < 0 ? 0 : x" so that a NaN input gives NaN, as in PyTorch.
template <class T>
void relu(const StreamHandle&, std::int64_t n, const T* x, T* y) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] < T(0) ? T(0) : x[i];
}

template <class T>
void relu_backward(const StreamHandle&, std::int64_t n, const T* y, const T* dy, T* dx) {
  for (std::int64_t i = 0; i < n; ++i) dx[i] = y[i] > T(0) ? dy[i] : T(0);
}

template <class T>
void copy(const StreamHandle&, std::int64_t n, const T* x, T* y) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i];
}

template <class T>
void fill(const StreamHandle&, std::int64_t n, double value, T* y) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(value);
}

#define PETRA_INSTANTIATE(T)                                                                   \
  template void add<T>(const StreamHandle&, std::int64_t, const T*, const T*, T*);             \
  template void sub<T>(const StreamHandle&, std::int64_t, const T*, const T*, T*);             \
  template void mul<T>(const StreamHandle&, std::int64_t, const T*, const T*, T*);             \
  template void scale<T>(const StreamHandle&, std::int64_t, double, const T*, T*);             \
  template void axpy<T>(const StreamHandle&, std::int64_t, double, const T*, T*);              \
  template void add_inplace<T>(const StreamHandle&, std::int64_t, const T*, T*);               \
  template void relu<T>(const StreamHandle&, std::int64_t, const T*, T*);                      \
  template void relu_backward<T>(const StreamHandle&, std::int64_t, const T*, const T*, T*);   \
  template void copy<T>(const StreamHandle&, std::int64_t, const T*, T*);                      \
  template void fill<T>(const StreamHandle&, std::int64_t, double, T*);
PETRA_INSTANTIATE(float)
PETRA_INSTANTIATE(double)
#undef PETRA_INSTANTIATE

}  // namespace petra::kernels::ref
