// kernels/cuda/conv2d.cu: the cuda:: 2-d convolution of kernels/conv2d.hpp (forward, backward
// data, backward weight +=, backward bias +=), FP32 (and, optionally, TF32 on the tensor cores for
// the three products), hand-written, deterministic.
//
// The three products are one shared-memory tiled SGEMM over operands gathered on the fly
// (implicit GEMM: no im2col matrix is materialised; docs/gpu-kernels.md walks from the formula to
// this kernel). conv2d_tiling.cuh has the arithmetic, checked on its own:
//
//   forward          y[o, (b,oh,ow)]  = sum_k w[o, k] * x(k=(c,i,j), (b,oh,ow)) + bias[o]
//                    M = out_channels, N = batch*out_h*out_w, K = in_channels*kh*kw
//   backward data    dx[c, (b,h,w)]   = sum_k w[o, c, i, j] * dy(k=(o,i,j), (b,h,w))
//                    M = in_channels, N = batch*in_h*in_w, K = out_channels*kh*kw (per stride
//                    class, below: N and K of the class's pixels and taps)
//   backward weight  dw[o, (c,i,j)]  += sum_k dy[o, k=(b,oh,ow)] * x((c,i,j), k)
//                    M = out_channels, N = in_channels*kh*kw, K = batch*out_h*out_w
//
// The tiled kernel (implicit_gemm), the same for all three:
//   - one block of 256 threads computes an M x N tile of C, M and N each 64 or 128
//     (conv2d_tiling::TileShape; choose_tile picks one per pass and shape, as measured);
//     thread (tx, ty) owns M/16 x N/16 outputs (4 x 4 to 8 x 8: rows 4 ty.. and, in a 128-row
//     tile, 64 + 4 ty..; columns likewise) and keeps them in registers (register blocking: each
//     value read from shared memory feeds 4 to 8 multiply-adds; a thread's A and B values of a k
//     are float4 loads);
//   - K is walked in steps of 16: the block gathers the M x 16 tile of A and the 16 x N tile of B
//     into shared memory (M/16 and N/16 values per thread; a value in the zero padding, past a tail, or
//     reached through no output is stored as 0, so the tails of M, N and K and the borders need no
//     special path) and multiplies out of shared memory. Each gathered value is used 64 or 128
//     times, against once per multiply-add in the naive one-thread-per-output kernel;
//   - a thread's A rows and its B column stay the same for the whole K loop, so their index
//     decomposition (which sample, which output or input pixel, which channel) is done once; the
//     K index's decomposition (which channel and tap, or which pixel) is done once per step for
//     the whole block: threads 0..15 write the step's 16 entries into a table in shared memory
//     (write_k_step, KEntry; each thread advances its index's digits by 16 from one step to
//     the next instead of dividing again), and each gather is then an add and a bounds check (two
//     bit tests against a pixel's masks of taps inside: conv2d_tiling::bits_meet), in 32-bit
//     offsets (a batch whose tensors reach 2^31 elements runs in several launches);
//   - a pipeline of asynchronous copies (cp.async, k_loop): the shared tiles have 2 or 3 stages;
//     while the block multiplies step i out of one, the copies of the next one or two steps are in
//     flight into the others, with one barrier per step and no register holding a gathered value;
//   - the epilogue decomposes each of a thread's output columns and rows once (store_column,
//     store_row), not each output, and stores a group of 4 (FP32) or 2 (TF32) outputs that are
//     consecutive in memory as one float4 / float2 (store_outputs);
//   - the gather is a problem type (ForwardProblem, DataProblem, WeightProblem, and below the
//     TF32 path's channels-last problems and Winograd's) with row(m), column(n), k_radix /
//     k_entry_at, a_offset / b_offset / b_inside, store_column / store_row / store and its K range
//     per slice: the tiling is written once.
// Backward data is the gather form of the transposed convolution: dx[b, c, h, w] sums over the
// taps (o, i, j) whose output position oh = (h + pad - i) / stride is an integer inside the output.
// Every dx is written by exactly one thread: no atomics. For strides > 1 the input pixels are
// grouped by stride class (conv2d_tiling::stride_class; grid.z = the class): the pixels of a class
// all read through the same taps, so its K holds only those (a 3x3 stride-2 layer sums 4, 2, 2 or
// 1 taps per pixel instead of 9 of which three in four were zeros, and needs no division).
//
// Backward weight sums over K = batch*out_h*out_w, long while M x N is small (64 x 576 for a
// 64-channel 3x3 layer: nine tiles for a whole GPU). Split-K: K is cut into S fixed slices
// (conv2d_tiling::weight_split_slices, a function of the shape only), grid.z = slice; block z
// writes its tile's partial sums to scratch (s.scratch(), S * weight_size floats, at most 64 MiB),
// then sum_weight_partials adds, for each dw element, dw and its S partials in slice order in
// double and rounds once. With S = 1 the tile adds into dw directly. (The TF32 path's copy of x,
// ChannelsLastWeightProblem, takes up to 64 MiB more scratch, before the partials.)
//
// The TF32 path (all three passes, when set_conv2d_math(Conv2dMath::tf32)): implicit_gemm_tf32, the
// same gather into shared tiles of the same sizes (choose_tile's) but laid out for the tensor cores
// (conv2d_tiling's Tf32Tile): A in rows of 16 k, each row pair's values in the mma's operand
// order (TileShape::a_row), B's rows in tf32_b_row's order and its columns in tf32_b_slot's. Where
// A's rows are contiguous in k and aligned (the forward's weights, the weight gradient's dy and,
// through a copy laid out by k, backward data's weights), A comes in 16-byte copies of four k (a
// quarter of the copies). Each thread rounds the values it copied to TF32 in the tile, once, after
// they land (tf32_operand: half a unit added to the bits, the tensor cores
// truncating the rest); each of the 8 warps multiplies its piece of the tile (16 x 32 to 32 x 64,
// conv2d_tiling::WarpLayout) on the tensor cores (mma.m16n8k8 .tf32, FP32 accumulation; a lane's
// four A operands of a k8 step one 16-byte load, the step taking 8 of the K step's 16 k,
// tf32_step_k; B's fragments of four columns one 16-byte load), then stores its accumulators from
// the registers.
// Under TF32 the forward (in_channels % 4 == 0) and backward data (out_channels % 4 == 0) read
// channels-last copies instead (ChannelsLastForwardProblem, ChannelsLastDataProblem; two more
// launches per call, set_conv2d_channels_last): the product transposed, M the pixels, so that the
// gathered operand is A with four channels of a tap in one 16-byte copy, and the weights (laid
// out by tap and rounded to TF32 as they are copied) B, in 16-byte copies too.
// The tensor-core instructions are confined to one small struct, WarpTileTf32; under the emulation
// (and below sm_80) its twin does the same math element by element: fmaf(a, b, acc) over k in
// order, a and b as the tiles hold them (rounded).
//
// The bias gradient: blocks of (out-channel, slice) add fixed strided parts of the channel's
// batch*plane values in double (each with cuda_detail::block_sum's fixed tree), and one warp per
// channel adds its slices' partials (a fixed tree; the slices depend on the shape only). The
// blocks read float4s where the plane is a multiple of 4 and dy is 16-byte aligned, which changes
// how the values are shared among the threads: an aligned dy and a misaligned view of the same
// values may then differ in the last bit of db.
//
// Deterministic: every output is summed by one thread, k in increasing order; the slices, the
// blocks' partition of a bias sum and every addition order depend on the shape (and, for the bias,
// dy's alignment) only, never on the grid, the tile or on scheduling. No floating-point atomics.
// Results agree with ref:: (double) to the float rounding of a K-term sum (nvcc contracts the
// multiply-adds to FMAs; the emulation does not).
//
// Checked under the CUDA emulation (emulated-conv2d) and on an H200 (test-cuda), against ref::;
// docs/results-gpu.md has its speed against cuDNN.
// cuDNN's convolution is the alternative chosen at run time (--conv-impl cudnn,
// kernels/cuda/cudnn_conv2d.cpp), not a part of this file (the emulation cannot run it). The
// convolution's global loads are scalar (the gathers have no alignment to vectorise on), so they
// assume no pointer alignment; the bias gradient checks dy's before it reads float4s.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "petra/error.hpp"
#include "petra/kernels/conv2d.hpp"
#include "petra/kernels/cuda/block_reduce.cuh"
#include "petra/kernels/cuda/conv2d_tiling.cuh"
#include "petra/kernels/cuda/fast_divide.cuh"
#include "petra/kernels/cuda/lanes.cuh"
#include "petra/kernels/cuda/launch.cuh"


// nvcc unrolls the fixed-count loops; the host compiler of the emulation does not know the pragma.
#ifdef __CUDACC__
#define PETRA_UNROLL _Pragma("unroll")
#define PETRA_NO_UNROLL _Pragma("unroll 1")
#else
#define PETRA_UNROLL
#define PETRA_NO_UNROLL
#endif

namespace petra::kernels::cuda {
namespace {

namespace tiling = conv2d_tiling;
using tiling::ConvGeometry;
using tiling::kThreads;
using tiling::Tap;

// ---- the three problems: how A and B are gathered and C is stored ----------------------------
//
// Each problem splits its gather in two. k_entry_at(k, digits) gives what one index k of the summed
// dimension contributes to the offsets, from its digits (k_radix: (channel, tap row, tap column)
// or (sample, row, column)): the block computes it once per k per step, 16 threads for the step's
// 16 k, into a table in shared memory (write_k_step, which moves the digits on by 16 a step). A value
// of A is then a_data()[a_offset(row, e)], one of B b_data()[b_offset(column, e)] where
// b_inside(column, e) (else the zero padding): two bit tests (tiling::bits_meet); a thread's rows and
// column are decomposed once, before the K loop. (Before the table each of the 256 threads
// decomposed each of its 8 values' k again: integer work that outweighed the multiply-adds, so the
// FP32 and TF32 kernels ran at the same ~11 TFLOP/s on an H200.)
//
// Offsets and coordinates in the K loop are 32-bit (Index): every tensor of a launch has fewer
// than 2^31 elements (the host splits a larger batch, conv2d_forward and the others below). In
// 64 bits each gathered value took twice the integer instructions, and the registers they needed
// made nvcc recompute the rows' offsets inside the loop (Nsight Compute's source view, run 9).
using Index = std::int32_t;
struct alignas(16) KEntry {  // 16-byte aligned: one 128-bit shared load per entry
  Index a, b;                  // offsets, problem-specific (see each k_entry_at)
  std::uint32_t h, w;  // k's side of the bounds check (Problem::b_inside): tap bits, or biased coordinates
};

// 0 <= v < extent, in one comparison (extent < 2^31).
__device__ inline bool inside(Index v, std::int64_t extent) { return std::uint32_t(v) < std::uint32_t(extent); }


// Where the forward's outputs go, as both forward problems store them: y[b, o, pixel] is a
// pixel's part (decomposed once per pixel, not per output) plus a channel's (with its bias).
struct YPixel {
  Index y_offset;  // b * out_channels * plane + pixel
};
struct YChannel {
  Index y_offset;  // o * plane
  float bias;      // bias[o], or 0 without a bias
};
__device__ inline YPixel y_pixel(const ConvGeometry& g, std::int64_t n) {  // n = (b, pixel)
  const std::int64_t plane = g.out_plane();
  const std::int64_t b = tiling::quotient(n, plane);
  return {Index(b * g.out_channels * plane + (n - b * plane))};
}
__device__ inline YChannel y_channel(const ConvGeometry& g, const float* bias, std::int64_t o) {
  return {Index(o * g.out_plane()), bias != nullptr ? bias[o] : 0.0f};
}
__device__ inline void store_y(float* y, const float* bias, const YChannel& c, const YPixel& p, float value) {
  y[c.y_offset + p.y_offset] = bias != nullptr ? value + c.bias : value;
}

// y = w . im2col(x) + bias. A = w as (out_channels) x (in_channels*kh*kw), row-major.
struct ForwardProblem {
  static constexpr tiling::ConvPass kPass = tiling::ConvPass::forward;
  ConvGeometry g;
  const float* x;
  const float* w;
  const float* bias;  // may be null
  float* y;

  struct Row {
    Index w_row;  // offset of the weight row
  };
  struct Column {
    Index x_corner;                // offset in x of the pixel's tap (0, 0) in channel 0 (may be padding)
    std::uint32_t taps_h, taps_w;  // the tap rows and columns that land inside x (tiling::taps_inside)
  };
  __device__ ForwardProblem in_slice(unsigned /*z*/) const { return *this; }
  // The same product into `out` (y's layout), without the bias: a K slice's partials (KSliced).
  __device__ ForwardProblem writing_to(float* out) const {
    ForwardProblem q = *this;
    q.y = out;
    q.bias = nullptr;
    return q;
  }
  __device__ std::int64_t rows() const { return g.out_channels; }
  __device__ std::int64_t columns() const { return g.batch * g.out_plane(); }
  __device__ std::int64_t depth() const { return g.in_channels * g.taps(); }
  __device__ std::int64_t k_begin(unsigned /*slice*/) const { return 0; }
  __device__ std::int64_t k_end(unsigned /*slice*/) const { return depth(); }
  __device__ Row row(Index m) const { return {m * Index(depth())}; }
  __device__ Column column(std::int64_t n) const {
    const tiling::OutputPixel o = tiling::output_pixel(g, n);
    return {Index(tiling::corner_offset(g, o)), tiling::taps_inside(Index(o.h0), Index(g.in_h)),
            tiling::taps_inside(Index(o.w0), Index(g.in_w))};
  }
  // k = (c, i, j) (its digits in k_radix): a = k, b = the tap's offset from the corner, the bits
  // of i and j.
  __device__ tiling::Radix k_radix() const { return {std::int32_t(g.kernel_h), std::int32_t(g.kernel_w)}; }
  __device__ KEntry k_entry_at(Index k, const tiling::Digits& d) const {
    return {k, (d.hi * Index(g.in_h) + d.mid) * Index(g.in_w) + d.lo, tiling::tap_bit(d.mid), tiling::tap_bit(d.lo)};
  }
  __device__ const float* a_data() const { return w; }
  __device__ Index a_offset(const Row& r, const KEntry& e) const { return r.w_row + e.a; }
  // A's k of a row are consecutive floats (a weight row), so four of them from a multiple of 4
  // are one 16-byte copy where every row starts aligned (TileGather's kVectorA).
  static constexpr bool kVectorA = true;
  // (the channels-last problems' features; kRoundedA/B also Winograd's)
  static constexpr bool kPaddedA = false, kVectorB = false, kRoundedA = false, kRoundedB = false;
  bool vector_a_allowed() const { return cuda_detail::aligned_16(w) && g.in_channels * g.taps() % 4 == 0; }
  __device__ const float* b_data() const { return x; }
  __device__ bool b_inside(const Column& c, const KEntry& e, bool /*k_inside*/) const {
    return tiling::bits_meet(c.taps_h, e.h, c.taps_w, e.w);
  }
  __device__ Index b_offset(const Column& c, const KEntry& e) const { return c.x_corner + e.b; }
  // y[b, m, pixel] for column n = (b, pixel) and row m
  using StoreColumn = YPixel;
  using StoreRow = YChannel;
  __device__ StoreColumn store_column(std::int64_t n) const { return y_pixel(g, n); }
  __device__ StoreRow store_row(std::int64_t m) const { return y_channel(g, bias, m); }
  __device__ void store(const StoreRow& r, const StoreColumn& c, float value, unsigned /*slice*/) const {
    store_y(y, bias, r, c, value);
  }
  // The vector stores of store_outputs: where an output is (row part + column part), whether the
  // destination of `slice` is aligned for G-float vectors, and G consecutive outputs at once.
  static constexpr bool kVectorStores = true;
  __device__ Index row_offset(const StoreRow& r) const { return r.y_offset; }
  __device__ Index column_offset(const StoreColumn& c) const { return c.y_offset; }
  template <int G>
  __device__ bool vector_aligned(unsigned /*slice*/) const { return cuda_detail::aligned_to<G>(y); }
  template <int G>
  __device__ void store_vector(const StoreRow& r, const StoreColumn& c, const float (&v)[G], unsigned) const {
    float w[G];
    for (int e = 0; e < G; ++e) w[e] = bias != nullptr ? v[e] + r.bias : v[e];
    cuda_detail::store_floats<G>(y + r.y_offset + c.y_offset, w);
  }
};

// The TF32 forward where in_channels % 4 == 0, from channels-last copies (conv2d_forward makes
// them: to_channels_last, weights_by_tap): y^T = im2col(x)^T . w^T, M = the output pixels, N = the
// out-channels, K = (i, j, c) with c fastest. A(pixel, k) = xc[b, h0 + i, w0 + j, c] (xc: x as
// [batch][in_h][in_w][in_channels]), so four consecutive k are four channels of one tap: one
// aligned 16-byte copy, one bounds check (kPaddedA). B(k, o) = wt[k][tf32_b_slot(o)] (rows of
// n_pad floats, o padded with zeros to a multiple of 128, rounded to TF32): 16-byte copies as
// well (kVectorB). In ForwardProblem's form (B = im2col(x), gathered a value at a time, with a
// bounds check each) B's copies were ~130 of the 372 SASS instructions of a 128 x 128 K step.
// The sum runs over k in (i, j, c) order, not (c, i, j): other bits than ForwardProblem's.
struct ChannelsLastForwardProblem {
  static constexpr tiling::ConvPass kPass = tiling::ConvPass::forward;
  ConvGeometry g;
  const float* xc;  // x channels-last
  const float* wt;  // [K][n_pad], rounded to TF32, columns in tf32_b_slot's order
  const float* bias;  // may be null
  float* y;
  Index n_pad;

  struct Row {
    Index corner;                  // where the pixel's tap (0, 0) is in xc, channel 0 (may be padding)
    std::uint32_t taps_h, taps_w;  // the tap rows and columns that land inside x (tiling::taps_inside)
  };
  struct Column {
    Index first;  // the slot of the thread's 16-byte B copies (TileGather, kVectorB)
  };
  __device__ ChannelsLastForwardProblem in_slice(unsigned /*z*/) const { return *this; }
  __device__ ChannelsLastForwardProblem writing_to(float* out) const {  // (ForwardProblem's)
    ChannelsLastForwardProblem q = *this;
    q.y = out;
    q.bias = nullptr;
    return q;
  }
  __device__ std::int64_t rows() const { return g.batch * g.out_plane(); }
  __device__ std::int64_t columns() const { return g.out_channels; }
  __device__ std::int64_t depth() const { return g.in_channels * g.taps(); }
  __device__ std::int64_t k_begin(unsigned /*slice*/) const { return 0; }
  __device__ std::int64_t k_end(unsigned /*slice*/) const { return depth(); }
  __device__ Row row(Index m) const {
    const tiling::Pixel p = tiling::split_pixel(m, g.out_h, g.out_w);
    const Index h0 = Index(p.y * g.stride_h - g.pad_h), w0 = Index(p.x * g.stride_w - g.pad_w);
    return {((Index(p.b) * Index(g.in_h) + h0) * Index(g.in_w) + w0) * Index(g.in_channels),
            tiling::taps_inside(h0, Index(g.in_h)), tiling::taps_inside(w0, Index(g.in_w))};
  }
  __device__ Column column(std::int64_t n) const { return {Index(n)}; }
  // k = (i, j, c) (its digits in k_radix): a = the offset in xc from a corner, b = where wt's row k
  // starts, the bits of i and j.
  __device__ tiling::Radix k_radix() const { return {std::int32_t(g.kernel_w), std::int32_t(g.in_channels)}; }
  __device__ KEntry k_entry_at(Index k, const tiling::Digits& d) const {
    return {(d.hi * Index(g.in_w) + d.mid) * Index(g.in_channels) + d.lo, k * n_pad, tiling::tap_bit(d.hi),
            tiling::tap_bit(d.mid)};
  }
  __device__ const float* a_data() const { return xc; }
  __device__ Index a_offset(const Row& r, const KEntry& e) const { return r.corner + e.a; }
  // (always: conv2d_forward takes this problem where in_channels % 4 == 0, channels_last_applies)
  static constexpr bool kVectorA = true, kPaddedA = true, kVectorB = true, kRoundedA = true, kRoundedB = true;
  __device__ bool a_inside(const Row& r, const KEntry& e) const {
    return tiling::bits_meet(r.taps_h, e.h, r.taps_w, e.w);
  }
  __device__ const float* b_data() const { return wt; }
  // B's 16-byte copies (TileGather, kVectorB): the four slots from the thread's first, c.first, of
  // row k; wt has no padding term (o past out_channels is zeros), so inside wherever k is.
  __device__ bool b_inside(const Column& /*c*/, const KEntry& /*e*/, bool k_inside) const { return k_inside; }
  __device__ Index b_offset(const Column& c, const KEntry& e) const { return e.b + c.first; }
  // y[b, o, pixel] for row m = (b, pixel) and column o (ForwardProblem's, transposed)
  using StoreRow = YPixel;
  using StoreColumn = YChannel;
  __device__ StoreRow store_row(std::int64_t m) const { return y_pixel(g, m); }
  __device__ StoreColumn store_column(std::int64_t o) const { return y_channel(g, bias, o); }
  __device__ void store(const StoreRow& r, const StoreColumn& c, float value, unsigned /*slice*/) const {
    store_y(y, bias, c, r, value);
  }
  static constexpr bool kVectorStores = false;  // a lane's adjacent columns are planes apart in y
};

// Where backward data's outputs go, as both data problems store them: dx[b, c, h, w] is a stride
// class's pixel's part (decomposed once per pixel) plus a channel's.
struct DxPixel {
  Index dx_offset;  // (b * in_channels * in_h + h) * in_w + w
};
struct DxChannel {
  Index dx_offset;  // c * in_h * in_w
};
__device__ inline DxPixel dx_pixel(const ConvGeometry& g, const tiling::StrideClass& class_h,
                                   const tiling::StrideClass& class_w, std::int64_t n) {  // n = the class's (b, h, w)
  const tiling::Pixel p = tiling::split_pixel(n, class_h.count, class_w.count);
  const std::int64_t h = class_h.first + p.y * g.stride_h, w = class_w.first + p.x * g.stride_w;
  return {Index((p.b * g.in_channels * g.in_h + h) * g.in_w + w)};
}
__device__ inline DxChannel dx_channel(const ConvGeometry& g, std::int64_t c) { return {Index(c * g.in_plane())}; }

// dx = w^T . gather(dy) for the input pixels of one stride class (conv2d_tiling::stride_class),
// class blockIdx.z = r_h * stride_w + r_w: N = batch x the class's rows x its columns, K =
// out_channels x the class's tap rows x its tap columns, A(c, (o,i,j)) = w[o, c, i, j].
// A's k of a row are apart in w (a tap's weights across out-channels), so the TF32 path can read
// A from a copy laid out by k instead (data_weight_transpose: wt[z][c][k], rows of k_max floats,
// k = (o, v_i, v_j) of class z), whose rows take 16-byte copies (TileGather's kVectorA).
struct DataProblem {
  static constexpr tiling::ConvPass kPass = tiling::ConvPass::data;
  ConvGeometry g;
  const float* dy;
  const float* w;
  float* dx;
  const float* wt = nullptr;  // the copy by k, or null: A from w
  Index k_max = 0;            // wt's row length (data_weight_k_max, a multiple of 4)
  tiling::StrideClass class_h{}, class_w{};  // set by in_slice
  Index a_base = 0;                          // set by in_slice: where class z's rows start in wt

  struct Row {
    Index w_channel;  // c * kh * kw: the in-channel's offset inside a weight row
  };
  struct Column {
    Index dy_pixel;  // where output pixel (oh0, ow0) of the sample's channel 0 is in dy (may be outside)
    // the class's taps v through which a pixel of dy reads this input pixel, where (oh0, ow0) is
    // the one that reads it through the class's tap 0: (oh0 - v_i, ow0 - v_j) inside dy
    std::uint32_t taps_h, taps_w;
  };
  __device__ DataProblem in_slice(unsigned z) const {
    DataProblem q = *this;
    const std::int64_t r_h = tiling::quotient(z, g.stride_w), r_w = z - r_h * g.stride_w;
    q.class_h = tiling::stride_class(r_h, g.stride_h, g.pad_h, g.in_h, g.kernel_h);
    q.class_w = tiling::stride_class(r_w, g.stride_w, g.pad_w, g.in_w, g.kernel_w);
    q.a_base = Index(z) * Index(g.in_channels) * k_max;
    return q;
  }
  // The same product into `out` (dx's layout): a K slice's partials (KSliced).
  __device__ DataProblem writing_to(float* out) const {
    DataProblem q = *this;
    q.dx = out;
    return q;
  }
  __device__ std::int64_t rows() const { return g.in_channels; }
  __device__ std::int64_t columns() const { return g.batch * class_h.count * class_w.count; }
  __device__ std::int64_t depth() const { return g.out_channels * class_h.taps * class_w.taps; }
  __device__ std::int64_t k_begin(unsigned /*slice*/) const { return 0; }
  __device__ std::int64_t k_end(unsigned /*slice*/) const { return depth(); }
  __device__ Row row(Index m) const { return {wt != nullptr ? a_base + m * k_max : m * Index(g.taps())}; }
  __device__ Column column(std::int64_t n) const {
    const tiling::Pixel p = tiling::split_pixel(n, class_h.count, class_w.count);
    const std::int64_t oh0 = class_h.out0 + p.y, ow0 = class_w.out0 + p.x;
    // 0 <= oh0 - v < out_h: oh0 - out_h < v <= oh0
    return {Index(p.b * g.out_channels * g.out_plane() + oh0 * g.out_w + ow0),
            tiling::bit_range(Index(oh0 - g.out_h + 1), Index(oh0 + 1)),
            tiling::bit_range(Index(ow0 - g.out_w + 1), Index(ow0 + 1))};
  }
  // k = (o, v_i, v_j) (its digits in k_radix), tap (i, j) = (tap0_h + v_i * stride_h, tap0_w +
  // v_j * stride_w): a = where w[o, 0, i, j] is (or k itself, reading wt); b = the offset in dy
  // from a column's (oh0, ow0) in channel 0 to the pixel (oh0 - v_i, ow0 - v_j) of channel o it
  // reads through the tap; the bits of v_i and v_j.
  __device__ tiling::Radix k_radix() const { return {std::int32_t(class_h.taps), std::int32_t(class_w.taps)}; }
  __device__ KEntry k_entry_at(Index k, const tiling::Digits& d) const {
    const Index i = Index(class_h.tap0) + d.mid * Index(g.stride_h), j = Index(class_w.tap0) + d.lo * Index(g.stride_w);
    return {wt != nullptr ? k : d.hi * Index(g.in_channels * g.taps()) + i * Index(g.kernel_w) + j,
            d.hi * Index(g.out_plane()) - d.mid * Index(g.out_w) - d.lo, tiling::tap_bit(d.mid),
            tiling::tap_bit(d.lo)};
  }
  __device__ const float* a_data() const { return wt != nullptr ? wt : w; }
  __device__ Index a_offset(const Row& r, const KEntry& e) const { return e.a + r.w_channel; }
  // Reading wt, A's k of a row are consecutive floats and its rows start aligned (k_max is a
  // multiple of 4): 16-byte copies.
  static constexpr bool kVectorA = true;
  // (the channels-last problems' features; kRoundedA/B also Winograd's)
  static constexpr bool kPaddedA = false, kVectorB = false, kRoundedA = false, kRoundedB = false;
  bool vector_a_allowed() const { return wt != nullptr && cuda_detail::aligned_16(wt); }
  __device__ const float* b_data() const { return dy; }
  __device__ bool b_inside(const Column& c, const KEntry& e, bool /*k_inside*/) const {
    return tiling::bits_meet(c.taps_h, e.h, c.taps_w, e.w);
  }
  __device__ Index b_offset(const Column& c, const KEntry& e) const { return c.dy_pixel + e.b; }
  // dx[b, m, h, w] for column n = the class's pixel (b, h, w) and row m
  using StoreColumn = DxPixel;
  using StoreRow = DxChannel;
  __device__ StoreColumn store_column(std::int64_t n) const { return dx_pixel(g, class_h, class_w, n); }
  __device__ StoreRow store_row(std::int64_t m) const { return dx_channel(g, m); }
  __device__ void store(const StoreRow& r, const StoreColumn& c, float value, unsigned /*slice*/) const {
    dx[r.dx_offset + c.dx_offset] = value;
  }
  static constexpr bool kVectorStores = true;
  __device__ Index row_offset(const StoreRow& r) const { return r.dx_offset; }
  __device__ Index column_offset(const StoreColumn& c) const { return c.dx_offset; }
  template <int G>
  __device__ bool vector_aligned(unsigned /*slice*/) const { return cuda_detail::aligned_to<G>(dx); }
  template <int G>
  __device__ void store_vector(const StoreRow& r, const StoreColumn& c, const float (&v)[G], unsigned) const {
    cuda_detail::store_floats<G>(dx + r.dx_offset + c.dx_offset, v);
  }
};

// Backward data under TF32 where out_channels % 4 == 0, from channels-last copies (as
// ChannelsLastForwardProblem; conv2d_backward_data makes them: to_channels_last of dy,
// data_weights_by_tap): per stride class z (DataProblem's), dx^T = gather(dy)^T . w_z^T, M the
// class's input pixels, N the in-channels, K = (v_i, v_j, o) with o fastest. A(pixel, k) =
// dyc[b, oh0 - v_i, ow0 - v_j, o] (dyc: dy as [batch][out_h][out_w][out_channels]): four
// consecutive k are four out-channels of one tap, one 16-byte copy and one bounds check. B(k, c) =
// wt[z][k][tf32_b_slot(c)] (per class rows of n_pad floats, k_max rows: the largest class's K;
// rounded to TF32). Its bits are those of the (v_i, v_j, o) order.
struct ChannelsLastDataProblem {
  static constexpr tiling::ConvPass kPass = tiling::ConvPass::data;
  ConvGeometry g;
  const float* dyc;  // dy channels-last
  const float* wt;   // [classes][k_max][n_pad], rounded to TF32, columns in tf32_b_slot's order
  float* dx;
  Index n_pad, k_max;
  tiling::StrideClass class_h{}, class_w{};  // set by in_slice
  Index b_base = 0;                          // set by in_slice: where class z's rows start in wt

  struct Row {
    Index corner;                  // where the pixel (oh0, ow0) that reads this one through tap 0 is in dyc
    std::uint32_t taps_h, taps_w;  // the class's taps v with (oh0 - v_i, ow0 - v_j) inside dy
  };
  struct Column {
    Index first;  // the slot of the thread's 16-byte B copies (TileGather, kVectorB)
  };
  __device__ ChannelsLastDataProblem in_slice(unsigned z) const {
    ChannelsLastDataProblem q = *this;
    const std::int64_t r_h = tiling::quotient(z, g.stride_w), r_w = z - r_h * g.stride_w;
    q.class_h = tiling::stride_class(r_h, g.stride_h, g.pad_h, g.in_h, g.kernel_h);
    q.class_w = tiling::stride_class(r_w, g.stride_w, g.pad_w, g.in_w, g.kernel_w);
    q.b_base = Index(z) * k_max * n_pad;
    return q;
  }
  __device__ ChannelsLastDataProblem writing_to(float* out) const {  // (DataProblem's)
    ChannelsLastDataProblem q = *this;
    q.dx = out;
    return q;
  }
  __device__ std::int64_t rows() const { return g.batch * class_h.count * class_w.count; }
  __device__ std::int64_t columns() const { return g.in_channels; }
  __device__ std::int64_t depth() const { return g.out_channels * class_h.taps * class_w.taps; }
  __device__ std::int64_t k_begin(unsigned /*slice*/) const { return 0; }
  __device__ std::int64_t k_end(unsigned /*slice*/) const { return depth(); }
  __device__ Row row(Index m) const {
    const tiling::Pixel p = tiling::split_pixel(m, class_h.count, class_w.count);
    const Index oh0 = Index(class_h.out0 + p.y), ow0 = Index(class_w.out0 + p.x);
    // 0 <= oh0 - v < out_h: oh0 - out_h < v <= oh0
    return {((Index(p.b) * Index(g.out_h) + oh0) * Index(g.out_w) + ow0) * Index(g.out_channels),
            tiling::bit_range(oh0 - Index(g.out_h) + 1, oh0 + 1), tiling::bit_range(ow0 - Index(g.out_w) + 1, ow0 + 1)};
  }
  __device__ Column column(std::int64_t n) const { return {Index(n)}; }
  // k = (v_i, v_j, o) (its digits in k_radix): a = the offset in dyc from a row's corner, b = where
  // wt's row k of the class starts, the bits of v_i and v_j.
  __device__ tiling::Radix k_radix() const { return {std::int32_t(class_w.taps), std::int32_t(g.out_channels)}; }
  __device__ KEntry k_entry_at(Index k, const tiling::Digits& d) const {
    return {(-d.hi * Index(g.out_w) - d.mid) * Index(g.out_channels) + d.lo, b_base + k * n_pad, tiling::tap_bit(d.hi),
            tiling::tap_bit(d.mid)};
  }
  __device__ const float* a_data() const { return dyc; }
  __device__ Index a_offset(const Row& r, const KEntry& e) const { return r.corner + e.a; }
  // (always: conv2d_backward_data takes this problem where out_channels % 4 == 0)
  static constexpr bool kVectorA = true, kPaddedA = true, kVectorB = true, kRoundedA = true, kRoundedB = true;
  __device__ bool a_inside(const Row& r, const KEntry& e) const {
    return tiling::bits_meet(r.taps_h, e.h, r.taps_w, e.w);
  }
  __device__ const float* b_data() const { return wt; }
  __device__ bool b_inside(const Column& /*c*/, const KEntry& /*e*/, bool k_inside) const { return k_inside; }
  __device__ Index b_offset(const Column& c, const KEntry& e) const { return e.b + c.first; }
  // dx[b, c, h, w] for row m = the class's pixel (b, h, w) and column c (DataProblem's, transposed)
  using StoreRow = DxPixel;
  using StoreColumn = DxChannel;
  __device__ StoreRow store_row(std::int64_t m) const { return dx_pixel(g, class_h, class_w, m); }
  __device__ StoreColumn store_column(std::int64_t c) const { return dx_channel(g, c); }
  __device__ void store(const StoreRow& r, const StoreColumn& c, float value, unsigned /*slice*/) const {
    dx[r.dx_offset + c.dx_offset] = value;
  }
  static constexpr bool kVectorStores = false;  // a lane's adjacent columns are planes apart in dx
};

// Where both weight problems put dw's element `index` of K slice `slice`: added into dw (one
// slice), or written to the slice's partials (several; at most 64 MiB: weight_split_slices).
__device__ inline void store_dw(float* dw, float* partials, const ConvGeometry& g, Index index, float value,
                                unsigned slice) {
  if (partials == nullptr)
    dw[index] += value;
  else
    partials[Index(slice * g.out_channels * g.in_channels * g.taps()) + index] = value;
}

// dw += dy . im2col(x)^T over K slice blockIdx.z. A(o, (b,oh,ow)) = dy[b, o, oh, ow].
struct WeightProblem {
  static constexpr tiling::ConvPass kPass = tiling::ConvPass::weight;
  ConvGeometry g;
  const float* x;
  const float* dy;
  float* dw;        // the single-slice destination (+=)
  float* partials;  // [slice][out_channels][in_channels*kh*kw] when there are several slices
  tiling::SplitK split;

  struct Row {
    Index dy_channel;  // o * out_h * out_w
  };
  struct Column {
    Index x_tap;         // the tap's offset from an output pixel's corner: (c * in_h + i) * in_w + j
    std::uint32_t i, j;  // the tap, less kCoordinateBias (mod 2^32)
  };
  // The K-step table's entries hold the input coordinates (h0, w0) of their pixel's tap (0, 0)
  // plus 2^31 (mod 2^32), the columns their tap (i, j) less as much, so that an entry plus a column
  // is h0 + i and w0 + j, checked in one unsigned comparison each, and the zero entry past k_end is
  // a pixel at -2^31, outside the image for every tap. (A pixel's taps as masks, as the forward's,
  // would have the table's writers compute four masks an entry: no fewer instructions in all.)
  static constexpr std::uint32_t kCoordinateBias = 0x80000000u;
  __device__ WeightProblem in_slice(unsigned /*z*/) const { return *this; }  // z: the K slice
  __device__ std::int64_t rows() const { return g.out_channels; }
  __device__ std::int64_t columns() const { return g.in_channels * g.taps(); }
  // K = batch*out_h*out_w, the part of it in slice blockIdx.z.
  __device__ std::int64_t k_begin(unsigned slice) const { return split.begin(slice); }
  __device__ std::int64_t k_end(unsigned slice) const { return split.end(slice); }
  __device__ Row row(Index m) const { return {m * Index(g.out_plane())}; }
  __device__ Column column(std::int64_t n) const {
    const Tap t = tiling::split_tap(n, g.kernel_h, g.kernel_w);
    return {Index(tiling::tap_offset(g, t)), std::uint32_t(t.i) - kCoordinateBias, std::uint32_t(t.j) - kCoordinateBias};
  }
  // k = output pixel (b, oh, ow) (its digits in k_radix): a = its offset in dy's channel 0, b =
  // its tap (0, 0)'s offset in x's channel 0 (the corner, as ForwardProblem's), and that tap's
  // input coordinates plus kCoordinateBias.
  __device__ tiling::Radix k_radix() const { return {std::int32_t(g.out_h), std::int32_t(g.out_w)}; }
  __device__ KEntry k_entry_at(Index /*k*/, const tiling::Digits& d) const {
    const Index h0 = d.mid * Index(g.stride_h) - Index(g.pad_h), w0 = d.lo * Index(g.stride_w) - Index(g.pad_w);
    return {d.hi * Index(g.out_channels * g.out_plane()) + d.mid * Index(g.out_w) + d.lo,
            d.hi * Index(g.in_channels * g.in_plane()) + h0 * Index(g.in_w) + w0,
            std::uint32_t(h0) + kCoordinateBias, std::uint32_t(w0) + kCoordinateBias};
  }
  __device__ const float* a_data() const { return dy; }
  __device__ Index a_offset(const Row& r, const KEntry& e) const { return e.a + r.dy_channel; }
  // A's k of a row are an out-channel's output pixels, sample after sample: four from a multiple
  // of 4 (the slices begin at multiples of kTileK) are consecutive floats of one sample, and one
  // aligned 16-byte copy, where the plane is a multiple of 4 and dy aligned (TileGather's kVectorA).
  static constexpr bool kVectorA = true;
  // (the channels-last problems' features; kRoundedA/B also Winograd's)
  static constexpr bool kPaddedA = false, kVectorB = false, kRoundedA = false, kRoundedB = false;
  bool vector_a_allowed() const { return cuda_detail::aligned_16(dy) && g.out_plane() % 4 == 0; }
  __device__ const float* b_data() const { return x; }
  __device__ bool b_inside(const Column& c, const KEntry& e, bool /*k_inside*/) const {
    return (e.h + c.i < std::uint32_t(g.in_h)) & (e.w + c.j < std::uint32_t(g.in_w));
  }
  __device__ Index b_offset(const Column& c, const KEntry& e) const { return e.b + c.x_tap; }
  // dw[m, n] (+=), or slice `slice`'s partial of it.
  struct StoreColumn {
    Index n;
  };
  struct StoreRow {
    Index index;  // m * columns
  };
  __device__ StoreColumn store_column(std::int64_t n) const { return {Index(n)}; }
  __device__ StoreRow store_row(std::int64_t m) const { return {Index(m * columns())}; }
  __device__ void store(const StoreRow& r, const StoreColumn& c, float value, unsigned slice) const {
    store_dw(dw, partials, g, r.index + c.n, value, slice);
  }
  // Scalar stores only (store_outputs): the epilogue is a sliver of this pass's long K loop, and
  // the vector read-modify-write of dw made the FP32 64 x 64 kernel spill at its 85 registers.
  static constexpr bool kVectorStores = false;
};

// The TF32 weight gradient where in_channels % 32 == 0, from a channels-last copy of x
// (conv2d_backward_weight makes it: to_channels_last<true>): WeightProblem's product (M = the
// out-channels, K = the output pixels (b, oh, ow), A = dy as it is) with N = (i, j, c), c fastest.
// B(pixel, (i, j, c)) = xc[b, h0 + i, w0 + j, slot(c)] (xc: x as [batch][in_h][in_w][in_channels],
// each 32 channels in tf32_b_slot's order and rounded to TF32), so a thread's four slots of a tile
// row are four channels of one tap, next to each other in xc: one aligned 16-byte copy and one
// bounds check (kVectorB with a padding term) where WeightProblem gathers four values along an
// image row, each checked. Every sum is WeightProblem's, term for term and in the same order, so
// the bits are its bits (the emulated test checks it); only dw's index of a column changes.
struct ChannelsLastWeightProblem {
  static constexpr tiling::ConvPass kPass = tiling::ConvPass::weight;
  ConvGeometry g;
  const float* xc;  // x channels-last, its channels in tf32_b_slot's order by 32, rounded to TF32
  const float* dy;
  float* dw;        // the single-slice destination (+=)
  float* partials;  // [slice][out_channels][in_channels*kh*kw] (dw's order) when there are several slices
  tiling::SplitK split;

  using Row = WeightProblem::Row;
  struct Column {
    Index x_tap;         // where the copy's channels of tap (i, j) are in xc, from a pixel's corner
    std::uint32_t i, j;  // the tap, less kCoordinateBias (mod 2^32)
  };
  static constexpr std::uint32_t kCoordinateBias = WeightProblem::kCoordinateBias;
  __device__ ChannelsLastWeightProblem in_slice(unsigned /*z*/) const { return *this; }  // z: the K slice
  __device__ std::int64_t rows() const { return g.out_channels; }
  __device__ std::int64_t columns() const { return g.in_channels * g.taps(); }
  __device__ std::int64_t k_begin(unsigned slice) const { return split.begin(slice); }
  __device__ std::int64_t k_end(unsigned slice) const { return split.end(slice); }
  __device__ Row row(Index m) const { return {m * Index(g.out_plane())}; }
  // n = (tap, slot): the thread's first slot of a 16-byte copy (a multiple of 4, so the four are
  // inside one group of 32 channels, of one tap)
  __device__ Column column(std::int64_t n) const {
    const Index tap = Index(n) / Index(g.in_channels), slot = Index(n) - tap * Index(g.in_channels);
    const Index i = tap / Index(g.kernel_w), j = tap - i * Index(g.kernel_w);
    return {(i * Index(g.in_w) + j) * Index(g.in_channels) + slot, std::uint32_t(i) - kCoordinateBias,
            std::uint32_t(j) - kCoordinateBias};
  }
  // k = output pixel (b, oh, ow): a = its offset in dy's channel 0 (WeightProblem's), b = its
  // tap (0, 0)'s offset in xc, and that tap's coordinates plus kCoordinateBias.
  __device__ tiling::Radix k_radix() const { return {std::int32_t(g.out_h), std::int32_t(g.out_w)}; }
  __device__ KEntry k_entry_at(Index /*k*/, const tiling::Digits& d) const {
    const Index h0 = d.mid * Index(g.stride_h) - Index(g.pad_h), w0 = d.lo * Index(g.stride_w) - Index(g.pad_w);
    return {d.hi * Index(g.out_channels * g.out_plane()) + d.mid * Index(g.out_w) + d.lo,
            ((d.hi * Index(g.in_h) + h0) * Index(g.in_w) + w0) * Index(g.in_channels),
            std::uint32_t(h0) + kCoordinateBias, std::uint32_t(w0) + kCoordinateBias};
  }
  __device__ const float* a_data() const { return dy; }
  __device__ Index a_offset(const Row& r, const KEntry& e) const { return e.a + r.dy_channel; }
  // (always: conv2d_backward_weight takes this problem where WeightProblem's A rows allow 16-byte
  // copies, weight_channels_last_applies)
  static constexpr bool kVectorA = true, kPaddedA = false, kVectorB = true, kRoundedA = false, kRoundedB = true;
  __device__ const float* b_data() const { return xc; }
  // the zero entry past k_end is a pixel at -2^31: outside for every tap
  __device__ bool b_inside(const Column& c, const KEntry& e, bool /*k_inside*/) const {
    return (e.h + c.i < std::uint32_t(g.in_h)) & (e.w + c.j < std::uint32_t(g.in_w));
  }
  __device__ Index b_offset(const Column& c, const KEntry& e) const { return e.b + c.x_tap; }
  // dw[m, (c, i, j)] (+=), or slice `slice`'s partial of it, for column n = (i, j, c)
  using StoreRow = WeightProblem::StoreRow;
  using StoreColumn = WeightProblem::StoreColumn;  // n: dw's index in a row
  __device__ StoreColumn store_column(std::int64_t n) const {
    const Index tap = Index(n) / Index(g.in_channels), c = Index(n) - tap * Index(g.in_channels);
    return {c * Index(g.taps()) + tap};
  }
  __device__ StoreRow store_row(std::int64_t m) const { return {Index(m * columns())}; }
  __device__ void store(const StoreRow& r, const StoreColumn& c, float value, unsigned slice) const {
    store_dw(dw, partials, g, r.index + c.n, value, slice);
  }
  static constexpr bool kVectorStores = false;  // (WeightProblem's reason)
};

// The weight gradient of a 3x3, stride-1, padding-1 convolution in Winograd's F(2x2, 3x3) domain
// (set_conv2d_weight_algorithm(winograd); the transforms are below, winograd_weight_launch): 16
// independent products, one per element e of the 4 x 4 transformed tile, over the tiles t of the
// batch part: M_e(o, c) = sum_t U_e(o, t) V_e(t, c), A = U_e (o x T, row-major, t contiguous) and
// B = V_e (T x C, c contiguous), both dense (no padding term, no gather), into the partials
// m[z][o][c] of grid layer z = slice * 16 + e. K = the tiles, cut into split's slices.
// The Winograd forward and backward data (winograd_forward_launch) run the same 16 products with
// the names read the other way: rows the out-channels, K the in-channels, columns the tiles (one
// slice): a batched dense GEMM either way. (kPass only steers the kernel's register budget.)
struct WinogradWeightProblem {
  static constexpr tiling::ConvPass kPass = tiling::ConvPass::weight;
  const float* u;   // [16][O][T]
  const float* v;   // [16][T][C]
  float* m;         // [slices][16][O][C]
  Index o_count, c_count, t_count;
  tiling::SplitK split;
  Index element = 0;  // e, set by in_slice (U and V hold fewer than 2^31 values: 128 MiB at most)

  struct Row {
    Index u_row;  // where U_e's row o starts: (e * O + o) * T
  };
  struct Column {
    Index v_column;  // V_e's column c: e * T * C + c
  };
  __device__ WinogradWeightProblem in_slice(unsigned z) const {  // z = slice * 16 + e
    WinogradWeightProblem q = *this;
    q.element = Index(z % 16);
    return q;
  }
  __device__ std::int64_t rows() const { return o_count; }
  __device__ std::int64_t columns() const { return c_count; }
  __device__ std::int64_t k_begin(unsigned z) const { return split.begin(z / 16); }
  __device__ std::int64_t k_end(unsigned z) const { return split.end(z / 16); }
  __device__ Row row(Index o) const { return {(element * o_count + o) * t_count}; }
  __device__ Column column(std::int64_t c) const { return {element * t_count * c_count + Index(c)}; }
  // k = the tile t itself (one digit): a = t, b = t * C.
  __device__ tiling::Radix k_radix() const { return {1, 1}; }
  __device__ KEntry k_entry_at(Index k, const tiling::Digits& /*d*/) const { return {k, k * c_count, 0, 0}; }
  __device__ const float* a_data() const { return u; }
  __device__ Index a_offset(const Row& r, const KEntry& e) const { return r.u_row + e.a; }
  // A's k of a row are consecutive floats of U_e's row: 16-byte copies where T is a multiple of 4.
  static constexpr bool kVectorA = true;
  static constexpr bool kPaddedA = false, kVectorB = false;
  // U and V are written rounded to TF32 when the TF32 kernel multiplies them (the transforms' tf32)
  static constexpr bool kRoundedA = true, kRoundedB = true;
  bool vector_a_allowed() const { return cuda_detail::aligned_16(u) && t_count % 4 == 0; }
  __device__ const float* b_data() const { return v; }
  // No padding: inside wherever k is before k_end (one comparison, cheaper than testing the entry,
  // which is zero past k_end: measured with conv_ptx_stats.py --sass).
  __device__ bool b_inside(const Column& /*c*/, const KEntry& /*e*/, bool k_inside) const { return k_inside; }
  __device__ Index b_offset(const Column& c, const KEntry& e) const { return e.b + c.v_column; }
  struct StoreColumn {
    Index c;
  };
  struct StoreRow {
    Index index;  // o * C
  };
  __device__ StoreColumn store_column(std::int64_t c) const { return {Index(c)}; }
  __device__ StoreRow store_row(std::int64_t o) const { return {Index(o) * c_count}; }
  __device__ void store(const StoreRow& r, const StoreColumn& c, float value, unsigned z) const {
    m[Index(z) * o_count * c_count + r.index + c.c] = value;  // the partials: at most 64 MiB (applies)
  }
  // A row's columns are consecutive floats of layer z's M: store_outputs' vector stores where the
  // layer's start, the row and the group are aligned (the forward's K steps are few, C / 16, so its
  // epilogue is a large share: run 11's short-K kernels).
  static constexpr bool kVectorStores = true;
  __device__ Index row_offset(const StoreRow& r) const { return r.index; }
  __device__ Index column_offset(const StoreColumn& c) const { return c.c; }
  template <int G>
  __device__ bool vector_aligned(unsigned z) const {
    return cuda_detail::aligned_to<G>(m + Index(z) * o_count * c_count);
  }
  template <int G>
  __device__ void store_vector(const StoreRow& r, const StoreColumn& c, const float (&v)[G], unsigned z) const {
    cuda_detail::store_floats<G>(m + Index(z) * o_count * c_count + r.index + c.c, v);
  }
};

// ---- the tiled implicit GEMM ------------------------------------------------------------------

// The K-step table: the decomposition of a K step's K indices k0 .. k0 + K - 1 (Problem::k_entry_at;
// K = Tile::kK), written by threads 0..K-1 and read by all: entry[k - k0]. Thread t writes the
// entry of k0 + t in every step, and keeps that index's digits (tiling::Digits, in the problem's
// k_radix) from one step to the next, advanced by the step's own digits, instead of splitting each
// k again: two divisions per entry, which made warp 0's steps a third longer than the other warps'
// (a weight-pass step is ~300 instructions per warp; an entry from k was ~150 more), and every warp
// waited for it at the step's barrier (barrier stalls were 26-28% of the weight kernels in run 11).
// An index past k_end gets a zero entry (its values are never gathered: TileGather::issue checks
// an A value's k < k_left = k_end - k0, and a zero entry is outside for every B column in
// Problem::b_inside; zeros keep the offsets it computes and discards in range). Indices are 32-bit: every
// K is below 2^31 (a launch's tensors are).
// Thread t's digits live in shared memory (cursor[t]: its own, read and written by it alone),
// not in registers: the block's threads all hold a kernel's registers, and the kernels at their
// budget (the TF32 backward data's 128 x 64, the TF32 forward's 64 x 64) spilled with six more.
struct KCursor {
  tiling::Digits next;  // the digits of the thread's index in the next step to write
  tiling::Digits step;  // the digits of K
};
// Thread t's cursor (t < K; cursor: [K] in shared memory) for a K loop from k_begin.
template <int K, class Problem>
__device__ void start_k_steps(const Problem& p, int t, Index k_begin, KCursor* cursor) {
  const tiling::Radix r = p.k_radix();
  if (t < K) cursor[t] = {tiling::split_digits(k_begin + t, r), tiling::split_digits(K, r)};
}
// Writes the entries of the next step, whose first index is k0, and moves the cursor on to the
// step after it.
template <int K, class Problem>
__device__ void write_k_step(const Problem& p, int t, Index k0, Index k_end, KCursor* cursor, KEntry* entry) {
  if (t < K) {
    const Index k = k0 + t;
    const tiling::Digits next = cursor[t].next;
    entry[t] = k < k_end ? p.k_entry_at(k, next) : KEntry{};
    cursor[t].next = tiling::advance(next, cursor[t].step, p.k_radix());
  }
}

// x as a TF32 operand of the tensor cores, rounded to nearest (ties away from zero, as
// cvt.rna.tf32.f32): on sm_80 and newer its bits plus half a TF32 unit in the last place where it
// is finite (conv2d_tiling::tf32_operand_bits: the mma reads only the 19 leading bits, which are
// then the rounded value's; two instructions where cvt.rna is three), below sm_80 and under the
// emulation the rounded value itself (tf32_round), which the twin multiplies. Only the tensor
// cores read the result.
__device__ inline float tf32_operand(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return isfinite(x) ? __uint_as_float(__float_as_uint(x) + 0x1000u) : x;
#else
  return tiling::tf32_round(x);
#endif
}

// base + offset where ok, else base itself (the copies' source: a copy that reads nothing still
// needs an address). The select is made on the 32-bit offset and the result hidden from the
// compiler (an empty asm), so that it widens and scales the offset after the select, one
// multiply-add with the base, instead of pushing the widening above the select: a 64-bit select,
// a sign extension and a 64-bit shift and add per copy.
__device__ inline const float* at_or_base(const float* base, Index offset, bool ok) {
  Index chosen = ok ? offset : 0;
#ifdef __CUDA_ARCH__
  asm("" : "+r"(chosen));
#endif
  return base + chosen;
}

// *shared_dst = ok ? *src : 0, as an asynchronous copy (cp.async, sm_80 and newer: global memory
// to shared memory without passing through registers; with !ok it reads nothing and writes 0).
// copy_commit() closes the group of copies this thread issued since the last one;
// copy_wait<N>() returns when at most N of its groups are still in flight. A barrier after the
// wait makes every thread's copies visible to the block. Under the emulation (and below sm_80)
// the copy is a plain one, done when issued, and commit and wait do nothing.
__device__ inline void copy_async(float* shared_dst, const float* src, bool ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 4 : 0));
#else
  *shared_dst = ok ? *src : 0.0f;
#endif
}
// The same for 16 bytes: shared_dst[i] = i < floats ? src[i] : 0 for i < 4 (floats <= 4; the
// copy reads the first `floats` and fills the rest with zeros). Both addresses 16-byte aligned.
__device__ inline void copy_async16(float* shared_dst, const float* src, int floats) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(4 * floats));
#else
  for (int i = 0; i < 4; ++i) shared_dst[i] = i < floats ? src[i] : 0.0f;
#endif
}
__device__ inline void copy_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ inline void copy_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // "memory": the loads after the wait (the TF32 path rounds the copied values before the step's
  // barrier) must not be moved above it
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// One thread's part of gathering the tiles: the A rows and the B column it loads, decomposed
// once (Tile::a_load, b_load); issue() starts the copies of its values of one K step into one
// stage of the shared tiles. kVectorA (the TF32 layout, where the problem's A rows allow it:
// Problem::kVectorA and vector_a_allowed): A in 16-byte copies of four consecutive k
// (Tile::a_vector_load), a quarter of the copies, from two rows per thread.
// Problem::kVectorB (TF32, with kVectorA): B in 16-byte copies of four slots of a tile row
// (Tile::b_vector_load) from a copy laid out in tf32_b_slot's order and rounded to TF32 by the
// launch that wrote it (B is then not rounded in the tile); each copy's bounds check is
// Problem::b_inside (the weight gradient's padding; k < k_left for the others).
// Problem::kPaddedA: A has zero padding (Problem::a_inside), checked per 16-byte copy.
// Problem::kRoundedA, kRoundedB: A (B) is a copy that the launch writing it rounded to TF32 (the
// channels-last copies, to_channels_last; the weights laid out by tap; Winograd's transforms under
// TF32), so the tiles do not round it again (round_to_tf32 only interleaves A's 16-byte copies).
// Every kVectorB problem's B is such a copy.
template <class Problem, class Tile, bool kVectorA = false>
struct TileGather {
  static_assert(!kVectorA || (Tile::kTf32 && Problem::kVectorA),
                "16-byte A copies: the TF32 layout, from A rows contiguous in k");
  static_assert(!(Problem::kVectorB || Problem::kPaddedA) || kVectorA,
                "a padded A or 16-byte B copies: in the 16-byte A copies' kernel only");
  static_assert(!Problem::kVectorB || Problem::kRoundedB, "16-byte B copies land as laid out: rounded there");
  static constexpr int kRowsA = kVectorA ? Tile::kVectorLoadsA : Tile::kLoadsA;
  // the tile row of the thread's A row q
  PETRA_HOST_DEVICE static constexpr int a_row_of(int t, int q) {
    return kVectorA ? Tile::a_vector_load(t, q).mn : Tile::a_load(t, q).mn;
  }
  typename Problem::Row rows[kRowsA];
  bool row_valid[kRowsA];
  // Past the product's last column, column 0's: its values land in outputs never stored (only
  // the zero entries past k_end must gather zeros, which A's zeros there would not cancel if B
  // held an infinity).
  typename Problem::Column column;

  __device__ TileGather(const Problem& p, int t, std::int64_t m0, std::int64_t n0) {
    // In 32 bits (M < 2^31): nvcc recomputes these inside the K loop rather than hold them in
    // registers, and in 64 bits that was 6 instructions per A value per step.
PETRA_UNROLL
    for (int q = 0; q < kRowsA; ++q) {
      const Index m = Index(m0) + a_row_of(t, q);
      row_valid[q] = m < Index(p.rows());
      rows[q] = p.row(row_valid[q] ? m : 0);
    }
    if constexpr (Problem::kVectorB) {
      // the first slot of the thread's 16-byte B copies (the same for every v): a slot of a row laid
      // out in tf32_b_slot's order, whose group of 32 holds columns from its first on (slot 4 g + f
      // holds column 8 f + g of the group), so the group is past the end when its first column is
      const std::int64_t slot = n0 + Tile::b_vector_load(t, 0).mn;
      column = p.column(slot - slot % 32 < p.columns() ? slot : 0);
    } else {
      const std::int64_t n = n0 + Tile::b_load(t, 0).mn;  // the same for every q
      column = p.column(n < p.columns() ? n : 0);
    }
  }

  // a_tile[k][m] = A(m0 + m, k0 + k), b_tile[k][n] = B(k0 + k, n0 + n) for this thread's tile
  // elements, 0 outside (a row past the product's end, k past k_end, the zero padding; a column
  // past its end holds column 0's values, never stored), with `entry` the step's table
  // (write_k_step) and k_left = k_end - k0 (an A value's k < k_left is inside; a B value's k past
  // k_end has a zero entry, outside for every column: Problem::b_inside). Asynchronous copies
  // (copy_async), so no register holds a value and all of a thread's loads are in flight at once;
  // issued without a branch (with one around each, as nvcc compiled the conditional loads before
  // run 9, they went one after another).
  __device__ void issue(const Problem& p, int t, Index k_left, const KEntry* entry, float (*a_tile)[Tile::kLdA],
                        float (*b_tile)[Tile::kLdB]) const {
    // A thread's A values of a step share their k (Tile::a_load), hence one table entry; with
    // kVectorA the entry of its four k's first, the four in a row of A (Problem::kVectorA), of
    // which those before k_end are copied.
    const int a_k = kVectorA ? Tile::a_vector_load(t, 0).k : Tile::a_load(t, 0).k;
    const KEntry a_entry = entry[a_k];
    const float* a_data = p.a_data();
    if constexpr (kVectorA) {
      if (t < Tile::kVectorThreadsA) {  // all threads but in the 64-row tiles (whole warps)
PETRA_UNROLL
        for (int group = 0; group < Tile::kVectorGroupsA; ++group) {  // (one but at K = 32)
          const int k = a_k + 16 * group;
          const KEntry e = group == 0 ? a_entry : entry[k];
          const int a_floats = k_left - k >= 4 ? 4 : (k_left > k ? int(k_left - k) : 0);
PETRA_UNROLL
          for (int q = 0; q < kRowsA; ++q) {
            int floats = row_valid[q] ? a_floats : 0;
            if constexpr (Problem::kPaddedA) floats = p.a_inside(rows[q], e) ? floats : 0;
            copy_async16(&a_tile[group * Tile::kABlockRows + a_row_of(t, q)][a_k],
                         at_or_base(a_data, p.a_offset(rows[q], e), floats > 0), floats);
          }
        }
      }
    } else {
      const bool a_k_inside = a_k < k_left;
PETRA_UNROLL
      for (int q = 0; q < kRowsA; ++q) {
        const tiling::TileCoordinate at = Tile::a_load(t, q);
        const bool ok = a_k_inside & row_valid[q];
        copy_async(&a_tile[Tile::a_row(at.mn, at.k)][Tile::a_column(at.mn, at.k)],
                   at_or_base(a_data, p.a_offset(rows[q], a_entry), ok), ok);
      }
    }
    const float* b_data = p.b_data();
    if constexpr (Problem::kVectorB) {
PETRA_UNROLL
      for (int v = 0; v < Tile::kVectorLoadsB; ++v) {
        const tiling::TileCoordinate at = Tile::b_vector_load(t, v);
        const KEntry e = entry[at.k];
        const bool ok = p.b_inside(column, e, at.k < k_left);  // false past k_end
        copy_async16(&b_tile[Tile::b_row(at.k)][at.mn], at_or_base(b_data, p.b_offset(column, e), ok), ok ? 4 : 0);
      }
    } else {
PETRA_UNROLL
      for (int q = 0; q < Tile::kLoadsB; ++q) {
        const tiling::TileCoordinate at = Tile::b_load(t, q);
        const KEntry e = entry[at.k];
        const bool ok = p.b_inside(column, e, at.k < k_left);  // false past k_end
        copy_async(&b_tile[Tile::b_load_row(t, q)][Tile::b_slot(at.mn)],
                   at_or_base(b_data, p.b_offset(column, e), ok), ok);
      }
    }
  }

  // The TF32 path: rounds to TF32 (tf32_operand), in place, the A and B values this thread copied
  // into a stage, once they have landed (after copy_wait, before the barrier that shows them to the
  // block). Each value is read by the warps of a row or a column of pieces (2 or 4); rounded here,
  // once, instead of by each of them after its fragment load (the copies cannot round: they bypass
  // the registers). Per step a thread's kLoadsA + kLoadsB loads, roundings and stores, where the
  // fragments cost each lane 4 FM + 2 FN roundings per k8 step. A warp's values are on 32 banks
  // (B, and A's 16-byte copies) or at most 2 ways of one (A's scalar copies), as the tiling test
  // counts.
  __device__ void round_to_tf32(int t, float (*a_tile)[Tile::kLdA], float (*b_tile)[Tile::kLdB]) const {
    if constexpr (kVectorA) {
      // its two copies, k 4 j .. 4 j + 3 of rows r and r + 8 as they landed, interleaved into
      // their places (Tile::a_row, a_column): (r, 4j) (r+8, 4j) (r, 4j+1) (r+8, 4j+1) in row r,
      // k 4 j + 2 and 4 j + 3 the same in row r + 8
      if (t < Tile::kVectorThreadsA) {
        const int k = Tile::a_vector_load(t, 0).k;
PETRA_UNROLL
        for (int group = 0; group < Tile::kVectorGroupsA; ++group) {  // (each block of M rows: 16 k)
          float4& low = *reinterpret_cast<float4*>(&a_tile[group * Tile::kABlockRows + a_row_of(t, 0)][k]);
          float4& high = *reinterpret_cast<float4*>(&a_tile[group * Tile::kABlockRows + a_row_of(t, 1)][k]);
          const float4 r = low, r8 = high;
          if constexpr (Problem::kRoundedA) {  // rounded by the launch that wrote A: interleaved only
            low = make_float4(r.x, r8.x, r.y, r8.y);
            high = make_float4(r.z, r8.z, r.w, r8.w);
          } else {
            low = make_float4(tf32_operand(r.x), tf32_operand(r8.x), tf32_operand(r.y), tf32_operand(r8.y));
            high = make_float4(tf32_operand(r.z), tf32_operand(r8.z), tf32_operand(r.w), tf32_operand(r8.w));
          }
        }
      }
    } else if constexpr (!Problem::kRoundedA) {  // (scalar copies land in place: nothing to interleave)
PETRA_UNROLL
      for (int q = 0; q < kRowsA; ++q) {
        const tiling::TileCoordinate at = Tile::a_load(t, q);
        float& v = a_tile[Tile::a_row(at.mn, at.k)][Tile::a_column(at.mn, at.k)];
        v = tf32_operand(v);
      }
    }
    if constexpr (!Problem::kRoundedB) {
PETRA_UNROLL
      for (int q = 0; q < Tile::kLoadsB; ++q) {
        float& v = b_tile[Tile::b_load_row(t, q)][Tile::b_slot(Tile::b_load(t, q).mn)];
        v = tf32_operand(v);
      }
    }
  }
};

// The epilogue both kernels share: a thread's R x C outputs, value(i, j) at row row_of(i) and
// column column_of(j) of C, stored where inside. Each column and each row is decomposed once
// (store_column, store_row; per output, a division each, it took more time than the K loop when
// K is short: run 9), and all rows before the first store, so that their loads (the forward's
// bias) are in flight together (one row at a time, each row's stores waited on its bias: run 11).
// The thread's columns come in groups of G (4 in the FP32 kernel, 2 in TF32's fragments): where a
// group's outputs are G consecutive, aligned floats of memory (the forward's and backward data's
// outputs along a row of the image; not a group cut by the end of a sample, a stride class or C),
// a row of it is one vector store (Problem::store_vector) instead of G (run 11: in short-K forward
// kernels the stores were most of the epilogue's samples; Winograd's M rows too). A problem with
// kVectorStores false (the direct weight passes) keeps scalar stores, as does a kernel that asks
// to (kVector false: TwoBlocksPerSm).
// The values and their rounding are the same either way.
template <int G, int R, int C, bool kVector, class Problem, class RowOf, class ColumnOf, class Value>
__device__ void store_outputs(const Problem& p, RowOf row_of, ColumnOf column_of, Value value) {
  static_assert(C % G == 0, "the columns come in whole groups");
  const std::int64_t rows = p.rows(), columns = p.columns();
  typename Problem::StoreColumn store_columns[C];
  bool column_inside[C];
PETRA_UNROLL
  for (int j = 0; j < C; ++j) {
    const std::int64_t n = column_of(j);
    column_inside[j] = n < columns;
    store_columns[j] = p.store_column(column_inside[j] ? n : 0);
  }
  typename Problem::StoreRow store_rows[R];
  bool row_inside[R];
PETRA_UNROLL
  for (int i = 0; i < R; ++i) {
    const std::int64_t m = row_of(i);
    row_inside[i] = m < rows;
    store_rows[i] = p.store_row(row_inside[i] ? m : 0);
  }
  // Group q is one vector per row when its offsets are G consecutive, G-aligned values and all
  // its columns are inside. A problem's offsets grow with the column (by 1 along a row of the
  // image, by more across a sample or a row of a stride class), so the group's last column
  // inside, G - 1 past the first, says both. (All false where the problem stores scalars.)
  bool group_vector[C / G] = {};
  if constexpr (kVector) {
    const bool aligned = p.template vector_aligned<G>(blockIdx.z);
PETRA_UNROLL
    for (int q = 0; q < C / G; ++q) {
      const Index first = p.column_offset(store_columns[G * q]);
      group_vector[q] = aligned && first % G == 0 && column_inside[G * q + G - 1] &&
                        p.column_offset(store_columns[G * q + G - 1]) == first + G - 1;
    }
  }
PETRA_UNROLL
  for (int i = 0; i < R; ++i) {
PETRA_UNROLL
    for (int q = 0; q < C / G; ++q) {
      if constexpr (kVector) {
        if (row_inside[i] && p.row_offset(store_rows[i]) % G == 0 && group_vector[q]) {
          float v[G];
PETRA_UNROLL
          for (int e = 0; e < G; ++e) v[e] = value(i, G * q + e);
          p.template store_vector<G>(store_rows[i], store_columns[G * q], v, blockIdx.z);
          continue;
        }
      }
PETRA_UNROLL
      for (int e = 0; e < G; ++e) {
        const int j = G * q + e;
        if (row_inside[i] && column_inside[j]) p.store(store_rows[i], store_columns[j], value(i, j), blockIdx.z);
      }
    }
  }
}

// The K loop both kernels share, a pipeline of Tile::kStages stages of the shared tiles: while
// the block multiplies step i out of stage i % S, the copies of steps i + 1 .. i + S - 1 are in
// flight into the other stages. Per step i:
//   wait for this thread's copies of step i (the TF32 path then rounds them in place,
//   TileGather::round_to_tf32); barrier (all threads' copies visible, and everyone
//   done with step i - 1's stage and table); issue the copies of step i + S - 1 into the stage
//   step i - 1 used; threads 0..K-1 decompose step i + S's k into the other table; multiply
//   step i.
// One barrier per step (two before run 11, when the values went through registers). Every thread
// commits one group of copies per step, empty past the last step, so copy_wait<S - 2> always
// means "step i has landed". A table is rewritten one step after its last reader, across a barrier.
template <class Tile, bool kVectorA, class Problem, class Multiply>
__device__ void k_loop(const Problem& p, int t, std::int64_t m0, std::int64_t n0, Index k_begin, Index k_end,
                       float (*a_tile)[Tile::kARows][Tile::kLdA], float (*b_tile)[Tile::kK][Tile::kLdB],
                       KEntry (*table)[Tile::kK], Multiply multiply) {
  constexpr int S = Tile::kStages;
  if (k_begin >= k_end) return;
  const TileGather<Problem, Tile, kVectorA> gather(p, t, m0, n0);
  const int steps = int(tiling::ceil_div(k_end - k_begin, Tile::kK));
  const auto k_of = [&](int step) { return k_begin + step * Tile::kK; };  // a step's first k
  // the valid k of step `step`: k_end - its first k (more than kK but in the last step)
  const auto k_left = [&](int step) { return k_end - k_of(step); };
  __shared__ KCursor cursors[Tile::kK];
  start_k_steps<Tile::kK>(p, t, k_begin, cursors);
  write_k_step<Tile::kK>(p, t, k_begin, k_end, cursors, table[0]);
PETRA_UNROLL
  for (int step = 0; step < S - 1; ++step) {
    __syncthreads();
    if (step < steps) gather.issue(p, t, k_left(step), table[step % 2], a_tile[step], b_tile[step]);
    copy_commit();
    if (step + 1 < steps) write_k_step<Tile::kK>(p, t, k_of(step + 1), k_end, cursors, table[(step + 1) % 2]);
  }
  for (int step = 0; step < steps; ++step) {
    copy_wait<S - 2>();
    if constexpr (Tile::kTf32) gather.round_to_tf32(t, a_tile[step % S], b_tile[step % S]);
    __syncthreads();
    const int ahead = step + S - 1;
    if (ahead < steps) gather.issue(p, t, k_left(ahead), table[ahead % 2], a_tile[ahead % S], b_tile[ahead % S]);
    copy_commit();
    if (ahead + 1 < steps) write_k_step<Tile::kK>(p, t, k_of(ahead + 1), k_end, cursors, table[(ahead + 1) % 2]);
    multiply(a_tile[step % S], b_tile[step % S]);
  }
}

// A tile compiled for two blocks per multiprocessor, 128 registers, where blocks_per_sm gives it
// one (TileChoice::k128x128_two_per_sm: the TF32 128 x 128 tile, an option bench-cuda times beside
// the others; choose_tile never picks it). Two blocks' 16 warps are 4 per scheduler where one
// block's are 2: one block's barrier or shared-memory wait could then hide behind the other's mma.
// kRollK8: the kernel keeps its two k8 steps a loop (WarpTileTf32::mma), which some problems need
// to fit 128 registers (two_blocks_per_sm below).
template <class Tile, bool kRollK8>
struct TwoBlocksPerSm : Tile {
  static constexpr int kBlocksPerSm = 2;
  static constexpr bool kRolledK8 = kRollK8;
  // Scalar stores in the epilogue: the vector stores' bookkeeping took Winograd's GEMM past 128
  // registers (28-44 bytes of spills, sm_80 and sm_90); the channels-last problems store scalars
  // anyway.
  static constexpr bool kScalarStores = true;
};

// Whether the TF32 kernel of Problem and Tile stores its outputs in vectors where it can.
template <class Problem, class Tile>
constexpr bool vector_stores() {
  if constexpr (requires { Tile::kScalarStores; }) return Problem::kVectorStores && !Tile::kScalarStores;
  return Problem::kVectorStores;
}

// Whether Tile asks implicit_gemm_tf32 to keep its k8 steps a loop.
template <class Tile>
constexpr bool rolls_k8() {
  if constexpr (requires { Tile::kRolledK8; }) return Tile::kRolledK8;
  return false;
}

// Blocks per multiprocessor a kernel is compiled for (its register budget: 65536 / (256 blocks)).
// Left to itself nvcc 13 gave some tiles 105-150 registers, one or two blocks where the code fits
// more: the weight pass's FP32 64 x 64 tile lost 30-40% so (run 9). Three for the forward and
// weight passes' 64 x 64 tile (at most 85 registers), two for the other tiles (128), one for the
// 128 x 128 tile and the FP32 backward data's 128 x 64 (which spill at 128; backward data's
// 64 x 64 at 85). A tile that says otherwise (TwoBlocksPerSm) has its way.
template <class Problem, class Tile, bool kTf32>
constexpr int blocks_per_sm() {
  if constexpr (requires { Tile::kBlocksPerSm; }) return Tile::kBlocksPerSm;
  const bool data = Problem::kPass == tiling::ConvPass::data;
  if (Tile::kM == 64 && Tile::kN == 64) return data ? 2 : 3;
  if (Tile::kM == 128 && (Tile::kN == 128 || (data && !kTf32))) return 1;
  return 2;
}

// The stages of a kernel's shared tiles, a[stage][row][column] and b[stage][k][slot]: static
// __shared__ arrays, or Tile::kDynamicShared's in the launch's dynamic shared memory (A's stages,
// then B's; KernelChoice::shared_bytes).
template <class Tile>
struct SharedTiles {
  float (*a)[Tile::kARows][Tile::kLdA];
  float (*b)[Tile::kK][Tile::kLdB];
};
template <class Tile>
__device__ __forceinline__ SharedTiles<Tile> shared_tiles() {
  if constexpr (Tile::kDynamicShared) {
    PETRA_DYNAMIC_SHARED(float, tiles);
    return {reinterpret_cast<float (*)[Tile::kARows][Tile::kLdA]>(tiles),
            reinterpret_cast<float (*)[Tile::kK][Tile::kLdB]>(tiles + Tile::kStages * Tile::kARows * Tile::kLdA)};
  } else {
    __shared__ __align__(32) float a_tile[Tile::kStages][Tile::kARows][Tile::kLdA];
    __shared__ __align__(32) float b_tile[Tile::kStages][Tile::kK][Tile::kLdB];
    return {a_tile, b_tile};
  }
}

// C tile (blockIdx.y, blockIdx.x) of `p`, over K slice blockIdx.z. Block: kThreads threads (1-d).
template <class Problem, class Tile>
__global__ void __launch_bounds__(kThreads, blocks_per_sm<Problem, Tile, false>()) implicit_gemm(Problem whole) {
  static_assert(!Tile::kDynamicShared, "the FP32 kernel's tiles are static");
  // a_tile[stage][k][m] (A transposed) and b_tile[stage][k][n]: in the inner loop each thread
  // reads its groups of 4 consecutive a_tile values and of 4 consecutive b_tile values of a k as
  // one float4 each (rows of kLdA and kLdB floats keep every float4 16-byte aligned).
  __shared__ __align__(32) float a_tile[Tile::kStages][Tile::kARows][Tile::kLdA];
  __shared__ __align__(32) float b_tile[Tile::kStages][Tile::kK][Tile::kLdB];
  __shared__ KEntry table[2][Tile::kK];
  const int t = int(threadIdx.x);
  const std::int64_t m0 = std::int64_t(blockIdx.y) * Tile::kM, n0 = std::int64_t(blockIdx.x) * Tile::kN;
  const Problem p = whole.in_slice(blockIdx.z);
  // a smaller stride class than the grid's widest (the whole block): its pixels are DataProblem's
  // columns, ChannelsLastDataProblem's rows (a class may have none: a row's split would divide by 0)
  if (n0 >= p.columns() || m0 >= p.rows()) return;

  constexpr int kMicroM = Tile::kMicroM, kMicroN = Tile::kMicroN;
  float acc[kMicroM][kMicroN] = {};
  k_loop<Tile, false>(p, t, m0, n0, Index(p.k_begin(blockIdx.z)), Index(p.k_end(blockIdx.z)), a_tile, b_tile, table,
               [&](const float (*as)[Tile::kLdA], const float (*bs)[Tile::kLdB]) {
PETRA_UNROLL
                 for (int k = 0; k < Tile::kK; ++k) {
                   float av[kMicroM], bv[kMicroN];
PETRA_UNROLL
                   for (int g = 0; g < kMicroM; g += 4) {
                     const float4 a4 = *reinterpret_cast<const float4*>(&as[k][Tile::micro_row(t, g)]);
                     av[g] = a4.x, av[g + 1] = a4.y, av[g + 2] = a4.z, av[g + 3] = a4.w;
                   }
PETRA_UNROLL
                   for (int g = 0; g < kMicroN; g += 4) {
                     const float4 b4 = *reinterpret_cast<const float4*>(&bs[k][Tile::micro_column(t, g)]);
                     bv[g] = b4.x, bv[g + 1] = b4.y, bv[g + 2] = b4.z, bv[g + 3] = b4.w;
                   }
PETRA_UNROLL
                   for (int r = 0; r < kMicroM; ++r)
PETRA_UNROLL
                     for (int q = 0; q < kMicroN; ++q) acc[r][q] += av[r] * bv[q];
                 }
               });
  store_outputs<4, kMicroM, kMicroN, Problem::kVectorStores>(
      p, [&](int r) { return m0 + Tile::micro_row(t, r); }, [&](int q) { return n0 + Tile::micro_column(t, q); },
      [&](int r, int q) { return acc[r][q]; });
}

// ---- the TF32 path: the same tiles, multiplied by the tensor cores -----------------------------

// A warp's FM x FN accumulators of 16 x 8 (its piece of the block's C tile, rows wm.., columns
// wn.., conv2d_tiling::WarpLayout), in the registers of mma.m16n8k8's fragments: zero(), mma<K>()
// adds A(wm.., 0..K) B(0..K, wn..) from the shared tiles, whose values the gather rounded to TF32
// (TileGather::round_to_tf32; A in the mma's operand order, tf32_a_row, B in tf32_b_row's row
// and tf32_b_slot's column order), with FP32 accumulation; c[fm][fn][e] is then
// C(wm + Fragment::row(fm, e / 2, g), wn + Fragment::column(fn, t, e % 2)) for lane 4 g + t. Every
// lane of the warp calls mma (it is warp-collective). The only code with tensor-core
// instructions; below sm_80 and under the emulation it is the twin after it.
template <int FM, int FN>
struct WarpTileTf32Base {
  using Fragment = tiling::Tf32Fragment<FM>;  // which rows and columns a lane's elements are
  float c[FM][FN][4];
  __device__ void zero() {
PETRA_UNROLL
    for (int fm = 0; fm < FM; ++fm)
PETRA_UNROLL
      for (int fn = 0; fn < FN; ++fn)
PETRA_UNROLL
        for (int e = 0; e < 4; ++e) c[fm][fn][e] = 0.0f;
  }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// Per 16 k, lane 4 g + t takes the k 4 t .. 4 t + 3 of its 2 FM rows (Fragment::row: g, g + 8 of
// each fragment) and feeds them to two k8 steps: k 4 t and 4 t + 1 as the fragments' k t and
// t + 4 in the first, 4 t + 2 and 4 t + 3 in the second (tf32_step_k; the mma's k are any 8 of
// the step's, if A's and B's agree: each step sums 8 distinct k, the two all 16). The A tile holds
// a fragment's four operands of a step side by side in the mma's order (TileShape::a_row), so
// each is one 16-byte load into the instruction's register quad. B's column g of its FN
// fragments at those k is FN / 4 float4 per k (tf32_b_slot puts four fragments' columns side by
// side, tf32_b_row the lane's k on rows t, t + 4, t + 8, t + 12). So per 16 k: 2 FM + FN shared
// loads for 2 FM FN products, each load's lanes on 32 different banks per quarter-warp, and no
// rounding (the gather rounded the tiles). (Until run 9 this was WMMA m16n16k8, whose fragment
// loads nvcc emitted as generic loads, one per element; until run 11 the A tile was a_tile[k][m]
// and each warp rounded its A values again at every fragment load.)
template <int FM, int FN>
struct WarpTileTf32 : WarpTileTf32Base<FM, FN> {
  static_assert(FN % 4 == 0, "B's fragments are loaded four at a time (tf32_b_slot)");
  template <int K, bool kRolled, int LdA, int LdB>
  __device__ void mma(const float (*a_tile)[LdA], const float (*b_tile)[LdB], int wm, int wn) {
    static_assert(K == 16 && LdA == 16, "a_tile: one K step of 16 k per row (conv2d_tiling's TileShape::a_row)");
    const int lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
    if constexpr (kRolled) {
PETRA_NO_UNROLL
      for (int h = 0; h < 2; ++h) mma_k8(a_tile, b_tile, wm, wn, t, g, h);
    } else {
      mma_k8(a_tile, b_tile, wm, wn, t, g, 0);
      mma_k8(a_tile, b_tile, wm, wn, t, g, 1);
    }
  }
  // The products of k8 step h (0 or 1) of the 16: k 4 t + 2 h and 4 t + 2 h + 1 of lane t.
  template <int LdA, int LdB>
  __device__ __forceinline__ void mma_k8(const float (*a_tile)[LdA], const float (*b_tile)[LdB], int wm, int wn,
                                         int t, int g, int h) {
    // operands[fm]: fragment fm's A operands of this step, in the mma's order (TileShape::a_row:
    // row g + 8 h of the fragment's 16 holds them at 4 t ..)
    float4 operands[FM];
PETRA_UNROLL
    for (int fm = 0; fm < FM; ++fm)
      operands[fm] = *reinterpret_cast<const float4*>(&a_tile[wm + 16 * fm + g + 8 * h][4 * t]);
    // fragments 4 j .. 4 j + 3: tile columns wn + 8 fn + g, at slots wn + 32 j + 4 g
    float4 low_columns[FN / 4], high_columns[FN / 4];
    const float* low_row = b_tile[tiling::tf32_step_b_row(t, h, 0)];  // tf32_b_row(tf32_step_k(t, h, 0))
    const float* high_row = b_tile[tiling::tf32_step_b_row(t, h, 1)];
PETRA_UNROLL
    for (int j = 0; j < FN / 4; ++j) {
      low_columns[j] = *reinterpret_cast<const float4*>(&low_row[wn + 32 * j + 4 * g]);
      high_columns[j] = *reinterpret_cast<const float4*>(&high_row[wn + 32 * j + 4 * g]);
    }
PETRA_UNROLL
    for (int fn = 0; fn < FN; ++fn) {
      const std::uint32_t b0 = __float_as_uint(reinterpret_cast<const float*>(&low_columns[fn / 4])[fn % 4]);
      const std::uint32_t b1 = __float_as_uint(reinterpret_cast<const float*>(&high_columns[fn / 4])[fn % 4]);
PETRA_UNROLL
      for (int fm = 0; fm < FM; ++fm) {
        // A's elements (row g, k t), (row g + 8, k t), (row g, k t + 4), (row g + 8, k t + 4), k t
        // and t + 4 standing for tf32_step_k(t, h, 0 and 1): the float4 as it is
        const float4& a = operands[fm];
        const float a0 = a.x, a1 = a.y, a2 = a.z, a3 = a.w;
        float* d = this->c[fm][fn];
        asm volatile(
            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(__float_as_uint(a0)), "r"(__float_as_uint(a1)), "r"(__float_as_uint(a2)), "r"(__float_as_uint(a3)),
              "r"(b0), "r"(b1));
      }
    }
  }
};
#else
// The emulated twin (also valid CUDA): each of the lane's accumulator elements adds, k in order,
// fmaf(A, B, acc) over the rows and columns Tf32Fragment assigns it, A and B read from the tiles
// where the gather put them (tf32_a_row, tf32_a_column; tf32_b_row, tf32_b_slot), rounded there to
// TF32 as the real path takes them: TF32 inputs, FP32 accumulation. The tensor cores' internal
// order of a k8 step, and which k the real path's steps take, are the hardware's and the kernel's,
// so a GPU's bits may differ from these; the emulated test holds the twin to a host model bit for bit and
// both to ref:: within TF32's error (and the GPU's test-cuda holds the real instructions to
// ref::, and its rounding to an exact case).
template <int FM, int FN>
struct WarpTileTf32 : WarpTileTf32Base<FM, FN> {
  using Fragment = typename WarpTileTf32Base<FM, FN>::Fragment;
  template <int K, bool /*kRolled*/, int LdA, int LdB>
  __device__ void mma(const float (*a_tile)[LdA], const float (*b_tile)[LdB], int wm, int wn) {
    __syncwarp();
    const int lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
    for (int fm = 0; fm < FM; ++fm)
      for (int fn = 0; fn < FN; ++fn)
        for (int e = 0; e < 4; ++e) {
          const int row = wm + Fragment::row(fm, e / 2, g), column = wn + Fragment::column(fn, t, e % 2);
          float v = this->c[fm][fn][e];
          for (int k = 0; k < K; ++k)
            v = fmaf(a_tile[tiling::tf32_a_row(row, k)][tiling::tf32_a_column(row, k)],
                     b_tile[tiling::tf32_b_row(k)][tiling::tf32_b_slot(column)], v);
          this->c[fm][fn][e] = v;
        }
    __syncwarp();
  }
};
#endif

// implicit_gemm with the multiply on the tensor cores: the same gather into the TF32 layout's
// tiles (A in the mma's operand order; in 16-byte copies with kVectorA, where the problem's A rows
// allow them: kernel_with), rounded there; each warp accumulates its piece in mma.m16n8k8 fragments
// (conv2d_tiling::WarpLayout, Tf32Fragment) and at the end stores them straight from its
// registers: each lane's 2 FM rows and 2 FN columns decomposed once. Deterministic too: a fixed
// sequence of mma per warp. The three passes use it under TF32 (choose_tile's tile unless
// set_conv2d_tile forces another; choose_kernel). Registers: blocks_per_sm.
template <class Problem, class Tile, bool kVectorA>
__global__ void __launch_bounds__(kThreads, blocks_per_sm<Problem, Tile, true>())
    implicit_gemm_tf32(Problem whole) {
  static_assert(Tile::kTf32, "WarpTileTf32 reads B at tf32_b_slot: the TF32 layout's tiles only");
  using Warps = tiling::WarpLayout<Tile>;
  using Fragment = tiling::Tf32Fragment<Warps::kFragmentsM>;
  constexpr int FM = Warps::kFragmentsM, FN = Warps::kFragmentsN;
  const SharedTiles<Tile> tiles = shared_tiles<Tile>();
  __shared__ KEntry table[2][Tile::kK];
  const int t = int(threadIdx.x), warp = t / 32, lane = t % 32;
  const int wm = Warps::row(warp), wn = Warps::column(warp);
  const std::int64_t m0 = std::int64_t(blockIdx.y) * Tile::kM, n0 = std::int64_t(blockIdx.x) * Tile::kN;
  const Problem p = whole.in_slice(blockIdx.z);
  if (n0 >= p.columns() || m0 >= p.rows()) return;  // (as implicit_gemm's)

  // The kernels with scalar A copies (a row per A value: four times the rows of kVectorA) compiled
  // for two or three blocks per multiprocessor keep the two k8 steps a loop (WarpTileTf32):
  // unrolled, nvcc loads both steps' B fragments before the first product, and the backward
  // data's (with its stride classes) and the forward's 64 x 64 spilled at their 128 or 80
  // registers. So do the tiles that ask to (TwoBlocksPerSm).
  constexpr bool kRolledK8 = (!kVectorA || rolls_k8<Tile>()) && blocks_per_sm<Problem, Tile, true>() >= 2;
  WarpTileTf32<FM, FN> acc;
  acc.zero();
  k_loop<Tile, kVectorA>(p, t, m0, n0, Index(p.k_begin(blockIdx.z)), Index(p.k_end(blockIdx.z)), tiles.a, tiles.b,
                         table, [&](const float (*as)[Tile::kLdA], const float (*bs)[Tile::kLdB]) {
                           // each 16 k of the step: its block of rows of A, its 16 rows of B (a
                           // loop of one iteration kept nvcc from unrolling the K loop when asked:
                           // conv_ptx_stats.py --sass)
                           if constexpr (Tile::kK == 16) {
                             acc.template mma<16, kRolledK8>(as, bs, wm, wn);
                           } else {
                             for (int q = 0; q < Tile::kK / 16; ++q)
                               acc.template mma<16, kRolledK8>(as + q * Tile::kABlockRows, bs + 16 * q, wm, wn);
                           }
                         });
  // Lane 4 g + t holds rows Fragment::row(fm, s, g) and columns Fragment::column(fn, t, e) of the
  // piece: output row i = 2 fm + s, column j = 2 fn + e.
  const int g = lane / 4, lane_t = lane % 4;
  store_outputs<2, 2 * FM, 2 * FN, vector_stores<Problem, Tile>()>(
      p, [&](int i) { return m0 + wm + Fragment::row(i / 2, i % 2, g); },
      [&](int j) { return n0 + wn + Fragment::column(j / 2, lane_t, j % 2); },
      [&](int i, int j) { return acc.c[i / 2][j / 2][2 * (i % 2) + j % 2]; });
}

template <class Problem>
struct KernelChoice {
  void (*kernel)(Problem);
  int tile_m, tile_n;
  const char* name;
  bool tensor_cores;  // implicit_gemm_tf32: TF32 operands (a kRoundedA/kRoundedB copy must round)
  std::size_t shared_bytes = 0;  // dynamic shared memory per block (Tile::kDynamicShared)
  // With shared_bytes: the kernel of the same tile in static shared memory, for a device whose
  // blocks cannot hold shared_bytes (launch_gemm; the K step of 32 needs 101,760 bytes and its
  // tables 1,792 static, sm_86 and sm_89 GPUs allow 101,376)
  void (*static_kernel)(Problem) = nullptr;
};

template <class Problem>
void launch_gemm(const StreamHandle& s, const KernelChoice<Problem>& k, const Problem& p, std::int64_t rows,
                 std::int64_t columns, std::int64_t slices) {
  cuda_detail::DeviceGuard guard(s.device_index);
#ifdef PETRA_CUDA_EMULATION
  const ::petra::cuda_emulation::LaunchName launch_name(k.name);
#endif
  const dim3 grid(unsigned(tiling::ceil_div(columns, k.tile_n)), unsigned(tiling::ceil_div(rows, k.tile_m)),
                  unsigned(slices));
  void (*kernel)(Problem) = k.kernel;
  std::size_t shared_bytes = k.shared_bytes;
  if (shared_bytes > 0 &&
      !cuda_detail::dynamic_shared_fits(reinterpret_cast<const void*>(kernel), s.device_index, shared_bytes)) {
    kernel = k.static_kernel;
    shared_bytes = 0;
  }
  if (shared_bytes > 0)  // (the default limit is 48 KiB less the kernel's static shared memory)
    cuda_detail::allow_dynamic_shared(reinterpret_cast<const void*>(kernel), s.device_index, shared_bytes);
  PETRA_LAUNCH(kernel, grid, kThreads, shared_bytes, cuda_detail::stream_of(s))(p);
  cuda_detail::check_launch(k.name, __FILE__, __LINE__);
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

// ---- split-K for the forward and backward data (set_conv2d_split_k; conv2d_tiling::output_split)
//
// KSliced<P>: the product of P with its K cut into `split`'s slices, grid layer z summing slice z
// (P's own K order within it) into partials + z * slice_floats, laid out as P's output and without
// the bias; sum_output_partials then adds the slices. Only for problems with one grid layer of
// their own (the forward; backward data at stride 1, one stride class).
template <class Problem>
struct KSliced : Problem {
  tiling::SplitK split;
  float* partials;
  std::int64_t slice_floats;
  __device__ KSliced in_slice(unsigned z) const {
    KSliced q = *this;
    static_cast<Problem&>(q) = Problem::in_slice(0).writing_to(partials + z * slice_floats);
    return q;
  }
  __device__ std::int64_t k_begin(unsigned z) const { return split.begin(z); }
  __device__ std::int64_t k_end(unsigned z) const { return split.end(z); }
};

// out[e] = float(partials[0][e] + ... + partials[slices-1][e]), in double with the slices in order
// (the same bits on every run), plus bias[the channel of e] where there is one (as the unsplit
// forward adds it: after the sum, in float).
__global__ void sum_output_partials(std::int64_t size, std::int64_t slices, std::int64_t slice_floats,
                                    const float* partials, ChannelOf channel_of, const float* bias, float* out) {
  for (std::int64_t e = cuda_detail::thread_index(); e < size; e += cuda_detail::grid_threads()) {
    double sum = 0;
    for (std::int64_t z = 0; z < slices; ++z) sum += double(partials[z * slice_floats + e]);
    const float value = float(sum);
    out[e] = bias != nullptr ? value + bias[channel_of(e)] : value;
  }
}

// db[o] += the sum of dy[b, o, :, :] over b, in two launches (as batch norm's sums: one block per
// channel had too few blocks for a GPU, 64 us for (128, 64, 32, 32) on an H200). Block
// (o, slice) = blockIdx.x / slices, blockIdx.x % slices adds its thread's values of channel o
// (fast_divide.cuh's walk_channel, four loads ahead, in units of V: float4 where the plane is a
// multiple of 4 and dy 16-byte aligned, `plane` and `count` then in float4s) in double, then
// cuda_detail::block_sum's fixed tree, into partials[blockIdx.x]; add_bias_partials then adds
// each channel's partials with one warp (lane l the slices l, l + 32, ..., then warp_sum).
template <class V>
__global__ void __launch_bounds__(cuda_detail::kBlockThreads)
    bias_partials(std::int64_t channels, FastDivide plane, std::int64_t count, std::int64_t slices,
                  const float* dy, double* partials) {
  const std::int64_t o = blockIdx.x / slices, slice = blockIdx.x % slices;
  const std::int64_t start = slice * cuda_detail::kBlockThreads + threadIdx.x,
                     step = slices * cuda_detail::kBlockThreads;
  const auto* dyv = reinterpret_cast<const V*>(dy);
  double sum = 0;
  walk_channel<4>(
      ChannelWalk(plane, channels, o, start, step), start, step, count, [=](std::int64_t k) { return dyv[k]; },
      [&](const V& v) {
        for (int i = 0; i < cuda_detail::kWidth<V>; ++i) sum += double(cuda_detail::lane(v, i));
      });
  const double total = cuda_detail::block_sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// Launched with 32 threads per channel: warp o adds channel o's partials.
__global__ void add_bias_partials(std::int64_t channels, std::int64_t slices, const double* partials,
                                  float* db) {
  for (std::int64_t o = cuda_detail::warp_index(); o < channels; o += cuda_detail::grid_warps()) {
    const double total = cuda_detail::warp_strided_sum(partials + o * slices, slices, 1);
    if (threadIdx.x % 32 == 0) db[o] = float(double(db[o]) + total);
  }
}

// The math of the three passes (set_conv2d_math): process-wide, FP32 unless asked.
std::atomic<int> conv_math{int(Conv2dMath::fp32)};
// The FP32 path's tile (set_conv2d_tile): < 0 for choose_tile's.
std::atomic<int> conv_tile{-1};
// Whether the TF32 forward may read channels-last copies (set_conv2d_channels_last).
std::atomic<bool> conv_channels_last{true};
// The weight gradient's algorithm on 3x3, stride-1, padding-1 layers (set_conv2d_weight_algorithm).
std::atomic<int> conv_weight_algorithm{int(Conv2dWeightAlgorithm::automatic)};
// set_conv2d_forward_algorithm's choice (Conv2dForwardAlgorithm)
std::atomic<int> conv_forward_algorithm{int(Conv2dForwardAlgorithm::direct)};
// Whether the forward and backward data may cut their K into slices (set_conv2d_split_k).
std::atomic<bool> conv_split_k{false};
// The most elements a tensor of one launch may have (set_conv2d_launch_elements): the kernels
// index in 32 bits.
constexpr std::int64_t kIndexLimit = std::numeric_limits<Index>::max();
std::atomic<std::int64_t> launch_element_limit{kIndexLimit};

// Runs launch(part, x_at, y_at) over consecutive parts of the batch, each of as many samples as
// keep the input and output of a launch within launch_element_limit (the whole batch unless it is
// over 2^31 elements); x_at and y_at are where the part starts in the input and the output. The
// parts depend on the shape only; the weight gradient adds them into dw in batch order. A sample
// over the limit, one whose padding puts the gathers' offsets past 2^31, or a kernel over
// kMaxKernelExtent taps a side, is a ShapeError.
template <class Launch>
void for_each_batch_part(const Conv2dShape& shape, Launch launch) {
  const std::int64_t limit = launch_element_limit.load();
  const std::int64_t x_sample = shape.in_channels * shape.in_h * shape.in_w,
                     y_sample = shape.out_channels * shape.out_h() * shape.out_w();
  const std::int64_t per_sample = std::max(x_sample, y_sample);
  if (per_sample > limit || shape.weight_size() > limit)
    throw ShapeError(detail::concat("conv2d: petra's CUDA kernels index in 32 bits: one sample has ", per_sample,
                                    " elements and the weights ", shape.weight_size(), ", over the limit of ", limit,
                                    " (--conv-impl cudnn has none)"));
  if (shape.kernel_h > tiling::kMaxKernelExtent || shape.kernel_w > tiling::kMaxKernelExtent)
    throw ShapeError(detail::concat("conv2d: petra's CUDA kernels take kernels of at most ", tiling::kMaxKernelExtent,
                                    " taps a side (their bounds checks are 32-bit masks of taps), not ",
                                    shape.kernel_h, "x", shape.kernel_w, " (--conv-impl cudnn has no such limit)"));
  // ... and keep the offsets of the gathers within 32 bits: they reach past x's and dy's planes by
  // up to the padding plus the kernel (tiling::offsets_fit; binds only with a padding of hundreds)
  const std::int64_t reach_h = shape.pad_h + shape.kernel_h, reach_w = shape.pad_w + shape.kernel_w;
  const auto offsets_fit = [&](std::int64_t samples) {
    return tiling::offsets_fit(samples * shape.in_channels, shape.in_h, shape.in_w, 1, reach_h, reach_w) &&
           tiling::offsets_fit(samples * shape.out_channels, shape.out_h(), shape.out_w(), 1, reach_h, reach_w);
  };
  if (!offsets_fit(1))
    throw ShapeError(detail::concat("conv2d: petra's CUDA kernels index in 32 bits: a padding of ", shape.pad_h, "x",
                                    shape.pad_w, " around one sample's ", shape.in_channels, " planes of ", shape.in_h,
                                    "x", shape.in_w, " puts offsets past 2^31 (--conv-impl cudnn has no such limit)"));
  std::int64_t part = std::max<std::int64_t>(1, limit / std::max<std::int64_t>(per_sample, 1));
  for (std::int64_t fits = 1; !offsets_fit(part);) {  // the most samples that fit: between fits and part
    const std::int64_t middle = fits + (part - fits) / 2;
    if (middle == fits) part = fits;
    else if (offsets_fit(middle)) fits = middle;
    else part = middle;
  }
  for (std::int64_t b0 = 0; b0 < shape.batch; b0 += part) {
    Conv2dShape sub = shape;
    sub.batch = std::min(part, shape.batch - b0);
    launch(sub, b0 * x_sample, b0 * y_sample);
  }
}

// The FP32 or tensor-core kernel of a tile; the tensor-core one with 16-byte A copies where the
// problem's A allows them (vector_a: Problem::kVectorA and its vector_a_allowed()).
// (A problem with 16-byte B copies, Problem::kVectorB, has that one kernel only.)
template <class Problem, bool tf32, class Tile>
KernelChoice<Problem> kernel_with(const char* name, bool vector_a) {
  if constexpr (!tf32) {
    static_assert(!Problem::kVectorB, "16-byte B copies: the TF32 kernel only");
    return {implicit_gemm<Problem, Tile>, Tile::kM, Tile::kN, name, false};
  } else {
    constexpr std::size_t shared = Tile::kDynamicSharedBytes;
    if constexpr (Problem::kVectorB) {
      return {implicit_gemm_tf32<Problem, Tile, true>, Tile::kM, Tile::kN, name, true, shared};
    } else {
      if constexpr (Problem::kVectorA) {
        if (vector_a) return {implicit_gemm_tf32<Problem, Tile, true>, Tile::kM, Tile::kN, name, true, shared};
      }
      return {implicit_gemm_tf32<Problem, Tile, false>, Tile::kM, Tile::kN, name, true, shared};
    }
  }
}
// The FP32 path's tiles and the TF32 path's (conv2d_tiling.cuh, Tf32Tile).
template <class Problem, bool tf32, int M, int N>
KernelChoice<Problem> kernel_of_shape(const char* name, bool vector_a) {
  if constexpr (tf32)
    return kernel_with<Problem, true, tiling::Tf32Tile<M, N>>(name, vector_a);
  else
    return kernel_with<Problem, false, tiling::TileShape<M, N>>(name, vector_a);
}
// The problems whose TF32 128 x 128 kernel fits 128 registers, two blocks per multiprocessor,
// without spilling (ptxas -v, sm_80 and sm_90, nvcc 13.0, 2026-12-06), and how: the channels-last
// forward with its k8 steps a loop (unrolled it spills 4 bytes on sm_90), the channels-last weight
// gradient and Winograd's GEMM as they are (the former spills 4 bytes on sm_80 with the loop). The
// others spill 8-180 bytes there (the NCHW passes; the channels-last backward data 48 / 104 bytes
// on sm_90 even with the loop): for them k128x128_two_per_sm is the one-block 128 x 128 kernel.
enum class TwoBlocks { no, as_is, rolled_k8 };
template <class Problem>
constexpr TwoBlocks two_blocks_per_sm() {
  if constexpr (std::is_same_v<Problem, ChannelsLastForwardProblem>) return TwoBlocks::rolled_k8;
  if constexpr (std::is_same_v<Problem, ChannelsLastWeightProblem> || std::is_same_v<Problem, WinogradWeightProblem>)
    return TwoBlocks::as_is;
  return TwoBlocks::no;
}
template <class Problem, bool tf32>
KernelChoice<Problem> kernel_for(tiling::TileChoice tile, const char* name, bool vector_a) {
  constexpr TwoBlocks two_blocks = two_blocks_per_sm<Problem>();
  switch (tile) {
    case tiling::TileChoice::k128x128_two_per_sm:
      if constexpr (tf32 && two_blocks != TwoBlocks::no) {
        using Tile = TwoBlocksPerSm<tiling::Tf32Tile<128, 128>, two_blocks == TwoBlocks::rolled_k8>;
        return kernel_with<Problem, true, Tile>(name, vector_a);
      }
      return kernel_of_shape<Problem, tf32, 128, 128>(name, vector_a);
    case tiling::TileChoice::k128x128_k32:
      if constexpr (tf32) {
        KernelChoice<Problem> k32 = kernel_with<Problem, true, tiling::Tf32TileK32<128, 128>>(name, vector_a);
        k32.static_kernel = kernel_of_shape<Problem, true, 128, 128>(name, vector_a).kernel;
        return k32;
      }
      [[fallthrough]];
    case tiling::TileChoice::k128x128: return kernel_of_shape<Problem, tf32, 128, 128>(name, vector_a);
    case tiling::TileChoice::k64x128: return kernel_of_shape<Problem, tf32, 64, 128>(name, vector_a);
    case tiling::TileChoice::k128x64: return kernel_of_shape<Problem, tf32, 128, 64>(name, vector_a);
    case tiling::TileChoice::k64x64: break;
  }
  return kernel_of_shape<Problem, tf32, 64, 64>(name, vector_a);
}

// The pass's kernel for a product of rows x columns x layers under the current math and tile:
// the FP32 or the tensor-core one, with the tile set_conv2d_tile forces or choose_tile picks. The
// launch name is the same for every tile.
// The tile set_conv2d_tile forces, or choose_tile's.
tiling::TileChoice tile_for(tiling::ConvPass pass, std::int64_t rows, std::int64_t columns, std::int64_t layers) {
  const int forced = conv_tile.load();
  return forced >= 0 ? tiling::TileChoice(forced) : tiling::choose_tile(pass, rows, columns, layers);
}
template <class Problem>
KernelChoice<Problem> choose_kernel(const Problem& p, const char* fp32_name, const char* tf32_name,
                                    tiling::ConvPass pass, std::int64_t rows, std::int64_t columns,
                                    std::int64_t layers) {
  const tiling::TileChoice tile = tile_for(pass, rows, columns, layers);
  if (Conv2dMath(conv_math.load()) == Conv2dMath::tf32)
    return kernel_for<Problem, true>(tile, tf32_name, p.vector_a_allowed());
  return kernel_for<Problem, false>(tile, fp32_name, false);
}

// The least terms in a K slice of the forward or backward data (conv2d_tiling::output_split); 64
// under the emulation, so that the tests' small shapes split.
#ifdef PETRA_CUDA_EMULATION
constexpr std::int64_t kOutputSliceMinK = 64;
#else
constexpr std::int64_t kOutputSliceMinK = tiling::kOutputSliceMinK;
#endif
// The most scratch a split product's partials may take (more: no split).
constexpr std::int64_t kOutputMaxPartialBytes = std::int64_t(64) << 20;

// Floats of one slice's partials: the output's, rounded up to 64 (each slice 256-byte aligned).
std::int64_t slice_floats_of(std::int64_t output_floats) { return tiling::ceil_div(output_floats, 64) * 64; }
std::int64_t partial_floats_of(const tiling::SplitK& split, std::int64_t output_floats) {
  return split.slices > 1 ? split.slices * slice_floats_of(output_floats) : 0;
}

// `rule`'s slices where set_conv2d_split_k is on, no tile is forced (bench-cuda's per-tile rows
// stay the tiles' own), the stream has a workspace and the partials of an output of output_floats
// fit kOutputMaxPartialBytes; else one slice.
tiling::SplitK output_split_for(const StreamHandle& s, const tiling::SplitK& rule, std::int64_t output_floats) {
  const tiling::SplitK whole{rule.total, rule.total, 1};
  if (!conv_split_k.load() || conv_tile.load() >= 0 || s.workspace == nullptr || rule.slices < 2) return whole;
  if (partial_floats_of(rule, output_floats) * std::int64_t(sizeof(float)) > kOutputMaxPartialBytes) return whole;
  return rule;
}

// p's product of rows x columns over split's slices (KSliced) on the 128 x 128 tile into
// `partials`, then their sum into `out` (output_floats floats; with the forward's bias by
// channel_of). The product keeps the unsplit kernel's launch name; the sum is `sum_name`.
template <class Problem>
void launch_sliced(const StreamHandle& s, const Problem& p, const tiling::SplitK& split, float* partials,
                   std::int64_t rows, std::int64_t columns, const char* fp32_name, const char* tf32_name,
                   const char* sum_name, std::int64_t output_floats, ChannelOf channel_of, const float* bias,
                   float* out) {
  const std::int64_t slice_floats = slice_floats_of(output_floats);
  const KSliced<Problem> sliced{p, split, partials, slice_floats};
  const auto kernel = [&] {
    if constexpr (Problem::kVectorB)  // (the channels-last problems: TF32 only)
      return kernel_of_shape<KSliced<Problem>, true, 128, 128>(tf32_name, true);
    else if (Conv2dMath(conv_math.load()) == Conv2dMath::tf32)
      return kernel_of_shape<KSliced<Problem>, true, 128, 128>(tf32_name, p.vector_a_allowed());
    else
      return kernel_of_shape<KSliced<Problem>, false, 128, 128>(fp32_name, false);
  }();
  launch_gemm(s, kernel, sliced, rows, columns, split.slices);
  cuda_detail::launch_grid_stride(sum_name, s, output_floats, sum_output_partials, output_floats, split.slices,
                                  slice_floats, static_cast<const float*>(partials), channel_of, bias, out);
}

}  // namespace

void set_conv2d_math(Conv2dMath math) { conv_math.store(int(math)); }
void set_conv2d_tile(int tile) { conv_tile.store(tile < 0 || tile > 5 ? -1 : tile); }
void set_conv2d_weight_algorithm(Conv2dWeightAlgorithm algorithm) { conv_weight_algorithm.store(int(algorithm)); }
void set_conv2d_channels_last(bool enabled) { conv_channels_last.store(enabled); }
bool conv2d_channels_last() { return conv_channels_last.load(); }
Conv2dWeightAlgorithm conv2d_weight_algorithm() { return Conv2dWeightAlgorithm(conv_weight_algorithm.load()); }
void set_conv2d_forward_algorithm(Conv2dForwardAlgorithm algorithm) { conv_forward_algorithm.store(int(algorithm)); }
void set_conv2d_split_k(bool on) { conv_split_k.store(on); }
bool conv2d_split_k() { return conv_split_k.load(); }
Conv2dForwardAlgorithm conv2d_forward_algorithm() { return Conv2dForwardAlgorithm(conv_forward_algorithm.load()); }
void set_conv2d_launch_elements(std::int64_t limit) {
  launch_element_limit.store(limit <= 0 || limit > kIndexLimit ? kIndexLimit : limit);
}
Conv2dMath conv2d_math() { return Conv2dMath(conv_math.load()); }

namespace {
// The TF32 backward data's copy of the weights laid out by k (DataProblem::wt): per stride class z
// and in-channel c a row of k_max floats, A(c, k) of the class at k (k = (o, v_i, v_j)), zeros
// past the class's own K. k_max: out_channels x the largest class's taps (the first class's:
// ceil(kernel / stride) per axis), rounded up to a multiple of 4 so that every row starts 16-byte
// aligned (the 16-byte copies stop at the class's K).
std::int64_t data_weight_k_max(const Conv2dShape& s) {
  const std::int64_t k =
      s.out_channels * tiling::ceil_div(s.kernel_h, s.stride_h) * tiling::ceil_div(s.kernel_w, s.stride_w);
  return tiling::ceil_div(k, 4) * 4;
}
std::int64_t data_weight_transposed_size(const Conv2dShape& s) {
  return s.stride_h * s.stride_w * s.in_channels * data_weight_k_max(s);
}
__global__ void data_weight_transpose(ConvGeometry g, Index k_max, const float* w, float* wt) {
  const std::int64_t per_class = g.in_channels * std::int64_t(k_max), n = g.stride_h * g.stride_w * per_class;
  for (std::int64_t i = cuda_detail::thread_index(); i < n; i += cuda_detail::grid_threads()) {
    const std::int64_t z = i / per_class, rest = i - z * per_class, c = rest / k_max, k = rest - c * k_max;
    const std::int64_t r_h = z / g.stride_w, r_w = z - r_h * g.stride_w;
    const tiling::StrideClass ch = tiling::stride_class(r_h, g.stride_h, g.pad_h, g.in_h, g.kernel_h);
    const tiling::StrideClass cw = tiling::stride_class(r_w, g.stride_w, g.pad_w, g.in_w, g.kernel_w);
    const std::int64_t taps = std::int64_t(ch.taps) * cw.taps;
    float v = 0.0f;
    if (k < g.out_channels * taps) {
      const std::int64_t o = k / taps, t = k - o * taps, v_i = t / cw.taps, v_j = t - v_i * cw.taps;
      const std::int64_t tap_h = ch.tap0 + v_i * g.stride_h, tap_w = cw.tap0 + v_j * g.stride_w;
      v = w[((o * g.in_channels + c) * g.kernel_h + tap_h) * g.kernel_w + tap_w];
    }
    wt[i] = v;
  }
}

// ---- the TF32 forward from channels-last copies (ChannelsLastForwardProblem) -----------------

// xc[b][p][c] = x[b][c][p] (p: a pixel of the plane), through 32 x 32 tiles of shared memory so
// that both the reads (along a channel's plane) and the writes (along a pixel's channels) are
// coalesced; block i handles tiles i, i + grid, ... of (sample, channel tile, pixel tile). The
// tile's rows are 33 floats: a column of it (the writes' reads) is then on 32 banks. Every value
// is rounded to TF32 (tf32_round) as it is written: the copies feed only the tensor cores, and so
// the K loop does not round them (Problem::kRoundedA: the forward's and backward data's A, in
// place of tf32_operand's add on every value of every step, whose guard against infinities and
// NaN took 6 PTX instructions a value, 48 of a 128 x 128 step's 243, 20 of its 260 in SASS; the same
// bits, as the tensor cores truncate tf32_operand's to tf32_round's, conv2d_tiling::tf32_operand_bits).
// kTf32B (the weight gradient's B, ChannelsLastWeightProblem; channels % 32 == 0): each 32
// channels in tf32_b_slot's order, xc[b][p][tf32_b_slot(c)].
constexpr int kTransposeTile = 32;
template <bool kTf32B>
__global__ void to_channels_last(Index batch, Index channels, Index plane, const float* x, float* xc) {
  __shared__ float tile[kTransposeTile][kTransposeTile + 1];
  const int tx = int(threadIdx.x) % kTransposeTile, ty = int(threadIdx.x) / kTransposeTile;
  constexpr int kRowsPerPass = kThreads / kTransposeTile;  // 8
  const Index pixel_tiles = (plane + kTransposeTile - 1) / kTransposeTile;
  const Index channel_tiles = (channels + kTransposeTile - 1) / kTransposeTile;
  const std::int64_t tiles = std::int64_t(batch) * channel_tiles * pixel_tiles;
  for (std::int64_t i = blockIdx.x; i < tiles; i += gridDim.x) {
    const Index b = Index(i / (std::int64_t(channel_tiles) * pixel_tiles));
    const Index rest = Index(i - std::int64_t(b) * channel_tiles * pixel_tiles);
    const Index c0 = rest / pixel_tiles * kTransposeTile, p0 = rest % pixel_tiles * kTransposeTile;
    const float* sample = x + std::int64_t(b) * channels * plane;
    float* sample_c = xc + std::int64_t(b) * channels * plane;
    __syncthreads();  // the previous tile's reads of `tile` are done
    for (int r = ty; r < kTransposeTile; r += kRowsPerPass) {
      const Index c = c0 + r, p = p0 + tx;
      if (c < channels && p < plane) tile[r][tx] = sample[std::int64_t(c) * plane + p];
    }
    __syncthreads();
    for (int r = ty; r < kTransposeTile; r += kRowsPerPass) {
      const Index p = p0 + r, c = c0 + tx;
      if constexpr (kTf32B) {  // slot tx holds channel c0 + tf32_b_column_of_slot(tx) (a whole tile of channels)
        if (p < plane) sample_c[std::int64_t(p) * channels + c] = tiling::tf32_round(tile[tiling::tf32_b_column_of_slot(tx)][r]);
      } else {
        if (c < channels && p < plane) sample_c[std::int64_t(p) * channels + c] = tiling::tf32_round(tile[tx][r]);
      }
    }
  }
}

// to_channels_last of `batch` samples of `channels` x `plane` floats, from `from` into `to` (at most
// 4096 blocks, each looping over its share of the 32 x 32 tiles).
template <bool kTf32B = false>
void launch_to_channels_last(const char* name, const StreamHandle& s, std::int64_t batch, std::int64_t channels,
                             std::int64_t plane, const float* from, float* to) {
  // (kTf32B writes whole tiles of 32 channels: a partial one would write past `to`)
  PETRA_CHECK(!kTf32B || channels % kTransposeTile == 0, ShapeError, name, ": ", channels,
              " channels, not a multiple of ", kTransposeTile);
  const std::int64_t tiles =
      batch * tiling::ceil_div(channels, kTransposeTile) * tiling::ceil_div(plane, kTransposeTile);
  if (tiles <= 0) return;  // nothing to copy (no channel, or an empty plane): an empty grid is an error
  cuda_detail::launch_blocks(name, s, unsigned(std::min<std::int64_t>(tiles, 4096)), kThreads,
                             to_channels_last<kTf32B>, Index(batch), Index(channels), Index(plane), from, to);
}

// wt[k][tf32_b_slot(o)] = tf32_round(w[o, c, i, j]) for k = (i, j, c), c fastest, and 0 for the
// padding o >= out_channels (rows of n_pad floats, a multiple of 128).
__global__ void weights_by_tap(ConvGeometry g, Index n_pad, const float* w, float* wt) {
  const std::int64_t n = g.in_channels * g.taps() * std::int64_t(n_pad);
  for (std::int64_t e = cuda_detail::thread_index(); e < n; e += cuda_detail::grid_threads()) {
    const std::int64_t k = e / n_pad, o = tiling::tf32_b_column_of_slot(int(e - k * n_pad));
    const std::int64_t tap = k / g.in_channels, c = k - tap * g.in_channels;
    wt[e] = o < g.out_channels ? tiling::tf32_round(w[(o * g.in_channels + c) * g.taps() + tap]) : 0.0f;
  }
}

// The copies' sizes in floats (the weights' rows start at a multiple of 64 floats after xc), and
// the most scratch memory they may take: above it (a batch part's input over ~60 MiB), the forward
// takes ForwardProblem's path.
constexpr std::int64_t kChannelsLastMaxBytes = std::int64_t(64) << 20;
// B's rows: the columns padded to a multiple of 128 (the widest tile)
std::int64_t channels_last_n_pad_of(std::int64_t columns) { return tiling::ceil_div(columns, 128) * 128; }
std::int64_t channels_last_n_pad(const Conv2dShape& s) { return channels_last_n_pad_of(s.out_channels); }
std::int64_t channels_last_x_floats(const Conv2dShape& s) { return tiling::ceil_div(s.input_size(), 64) * 64; }
std::int64_t channels_last_floats(const Conv2dShape& s) {
  return channels_last_x_floats(s) + s.in_channels * s.kernel_h * s.kernel_w * channels_last_n_pad(s);
}

// Whether the channels-last problems' 32-bit offsets into a copy of x (the forward's, the weight
// gradient's) or of dy (backward data's) stay in range: their pixels' corners lie up to the
// padding outside the image, times the channels now (tiling::offsets_fit; the 64 MiB cap on the
// copies does not bound that with a padding of 128 or more).
bool x_channels_last_offsets_fit(const Conv2dShape& s) {
  return tiling::offsets_fit(s.batch, s.in_h, s.in_w, s.in_channels, s.pad_h + s.kernel_h, s.pad_w + s.kernel_w);
}
bool dy_channels_last_offsets_fit(const Conv2dShape& s) {
  return tiling::offsets_fit(s.batch, s.out_h(), s.out_w(), s.out_channels, s.pad_h + s.kernel_h,
                             s.pad_w + s.kernel_w);
}

// Whether conv2d_forward takes the channels-last path for a batch part: TF32 with
// set_conv2d_channels_last on (the default), stride 1, in_channels a multiple of 4 (four k of a
// tap in one aligned 16-byte copy), a stream with scratch memory, the copies within
// kChannelsLastMaxBytes, and the pixels' row tiles within a grid's y (65535). Stride 1: at stride
// 2 the product reads a quarter of x's pixels (1x1) or about as many as x has (3x3) but the copy
// moves all of it, and run 12 (H100) timed the NCHW path faster there: the ResNet shortcuts
// 0.025 / 0.019 / 0.020 ms against 0.058 / 0.037 / 0.029, the first 3x3 stride-2 layer 0.099
// against 0.114 (the other two within 6%).
bool channels_last_applies(const StreamHandle& s, const Conv2dShape& shape) {
  return Conv2dMath(conv_math.load()) == Conv2dMath::tf32 && conv_channels_last.load() &&
         shape.stride_h == 1 && shape.stride_w == 1 && shape.in_channels % 4 == 0 &&
         s.workspace != nullptr &&
         channels_last_floats(shape) * std::int64_t(sizeof(float)) <= kChannelsLastMaxBytes &&
         tiling::ceil_div(shape.batch * shape.out_h() * shape.out_w(), 64) <= 65535 &&
         x_channels_last_offsets_fit(shape);
}

void channels_last_forward_launch(const StreamHandle& s, const Conv2dShape& shape, const float* x, const float* w,
                                  const float* bias, float* y) {
  // the scratch: the copies of x and of the weights, then the partials of a split product
  const tiling::SplitK split =
      output_split_for(s, tiling::forward_output_split(shape, kOutputSliceMinK), shape.output_size());
  const std::int64_t copies = slice_floats_of(channels_last_floats(shape));
  auto* xc = static_cast<float*>(
      s.scratch(std::size_t(copies + partial_floats_of(split, shape.output_size())) * sizeof(float)));
  float* wt = xc + channels_last_x_floats(shape);
  const ConvGeometry g = ConvGeometry::of(shape);
  const Index n_pad = Index(channels_last_n_pad(shape));
  launch_to_channels_last("conv2d_forward_to_channels_last", s, shape.batch, shape.in_channels,
                          shape.in_h * shape.in_w, x, xc);
  cuda_detail::launch_grid_stride("conv2d_forward_weights_by_tap", s, channels_last_floats(shape) -
                                  channels_last_x_floats(shape), weights_by_tap, g, n_pad, w, wt);
  const ChannelsLastForwardProblem p{g, xc, wt, bias, y, n_pad};
  const std::int64_t pixels = shape.batch * shape.out_h() * shape.out_w();
  if (split.slices > 1)
    return launch_sliced(s, p, split, xc + copies, pixels, shape.out_channels, nullptr,
                         "conv2d_forward_tf32_channels_last", "conv2d_forward_slices_sum", shape.output_size(),
                         ChannelOf(shape.out_h() * shape.out_w(), shape.out_channels), bias, y);
  const auto k = kernel_for<ChannelsLastForwardProblem, true>(
      tile_for(tiling::ConvPass::forward, pixels, shape.out_channels, 1), "conv2d_forward_tf32_channels_last", true);
  launch_gemm(s, k, p, pixels, shape.out_channels, 1);
}

// Backward data's weights for ChannelsLastDataProblem: wt[z][k][tf32_b_slot(c)] =
// tf32_round(w[o, c, tap_h, tap_w]) for stride class z and its k = (v_i, v_j, o), o fastest (tap =
// the class's tap0 + v * stride), 0 past the class's own K (k_max rows: data_weight_k_max) and for
// the padding c >= in_channels.
__global__ void data_weights_by_tap(ConvGeometry g, Index k_max, Index n_pad, const float* w, float* wt) {
  const std::int64_t per_class = std::int64_t(k_max) * n_pad, n = g.stride_h * g.stride_w * per_class;
  for (std::int64_t e = cuda_detail::thread_index(); e < n; e += cuda_detail::grid_threads()) {
    const std::int64_t z = e / per_class, rest = e - z * per_class, k = rest / n_pad;
    const std::int64_t c = tiling::tf32_b_column_of_slot(int(rest - k * n_pad));
    const std::int64_t r_h = z / g.stride_w, r_w = z - r_h * g.stride_w;
    const tiling::StrideClass ch = tiling::stride_class(r_h, g.stride_h, g.pad_h, g.in_h, g.kernel_h);
    const tiling::StrideClass cw = tiling::stride_class(r_w, g.stride_w, g.pad_w, g.in_w, g.kernel_w);
    float v = 0.0f;
    if (c < g.in_channels && k < g.out_channels * ch.taps * cw.taps) {
      const std::int64_t tap = k / g.out_channels, o = k - tap * g.out_channels;
      const std::int64_t v_i = tap / cw.taps, v_j = tap - v_i * cw.taps;
      const std::int64_t tap_h = ch.tap0 + v_i * g.stride_h, tap_w = cw.tap0 + v_j * g.stride_w;
      v = tiling::tf32_round(w[((o * g.in_channels + c) * g.kernel_h + tap_h) * g.kernel_w + tap_w]);
    }
    wt[e] = v;
  }
}

// Backward data's copies, in floats: the weights per class (data_weights_by_tap), then dy
// channels-last from a multiple of 64 floats.
std::int64_t data_channels_last_weight_floats(const Conv2dShape& s) {
  return tiling::ceil_div(s.stride_h * s.stride_w * data_weight_k_max(s) * channels_last_n_pad_of(s.in_channels), 64) *
         64;
}
std::int64_t data_channels_last_floats(const Conv2dShape& s) {
  return data_channels_last_weight_floats(s) + s.output_size();
}
// As channels_last_applies, for backward data: out_channels % 4 == 0, the widest class's pixels
// in row tiles within a grid's y.
bool data_channels_last_applies(const StreamHandle& s, const Conv2dShape& shape) {
  const std::int64_t widest =
      shape.batch * tiling::ceil_div(shape.in_h, shape.stride_h) * tiling::ceil_div(shape.in_w, shape.stride_w);
  return Conv2dMath(conv_math.load()) == Conv2dMath::tf32 && conv_channels_last.load() &&
         shape.out_channels % 4 == 0 && s.workspace != nullptr &&
         data_channels_last_floats(shape) * std::int64_t(sizeof(float)) <= kChannelsLastMaxBytes &&
         tiling::ceil_div(widest, 64) <= 65535 && dy_channels_last_offsets_fit(shape);
}

// Backward data from channels-last copies (ChannelsLastDataProblem): the weights once, then per
// batch part dy copied and the product, one grid layer per stride class.
void channels_last_data(const StreamHandle& s, const Conv2dShape& shape, const float* dy, const float* w,
                        float* dx) {
  // the scratch: the weights by class and tap, the copy of dy, then the partials of a split product
  // (stride 1 only; the parts share the whole batch's split: parts exist only where a tensor
  // reaches 2^31 elements, and then the rule never splits)
  const tiling::SplitK split =
      output_split_for(s, tiling::data_output_split(shape, kOutputSliceMinK), shape.input_size());
  const std::int64_t copies = slice_floats_of(data_channels_last_floats(shape));
  auto* wt = static_cast<float*>(
      s.scratch(std::size_t(copies + partial_floats_of(split, shape.input_size())) * sizeof(float)));
  float* dyc = wt + data_channels_last_weight_floats(shape);
  const Index k_max = Index(data_weight_k_max(shape)), n_pad = Index(channels_last_n_pad_of(shape.in_channels));
  cuda_detail::launch_grid_stride("conv2d_backward_data_weights_by_tap", s,
                                  shape.stride_h * shape.stride_w * std::int64_t(k_max) * n_pad, data_weights_by_tap,
                                  ConvGeometry::of(shape), k_max, n_pad, w, wt);
  for_each_batch_part(shape, [&](const Conv2dShape& part, std::int64_t x_at, std::int64_t y_at) {
    launch_to_channels_last("conv2d_backward_data_to_channels_last", s, part.batch, part.out_channels,
                            part.out_h() * part.out_w(), dy + y_at, dyc);
    const ChannelsLastDataProblem p{ConvGeometry::of(part), dyc, wt, dx + x_at, n_pad, k_max};
    const std::int64_t widest =
        part.batch * tiling::ceil_div(part.in_h, part.stride_h) * tiling::ceil_div(part.in_w, part.stride_w);
    const std::int64_t classes = part.stride_h * part.stride_w;
    if (split.slices > 1)
      return launch_sliced(s, p, split, wt + copies, widest, part.in_channels, nullptr,
                           "conv2d_backward_data_tf32_channels_last", "conv2d_backward_data_slices_sum",
                           part.input_size(), ChannelOf(1, 1), nullptr, dx + x_at);
    const auto k = kernel_for<ChannelsLastDataProblem, true>(tile_for(tiling::ConvPass::data, widest, part.in_channels,
                                                                      classes),
                                                             "conv2d_backward_data_tf32_channels_last", true);
    launch_gemm(s, k, p, widest, part.in_channels, classes);
  });
}

void forward_launch(const StreamHandle& s, const Conv2dShape& shape, const float* x, const float* w,
                    const float* bias, float* y) {
  if (channels_last_applies(s, shape)) return channels_last_forward_launch(s, shape, x, w, bias, y);
  const ForwardProblem p{ConvGeometry::of(shape), x, w, bias, y};
  const std::int64_t columns = shape.batch * shape.out_h() * shape.out_w();
  const tiling::SplitK split =
      output_split_for(s, tiling::forward_output_split(shape, kOutputSliceMinK), shape.output_size());
  if (split.slices > 1) {
    auto* partials = static_cast<float*>(
        s.scratch(std::size_t(partial_floats_of(split, shape.output_size())) * sizeof(float)));
    return launch_sliced(s, p, split, partials, shape.out_channels, columns, "conv2d_forward", "conv2d_forward_tf32",
                         "conv2d_forward_slices_sum", shape.output_size(),
                         ChannelOf(shape.out_h() * shape.out_w(), shape.out_channels), bias, y);
  }
  const auto k = choose_kernel(p, "conv2d_forward", "conv2d_forward_tf32", tiling::ConvPass::forward,
                               shape.out_channels, columns, 1);
  launch_gemm(s, k, p, shape.out_channels, columns, 1);
}

void data_launch(const StreamHandle& s, const Conv2dShape& shape, const float* dy, const float* w, float* dx,
                 const float* wt) {
  DataProblem p{ConvGeometry::of(shape), dy, w, dx};
  if (wt != nullptr) p.wt = wt, p.k_max = Index(data_weight_k_max(shape));
  // One grid layer per stride class, each as wide as the widest class (ceil(in / stride) per axis).
  const std::int64_t widest = shape.batch * tiling::ceil_div(shape.in_h, shape.stride_h) *
                              tiling::ceil_div(shape.in_w, shape.stride_w);
  const std::int64_t classes = shape.stride_h * shape.stride_w;
  // (a split needs scratch of its own: not with the weights' copy, wt, in it)
  const tiling::SplitK split = wt != nullptr ? tiling::SplitK{1, 1, 1}
                                             : output_split_for(s, tiling::data_output_split(shape, kOutputSliceMinK),
                                                                shape.input_size());
  if (split.slices > 1) {
    auto* partials = static_cast<float*>(
        s.scratch(std::size_t(partial_floats_of(split, shape.input_size())) * sizeof(float)));
    return launch_sliced(s, p, split, partials, shape.in_channels, widest, "conv2d_backward_data",
                         "conv2d_backward_data_tf32", "conv2d_backward_data_slices_sum", shape.input_size(),
                         ChannelOf(1, 1), nullptr, dx);
  }
  const auto k = choose_kernel(p, "conv2d_backward_data", "conv2d_backward_data_tf32", tiling::ConvPass::data,
                               shape.in_channels, widest, classes);
  launch_gemm(s, k, p, shape.in_channels, widest, classes);
}

// Whether the weight gradient of a batch part takes ChannelsLastWeightProblem: TF32 with
// set_conv2d_channels_last on (the default), in_channels a multiple of 32 (a 16-byte copy's four
// slots are then in one group of 32 channels, of one tap), dy's rows in 16-byte copies (the
// kernel has those only: WeightProblem::vector_a_allowed), a stream with scratch memory, and the
// copy of x within kChannelsLastMaxBytes.
bool weight_channels_last_applies(const StreamHandle& s, const Conv2dShape& shape, const WeightProblem& p) {
  return Conv2dMath(conv_math.load()) == Conv2dMath::tf32 && conv_channels_last.load() &&
         shape.in_channels % 32 == 0 && p.vector_a_allowed() && s.workspace != nullptr &&
         channels_last_x_floats(shape) * std::int64_t(sizeof(float)) <= kChannelsLastMaxBytes &&
         x_channels_last_offsets_fit(shape);
}

void weight_launch(const StreamHandle& s, const Conv2dShape& shape, const float* x, const float* dy, float* dw,
                   std::int64_t slices) {
  const std::int64_t depth = shape.batch * shape.out_h() * shape.out_w();
  const std::int64_t size = shape.weight_size();
  if (size <= 0 || depth <= 0) return;  // dw += 0
  const tiling::SplitK split = tiling::split_k(depth, slices);
  const ConvGeometry g = ConvGeometry::of(shape);
  const std::int64_t columns = shape.in_channels * shape.kernel_h * shape.kernel_w;
  WeightProblem p{g, x, dy, dw, nullptr, split};
  // the scratch: the channels-last copy of x (if taken), then the partials (if several slices)
  const std::int64_t xc_floats = weight_channels_last_applies(s, shape, p) ? channels_last_x_floats(shape) : 0;
  const std::int64_t partial_floats = split.slices > 1 ? split.slices * size : 0;
  float* scratch = xc_floats + partial_floats > 0
                       ? static_cast<float*>(s.scratch(std::size_t(xc_floats + partial_floats) * sizeof(float)))
                       : nullptr;
  float* partials = partial_floats > 0 ? scratch + xc_floats : nullptr;
  if (xc_floats > 0) {
    launch_to_channels_last<true>("conv2d_backward_weight_to_channels_last", s, shape.batch, shape.in_channels,
                                  shape.in_h * shape.in_w, x, scratch);
    const ChannelsLastWeightProblem q{g, scratch, dy, dw, partials, split};
    const auto k = kernel_for<ChannelsLastWeightProblem, true>(
        tile_for(tiling::ConvPass::weight, shape.out_channels, columns, split.slices),
        "conv2d_backward_weight_tf32_channels_last", true);
    launch_gemm(s, k, q, shape.out_channels, columns, split.slices);
  } else {
    p.partials = partials;
    const auto k = choose_kernel(p, "conv2d_backward_weight", "conv2d_backward_weight_tf32", tiling::ConvPass::weight,
                                 shape.out_channels, columns, split.slices);
    launch_gemm(s, k, p, shape.out_channels, columns, split.slices);
  }
  if (partials != nullptr)
    cuda_detail::launch_grid_stride("conv2d_backward_weight_sum", s, size, sum_weight_partials, size,
                                    split.slices, partials, dw);
}

// ---- the weight gradient in Winograd's F(2x2, 3x3) domain (set_conv2d_weight_algorithm) ----------
//
// For a 3x3 convolution at stride 1 and padding 1, cut the output into 2x2 tiles; tile t reads the
// 4x4 input patch d_t. With B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; .5 .5 .5;
// .5 -.5 .5; 0 0 1] and A^T = [1 1 1 0; 0 1 -1 -1] (kernels/cpu/conv2d_winograd.cpp, Lavin & Gray
// 2016), a tile of the output is Y_t = A^T [ sum_c (G g[o,c] G^T) .* (B^T d_t[c] B) ] A, so the
// gradient of the weight is
//   dW[o, c] = G^T M[o, c] G,   M[o, c] = sum over t of (A dY_t[o] A^T) .* (B^T d_t[c] B):
// for each of the 16 elements e of the 4 x 4 tile, M_e = U_e V_e with U_e = (A dY A^T)_e (out-channels
// x tiles) and V_e = (B^T d B)_e (tiles x in-channels): 16 dense products of 2 O C T multiply-adds
// where the direct product (WeightProblem) does 9 x 4 per tile: 2.25x fewer, and no padding term.
// Three kernels around the GEMM: the transforms write U and V (winograd_gradient_transform,
// winograd_input_transform), the GEMM (WinogradWeightProblem, split-K over the tiles) writes the
// partial M's, and winograd_weight_output adds them in slice order in double and adds G^T M G into
// dW. The transforms only add, subtract and halve (exact), so the result differs from the direct
// product's by a few roundings. Deterministic: every sum has a fixed order.
struct WinogradTiles {
  Index rows, cols;  // tile rows and columns of an image: ceil(out / 2)
  Index per_image;   // rows * cols
};

// V[e][t][c] = (B^T d B)[e] for tile t's 4 x 4 patch d of channel c (input rows 2 ty - 1 .. 2 ty +
// 2, columns likewise; 0 outside the image). One thread per (t, c), c fastest: V's writes
// coalesce, x's reads go through the L2 cache. With tf32 (the GEMM on the tensor cores) each
// value is written rounded to TF32, so that the GEMM's K steps do not round it
// (WinogradWeightProblem::kRoundedB), as winograd_gradient_transform's U (kRoundedA).
//
// kTilesInner: the forward's layout instead, V[e][c][t] (channels x tiles, the forward's B:
// winograd_forward_launch below), one thread per (c, t), t fastest.
template <bool kTilesInner = false>
__global__ void winograd_input_transform(ConvGeometry g, WinogradTiles tiles, Index t_count, const float* x,
                                         float* v, bool tf32) {
  const Index channels = Index(g.in_channels), in_h = Index(g.in_h), in_w = Index(g.in_w);
  const std::int64_t n = std::int64_t(t_count) * channels;
  for (std::int64_t i = cuda_detail::thread_index(); i < n; i += cuda_detail::grid_threads()) {
    // i < T C < 2^31
    const Index t = kTilesInner ? Index(i) % t_count : Index(i) / channels;
    const Index c = kTilesInner ? Index(i) / t_count : Index(i) - t * channels;
    const Index b = t / tiles.per_image, rest = t - b * tiles.per_image;
    const Index ty = rest / tiles.cols, tx = rest - ty * tiles.cols;
    const float* plane = x + (std::int64_t(b) * channels + c) * in_h * in_w;
    float d[4][4];
    for (int r = 0; r < 4; ++r)
      for (int q = 0; q < 4; ++q) {
        const Index h = 2 * ty - 1 + r, w = 2 * tx - 1 + q;
        d[r][q] = inside(h, in_h) && inside(w, in_w) ? plane[h * in_w + w] : 0.0f;
      }
    float bd[4][4];  // B^T d
    for (int q = 0; q < 4; ++q) {
      bd[0][q] = d[0][q] - d[2][q];
      bd[1][q] = d[1][q] + d[2][q];
      bd[2][q] = d[2][q] - d[1][q];
      bd[3][q] = d[1][q] - d[3][q];
    }
    for (int r = 0; r < 4; ++r) {  // (B^T d) B
      const float e[4] = {bd[r][0] - bd[r][2], bd[r][1] + bd[r][2], bd[r][2] - bd[r][1], bd[r][1] - bd[r][3]};
      for (int q = 0; q < 4; ++q) {
        const std::int64_t at = kTilesInner ? (std::int64_t(4 * r + q) * channels + c) * t_count + t
                                            : (std::int64_t(4 * r + q) * t_count + t) * channels + c;
        v[at] = tf32 ? tiling::tf32_round(e[q]) : e[q];
      }
    }
  }
}

// U[e][o][t] = (A g A^T)[e] for tile t's 2 x 2 block g of dy's channel o (0 past the output's
// last row or column). One thread per (o, t), t fastest: U's writes coalesce. With tf32, rounded
// to TF32 (as winograd_input_transform's V).
__global__ void winograd_gradient_transform(ConvGeometry g, WinogradTiles tiles, Index t_count, const float* dy,
                                            float* u, bool tf32) {
  const Index out_h = Index(g.out_h), out_w = Index(g.out_w);
  const std::int64_t n = std::int64_t(t_count) * g.out_channels;
  for (std::int64_t i = cuda_detail::thread_index(); i < n; i += cuda_detail::grid_threads()) {
    const Index o = Index(i) / t_count, t = Index(i) - o * t_count;  // i < O T < 2^31
    const Index b = t / tiles.per_image, rest = t - b * tiles.per_image;
    const Index ty = rest / tiles.cols, tx = rest - ty * tiles.cols;
    const float* plane = dy + (std::int64_t(b) * g.out_channels + o) * out_h * out_w;
    float gt[2][2];
    for (int r = 0; r < 2; ++r)
      for (int q = 0; q < 2; ++q) {
        const Index h = 2 * ty + r, w = 2 * tx + q;
        gt[r][q] = h < out_h && w < out_w ? plane[h * out_w + w] : 0.0f;
      }
    float ag[4][2];  // A g
    for (int q = 0; q < 2; ++q) {
      ag[0][q] = gt[0][q];
      ag[1][q] = gt[0][q] + gt[1][q];
      ag[2][q] = gt[0][q] - gt[1][q];
      ag[3][q] = -gt[1][q];
    }
    for (int r = 0; r < 4; ++r) {  // (A g) A^T
      const float e[4] = {ag[r][0], ag[r][0] + ag[r][1], ag[r][0] - ag[r][1], -ag[r][1]};
      for (int q = 0; q < 4; ++q)
        u[(std::int64_t(4 * r + q) * g.out_channels + o) * t_count + t] = tf32 ? tiling::tf32_round(e[q]) : e[q];
    }
  }
}

// dw[o, c] += G^T M G, M[e] the sum of the `slices` partials m[slice][e][o][c] in slice order, in
// double (as sum_weight_partials), the 3 x 3 result rounded once per element.
__global__ void winograd_weight_output(Index o_count, Index c_count, Index slices, const float* m, float* dw) {
  const std::int64_t n = std::int64_t(o_count) * c_count, plane = n;
  for (std::int64_t i = cuda_detail::thread_index(); i < n; i += cuda_detail::grid_threads()) {  // i = o * C + c
    double mm[4][4];
    for (int e = 0; e < 16; ++e) {
      double sum = 0;
      for (Index slice = 0; slice < slices; ++slice) sum += double(m[(std::int64_t(slice) * 16 + e) * plane + i]);
      mm[e / 4][e % 4] = sum;
    }
    double gm[3][4];  // G^T M
    for (int q = 0; q < 4; ++q) {
      gm[0][q] = mm[0][q] + 0.5 * (mm[1][q] + mm[2][q]);
      gm[1][q] = 0.5 * (mm[1][q] - mm[2][q]);
      gm[2][q] = 0.5 * (mm[1][q] + mm[2][q]) + mm[3][q];
    }
    float* out = dw + i * 9;
    for (int r = 0; r < 3; ++r) {  // (G^T M) G
      const double w[3] = {gm[r][0] + 0.5 * (gm[r][1] + gm[r][2]), 0.5 * (gm[r][1] - gm[r][2]),
                           0.5 * (gm[r][1] + gm[r][2]) + gm[r][3]};
      for (int q = 0; q < 3; ++q) out[3 * r + q] = float(double(out[3 * r + q]) + w[q]);
    }
  }
}

// The transformed operands of one batch part, U and V, take at most this much of the workspace
// (the batch goes in parts, each added into dw in batch order), the partial M's at most
// kWeightMaxPartialBytes more; a layer whose single image needs more, or whose 16 M's of one slice
// do (16 O C floats: O C > 2^20), keeps the direct product.
constexpr std::int64_t kWinogradOperandBytes = std::int64_t(128) << 20;

WinogradTiles winograd_tiles(const Conv2dShape& shape) {
  const Index rows = Index(tiling::ceil_div(shape.out_h(), 2)), cols = Index(tiling::ceil_div(shape.out_w(), 2));
  return {rows, cols, rows * cols};
}
std::int64_t winograd_image_bytes(const Conv2dShape& shape) {
  return 16 * (shape.out_channels + shape.in_channels) * std::int64_t(winograd_tiles(shape).per_image) * 4;
}

// The split of a part's tiles: the direct weight gradient's rule (tiling::weight_split) on 16
// products of O x C, from the shape alone.
tiling::SplitK winograd_split(std::int64_t tiles, std::int64_t o_count, std::int64_t c_count) {
  const std::int64_t blocks = 16 * tiling::ceil_div(o_count, tiling::kTileM) * tiling::ceil_div(c_count, tiling::kTileN);
  return tiling::weight_split(tiles, blocks, 16 * o_count * c_count * std::int64_t(sizeof(float)));
}

void winograd_weight_launch(const StreamHandle& s, const Conv2dShape& shape, const float* x, const float* dy,
                            float* dw) {
  const WinogradTiles tiles = winograd_tiles(shape);
  const std::int64_t o_count = shape.out_channels, c_count = shape.in_channels;
  // Images per part: U and V within kWinogradOperandBytes, and each of their 16 planes (O x T,
  // T x C) within launch_element_limit (the kernels index in 32 bits; tests lower the limit).
  const std::int64_t plane_per_image = std::max(o_count, c_count) * tiles.per_image;
  const std::int64_t part = std::clamp<std::int64_t>(
      std::min(kWinogradOperandBytes / winograd_image_bytes(shape), launch_element_limit.load() / plane_per_image), 1,
      shape.batch);
  for (std::int64_t b0 = 0; b0 < shape.batch; b0 += part) {
    Conv2dShape sub = shape;
    sub.batch = std::min(part, shape.batch - b0);
    const std::int64_t t_count = sub.batch * tiles.per_image;
    const tiling::SplitK split = winograd_split(t_count, o_count, c_count);
    const std::size_t u_floats = std::size_t(16 * o_count * t_count), v_floats = std::size_t(16 * t_count * c_count),
                      m_floats = std::size_t(split.slices * 16 * o_count * c_count);
    auto* u = static_cast<float*>(s.scratch((u_floats + v_floats + m_floats) * sizeof(float)));
    float* v = u + u_floats;
    float* m = v + v_floats;
    const ConvGeometry g = ConvGeometry::of(sub);
    const WinogradWeightProblem p{u, v, m, Index(o_count), Index(c_count), Index(t_count), split};
    const auto k = choose_kernel(p, "conv2d_backward_weight_winograd", "conv2d_backward_weight_winograd_tf32",
                                 tiling::ConvPass::weight, o_count, c_count, 16 * split.slices);
    cuda_detail::launch_grid_stride("conv2d_backward_weight_winograd_input", s, t_count * c_count,
                                    winograd_input_transform<false>, g, tiles, Index(t_count),
                                    x + b0 * c_count * shape.in_h * shape.in_w, v, k.tensor_cores);
    cuda_detail::launch_grid_stride("conv2d_backward_weight_winograd_gradient", s, t_count * o_count,
                                    winograd_gradient_transform, g, tiles, Index(t_count),
                                    dy + b0 * o_count * shape.out_h() * shape.out_w(), u, k.tensor_cores);
    launch_gemm(s, k, p, o_count, c_count, 16 * split.slices);
    cuda_detail::launch_grid_stride("conv2d_backward_weight_winograd_output", s, o_count * c_count,
                                    winograd_weight_output, Index(o_count), Index(c_count), Index(split.slices), m, dw);
  }
}

// Where Conv2dWeightAlgorithm::automatic takes Winograd: where run 12 (H100, bench-cuda, batch 128)
// timed it faster than the direct product. FP32: on all four ResNet-18 stride-1 3x3 layers after
// the stem (64-512 channels; 0.521 -> 0.429 ms at 64 channels on 32 x 32, 0.416 -> 0.172 at 512 on
// 4 x 4), not on the 3-channel stem (0.157 -> 0.547: its transforms are the work). TF32, whose
// direct product is faster: at 16 x 16 and smaller planes (0.210 -> 0.194, 0.208 -> 0.146, 0.298 ->
// 0.144), not at 32 x 32 (0.258 -> 0.375).
bool winograd_measured_faster(const Conv2dShape& shape) {
  const bool tf32 = Conv2dMath(conv_math.load()) == Conv2dMath::tf32;
  return std::min(shape.in_channels, shape.out_channels) >= 64 && (!tf32 || shape.out_h() * shape.out_w() <= 256);
}

// Whether F(2x2, 3x3) can take `shape` in any pass: a 3x3 kernel at stride 1 and padding 1, one
// image's transformed operands within the workspace's share and their planes within the launch
// limit, and the 16 O C floats (the weight gradient's partial M's of a slice, the forward's U)
// within kWeightMaxPartialBytes.
bool winograd_fits(const Conv2dShape& shape) {
  return shape.kernel_h == 3 && shape.kernel_w == 3 && shape.stride_h == 1 && shape.stride_w == 1 &&
         shape.pad_h == 1 && shape.pad_w == 1 && winograd_image_bytes(shape) <= kWinogradOperandBytes &&
         16 * shape.out_channels * shape.in_channels * std::int64_t(sizeof(float)) <= tiling::kWeightMaxPartialBytes &&
         std::max(shape.out_channels, shape.in_channels) * winograd_tiles(shape).per_image <=
             launch_element_limit.load();
}

// Whether the weight gradient of `shape` goes to winograd_weight_launch: asked for (or automatic
// and measured faster) and winograd_fits.
bool winograd_weight_applies(const StreamHandle& s, const Conv2dShape& shape) {
  const auto algorithm = Conv2dWeightAlgorithm(conv_weight_algorithm.load());
  return (algorithm == Conv2dWeightAlgorithm::winograd ||
          (algorithm == Conv2dWeightAlgorithm::automatic && winograd_measured_faster(shape))) &&
         s.workspace != nullptr && winograd_fits(shape);
}

// ---- the forward and backward data in Winograd's F(2x2, 3x3) domain (set_conv2d_forward_algorithm)
//
// The same identity read the other way (Lavin & Gray 2016's own use): output tile t of channel o is
//   Y_t[o] = A^T [ sum_c U[o, c] .* V_t[c] ] A,   U[o, c] = G g[o, c] G^T,   V_t[c] = B^T d_t[c] B,
// so for each element e of the 4 x 4 tile, M_e = U_e V_e with U_e (out-channels x in-channels) and
// V_e (in-channels x tiles): 16 dense products of 2 O C T multiply-adds where the direct product
// does 9 x 4 per tile (2.25x fewer). They are WinogradWeightProblem's 16 products with its names
// read as rows = O, K = C, columns = T (one K slice): the same GEMM kernels, no new ones. Around
// them: winograd_filter_transform writes U (once per call), winograd_input_transform<true> V
// (tiles innermost: the product's B rows), and winograd_forward_output adds A^T M_t A and the bias
// into y. Backward data at stride 1 and padding 1 is the forward of dy with the kernel turned by
// 180 degrees and its channels swapped (dx[c] = sum_o rot180(w[o, c]) * dy[o], padding 1), so it
// is the same launch with U[c, o] = G rot180(g[o, c]) G^T. The transforms add, subtract and halve;
// G's halves make U's values one rounding from exact (computed in double); the sums have a fixed
// order: deterministic.

// U[e][r][k] = (G g G^T)[e]: forward, r = o and k = c, g = w[o, c]; backward data (kFlipped),
// r = c and k = o, g = w[o, c] turned by 180 degrees. In double, rounded once to float (then to TF32
// with tf32: WinogradWeightProblem::kRoundedA). One thread per (r, k), k fastest.
template <bool kFlipped>
__global__ void winograd_filter_transform(Index o_count, Index c_count, const float* w, float* u, bool tf32) {
  const Index rows = kFlipped ? c_count : o_count, depth = kFlipped ? o_count : c_count;
  const std::int64_t n = std::int64_t(rows) * depth;
  for (std::int64_t i = cuda_detail::thread_index(); i < n; i += cuda_detail::grid_threads()) {
    const Index r = Index(i) / depth, k = Index(i) - r * depth;  // i < O C <= 2^20 (applies)
    const float* kernel = w + (std::int64_t(kFlipped ? k : r) * c_count + (kFlipped ? r : k)) * 9;
    double g[3][3];
    for (int a = 0; a < 3; ++a)
      for (int b = 0; b < 3; ++b) g[a][b] = kFlipped ? kernel[(2 - a) * 3 + (2 - b)] : kernel[a * 3 + b];
    double gg[4][3];  // G g
    for (int b = 0; b < 3; ++b) {
      gg[0][b] = g[0][b];
      gg[1][b] = 0.5 * (g[0][b] + g[1][b] + g[2][b]);
      gg[2][b] = 0.5 * (g[0][b] - g[1][b] + g[2][b]);
      gg[3][b] = g[2][b];
    }
    for (int a = 0; a < 4; ++a) {  // (G g) G^T
      const double e[4] = {gg[a][0], 0.5 * (gg[a][0] + gg[a][1] + gg[a][2]), 0.5 * (gg[a][0] - gg[a][1] + gg[a][2]),
                           gg[a][2]};
      for (int b = 0; b < 4; ++b) {
        const float value = float(e[b]);
        u[(std::int64_t(4 * a + b) * rows + r) * depth + k] = tf32 ? tiling::tf32_round(value) : value;
      }
    }
  }
}

// y[b, o, 2 ty + a, 2 tx + q] = (A^T M A)[a][q] (+ bias[o]) for tile t = (b, ty, tx) of channel o,
// M[e] = m[e][o][t]; a last tile row or column past the plane is not stored. One thread per (o, t),
// t fastest: m's reads coalesce. In float, in a fixed order.
__global__ void winograd_forward_output(Index o_count, Index t_count, WinogradTiles tiles, Index out_h, Index out_w,
                                        const float* m, const float* bias, float* y) {
  const std::int64_t n = std::int64_t(o_count) * t_count;
  for (std::int64_t i = cuda_detail::thread_index(); i < n; i += cuda_detail::grid_threads()) {
    const Index o = Index(i) / t_count, t = Index(i) - o * t_count;  // i < O T < 2^31
    float mm[4][4];
    for (int e = 0; e < 16; ++e) mm[e / 4][e % 4] = m[(std::int64_t(e) * o_count + o) * t_count + t];
    float am[2][4];  // A^T M
    for (int q = 0; q < 4; ++q) {
      am[0][q] = mm[0][q] + mm[1][q] + mm[2][q];
      am[1][q] = mm[1][q] - mm[2][q] - mm[3][q];
    }
    const Index b = t / tiles.per_image, rest = t - b * tiles.per_image;
    const Index ty = rest / tiles.cols, tx = rest - ty * tiles.cols;
    const float add = bias != nullptr ? bias[o] : 0.0f;
    float* plane = y + (std::int64_t(b) * o_count + o) * out_h * out_w;
    for (int a = 0; a < 2; ++a) {  // (A^T M) A
      const float row[2] = {am[a][0] + am[a][1] + am[a][2], am[a][1] - am[a][2] - am[a][3]};
      const Index h = 2 * ty + a;
      for (int q = 0; q < 2; ++q) {
        const Index w = 2 * tx + q;
        if (h < out_h && w < out_w) plane[std::int64_t(h) * out_w + w] = bias != nullptr ? row[q] + add : row[q];
      }
    }
  }
}

// y = conv(x, w) (+ bias) of a 3x3 stride-1 padding-1 shape, or with `flipped` dx from dy (shape
// is then backward data's, and the launch runs its transposed forward: dy's O channels in, C out).
// U once, then the batch in parts whose V and M fit kWinogradOperandBytes and whose planes fit
// launch_element_limit; one scratch request for all (a later, larger request could move it).
void winograd_forward_launch(const StreamHandle& s, const Conv2dShape& shape, const float* x, const float* w,
                             const float* bias, float* y, bool flipped) {
  Conv2dShape as_forward = shape;  // the product the launch computes: in -> out channels
  if (flipped) std::swap(as_forward.in_channels, as_forward.out_channels);
  const WinogradTiles tiles = winograd_tiles(as_forward);
  const std::int64_t in_count = as_forward.in_channels, out_count = as_forward.out_channels;
  const std::int64_t plane_per_image = std::max(in_count, out_count) * tiles.per_image;
  const std::int64_t part = std::clamp<std::int64_t>(
      std::min(kWinogradOperandBytes / winograd_image_bytes(as_forward), launch_element_limit.load() / plane_per_image),
      1, shape.batch);
  const std::int64_t part_tiles = part * tiles.per_image;
  const std::size_t u_floats = std::size_t(16 * out_count * in_count), v_floats = std::size_t(16 * in_count * part_tiles),
                    m_floats = std::size_t(16 * out_count * part_tiles);
  auto* u = static_cast<float*>(s.scratch((u_floats + v_floats + m_floats) * sizeof(float)));
  float* v = u + u_floats;
  float* m = v + v_floats;
  const char* name = flipped ? "conv2d_backward_data_winograd" : "conv2d_forward_winograd";
  const char* tf32_name = flipped ? "conv2d_backward_data_winograd_tf32" : "conv2d_forward_winograd_tf32";
  // (the product of a full part: its tile and kernel serve the last, shorter part too)
  const WinogradWeightProblem whole{u, v, m, Index(out_count), Index(part_tiles), Index(in_count),
                                    tiling::split_k(in_count, 1)};
  const auto k = choose_kernel(whole, name, tf32_name, tiling::ConvPass::forward, out_count, part_tiles, 16);
  if (flipped)
    cuda_detail::launch_grid_stride("conv2d_backward_data_winograd_filter", s, std::int64_t(u_floats / 16),
                                    winograd_filter_transform<true>, Index(shape.out_channels),
                                    Index(shape.in_channels), w, u, k.tensor_cores);
  else
    cuda_detail::launch_grid_stride("conv2d_forward_winograd_filter", s, std::int64_t(u_floats / 16),
                                    winograd_filter_transform<false>, Index(shape.out_channels),
                                    Index(shape.in_channels), w, u, k.tensor_cores);
  const std::int64_t in_image = in_count * shape.in_h * shape.in_w, out_image = out_count * shape.in_h * shape.in_w;
  for (std::int64_t b0 = 0; b0 < shape.batch; b0 += part) {
    Conv2dShape sub = as_forward;
    sub.batch = std::min(part, shape.batch - b0);
    const std::int64_t t_count = sub.batch * tiles.per_image;
    WinogradWeightProblem p = whole;
    p.c_count = Index(t_count);
    cuda_detail::launch_grid_stride(flipped ? "conv2d_backward_data_winograd_input" : "conv2d_forward_winograd_input",
                                    s, t_count * in_count, winograd_input_transform<true>, ConvGeometry::of(sub),
                                    tiles, Index(t_count), x + b0 * in_image, v, k.tensor_cores);
    launch_gemm(s, k, p, out_count, t_count, 16);
    cuda_detail::launch_grid_stride(flipped ? "conv2d_backward_data_winograd_output" : "conv2d_forward_winograd_output",
                                    s, out_count * t_count, winograd_forward_output, Index(out_count), Index(t_count),
                                    tiles, Index(sub.out_h()), Index(sub.out_w()), m, bias, y + b0 * out_image);
  }
}

// Conv2dForwardAlgorithm::automatic's rule, an estimate from run 12's numbers (docs/gpu-kernels.md):
// V and M cost 4x the activation's traffic each, which the 2.25x fewer multiply-adds repay on the
// smaller planes of the wider layers only; in TF32, whose direct products run 1.6-2.3x faster, only
// at 8 x 8 and below.
bool winograd_forward_estimated_faster(const Conv2dShape& shape) {
  const bool tf32 = Conv2dMath(conv_math.load()) == Conv2dMath::tf32;
  return std::min(shape.in_channels, shape.out_channels) >= 64 && shape.out_h() * shape.out_w() <= (tf32 ? 64 : 256);
}

// Whether conv2d_forward (and, of its shape, conv2d_backward_data) goes to winograd_forward_launch:
// asked for (or automatic and estimated faster), a stream with a workspace, packed images, and
// winograd_fits (U within kWeightMaxPartialBytes, one image's V and M within the workspace's share).
bool winograd_forward_applies(const StreamHandle& s, const Conv2dShape& shape) {
  const auto algorithm = Conv2dForwardAlgorithm(conv_forward_algorithm.load());
  return (algorithm == Conv2dForwardAlgorithm::winograd ||
          (algorithm == Conv2dForwardAlgorithm::automatic && winograd_forward_estimated_faster(shape))) &&
         s.workspace != nullptr && shape.in_image_stride == 0 && winograd_fits(shape);
}

}  // namespace

// Each pass in launches over parts of the batch (for_each_batch_part: one launch unless a tensor
// reaches 2^31 elements).
void conv2d_forward(const StreamHandle& s, const Conv2dShape& shape, const float* x, const float* w,
                    const float* bias, float* y) {
  if (shape.output_size() <= 0) return;
  if (winograd_forward_applies(s, shape)) return winograd_forward_launch(s, shape, x, w, bias, y, false);
  for_each_batch_part(shape, [&](const Conv2dShape& part, std::int64_t x_at, std::int64_t y_at) {
    forward_launch(s, part, x + x_at, w, bias, y + y_at);
  });
}

void conv2d_backward_data(const StreamHandle& s, const Conv2dShape& shape, const float* dy, const float* w,
                          float* dx) {
  if (shape.input_size() <= 0) return;
  if (shape.output_size() > 0 && winograd_forward_applies(s, shape))
    return winograd_forward_launch(s, shape, dy, w, nullptr, dx, true);
  if (data_channels_last_applies(s, shape)) return channels_last_data(s, shape, dy, w, dx);
  // Under TF32, A from the weights laid out by k (data_weight_transpose), once for all parts,
  // where the copy fits 64 MiB of the stream's scratch (and there is one).
  const float* wt = nullptr;
  const std::int64_t wt_size = data_weight_transposed_size(shape);
  if (Conv2dMath(conv_math.load()) == Conv2dMath::tf32 && s.workspace != nullptr &&
      wt_size * std::int64_t(sizeof(float)) <= (std::int64_t(64) << 20)) {
    auto* copy = static_cast<float*>(s.scratch(std::size_t(wt_size) * sizeof(float)));
    cuda_detail::launch_grid_stride("conv2d_backward_data_weight_transpose", s, wt_size, data_weight_transpose,
                                    ConvGeometry::of(shape), Index(data_weight_k_max(shape)), w, copy);
    wt = copy;
  }
  for_each_batch_part(shape, [&](const Conv2dShape& part, std::int64_t x_at, std::int64_t y_at) {
    data_launch(s, part, dy + y_at, w, dx + x_at, wt);
  });
}

void conv2d_backward_weight_split(const StreamHandle& s, const Conv2dShape& shape, const float* x,
                                  const float* dy, float* dw, std::int64_t slices) {
  for_each_batch_part(shape, [&](const Conv2dShape& part, std::int64_t x_at, std::int64_t y_at) {
    weight_launch(s, part, x + x_at, dy + y_at, dw, slices);
  });
}

void conv2d_backward_weight(const StreamHandle& s, const Conv2dShape& shape, const float* x,
                            const float* dy, float* dw) {
  if (shape.weight_size() <= 0 || shape.output_size() <= 0) return;  // dw += 0 (and no batch to part)
  if (winograd_weight_applies(s, shape)) return winograd_weight_launch(s, shape, x, dy, dw);
  conv2d_backward_weight_split(s, shape, x, dy, dw, tiling::weight_split_slices(shape));
}

void conv2d_backward_bias(const StreamHandle& s, const Conv2dShape& shape, const float* dy,
                          float* db) {
  if (shape.out_channels <= 0) return;
  const std::int64_t plane = shape.out_h() * shape.out_w(), count = shape.batch * plane;
  const std::int64_t slices = channel_slices(count);
  auto* partials = static_cast<double*>(s.scratch(std::size_t(shape.out_channels * slices) * sizeof(double)));
  const unsigned blocks = unsigned(shape.out_channels * slices);
  if (plane % 4 == 0 && cuda_detail::aligned_16(dy))
    cuda_detail::launch_blocks("conv2d_backward_bias", s, blocks, cuda_detail::kBlockThreads, bias_partials<float4>,
                               shape.out_channels, FastDivide(plane / 4), count / 4, slices, dy, partials);
  else
    cuda_detail::launch_blocks("conv2d_backward_bias", s, blocks, cuda_detail::kBlockThreads, bias_partials<float>,
                               shape.out_channels, FastDivide(plane), count, slices, dy, partials);
  cuda_detail::launch_grid_stride("conv2d_backward_bias_sum", s, shape.out_channels * 32, add_bias_partials,
                                  shape.out_channels, slices, partials, db);
}

}  // namespace petra::kernels::cuda

#undef PETRA_UNROLL
#undef PETRA_NO_UNROLL
