// kernels/linear.hpp: the fully connected layer (PyTorch's nn.Linear): y = x w^T + b.
//
//   y[b, o] = bias[o] + sum_i x[b, i] * w[o, i]
// Backward, for L = <dy, y>:
//   dx[b, i]  = sum_o dy[b, o] * w[o, i]        (dx = dy w)
//   dw[o, i] += sum_b dy[b, o] * x[b, i]        (dw += dy^T x)
//   db[o]    += sum_b dy[b, o]
//
// Layout (row-major, contiguous, as PyTorch): x, dx (batch, in_features); w, dw (out_features,
// in_features); y, dy (batch, out_features); bias, db (out_features). bias may be nullptr.
// cpu:: is three Eigen GEMMs (multi-threaded with s.num_threads); it needs no scratch.
#pragma once

#include <cstdint>

#include "petra/config.hpp"
#include "petra/kernels/common.hpp"

namespace petra::kernels {

struct LinearShape {
  std::int64_t batch = 0, in_features = 0, out_features = 0;

  // Multiply-adds times 2 of the forward pass; each backward pass (data, weight) costs the same.
  std::int64_t flops() const { return 2 * batch * in_features * out_features; }
};

namespace ref {

// y = x w^T + bias.
template <class T>
void linear_forward(const StreamHandle& s, const LinearShape& shape, const T* x, const T* w,
                    const T* bias, T* y);

// dx = dy w.
template <class T>
void linear_backward_data(const StreamHandle& s, const LinearShape& shape, const T* dy,
                          const T* w, T* dx);

// dw += dy^T x.
template <class T>
void linear_backward_weight(const StreamHandle& s, const LinearShape& shape, const T* x,
                            const T* dy, T* dw);

// db += the sum of dy over the batch.
template <class T>
void linear_backward_bias(const StreamHandle& s, const LinearShape& shape, const T* dy, T* db);

}  // namespace ref

namespace cpu {

// Same contracts as ref::, for float and double.
void linear_forward(const StreamHandle& s, const LinearShape& shape, const float* x,
                    const float* w, const float* bias, float* y);
void linear_backward_data(const StreamHandle& s, const LinearShape& shape, const float* dy,
                          const float* w, float* dx);
void linear_backward_weight(const StreamHandle& s, const LinearShape& shape, const float* x,
                            const float* dy, float* dw);
void linear_backward_bias(const StreamHandle& s, const LinearShape& shape, const float* dy,
                          float* db);

void linear_forward(const StreamHandle& s, const LinearShape& shape, const double* x,
                    const double* w, const double* bias, double* y);
void linear_backward_data(const StreamHandle& s, const LinearShape& shape, const double* dy,
                          const double* w, double* dx);
void linear_backward_weight(const StreamHandle& s, const LinearShape& shape, const double* x,
                            const double* dy, double* dw);
void linear_backward_bias(const StreamHandle& s, const LinearShape& shape, const double* dy,
                          double* db);

}  // namespace cpu

#if PETRA_HAVE_CUDA
// Same contracts as ref::, float, launched on s.cuda_stream; pointers are device memory
// (kernels/cuda/linear.cu). The three products are one shared-memory tiled SGEMM (32 x 32 tiles
// of the output, 4 rows per thread, operands read through strides so no transpose is copied);
// each output is summed by one thread in a fixed order, so results are deterministic. The bias
// gradient is one thread per feature summing the batch in order. No scratch. These are what runs
// where petra is built without cuBLAS and what the CUDA emulation checks; with cuBLAS, petra/ops.cpp
// sends the three products to kernels::cublas (kernels/cuda_libraries.hpp) instead.
namespace cuda {

void linear_forward(const StreamHandle& s, const LinearShape& shape, const float* x,
                    const float* w, const float* bias, float* y);
void linear_backward_data(const StreamHandle& s, const LinearShape& shape, const float* dy,
                          const float* w, float* dx);
void linear_backward_weight(const StreamHandle& s, const LinearShape& shape, const float* x,
                            const float* dy, float* dw);
void linear_backward_bias(const StreamHandle& s, const LinearShape& shape, const float* dy,
                          float* db);

}  // namespace cuda
#endif

}  // namespace petra::kernels
