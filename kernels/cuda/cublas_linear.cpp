// kernels/cuda/cublas_linear.cpp: the linear layer's three matrix products on cuBLAS
// (kernels/cuda_libraries.hpp, kernels::cublas). Compiled by the host compiler against cuBLAS's
// headers, linked into petra-core only where meson found cuBLAS.
//
// Layout mapping. petra's matrices are row-major; cuBLAS's are column-major. A row-major R x C
// matrix with leading dimension C is, read by cuBLAS, the column-major C x R matrix: its transpose.
// So each product is computed transposed, with no copy:
//   y  = x w^T     (batch x out)  ->  y^T  = w x^T      : gemm(T, N, m=out, n=batch, k=in,
//                                                           A=w lda=in, B=x ldb=in, C=y ldc=out)
//   dx = dy w      (batch x in)   ->  dx^T = w^T dy^T   : gemm(N, N, m=in, n=batch, k=out,
//                                                           A=w lda=in, B=dy ldb=out, C=dx ldc=in)
//   dw += dy^T x   (out x in)     ->  dw^T += x^T dy    : gemm(N, T, m=in, n=out, k=batch,
//                                                           A=x lda=in, B=dy ldb=out, C=dw ldc=in, beta=1)
// The forward's bias is first broadcast into y (cuda::reduce_sum_backward: y[b, o] = bias[o]), then
// the GEMM adds onto it (beta = 1): y = bias + x w^T, one pass more over y than a fused epilogue.
//
// Precision: cublasSgemm under CUBLAS_DEFAULT_MATH, FP32 multiply-adds (no TF32 unless the
// environment sets NVIDIA_TF32_OVERRIDE=1). Determinism: the same bits on every run with one GPU
// model and one cuBLAS version; atomics stay off (cuBLAS's default), one handle per stream.
// cuBLAS keeps its own workspace per handle: those bytes are not in petra's memory accounting.
#include <cublas_v2.h>

#include <climits>
#include <cstdint>

#include "petra/error.hpp"
#include "petra/kernels/cuda/check.cuh"
#include "petra/kernels/cuda/per_stream_handles.hpp"
#include "petra/kernels/cuda_libraries.hpp"
#include "petra/kernels/reduce.hpp"

namespace petra::kernels::cublas {
namespace {

[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* operation, int line) {
  const std::string message = detail::concat(operation, " failed: ", cublasGetStatusName(status), " (",
                                             cublasGetStatusString(status), ") at ", __FILE__, ":", line);
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      throw OutOfMemoryError(message);
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      throw DeviceError(message);
    default:
      throw Error(message);
  }
}

#define PETRA_CUBLAS_CHECK(expr)                                      \
  do {                                                                \
    const cublasStatus_t petra_cublas_status_ = (expr);               \
    if (petra_cublas_status_ != CUBLAS_STATUS_SUCCESS)                \
      throw_cublas_error(petra_cublas_status_, #expr, __LINE__);      \
  } while (0)

cublasHandle_t make_handle(cudaStream_t stream) {
  cublasHandle_t handle = nullptr;
  PETRA_CUBLAS_CHECK(cublasCreate(&handle));
  PETRA_CUBLAS_CHECK(cublasSetStream(handle, stream));
  PETRA_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
  PETRA_CUBLAS_CHECK(cublasSetAtomicsMode(handle, CUBLAS_ATOMICS_NOT_ALLOWED));
  return handle;
}

cublasHandle_t handle_for(const StreamHandle& s) {
  static cuda_detail::PerStreamHandles<cublasHandle_t> handles(make_handle);
  return handles.get(s);
}

// cuBLAS takes int sizes; larger layers run the hand-written kernel.
bool fits_int(const LinearShape& shape) {
  return shape.batch <= INT_MAX && shape.in_features <= INT_MAX && shape.out_features <= INT_MAX;
}

// C (m x n, column-major, ldc) = alpha op(A) op(B) + beta C.
void sgemm(const StreamHandle& s, cublasOperation_t op_a, cublasOperation_t op_b, std::int64_t m,
           std::int64_t n, std::int64_t k, const float* a, std::int64_t lda, const float* b,
           std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  const float alpha = 1.0f;
  PETRA_CUBLAS_CHECK(cublasSgemm(handle_for(s), op_a, op_b, int(m), int(n), int(k), &alpha, a, int(lda), b,
                                 int(ldb), &beta, c, int(ldc)));
}

}  // namespace

void linear_forward(const StreamHandle& s, const LinearShape& shape, const float* x,
                    const float* w, const float* bias, float* y) {
  if (!fits_int(shape)) return cuda::linear_forward(s, shape, x, w, bias, y);
  const std::int64_t batch = shape.batch, in = shape.in_features, out = shape.out_features;
  if (batch == 0 || out == 0) return;
  cuda_detail::DeviceGuard guard(s.device_index);
  float beta = 0.0f;
  if (bias != nullptr) {  // y[b, o] = bias[o], then y += x w^T
    const std::int64_t dims[2] = {batch, out};
    cuda::reduce_sum_backward(s, dims, 1u, bias, y);
    beta = 1.0f;
  }
  sgemm(s, CUBLAS_OP_T, CUBLAS_OP_N, out, batch, in, w, in, x, in, beta, y, out);
}

void linear_backward_data(const StreamHandle& s, const LinearShape& shape, const float* dy,
                          const float* w, float* dx) {
  if (!fits_int(shape)) return cuda::linear_backward_data(s, shape, dy, w, dx);
  const std::int64_t batch = shape.batch, in = shape.in_features, out = shape.out_features;
  if (batch == 0 || in == 0) return;
  cuda_detail::DeviceGuard guard(s.device_index);
  sgemm(s, CUBLAS_OP_N, CUBLAS_OP_N, in, batch, out, w, in, dy, out, 0.0f, dx, in);
}

void linear_backward_weight(const StreamHandle& s, const LinearShape& shape, const float* x,
                            const float* dy, float* dw) {
  if (!fits_int(shape)) return cuda::linear_backward_weight(s, shape, x, dy, dw);
  const std::int64_t batch = shape.batch, in = shape.in_features, out = shape.out_features;
  if (batch == 0 || in == 0 || out == 0) return;  // dw += 0
  cuda_detail::DeviceGuard guard(s.device_index);
  sgemm(s, CUBLAS_OP_N, CUBLAS_OP_T, in, out, batch, x, in, dy, out, 1.0f, dw, in);
}

}  // namespace petra::kernels::cublas
