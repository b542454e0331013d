// kernels/ref/reduce.cpp: the reference reductions: one pass over x, each element added (in
// double) to the output element it folds into; the backward reads, for each element of dx, the
// element of dy it came from.
#include <vector>

#include "petra/kernels/reduce.hpp"

namespace petra::kernels::ref {
namespace {

// The index in y of element i of x: i's coordinates with the reduced ones dropped, flattened in
// y's (kept) dims.
std::int64_t output_index(std::span<const std::int64_t> dims, std::uint32_t reduce_mask, std::int64_t i) {
  std::int64_t index = 0, stride = 1;
  for (std::size_t d = dims.size(); d-- > 0;) {
    const std::int64_t coordinate = i % dims[d];
    i /= dims[d];
    if (!(reduce_mask >> d & 1u)) {
      index += coordinate * stride;
      stride *= dims[d];
    }
  }
  return index;
}

std::int64_t input_count(std::span<const std::int64_t> dims) {
  std::int64_t n = 1;
  for (std::int64_t d : dims) n *= d;
  return n;
}

std::int64_t output_count(std::span<const std::int64_t> dims, std::uint32_t reduce_mask) {
  std::int64_t m = 1;
  for (std::size_t d = 0; d < dims.size(); ++d)
    if (!(reduce_mask >> d & 1u)) m *= dims[d];
  return m;
}

// y = (sum of x over the reduced dims) / divisor
template <class T>
void sum_and_divide(std::span<const std::int64_t> dims, std::uint32_t reduce_mask, double divisor, const T* x, T* y) {
  std::vector<double> sums(static_cast<std::size_t>(output_count(dims, reduce_mask)), 0.0);
  const std::int64_t n = input_count(dims);
  for (std::int64_t i = 0; i < n; ++i) sums[std::size_t(output_index(dims, reduce_mask, i))] += double(x[i]);
  for (std::size_t j = 0; j < sums.size(); ++j) y[j] = static_cast<T>(sums[j] / divisor);
}

// dx = dy / divisor, broadcast over the reduced dims
template <class T>
void broadcast_and_divide(std::span<const std::int64_t> dims, std::uint32_t reduce_mask, double divisor,
                          const T* dy, T* dx) {
  const std::int64_t n = input_count(dims);
  for (std::int64_t i = 0; i < n; ++i) dx[i] = static_cast<T>(double(dy[output_index(dims, reduce_mask, i)]) / divisor);
}

}  // namespace

template <class T>
void reduce_sum(const StreamHandle&, std::span<const std::int64_t> dims, std::uint32_t reduce_mask, const T* x, T* y) {
  sum_and_divide(dims, reduce_mask, 1.0, x, y);
}

template <class T>
void reduce_mean(const StreamHandle&, std::span<const std::int64_t> dims, std::uint32_t reduce_mask, const T* x, T* y) {
  sum_and_divide(dims, reduce_mask, double(reduced_count(dims, reduce_mask)), x, y);
}

template <class T>
void reduce_sum_backward(const StreamHandle&, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                         const T* dy, T* dx) {
  broadcast_and_divide(dims, reduce_mask, 1.0, dy, dx);
}

template <class T>
void reduce_mean_backward(const StreamHandle&, std::span<const std::int64_t> dims, std::uint32_t reduce_mask,
                          const T* dy, T* dx) {
  broadcast_and_divide(dims, reduce_mask, double(reduced_count(dims, reduce_mask)), dy, dx);
}

#define PETRA_INSTANTIATE(T)                                                                                        \
  template void reduce_sum<T>(const StreamHandle&, std::span<const std::int64_t>, std::uint32_t, const T*, T*);          \
  template void reduce_mean<T>(const StreamHandle&, std::span<const std::int64_t>, std::uint32_t, const T*, T*);         \
  template void reduce_sum_backward<T>(const StreamHandle&, std::span<const std::int64_t>, std::uint32_t, const T*, T*); \
  template void reduce_mean_backward<T>(const StreamHandle&, std::span<const std::int64_t>, std::uint32_t, const T*, T*);
PETRA_INSTANTIATE(float)
PETRA_INSTANTIATE(double)
#undef PETRA_INSTANTIATE

}  // namespace petra::kernels::ref
