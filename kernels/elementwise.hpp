// kernels/elementwise.hpp: element-wise kernels on flat arrays (add, scale, axpy, relu, copy, ...).
//
// The "shape" of every op here is the element count n: the arrays are contiguous and hold n
// elements each. Scalars (a, value) are passed as double: ref:: computes in double, cpu:: rounds
// them to T once.
//
// Aliasing: an output may be the very same pointer as an input (z = x + z, relu in place);
// partially overlapping arrays are not allowed.
//
// ReLU's backward reads the forward OUTPUT y, not the input x: dx = dy * (y > 0). (y > 0 exactly
// when x > 0, so the result is the same; keeping y lets the caller free x, and in place
// relu(x, x) leaves only y anyway.) relu passes NaN through, as PyTorch does.
//
// Outputs are assigned (=), except those of axpy and add_inplace, which accumulate (+=).
//
// cpu:: runs single-threaded below kElementwiseParallelThreshold elements, where waking threads
// costs more than it saves, and on s.num_threads threads above it.
#pragma once

#include <cstdint>

#include "petra/kernels/common.hpp"
#include "petra/config.hpp"

namespace petra::kernels {

inline constexpr std::int64_t kElementwiseParallelThreshold = 64 * 1024;

namespace ref {

template <class T> void add(const StreamHandle& s, std::int64_t n, const T* x, const T* y, T* z);          // z  = x + y
template <class T> void sub(const StreamHandle& s, std::int64_t n, const T* x, const T* y, T* z);          // z  = x - y
template <class T> void mul(const StreamHandle& s, std::int64_t n, const T* x, const T* y, T* z);          // z  = x * y
template <class T> void scale(const StreamHandle& s, std::int64_t n, double a, const T* x, T* y);          // y  = a * x
template <class T> void axpy(const StreamHandle& s, std::int64_t n, double a, const T* x, T* y);           // y += a * x
template <class T> void add_inplace(const StreamHandle& s, std::int64_t n, const T* x, T* y);              // y += x
template <class T> void relu(const StreamHandle& s, std::int64_t n, const T* x, T* y);                     // y  = max(x, 0)
template <class T> void relu_backward(const StreamHandle& s, std::int64_t n, const T* y, const T* dy, T* dx);  // dx = dy * (y > 0)
template <class T> void copy(const StreamHandle& s, std::int64_t n, const T* x, T* y);                     // y  = x
template <class T> void fill(const StreamHandle& s, std::int64_t n, double value, T* y);                   // y  = value

}  // namespace ref

// Same contracts as ref::, for float and double.
namespace cpu {

template <class T> void add(const StreamHandle& s, std::int64_t n, const T* x, const T* y, T* z);
template <class T> void sub(const StreamHandle& s, std::int64_t n, const T* x, const T* y, T* z);
template <class T> void mul(const StreamHandle& s, std::int64_t n, const T* x, const T* y, T* z);
template <class T> void scale(const StreamHandle& s, std::int64_t n, double a, const T* x, T* y);
template <class T> void axpy(const StreamHandle& s, std::int64_t n, double a, const T* x, T* y);
template <class T> void add_inplace(const StreamHandle& s, std::int64_t n, const T* x, T* y);
template <class T> void relu(const StreamHandle& s, std::int64_t n, const T* x, T* y);
template <class T> void relu_backward(const StreamHandle& s, std::int64_t n, const T* y, const T* dy, T* dx);
template <class T> void copy(const StreamHandle& s, std::int64_t n, const T* x, T* y);
template <class T> void fill(const StreamHandle& s, std::int64_t n, double value, T* y);

}  // namespace cpu

#if PETRA_HAVE_CUDA
// Same contracts as ref::, float, launched on s.cuda_stream; pointers are device memory.
namespace cuda {

void add(const StreamHandle& s, std::int64_t n, const float* x, const float* y, float* z);
void sub(const StreamHandle& s, std::int64_t n, const float* x, const float* y, float* z);
void mul(const StreamHandle& s, std::int64_t n, const float* x, const float* y, float* z);
void scale(const StreamHandle& s, std::int64_t n, double a, const float* x, float* y);
void axpy(const StreamHandle& s, std::int64_t n, double a, const float* x, float* y);
void add_inplace(const StreamHandle& s, std::int64_t n, const float* x, float* y);
void relu(const StreamHandle& s, std::int64_t n, const float* x, float* y);
void relu_backward(const StreamHandle& s, std::int64_t n, const float* y, const float* dy, float* dx);
void copy(const StreamHandle& s, std::int64_t n, const float* x, float* y);
void fill(const StreamHandle& s, std::int64_t n, double value, float* y);

}  // namespace cuda
#endif

}  // namespace petra::kernels
