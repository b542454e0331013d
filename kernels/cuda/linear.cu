// kernels/cuda/linear.cu: the cuda:: fully connected layer of kernels/linear.hpp (forward,
// backward data, backward weight, backward bias).
//
// The three matrix products are one hand-written SGEMM, C (=, += or = + bias) A B, where A is
// M x K and B is K x N read through (row, column) strides, so that the transposes of the layer
// (y = x w^T, dx = dy w, dw += dy^T x) need no copies:
//   - one block of 32 x 8 threads computes a 32 x 32 tile of C; each thread owns one column and
//     four rows of it (register blocking: each value read from shared memory feeds four
//     multiply-adds, each B value one column);
//   - K is walked in steps of 32: the block loads a 32 x 32 tile of A and of B into shared memory
//     (each thread 4 + 4 values, out-of-range values as zero, so the tails of M, N and K need no
//     special path), __syncthreads, multiplies out of shared memory, __syncthreads before the next
//     load overwrites the tiles. Every input value is thus read from global memory 1/32 as often
//     as by a naive kernel. The load's thread-to-element mapping follows the operand's contiguous
//     direction, so consecutive threads read consecutive addresses (coalesced) for A, B = x, w,
//     dy in every one of the three products;
//   - the tiles are stored transposed where that makes the inner loop's shared reads conflict-free,
//     and padded by one column.
// Deterministic: each output element is summed by one thread, k = 0, 1, ..., K-1 in order, in
// float (no atomics, no split-K); the bias is added and the += outputs accumulated once, after
// the sum. Results agree with ref:: (double) to float rounding of a K-term sum.
//
// The bias gradient is a column sum of dy: one thread per output feature walks the batch in order
// (consecutive threads read consecutive features of a row, coalesced), summing in double as ref::.
//
// cuBLAS would be faster on large layers; it is deliberately not used here (the CPU emulation
// cannot run it, and its split-K algorithms are not deterministic by default). It can come later
// as an option next to this kernel.
#include <cstdint>

#include "petra/kernels/cuda/launch.cuh"
#include "petra/kernels/linear.hpp"

// nvcc unrolls the fixed-count loops; the host compiler of the emulation does not know the pragma.
#ifdef __CUDACC__
#define PETRA_UNROLL _Pragma("unroll")
#else
#define PETRA_UNROLL
#endif

namespace petra::kernels::cuda {
namespace {

using cuda_detail::launch_grid_stride;

inline constexpr int kTile = 32;                 // C tile is kTile x kTile, K step kTile
inline constexpr int kRowsPerThread = 4;         // rows of the tile per thread
inline constexpr int kThreadRows = kTile / kRowsPerThread;  // 8: blockDim.y
inline constexpr int kThreads = kTile * kThreadRows;        // 256

// An operand read through strides: element (r, c) is data[r * row_stride + c * col_stride].
struct Matrix {
  const float* data;
  std::int64_t rows, cols, row_stride, col_stride;
};

enum class Epilogue { kAssign, kAccumulate, kBias };

// Loads the kTile x kTile tile of `m` at (row0, col0) into tile[c][r] (transposed: column-major in
// shared memory) when `transposed`, else tile[r][c]. Values outside the matrix are zero. The
// element each thread loads walks the matrix's contiguous direction fastest.
__device__ inline void load_tile(const Matrix& m, std::int64_t row0, std::int64_t col0,
                                 float (*tile)[kTile + 1], bool transposed) {
  const int t = threadIdx.y * kTile + threadIdx.x;
  const bool rows_contiguous = m.col_stride != 1;  // then walk rows fastest
PETRA_UNROLL
  for (int j = 0; j < kTile * kTile / kThreads; ++j) {
    const int e = t + j * kThreads;
    const int r = rows_contiguous ? e % kTile : e / kTile;
    const int c = rows_contiguous ? e / kTile : e % kTile;
    const std::int64_t gr = row0 + r, gc = col0 + c;
    const float v =
        gr < m.rows && gc < m.cols ? m.data[gr * m.row_stride + gc * m.col_stride] : 0.0f;
    if (transposed)
      tile[c][r] = v;
    else
      tile[r][c] = v;
  }
}

// C[M x N] (row-major, leading dimension ldc) gets A[M x K] B[K x N] per `epilogue`.
// grid.x: tiles along M, grid.y: tiles along N; block (kTile, kThreadRows).
template <Epilogue epilogue>
__global__ void __launch_bounds__(kThreads)
    sgemm_tiled(Matrix a, Matrix b, const float* bias, float* c, std::int64_t ldc) {
  // a_tile[k][m] (A transposed), b_tile[k][n]: in the inner loop the threads of a warp read one
  // a_tile value (broadcast) and 32 consecutive b_tile values (32 banks).
  __shared__ float a_tile[kTile][kTile + 1];
  __shared__ float b_tile[kTile][kTile + 1];
  const std::int64_t row0 = std::int64_t(blockIdx.x) * kTile;
  const std::int64_t col0 = std::int64_t(blockIdx.y) * kTile;
  const int tx = threadIdx.x, ty = threadIdx.y;
  float acc[kRowsPerThread] = {};
  for (std::int64_t k0 = 0; k0 < a.cols; k0 += kTile) {
    load_tile(a, row0, k0, a_tile, true);
    load_tile(b, k0, col0, b_tile, false);
    __syncthreads();
PETRA_UNROLL
    for (int k = 0; k < kTile; ++k) {
      const float bv = b_tile[k][tx];
PETRA_UNROLL
      for (int r = 0; r < kRowsPerThread; ++r) acc[r] += a_tile[k][ty + r * kThreadRows] * bv;
    }
    __syncthreads();
  }
  const std::int64_t col = col0 + tx;
  if (col >= b.cols) return;  // after the last __syncthreads: no barrier is skipped
PETRA_UNROLL
  for (int r = 0; r < kRowsPerThread; ++r) {
    const std::int64_t row = row0 + ty + r * kThreadRows;
    if (row >= a.rows) continue;
    float& out = c[row * ldc + col];
    if constexpr (epilogue == Epilogue::kAssign)
      out = acc[r];
    else if constexpr (epilogue == Epilogue::kAccumulate)
      out += acc[r];
    else
      out = acc[r] + bias[col];
  }
}

template <Epilogue epilogue>
void launch_sgemm(const char* name, const StreamHandle& s, const Matrix& a, const Matrix& b,
                  const float* bias, float* c) {
  if (a.rows <= 0 || b.cols <= 0) return;
  cuda_detail::DeviceGuard guard(s.device_index);
#ifdef PETRA_CUDA_EMULATION
  const ::petra::cuda_emulation::LaunchName launch_name(name);
#endif
  const dim3 grid(unsigned((a.rows + kTile - 1) / kTile), unsigned((b.cols + kTile - 1) / kTile));
  const dim3 block(kTile, kThreadRows);
  PETRA_LAUNCH(sgemm_tiled<epilogue>, grid, block, 0, cuda_detail::stream_of(s))(a, b, bias, c,
                                                                                   b.cols);
  cuda_detail::check_launch(name, __FILE__, __LINE__);
}

// db[o] += sum over b of dy[b, o], in double, b in order.
__global__ void bias_gradient(std::int64_t batch, std::int64_t out, const float* dy, float* db) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t o = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < out;
       o += stride) {
    double sum = 0;
    for (std::int64_t b = 0; b < batch; ++b) sum += double(dy[b * out + o]);
    db[o] = float(double(db[o]) + sum);
  }
}

}  // namespace

// y = x w^T + bias: A = x (batch x in), B(i, o) = w[o, i].
void linear_forward(const StreamHandle& s, const LinearShape& shape, const float* x,
                    const float* w, const float* bias, float* y) {
  const std::int64_t in = shape.in_features, out = shape.out_features;
  const Matrix a{x, shape.batch, in, in, 1}, b{w, in, out, 1, in};
  if (bias != nullptr)
    launch_sgemm<Epilogue::kBias>("linear_forward", s, a, b, bias, y);
  else
    launch_sgemm<Epilogue::kAssign>("linear_forward", s, a, b, nullptr, y);
}

// dx = dy w: A = dy (batch x out), B = w (out x in).
void linear_backward_data(const StreamHandle& s, const LinearShape& shape, const float* dy,
                          const float* w, float* dx) {
  const std::int64_t in = shape.in_features, out = shape.out_features;
  launch_sgemm<Epilogue::kAssign>("linear_backward_data", s, Matrix{dy, shape.batch, out, out, 1},
                                  Matrix{w, out, in, in, 1}, nullptr, dx);
}

// dw += dy^T x: A(o, b) = dy[b, o], B = x (batch x in).
void linear_backward_weight(const StreamHandle& s, const LinearShape& shape, const float* x,
                            const float* dy, float* dw) {
  const std::int64_t in = shape.in_features, out = shape.out_features;
  launch_sgemm<Epilogue::kAccumulate>("linear_backward_weight", s,
                                      Matrix{dy, out, shape.batch, 1, out},
                                      Matrix{x, shape.batch, in, in, 1}, nullptr, dw);
}

void linear_backward_bias(const StreamHandle& s, const LinearShape& shape, const float* dy,
                          float* db) {
  launch_grid_stride("linear_backward_bias", s, shape.out_features, bias_gradient, shape.batch,
                     shape.out_features, dy, db);
}

}  // namespace petra::kernels::cuda

#undef PETRA_UNROLL
