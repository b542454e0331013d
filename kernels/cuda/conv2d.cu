// kernels/cuda/conv2d.cu: the cuda:: 2-d convolution of kernels/conv2d.hpp (forward, backward
// data, backward weight +=, backward bias +=), FP32 (and an optional TF32 forward), hand-written,
// deterministic.
//
// The three products are one shared-memory tiled SGEMM over operands gathered on the fly
// (implicit GEMM: no im2col matrix is materialised; docs/gpu-kernels.md walks from the formula to
// this kernel). conv2d_tiling.cuh has the arithmetic, checked on its own:
//
//   forward          y[o, (b,oh,ow)]  = sum_k w[o, k] * x(k=(c,i,j), (b,oh,ow)) + bias[o]
//                    M = out_channels, N = batch*out_h*out_w, K = in_channels*kh*kw
//   backward data    dx[c, (b,h,w)]   = sum_k w[o, c, i, j] * dy(k=(o,i,j), (b,h,w))
//                    M = in_channels, N = batch*in_h*in_w, K = out_channels*kh*kw
//   backward weight  dw[o, (c,i,j)]  += sum_k dy[o, k=(b,oh,ow)] * x((c,i,j), k)
//                    M = out_channels, N = in_channels*kh*kw, K = batch*out_h*out_w
//
// The tiled kernel (implicit_gemm), the same for all three:
//   - one block of 256 threads computes a 64 x 64 tile of C; thread (tx, ty) owns the 4 x 4
//     outputs (ty + 16 r, tx + 16 q) and keeps them in registers (register blocking: each value
//     read from shared memory feeds four multiply-adds);
//   - K is walked in steps of 16: the block gathers the 64 x 16 tile of A and the 16 x 64 tile of B
//     into shared memory (4 values each per thread; a value in the zero padding, past a tail, or
//     reached through no output is stored as 0, so the tails of M, N and K and the borders need no
//     special path), __syncthreads, multiplies out of shared memory, __syncthreads before the next
//     gather overwrites the tiles. Each gathered value is used 64 times, against once per
//     multiply-add in the naive one-thread-per-output kernel;
//   - a thread's A rows and its B column stay the same for the whole K loop, so their index
//     decomposition (which sample, which output or input pixel, which channel) is done once; per
//     step only the K index is decomposed;
//   - the gather is a problem type (ForwardProblem, DataProblem, WeightProblem) with row(m),
//     column(n), a(row, k), b(column, k), store(m, n, value, slice) and its K range per slice:
//     the tiling is written once.
// Backward data is the gather form of the transposed convolution: dx[b, c, h, w] sums over the
// taps (o, i, j) whose output position oh = (h + pad - i) / stride is an integer inside the output
// (output_coordinate). Every dx is written by exactly one thread: no atomics. For stride 2 three
// taps in four find no output and are gathered as zeros (the cost of keeping one kernel).
//
// Backward weight sums over K = batch*out_h*out_w, long while M x N is small (64 x 576 for a
// 64-channel 3x3 layer: nine tiles for a whole GPU). Split-K: K is cut into S fixed slices
// (conv2d_tiling::weight_split_slices, a function of the shape only), grid.z = slice; block z
// writes its tile's partial sums to scratch (s.scratch(), S * weight_size floats, at most 64 MiB),
// then sum_weight_partials adds, for each dw element, dw and its S partials in slice order in
// double and rounds once. With S = 1 the tile adds into dw directly.
//
// The TF32 path (forward only, when set_conv2d_math(Conv2dMath::tf32)): implicit_gemm_tf32, the
// same gather into the same shared tiles, but each of the 8 warps multiplies its 16 x 32 piece of
// the tile on the tensor cores (WMMA m16n16k8, precision::tf32: inputs rounded to a 10-bit
// mantissa, FP32 accumulation), and the finished tile goes through shared memory to the same
// stores. The WMMA calls are confined to one small struct, WarpTileTf32; under the emulation (and
// below sm_80) its twin does the same math lane by lane: fmaf(tf32_round(a), tf32_round(b), acc).
//
// The bias gradient: one block per out-channel (block-stride over channels) adds its batch*plane
// values in double, each thread a fixed stride of them, then cuda_detail::block_sum's fixed tree.
//
// Deterministic: every output is summed by one thread, k in increasing order; the slices, the
// blocks' partition of a bias sum and every addition order depend on the shape only, never on the
// grid or on scheduling. No floating-point atomics. Results agree with ref:: (double) to the float
// rounding of a K-term sum (nvcc contracts the multiply-adds to FMAs; the emulation does not).
//
// Never run on a GPU yet: checked under the CUDA emulation only (emulated-conv2d), against ref::.
// cuDNN would be faster; it is deliberately not used here (the emulation cannot run it, and its
// fastest algorithms are not deterministic). Global loads are scalar (the gathers have no
// alignment to vectorise on), so no pointer alignment is assumed.
#include <algorithm>
#include <atomic>
#include <cstdint>

#include "petra/kernels/conv2d.hpp"
#include "petra/kernels/cuda/block_reduce.cuh"
#include "petra/kernels/cuda/conv2d_tiling.cuh"
#include "petra/kernels/cuda/launch.cuh"

#ifdef __CUDACC__
#include <mma.h>  // WMMA, for the TF32 path
#endif

// nvcc unrolls the fixed-count loops; the host compiler of the emulation does not know the pragma.
#ifdef __CUDACC__
#define PETRA_UNROLL _Pragma("unroll")
#else
#define PETRA_UNROLL
#endif

namespace petra::kernels::cuda {
namespace {

namespace tiling = conv2d_tiling;
using tiling::ConvGeometry;
using tiling::kLoads;
using tiling::kMicro;
using tiling::kThreads;
using tiling::kTileK;
using tiling::kTileM;
using tiling::kTileN;
using tiling::Tap;

// ---- the three problems: how A and B are gathered and C is stored ----------------------------

// y = w . im2col(x) + bias. A = w as (out_channels) x (in_channels*kh*kw), row-major.
struct ForwardProblem {
  ConvGeometry g;
  const float* x;
  const float* w;
  const float* bias;  // may be null
  float* y;

  struct Row {
    std::int64_t w_row;  // offset of the weight row
  };
  struct Column {
    tiling::OutputPixel pixel;
  };
  __device__ std::int64_t rows() const { return g.out_channels; }
  __device__ std::int64_t columns() const { return g.batch * g.out_plane(); }
  __device__ std::int64_t depth() const { return g.in_channels * g.taps(); }
  __device__ std::int64_t k_begin(unsigned /*slice*/) const { return 0; }
  __device__ std::int64_t k_end(unsigned /*slice*/) const { return depth(); }
  __device__ Row row(std::int64_t m) const { return {m * depth()}; }
  __device__ Column column(std::int64_t n) const { return {tiling::output_pixel(g, n)}; }
  __device__ float a(const Row& r, std::int64_t k) const { return w[r.w_row + k]; }
  __device__ float b(const Column& c, std::int64_t k) const {
    const std::int64_t at = tiling::input_offset(g, c.pixel, tiling::split_tap(k, g.kernel_h, g.kernel_w));
    return at >= 0 ? x[at] : 0.0f;
  }
  __device__ void store(std::int64_t m, std::int64_t n, float value, unsigned /*slice*/) const {
    const std::int64_t plane = g.out_plane();
    const std::int64_t b = tiling::quotient(n, plane);
    y[(b * g.out_channels + m) * plane + (n - b * plane)] = bias != nullptr ? value + bias[m] : value;
  }
};

// dx = w^T . gather(dy). A(c, (o,i,j)) = w[o, c, i, j].
struct DataProblem {
  ConvGeometry g;
  const float* dy;
  const float* w;
  float* dx;

  struct Row {
    std::int64_t w_channel;  // c * kh * kw: the in-channel's offset inside a weight row
  };
  struct Column {
    tiling::InputPixel pixel;
  };
  __device__ std::int64_t rows() const { return g.in_channels; }
  __device__ std::int64_t columns() const { return g.batch * g.in_plane(); }
  __device__ std::int64_t depth() const { return g.out_channels * g.taps(); }
  __device__ std::int64_t k_begin(unsigned /*slice*/) const { return 0; }
  __device__ std::int64_t k_end(unsigned /*slice*/) const { return depth(); }
  __device__ Row row(std::int64_t m) const { return {m * g.taps()}; }
  __device__ Column column(std::int64_t n) const { return {tiling::input_pixel(g, n)}; }
  __device__ float a(const Row& r, std::int64_t k) const {
    const std::int64_t taps = g.taps();
    const std::int64_t o = tiling::quotient(k, taps);
    return w[o * g.in_channels * taps + r.w_channel + (k - o * taps)];
  }
  __device__ float b(const Column& c, std::int64_t k) const {
    const std::int64_t at = tiling::output_offset(g, c.pixel, tiling::split_tap(k, g.kernel_h, g.kernel_w));
    return at >= 0 ? dy[at] : 0.0f;
  }
  __device__ void store(std::int64_t m, std::int64_t n, float value, unsigned /*slice*/) const {
    const std::int64_t plane = g.in_plane();
    const std::int64_t b = tiling::quotient(n, plane);
    dx[(b * g.in_channels + m) * plane + (n - b * plane)] = value;
  }
};

// dw += dy . im2col(x)^T over K slice blockIdx.z. A(o, (b,oh,ow)) = dy[b, o, oh, ow].
struct WeightProblem {
  ConvGeometry g;
  const float* x;
  const float* dy;
  float* dw;        // the single-slice destination (+=)
  float* partials;  // [slice][out_channels][in_channels*kh*kw] when there are several slices
  tiling::SplitK split;

  struct Row {
    std::int64_t dy_channel;  // o * out_h * out_w
  };
  struct Column {
    Tap tap;
  };
  __device__ std::int64_t rows() const { return g.out_channels; }
  __device__ std::int64_t columns() const { return g.in_channels * g.taps(); }
  // K = batch*out_h*out_w, the part of it in slice blockIdx.z.
  __device__ std::int64_t k_begin(unsigned slice) const { return split.begin(slice); }
  __device__ std::int64_t k_end(unsigned slice) const { return split.end(slice); }
  __device__ Row row(std::int64_t m) const { return {m * g.out_plane()}; }
  __device__ Column column(std::int64_t n) const { return {tiling::split_tap(n, g.kernel_h, g.kernel_w)}; }
  __device__ float a(const Row& r, std::int64_t k) const {
    const std::int64_t plane = g.out_plane();
    const std::int64_t b = tiling::quotient(k, plane);
    return dy[b * g.out_channels * plane + r.dy_channel + (k - b * plane)];
  }
  __device__ float b(const Column& c, std::int64_t k) const {
    const std::int64_t at = tiling::input_offset(g, tiling::output_pixel(g, k), c.tap);
    return at >= 0 ? x[at] : 0.0f;
  }
  __device__ void store(std::int64_t m, std::int64_t n, float value, unsigned slice) const {
    const std::int64_t index = m * columns() + n;
    if (partials == nullptr)
      dw[index] += value;
    else
      partials[std::int64_t(slice) * rows() * columns() + index] = value;
  }
};

// ---- the tiled implicit GEMM ------------------------------------------------------------------

// One thread's part of gathering the tiles: the 4 A rows and the B column it loads, decomposed
// once (conv2d_tiling::a_load, b_load), and the load of one K step into the shared tiles.
template <class Problem>
struct TileGather {
  typename Problem::Row rows[kLoads];
  bool row_valid[kLoads];
  typename Problem::Column column;
  bool column_valid;

  __device__ TileGather(const Problem& p, int t, std::int64_t m0, std::int64_t n0) {
PETRA_UNROLL
    for (int q = 0; q < kLoads; ++q) {
      const std::int64_t m = m0 + tiling::a_load(t, q).mn;
      row_valid[q] = m < p.rows();
      rows[q] = p.row(row_valid[q] ? m : 0);
    }
    const std::int64_t n = n0 + tiling::b_load(t, 0).mn;  // the same for every q
    column_valid = n < p.columns();
    column = p.column(column_valid ? n : 0);
  }

  // a_tile[k][m] = A(m0 + m, k0 + k), b_tile[k][n] = B(k0 + k, n0 + n), 0 outside [.., k_end).
  __device__ void load(const Problem& p, int t, std::int64_t k0, std::int64_t k_end,
                       float (*a_tile)[tiling::kTileLd], float (*b_tile)[tiling::kTileLd]) const {
PETRA_UNROLL
    for (int q = 0; q < kLoads; ++q) {
      const tiling::TileCoordinate at = tiling::a_load(t, q);
      const std::int64_t k = k0 + at.k;
      a_tile[at.k][at.mn] = row_valid[q] && k < k_end ? p.a(rows[q], k) : 0.0f;
    }
PETRA_UNROLL
    for (int q = 0; q < kLoads; ++q) {
      const tiling::TileCoordinate at = tiling::b_load(t, q);
      const std::int64_t k = k0 + at.k;
      b_tile[at.k][at.mn] = column_valid && k < k_end ? p.b(column, k) : 0.0f;
    }
  }
};

// C tile (blockIdx.y, blockIdx.x) of `p`, over K slice blockIdx.z. Block: kThreads threads (1-d).
template <class Problem>
__global__ void __launch_bounds__(kThreads) implicit_gemm(Problem p) {
  // a_tile[k][m] (A transposed) and b_tile[k][n]: in the inner loop a half-warp reads two a_tile
  // values (broadcast) and 16 consecutive b_tile values. Rows padded to kTileLd.
  __shared__ __align__(32) float a_tile[kTileK][tiling::kTileLd];
  __shared__ __align__(32) float b_tile[kTileK][tiling::kTileLd];
  const int t = int(threadIdx.x);
  const std::int64_t m0 = std::int64_t(blockIdx.y) * kTileM, n0 = std::int64_t(blockIdx.x) * kTileN;
  const std::int64_t k_begin = p.k_begin(blockIdx.z), k_end = p.k_end(blockIdx.z);
  const TileGather<Problem> gather(p, t, m0, n0);

  float acc[kMicro][kMicro] = {};
  for (std::int64_t k0 = k_begin; k0 < k_end; k0 += kTileK) {
    gather.load(p, t, k0, k_end, a_tile, b_tile);
    __syncthreads();
PETRA_UNROLL
    for (int k = 0; k < kTileK; ++k) {
      float av[kMicro], bv[kMicro];
PETRA_UNROLL
      for (int r = 0; r < kMicro; ++r) av[r] = a_tile[k][tiling::micro_row(t, r)];
PETRA_UNROLL
      for (int q = 0; q < kMicro; ++q) bv[q] = b_tile[k][tiling::micro_column(t, q)];
PETRA_UNROLL
      for (int r = 0; r < kMicro; ++r)
PETRA_UNROLL
        for (int q = 0; q < kMicro; ++q) acc[r][q] += av[r] * bv[q];
    }
    __syncthreads();
  }
  const std::int64_t rows = p.rows(), columns = p.columns();
PETRA_UNROLL
  for (int r = 0; r < kMicro; ++r) {
    const std::int64_t m = m0 + tiling::micro_row(t, r);
    if (m >= rows) continue;
PETRA_UNROLL
    for (int q = 0; q < kMicro; ++q) {
      const std::int64_t n = n0 + tiling::micro_column(t, q);
      if (n < columns) p.store(m, n, acc[r][q], blockIdx.z);
    }
  }
}

// ---- the TF32 path: the same tiles, multiplied by the tensor cores -----------------------------

// A warp's 16 x 32 piece of the block's C tile (rows wm.., columns wn..): zero(), mma() adds
// A(wm.., 0..kTileK) B(0..kTileK, wn..) from the shared tiles with TF32 inputs and FP32
// accumulation, store() writes it to c_tile[m][n]. Every lane of the warp calls each (they are
// warp-collective). The only code that touches WMMA; below sm_80 and under the emulation it is the
// twin after it.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
struct WarpTileTf32 {
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 8, float> c[2];

  __device__ void zero() {
    nvcuda::wmma::fill_fragment(c[0], 0.0f);
    nvcuda::wmma::fill_fragment(c[1], 0.0f);
  }
  __device__ void mma(const float (*a_tile)[tiling::kTileLd], const float (*b_tile)[tiling::kTileLd],
                      int wm, int wn) {
    namespace wmma = nvcuda::wmma;
PETRA_UNROLL
    for (int k = 0; k < kTileK; k += 8) {
      // A(m, k) is a_tile[k][m]: column-major with leading dimension kTileLd.
      wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::col_major> a;
      wmma::load_matrix_sync(a, &a_tile[k][wm], tiling::kTileLd);
PETRA_UNROLL
      for (int i = 0; i < a.num_elements; ++i) a.x[i] = wmma::__float_to_tf32(a.x[i]);
PETRA_UNROLL
      for (int f = 0; f < 2; ++f) {
        wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> b;
        wmma::load_matrix_sync(b, &b_tile[k][wn + 16 * f], tiling::kTileLd);
PETRA_UNROLL
        for (int i = 0; i < b.num_elements; ++i) b.x[i] = wmma::__float_to_tf32(b.x[i]);
        wmma::mma_sync(c[f], a, b, c[f]);
      }
    }
  }
  __device__ void store(float (*c_tile)[tiling::kTileLd], int wm, int wn) const {
    for (int f = 0; f < 2; ++f)
      nvcuda::wmma::store_matrix_sync(&c_tile[wm][wn + 16 * f], c[f], tiling::kTileLd,
                                      nvcuda::wmma::mem_row_major);
  }
};
#else
// The emulated twin (also valid CUDA): lane l owns elements e = l + 32 i (row e / 16, column
// e % 16) of each 16 x 16 accumulator and adds, k in order, fmaf(tf32(A), tf32(B), acc): TF32
// inputs, FP32 accumulation. The tensor cores' internal order of a k8 step is not specified, so a
// GPU's bits may differ from these; the emulated test holds the twin to a host model bit for bit
// and both to ref:: within TF32's error.
struct WarpTileTf32 {
  float c[2][8];

  __device__ void zero() {
    for (int f = 0; f < 2; ++f)
      for (int i = 0; i < 8; ++i) c[f][i] = 0.0f;
  }
  __device__ void mma(const float (*a_tile)[tiling::kTileLd], const float (*b_tile)[tiling::kTileLd],
                      int wm, int wn) {
    __syncwarp();
    const int lane = int(threadIdx.x) % 32;
    for (int f = 0; f < 2; ++f)
      for (int i = 0; i < 8; ++i) {
        const int e = lane + 32 * i, row = e / 16, column = e % 16;
        float v = c[f][i];
        for (int k = 0; k < kTileK; ++k)
          v = fmaf(tiling::tf32_round(a_tile[k][wm + row]), tiling::tf32_round(b_tile[k][wn + 16 * f + column]), v);
        c[f][i] = v;
      }
    __syncwarp();
  }
  __device__ void store(float (*c_tile)[tiling::kTileLd], int wm, int wn) const {
    const int lane = int(threadIdx.x) % 32;
    for (int f = 0; f < 2; ++f)
      for (int i = 0; i < 8; ++i) {
        const int e = lane + 32 * i;
        c_tile[wm + e / 16][wn + 16 * f + e % 16] = c[f][i];
      }
    __syncwarp();
  }
};
#endif

// implicit_gemm with the multiply on the tensor cores: the same gather into the same shared
// tiles; each warp accumulates its 16 x 32 piece in WMMA fragments; at the end the block's C tile
// goes through shared memory (the fragments' layout is opaque) to the same per-thread stores.
// Deterministic too: a fixed sequence of mma_sync per warp. Used for the forward only.
template <class Problem>
__global__ void __launch_bounds__(kThreads) implicit_gemm_tf32(Problem p) {
  __shared__ __align__(32) float a_tile[kTileK][tiling::kTileLd];
  __shared__ __align__(32) float b_tile[kTileK][tiling::kTileLd];
  __shared__ __align__(32) float c_tile[kTileM][tiling::kTileLd];
  const int t = int(threadIdx.x), warp = t / 32;
  const int wm = tiling::warp_row(warp), wn = tiling::warp_column(warp);
  const std::int64_t m0 = std::int64_t(blockIdx.y) * kTileM, n0 = std::int64_t(blockIdx.x) * kTileN;
  const std::int64_t k_begin = p.k_begin(blockIdx.z), k_end = p.k_end(blockIdx.z);
  const TileGather<Problem> gather(p, t, m0, n0);

  WarpTileTf32 acc;
  acc.zero();
  for (std::int64_t k0 = k_begin; k0 < k_end; k0 += kTileK) {
    gather.load(p, t, k0, k_end, a_tile, b_tile);
    __syncthreads();
    acc.mma(a_tile, b_tile, wm, wn);
    __syncthreads();
  }
  acc.store(c_tile, wm, wn);
  __syncthreads();
  const std::int64_t rows = p.rows(), columns = p.columns();
PETRA_UNROLL
  for (int r = 0; r < kMicro; ++r) {
    const int mt = tiling::micro_row(t, r);
    if (m0 + mt >= rows) continue;
PETRA_UNROLL
    for (int q = 0; q < kMicro; ++q) {
      const int nt = tiling::micro_column(t, q);
      if (n0 + nt < columns) p.store(m0 + mt, n0 + nt, c_tile[mt][nt], blockIdx.z);
    }
  }
}

template <class Problem>
void launch_gemm(const char* name, const StreamHandle& s, void (*kernel)(Problem), const Problem& p,
                 std::int64_t rows, std::int64_t columns, std::int64_t slices) {
  cuda_detail::DeviceGuard guard(s.device_index);
#ifdef PETRA_CUDA_EMULATION
  const ::petra::cuda_emulation::LaunchName launch_name(name);
#endif
  const dim3 grid(unsigned(tiling::ceil_div(columns, kTileN)), unsigned(tiling::ceil_div(rows, kTileM)),
                  unsigned(slices));
  PETRA_LAUNCH(kernel, grid, kThreads, 0, cuda_detail::stream_of(s))(p);
  cuda_detail::check_launch(name, __FILE__, __LINE__);
}

// dw[e] = dw[e] + (partials[0][e] + ... + partials[slices-1][e]), in double, slices in order.
__global__ void sum_weight_partials(std::int64_t size, std::int64_t slices, const float* partials,
                                    float* dw) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < size; e += stride) {
    double sum = 0;
    for (std::int64_t slice = 0; slice < slices; ++slice) sum += double(partials[slice * size + e]);
    dw[e] = float(double(dw[e]) + sum);
  }
}

// db[o] += the sum of dy[b, o, :, :] over b, one block per channel (block-stride). Thread t adds
// the values t, t + 256, ... of each (b, o) plane in double, then the block's fixed tree.
__global__ void __launch_bounds__(cuda_detail::kBlockThreads)
    bias_gradient(std::int64_t batch, std::int64_t channels, std::int64_t plane, const float* dy,
                  float* db) {
  for (std::int64_t o = blockIdx.x; o < channels; o += gridDim.x) {
    double sum = 0;
    for (std::int64_t b = 0; b < batch; ++b) {
      const float* row = dy + (b * channels + o) * plane;
      for (std::int64_t i = threadIdx.x; i < plane; i += cuda_detail::kBlockThreads) sum += double(row[i]);
    }
    const double total = cuda_detail::block_sum(sum);
    if (threadIdx.x == 0) db[o] = float(double(db[o]) + total);
  }
}

// The math of conv2d_forward (set_conv2d_math): process-wide, FP32 unless asked.
std::atomic<int> forward_math{int(Conv2dMath::fp32)};

}  // namespace

void set_conv2d_math(Conv2dMath math) { forward_math.store(int(math)); }
Conv2dMath conv2d_math() { return Conv2dMath(forward_math.load()); }

void conv2d_forward(const StreamHandle& s, const Conv2dShape& shape, const float* x,
                    const float* w, const float* bias, float* y) {
  if (shape.output_size() <= 0) return;
  const ForwardProblem p{ConvGeometry::of(shape), x, w, bias, y};
  const std::int64_t columns = shape.batch * shape.out_h() * shape.out_w();
  if (conv2d_math() == Conv2dMath::tf32)
    launch_gemm("conv2d_forward_tf32", s, implicit_gemm_tf32<ForwardProblem>, p, shape.out_channels, columns, 1);
  else
    launch_gemm("conv2d_forward", s, implicit_gemm<ForwardProblem>, p, shape.out_channels, columns, 1);
}

void conv2d_backward_data(const StreamHandle& s, const Conv2dShape& shape, const float* dy,
                          const float* w, float* dx) {
  if (shape.input_size() <= 0) return;
  const DataProblem p{ConvGeometry::of(shape), dy, w, dx};
  launch_gemm("conv2d_backward_data", s, implicit_gemm<DataProblem>, p, shape.in_channels, shape.batch * shape.in_h * shape.in_w, 1);
}

void conv2d_backward_weight_split(const StreamHandle& s, const Conv2dShape& shape, const float* x,
                                  const float* dy, float* dw, std::int64_t slices) {
  const std::int64_t depth = shape.batch * shape.out_h() * shape.out_w();
  const std::int64_t size = shape.weight_size();
  if (size <= 0 || depth <= 0) return;  // dw += 0
  const tiling::SplitK split = tiling::split_k(depth, slices);
  float* partials =
      split.slices > 1 ? static_cast<float*>(s.scratch(std::size_t(split.slices * size) * sizeof(float))) : nullptr;
  const WeightProblem p{ConvGeometry::of(shape), x, dy, dw, partials, split};
  launch_gemm("conv2d_backward_weight", s, implicit_gemm<WeightProblem>, p, shape.out_channels,
              shape.in_channels * shape.kernel_h * shape.kernel_w, split.slices);
  if (partials != nullptr)
    cuda_detail::launch_grid_stride("conv2d_backward_weight_sum", s, size, sum_weight_partials, size,
                                    split.slices, partials, dw);
}

void conv2d_backward_weight(const StreamHandle& s, const Conv2dShape& shape, const float* x,
                            const float* dy, float* dw) {
  conv2d_backward_weight_split(s, shape, x, dy, dw, tiling::weight_split_slices(shape));
}

void conv2d_backward_bias(const StreamHandle& s, const Conv2dShape& shape, const float* dy,
                          float* db) {
  if (shape.out_channels <= 0) return;
  cuda_detail::DeviceGuard guard(s.device_index);
#ifdef PETRA_CUDA_EMULATION
  const ::petra::cuda_emulation::LaunchName launch_name("conv2d_backward_bias");
#endif
  PETRA_LAUNCH(bias_gradient, cuda_detail::block_stride_blocks(shape.out_channels), cuda_detail::kBlockThreads, 0,
               cuda_detail::stream_of(s))(shape.batch, shape.out_channels, shape.out_h() * shape.out_w(), dy, db);
  cuda_detail::check_launch("conv2d_backward_bias", __FILE__, __LINE__);
}

}  // namespace petra::kernels::cuda

#undef PETRA_UNROLL
