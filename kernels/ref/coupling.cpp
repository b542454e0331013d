// kernels/ref/coupling.cpp: the oracle for kernels/coupling.hpp, plain loops.
#include "petra/kernels/coupling.hpp"

namespace petra::kernels::ref {

template <class T>
void coupling_forward(const StreamHandle&, const CouplingShape& shape, const T* x, const T* f, T* y) {
  const std::int64_t size = shape.stream_size();
  for (std::int64_t n = 0; n < shape.batch; ++n)
    for (std::int64_t i = 0; i < size; ++i) {
      const T x1 = x[2 * n * size + i], x2 = x[(2 * n + 1) * size + i];
      y[2 * n * size + i] = x2 + f[n * size + i];  // y1 = x2 + f
      y[(2 * n + 1) * size + i] = x1;              // y2 = x1
    }
}

template <class T>
void coupling_inverse(const StreamHandle&, const CouplingShape& shape, const T* y, const T* f, T* x) {
  const std::int64_t size = shape.stream_size();
  for (std::int64_t n = 0; n < shape.batch; ++n)
    for (std::int64_t i = 0; i < size; ++i) {
      const T y1 = y[2 * n * size + i], y2 = y[(2 * n + 1) * size + i];
      x[2 * n * size + i] = y2;                         // x1 = y2
      x[(2 * n + 1) * size + i] = y1 - f[n * size + i];  // x2 = y1 - f
    }
}

// dx1 = dy2 + g, dx2 = dy1: the forward's map, applied to (dy, g); dx1 = dy2 where g is null.
template <class T>
void coupling_backward(const StreamHandle& s, const CouplingShape& shape, const T* dy, const T* g,
                       T* dx) {
  if (g != nullptr) {
    coupling_forward(s, shape, dy, g, dx);
    return;
  }
  const std::int64_t size = shape.stream_size();
  for (std::int64_t n = 0; n < shape.batch; ++n)
    for (std::int64_t i = 0; i < size; ++i) {
      dx[2 * n * size + i] = dy[(2 * n + 1) * size + i];  // dx1 = dy2
      dx[(2 * n + 1) * size + i] = dy[2 * n * size + i];  // dx2 = dy1
    }
}

#define PETRA_INSTANTIATE(T)                                                                       \
  template void coupling_forward<T>(const StreamHandle&, const CouplingShape&, const T*, const T*, \
                                    T*);                                                           \
  template void coupling_inverse<T>(const StreamHandle&, const CouplingShape&, const T*, const T*, \
                                    T*);                                                           \
  template void coupling_backward<T>(const StreamHandle&, const CouplingShape&, const T*,          \
                                     const T*, T*);
PETRA_INSTANTIATE(float)
PETRA_INSTANTIATE(double)
#undef PETRA_INSTANTIATE

}  // namespace petra::kernels::ref
