// kernels/cuda/conv2d_tiling.cuh: the index and tile arithmetic of kernels/cuda/conv2d.cu (internal,
// not installed), as plain functions that compile for the host and the device, so that they are
// checked on their own against brute force (tests/cpu/test_conv2d_tiling.cpp, every CPU build,
// with or without CUDA) and the kernels only combine them.
//
// The three convolution passes are matrix products whose operands are gathered from the tensors
// on the fly (implicit GEMM: no im2col matrix is written):
//
//   pass            C (M x N)                   M              N               K (summed)
//   forward         y  = W . im2col(x)          out_channels   batch*out_h*out_w in_channels*kh*kw
//   backward data   dx = W^T . col2im-gather(dy) in_channels    batch*in_h*in_w   out_channels*kh*kw
//   backward weight dw += dy . im2col(x)^T       out_channels   in_channels*kh*kw batch*out_h*out_w
//
// What lives here:
//   - ConvGeometry: Conv2dShape's numbers with out_h, out_w, as the kernels receive them;
//   - split_tap / split_pixel: a flat index of K or N into (channel, tap row, tap column) or
//     (sample, row, column);
//   - corner_offset + tap_offset: the x element an output pixel reads through a tap (forward,
//     weight), where tap_inside says it is not the zero padding;
//   - bit_range / bits_meet: that same bounds check as two bit tests (the taps of a pixel that
//     land inside, as a mask, against a tap's bit);
//   - stride_class: backward data's input pixels and taps grouped by stride class, so that its
//     gather has no zero terms and no division;
//   - Digits / advance: a K index's (channel, tap row, tap column) or (sample, row, column) moved
//     on by a K step without dividing again;
//   - the block's tile shape and which tile elements each thread loads and computes (and, for the
//     TF32 path, each warp);
//   - tf32_round: the rounding of the tensor cores' TF32 inputs (the emulated mma uses it), and
//     tf32_operand_bits, the same rounding as the real kernels hand it to the tensor cores;
//   - SplitK: K cut into fixed, tile-aligned slices (the deterministic split of the weight
//     gradient), and weight_split_slices, the number of slices a shape gets.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "petra/kernels/common.hpp"
#include "petra/kernels/conv2d.hpp"
#include "petra/kernels/host_device.hpp"

namespace petra::kernels::cuda::conv2d_tiling {

// ---- geometry -------------------------------------------------------------------------------

struct ConvGeometry {
  std::int64_t batch, in_channels, in_h, in_w;
  std::int64_t out_channels, kernel_h, kernel_w;
  std::int64_t stride_h, stride_w, pad_h, pad_w;
  std::int64_t out_h, out_w;

  static ConvGeometry of(const Conv2dShape& s) {
    return {s.batch,    s.in_channels, s.in_h,  s.in_w,  s.out_channels, s.kernel_h, s.kernel_w,
            s.stride_h, s.stride_w,    s.pad_h, s.pad_w, s.out_h(),      s.out_w()};
  }
  PETRA_HOST_DEVICE std::int64_t in_plane() const { return in_h * in_w; }
  PETRA_HOST_DEVICE std::int64_t out_plane() const { return out_h * out_w; }
  PETRA_HOST_DEVICE std::int64_t taps() const { return kernel_h * kernel_w; }
};

PETRA_HOST_DEVICE inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// Whether a gather's 32-bit offsets stay within limit (2^31 - 1) over `images` images of h x w
// pixels, `channels` values each: an offset is ((image * h + r) * w + c) * channels + channel,
// where an output pixel's corner and its taps put the row r and the column c up to reach_h and
// reach_w outside the image (the padding, taps past it), before the first element or after the
// last. NCHW tensors are images = batch * channels planes of one value a pixel, channels-last
// copies batch images of `channels`. The tensors' element limit alone does not bound this: at
// padding 128 an image of 2^24 floats already puts a channels-last corner at -2^31.
PETRA_HOST_DEVICE inline bool offsets_fit(std::int64_t images, std::int64_t h, std::int64_t w, std::int64_t channels,
                                          std::int64_t reach_h, std::int64_t reach_w,
                                          std::int64_t limit = std::int64_t(INT32_MAX)) {
  // the largest offset is below ((images * h + reach_h) * w + reach_w) * channels, the most
  // negative above minus (reach_h * w + reach_w) * channels
  return ((images * h + reach_h) * w + reach_w) * channels <= limit;
}

// a / b for a >= 0, b > 0, in 32 bits when both fit (a GPU divides 64-bit integers in a long
// subroutine, several times slower); the same result either way. Every index division of the
// kernels goes through it.
PETRA_HOST_DEVICE inline std::int64_t quotient(std::int64_t a, std::int64_t b) {
  if (((a | b) >> 31) == 0) return std::int64_t(std::uint32_t(a) / std::uint32_t(b));
  return a / b;
}

// Flat index k = (c * kernel_h + i) * kernel_w + j of a weight row (c is the in-channel in the
// forward and weight passes, the out-channel in the backward-data pass).
struct Tap {
  std::int64_t c, i, j;
};
PETRA_HOST_DEVICE inline Tap split_tap(std::int64_t k, std::int64_t kernel_h, std::int64_t kernel_w) {
  const std::int64_t taps = kernel_h * kernel_w;
  const std::int64_t c = quotient(k, taps), ij = k - c * taps;
  const std::int64_t i = quotient(ij, kernel_w);
  return {c, i, ij - i * kernel_w};
}

// Flat index n = (b * h + y) * w + x of a pixel of a batch of h x w planes.
struct Pixel {
  std::int64_t b, y, x;
};
PETRA_HOST_DEVICE inline Pixel split_pixel(std::int64_t n, std::int64_t h, std::int64_t w) {
  const std::int64_t plane = h * w;
  const std::int64_t b = quotient(n, plane), yx = n - b * plane;
  const std::int64_t y = quotient(yx, w);
  return {b, y, yx - y * w};
}

// ---- walking K: a flat index's digits, advanced without dividing ------------------------------

// split_tap and split_pixel write a flat index k as three digits of a mixed radix,
// k = (hi * mid_n + mid) * lo_n + lo with mid < mid_n, lo < lo_n (hi unbounded). The K loop of the
// kernels visits k, k + kTileK, k + 2 kTileK, ...: splitting each again costs two divisions (a
// GPU's integer division is a subroutine of ~20 instructions), adding the step's own digits
// costs a few additions and two carries (advance). Every value here is below 2^31 (the kernels'
// tensors are: conv2d.cu launches over parts of a larger batch).
struct Radix {
  std::int32_t mid_n, lo_n;  // >= 1
};
struct Digits {
  std::int32_t hi, mid, lo;
};
PETRA_HOST_DEVICE inline Digits split_digits(std::int64_t k, Radix r) {
  const std::int64_t inner = std::int64_t(r.mid_n) * r.lo_n;
  const std::int64_t hi = quotient(k, inner), rest = k - hi * inner;
  const std::int64_t mid = quotient(rest, r.lo_n);
  return {std::int32_t(hi), std::int32_t(mid), std::int32_t(rest - mid * r.lo_n)};
}
// The digits of k + step, given those of k and of step (split_digits(step, r)): each digit plus
// the carry from the one below, which is at most 1 (both addends are below the radix). In
// unsigned 32-bit arithmetic: a digit plus a step's digit stays below 2^32, and the kernels
// advance once past their last step, whose digits they never use but which, for a K within a
// step of 2^31, would overflow a signed hi.
PETRA_HOST_DEVICE inline Digits advance(Digits d, Digits step, Radix r) {
  std::uint32_t lo = std::uint32_t(d.lo) + std::uint32_t(step.lo);
  const bool lo_carry = lo >= std::uint32_t(r.lo_n);
  if (lo_carry) lo -= std::uint32_t(r.lo_n);
  std::uint32_t mid = std::uint32_t(d.mid) + std::uint32_t(step.mid) + std::uint32_t(lo_carry);
  const bool mid_carry = mid >= std::uint32_t(r.mid_n);
  if (mid_carry) mid -= std::uint32_t(r.mid_n);
  const std::uint32_t hi = std::uint32_t(d.hi) + std::uint32_t(step.hi) + std::uint32_t(mid_carry);
  return {std::int32_t(hi), std::int32_t(mid), std::int32_t(lo)};
}

// ---- forward and weight gradient: which x an output pixel reads ------------------------------

// Output pixel (b, oh, ow): where its sample starts in x, and the input coordinates of its tap
// (0, 0) (oh * stride - pad, which is negative in the padding).
struct OutputPixel {
  std::int64_t x_sample;  // b * in_channels * in_h * in_w
  std::int64_t h0, w0;
};
PETRA_HOST_DEVICE inline OutputPixel output_pixel(const ConvGeometry& g, std::int64_t n) {
  const Pixel p = split_pixel(n, g.out_h, g.out_w);
  return {p.b * g.in_channels * g.in_plane(), p.y * g.stride_h - g.pad_h, p.x * g.stride_w - g.pad_w};
}

// The x value that output pixel `o` multiplies with weight tap `t` (channel t.c) is at
// corner_offset(g, o) + tap_offset(g, t) when tap_inside(g, o, t), else it is the zero padding.
// The kernels split it so: a thread keeps one of the two for its whole K loop and the block's
// K-step table holds the other (forward: the corner per output pixel, the tap offset per k; weight
// gradient: the other way round). The corner itself may lie outside x; only the sum is read.
PETRA_HOST_DEVICE inline std::int64_t corner_offset(const ConvGeometry& g, const OutputPixel& o) {
  return o.x_sample + o.h0 * g.in_w + o.w0;
}
PETRA_HOST_DEVICE inline std::int64_t tap_offset(const ConvGeometry& g, const Tap& t) {
  return (t.c * g.in_h + t.i) * g.in_w + t.j;
}
PETRA_HOST_DEVICE inline bool tap_inside(const ConvGeometry& g, const OutputPixel& o, const Tap& t) {
  const std::int64_t h = o.h0 + t.i, w = o.w0 + t.j;
  return h >= 0 && h < g.in_h && w >= 0 && w < g.in_w;
}

// ---- the bounds check as bit tests ------------------------------------------------------------
// Whether a gathered value is inside the image (not the zero padding) depends on a tap (i, j) and
// a pixel: h0 + i and w0 + j inside. Per pixel, the taps that land inside are an interval of the
// tap rows and one of the tap columns, so the kernels whose thread keeps a pixel for the whole K
// loop (the forward's and backward data's B column, the channels-last problems' A rows) hold them
// as two 32-bit masks (bit i: tap row i lands inside), each K index its tap as two one-hot bits,
// and the check is two ANDs, (mask_h & bit_i) and (mask_w & bit_j) both nonzero (bits_meet), with
// no comparison against k_end either: the K-step table's zero entry past k_end meets nothing. As
// comparisons it took two additions and three to four comparisons per value (5 of the 9-10 SASS
// instructions of each B copy in the TF32 128 x 128 loops, measured by removing it). (The weight
// pass, whose thread keeps a tap and whose K indices are pixels, keeps biased coordinates:
// conv2d.cu, WeightProblem.) Taps are below 32 on both axes (kMaxKernelExtent; conv2d.cu refuses
// larger kernels).
inline constexpr std::int64_t kMaxKernelExtent = 32;
// Bits v < n of a 32-bit mask (none for n <= 0, all for n >= 32). On the device one funnel shift
// of 32 ones into a zero word, whose shift clamps at 32 (two instructions with the max), elsewhere
// the same by cases.
PETRA_HOST_DEVICE inline std::uint32_t bits_below(std::int32_t n) {
#ifdef __CUDA_ARCH__
  return __funnelshift_lc(~0u, 0u, unsigned(max(n, 0)));
#else
  return n <= 0 ? 0u : n >= 32 ? ~0u : (1u << n) - 1u;
#endif
}
// Bits v of a 32-bit mask with lo <= v < hi (none where hi <= lo; lo, hi may lie outside 0..32).
PETRA_HOST_DEVICE inline std::uint32_t bit_range(std::int32_t lo, std::int32_t hi) {
  return bits_below(hi) & ~bits_below(lo);
}
// Tap v (0 <= v < 32) as one bit.
PETRA_HOST_DEVICE constexpr std::uint32_t tap_bit(std::int32_t v) { return 1u << v; }
// The taps i whose input coordinate first + i lands in [0, extent) (the forward's rows and
// columns: first = the output pixel's tap-0 coordinate, out * stride - pad).
PETRA_HOST_DEVICE inline std::uint32_t taps_inside(std::int32_t first, std::int32_t extent) {
  return bit_range(-first, extent - first);
}
// Both axes' bits meet: the value is inside the image.
PETRA_HOST_DEVICE constexpr bool bits_meet(std::uint32_t mask_h, std::uint32_t bit_h, std::uint32_t mask_w,
                                           std::uint32_t bit_w) {
  return ((mask_h & bit_h) != 0) & ((mask_w & bit_w) != 0);
}

// ---- backward data: stride classes (the gather form without zero terms) -----------------------
// Input coordinate h receives gradient through tap row i only when h + pad - i is a multiple of
// the stride (then from output row (h + pad - i) / stride, if that is inside the output). So the
// input rows with (h + pad) mod stride = r, class r, all read through the taps i = r, r + stride,
// ... and through no other: per class (r_h, r_w), backward data is a dense product over
// out_channels x (the class's taps) with no zero terms. A 3x3 stride-2 layer has four classes
// with 4, 2, 2 and 1 of the 9 taps (the one-class gather summed 9, three in four of them zeros);
// a stride-1 layer has one class with every tap.
//
// Inside a class, input coordinate first + u * stride and the class's v-th tap, r + v * stride,
// meet at output coordinate out0 + u - v (no division left for the kernel).
// (32-bit fields: coordinates and tap counts of one image axis; a kernel keeps two classes in
// registers through its K loop.)
struct StrideClass {
  std::int32_t first;  // the class's first input coordinate; the others follow `stride` apart
  std::int32_t count;  // its input coordinates in [0, extent)
  std::int32_t tap0;   // its first tap (= r); the others follow `stride` apart
  std::int32_t taps;   // its taps in [0, kernel)
  std::int32_t out0;   // the output coordinate of (first, tap0): (first + pad - tap0) / stride
};
PETRA_HOST_DEVICE inline StrideClass stride_class(std::int64_t r, std::int64_t stride, std::int64_t pad,
                                                  std::int64_t extent, std::int64_t kernel) {
  const std::int64_t first = ((r - pad) % stride + stride) % stride;
  const std::int64_t count = first < extent ? (extent - first + stride - 1) / stride : 0;
  const std::int64_t taps = r < kernel ? (kernel - r + stride - 1) / stride : 0;
  return {std::int32_t(first), std::int32_t(count), std::int32_t(r), std::int32_t(taps),
          std::int32_t((first + pad - r) / stride)};
}

// ---- the block tile ---------------------------------------------------------------------------

// One block of kThreads = 16 x 16 threads computes an M x N tile of C (TileShape<M, N>, M and N
// each 64 or 128); K is walked in steps of kTileK. Thread (tx, ty) = (t % 16, t / 16) owns
// micro_m x micro_n outputs (M / 16 x N / 16: 4 x 4 in the 64 x 64 tile, 8 x 8 in the 128 x 128
// one): its rows are 4 consecutive rows 4 ty .. 4 ty + 3, and as many more groups of 4 as the tile
// has 64-row halves (4 ty + 64 ..), its columns the same with tx. So in the inner loop its A values
// and its B values of a k are 16-byte shared-memory loads (a warp: 16 distinct float4 of B, 2 of A,
// broadcast to the lanes that share them), and each value it reads feeds micro_n (or micro_m)
// multiply-adds: 8 per load in the 64 x 64 tile, 16 in the 128 x 128 one. The larger tiles also
// gather each global value for 128 outputs instead of 64; they need fewer, longer-lived blocks,
// so choose_tile keeps them for products with enough tiles to fill a GPU, per pass.
// (The first layout, (ty + 16 r, tx + 16 q), read them one float at a time: 8 loads for 16
// multiply-adds, which bounded the kernel by the shared-memory port at half the FMA rate.)
inline constexpr int kTileK = 16;
inline constexpr int kThreadsX = 16;
inline constexpr int kThreadsY = 16;
inline constexpr int kThreads = kThreadsX * kThreadsY;  // 256

// Tile coordinates (row m or column n in the tile, k in the step) of a value a thread loads.
struct TileCoordinate {
  int mn, k;
};

// Where column n of a B tile sits in a row of the TF32 path's b_tile: within each aligned group of
// 32 columns, column 8 f + g (f < 4, g < 8) is stored at 4 g + f. A warp's piece of the tile is one
// or two such groups (WarpLayout), and lane (g, t) of an mma.m16n8k8 needs B's column g of each
// fragment fn, piece column 8 fn + g: stored so, the four fragments 4 j .. 4 j + 3 of a k are one
// 16-byte load (at 32 j + 4 g) instead of four scalar ones. A 4 x 8 transpose, its own inverse
// only when read back through this same function.
PETRA_HOST_DEVICE constexpr int tf32_b_slot(int n) { return (n & ~31) | ((n & 7) << 2) | ((n >> 3) & 3); }
// The column whose slot is s: tf32_b_slot's inverse (slot 4 g + f holds column 8 f + g).
PETRA_HOST_DEVICE constexpr int tf32_b_column_of_slot(int s) { return (s & ~31) | ((s & 3) << 3) | ((s >> 2) & 7); }

// Which row of the TF32 path's b_tile holds B's k (b_tile[tf32_b_row(k)][...]): within each 16 k,
// k = 4 t + u (t, u < 4) at row 4 u + t. The TF32 path's mma.m16n8k8 steps do not take a K step's
// k in order: lane (g, t) supplies k = 4 t, 4 t + 1 (fragment k t and t + 4) in the first k8 step
// of each 16 and 4 t + 2, 4 t + 3 in the second (WarpTileTf32), so that its A operands of a step
// are one 16-byte load (TileShape::a_row). Stored so, its B values at those k are rows t, t + 4,
// t + 8, t + 12: the lanes of a load then sit on rows 8 banks apart, as when the rows were k's
// own. A 4 x 4 transpose, its own inverse.
PETRA_HOST_DEVICE constexpr int tf32_b_row(int k) { return (k & ~15) | ((k & 3) << 2) | ((k >> 2) & 3); }
// The k of a K step of 16 that lane (g, t)'s fragment k t (high = 0) or t + 4 (high = 1) stands
// for in the step's k8 product h (0 or 1): 4 t + 2 h + high, in A's and B's fragments alike; and
// its row in b_tile, tf32_b_row of it, as a sum (t < 4).
PETRA_HOST_DEVICE constexpr int tf32_step_k(int t, int h, int high) { return 4 * t + 2 * h + high; }
PETRA_HOST_DEVICE constexpr int tf32_step_b_row(int t, int h, int high) { return 4 * (2 * h + high) + t; }

// Where the TF32 layout's a_tile holds A(m, k) of a K step of 16 (TileShape::a_row, a_column).
PETRA_HOST_DEVICE constexpr int tf32_a_row(int m, int k) { return (m & ~8) + 8 * ((k % 4) / 2); }
PETRA_HOST_DEVICE constexpr int tf32_a_column(int m, int k) { return 4 * (k / 4) + 2 * (k % 2) + (m / 8) % 2; }

// The shared tiles' layout: the FP32 path's (A transposed, a_tile[k][m], rows padded by 4 floats;
// b_tile[k][n] the same) or the TF32 path's (A in rows of one K step, unpadded, each row pair's
// values in the mma's operand order, tf32_a_row and tf32_a_column; b_tile's rows padded by 8
// floats, in tf32_b_row's order, its columns in tf32_b_slot's).
enum class TileLayout { fp32, tf32 };

// K: the K step (kTileK = 16 for both paths' tiles, Tf32Tile below; 32 for the TF32 option
// Tf32TileK32, whose A tile is two blocks of M rows, one per 16 k).
template <int M, int N, int K = kTileK, TileLayout Layout = TileLayout::fp32>
struct TileShape {
  static_assert((M == 64 || M == 128) && (N == 64 || N == 128));
  static_assert(K == 16 || K == 32);
  static constexpr bool kTf32 = Layout == TileLayout::tf32;
  static_assert(!kTf32 || K % 16 == 0, "the TF32 layout's A rows are 16 k each (tf32_b_row, WarpTileTf32)");
  static_assert(kThreads == 256, "kVectorThreadsA: 2 M threads, at most all of them");
  static constexpr int kM = M, kN = N, kK = K;
  static constexpr int kMicroM = M / kThreadsY, kMicroN = N / kThreadsX;  // 4 or 8
  static_assert(kMicroM % 4 == 0 && kMicroN % 4 == 0, "the FP32 inner loop reads 4 values at a time (float4)");
  static constexpr int kLoadsA = M * K / kThreads, kLoadsB = N * K / kThreads;
  // The shared tiles: a_tile[kARows][kLdA], b_tile[K][kLdB] per stage. FP32: a_tile[k][m], its rows
  // padded by 4 floats (multiples of 4: 16-byte rows for the inner loop's float4 reads); b_tile the
  // same. TF32: M rows of K floats, unpadded (a_row below): a lane's A operands of a k8 step are
  // one 16-byte load, and the rows g of a load's quarter-warp pairs sit 16 banks apart (the K = 16
  // floats of a row), so its lanes read 32 different banks; b_tile's rows padded by 8 floats, so
  // that a row is 8 banks further than the previous one: the lanes (g, t) of a fragment load (rows
  // t + 4 u, columns g) then read 32 different banks (Tf32Fragment, tf32_b_row).
  // (K = 32 in TF32: the A tile's rows are two such blocks of M rows, k < 16 and k >= 16, so
  // that every row is 16 floats and the banks of a load are as at K = 16; the second block starts
  // one row further, kABlockRows = M + 1, so that the scalar copies of a warp, one row's 32 k,
  // reach 2 ways of a bank and not 4.)
  static constexpr int kABlockRows = K > 16 ? M + 1 : M;
  static constexpr int kARows = kTf32 ? kABlockRows * (K / 16) : K;
  static constexpr int kLdA = kTf32 ? 16 : M + 4, kLdB = N + (kTf32 ? 8 : 4);
  // Where A(m, k) and B(k, n) of a step are in the tiles (once the TF32 path has rounded them):
  // a_tile[a_row(m, k)][a_column(m, k)], b_tile[b_row(k)][b_slot(n)] (b_row: k itself, or, in the
  // TF32 layout, tf32_b_row(k); b_slot: n itself, or tf32_b_slot(n)). The TF32 layout keeps each
  // 16-float row of a_tile for one mma A fragment's operands: rows r and r + 8 of a 16-row group
  // (r % 16 < 8) share the cells of 4 k, k = 4 j .. 4 j + 3 (u = k % 4): u = 0, 1 in row r, u = 2,
  // 3 in row r + 8, at column 4 j + 2 (u % 2) + (the row's half: 0 for r, 1 for r + 8). So lane
  // (g, t)'s A operands of a k8 step h, (g, k 4t + 2h), (g + 8, 4t + 2h), (g, 4t + 2h + 1), (g +
  // 8, 4t + 2h + 1) in the mma's order, are the four floats of a_tile[g + 8 h][4 t ..]: one 16-byte
  // load straight into the instruction's register quad (with the rows apart, nvcc added moves to
  // assemble each quad: 17% of a 128 x 128 K step's SASS).
  PETRA_HOST_DEVICE static constexpr int a_row(int m, int k) {
    return kTf32 ? k / 16 * kABlockRows + tf32_a_row(m, k % 16) : k;
  }
  PETRA_HOST_DEVICE static constexpr int a_column(int m, int k) { return kTf32 ? tf32_a_column(m, k % 16) : m; }
  PETRA_HOST_DEVICE static constexpr int b_row(int k) { return kTf32 ? tf32_b_row(k) : k; }
  PETRA_HOST_DEVICE static constexpr int b_slot(int n) { return kTf32 ? tf32_b_slot(n) : n; }
  // The stages of the K loop's pipeline (conv2d.cu, k_loop): three where three copies of the two
  // tiles fit in 40 KiB of shared memory (under the 48 KiB a block may declare statically, with
  // room for the K-step tables), else two; where not even two fit (the 128 x 128 TF32 tile at
  // K = 32: 33 KiB a stage), three in dynamic shared memory (kDynamicShared: 99.4 KiB, opted in at
  // launch; one block per multiprocessor).
  static constexpr int kStageBytes = (kARows * kLdA + K * kLdB) * 4;
  static constexpr bool kDynamicShared = 2 * kStageBytes > 40 * 1024;
  static constexpr int kStages = kDynamicShared || 3 * kStageBytes <= 40 * 1024 ? 3 : 2;
  static constexpr int kDynamicSharedBytes = kDynamicShared ? kStages * kStageBytes : 0;

  // The q-th A value and B value that thread t loads, q < kLoadsA (kLoadsB). A: K consecutive
  // threads take K consecutive k of one row (the weight rows and dy rows are contiguous in k).
  // B: N consecutive threads take N consecutive columns of one k (consecutive pixels in the
  // forward and backward data). A thread keeps its B column and its A rows for the whole K loop,
  // so their decomposition is done once.
  PETRA_HOST_DEVICE static constexpr TileCoordinate a_load(int t, int q) {
    return {t / K + q * (kThreads / K), t % K};
  }
  // The TF32 layout's A copies of 16 bytes, where a problem's A rows allow them (conv2d.cu,
  // TileGather): threads t < kVectorThreadsA each copy the 4 k 4 j .. 4 j + 3 (j = t % 4) of the
  // rows r and r + 8 of one pair (r = a_pair_row(t / 4)), v = 0 and 1, to a_tile[row][4 j ..] as
  // they are (a_vector_load: the row and the first k of copy v; where it lands, too). Those 8
  // places are where a_row and a_column put the same 8 values, so the thread that copied them
  // rounds them and puts them in place (interleaved, TileGather::round_to_tf32) without another
  // thread's values in the way. A quarter-warp's copies fill two whole rows: 32 banks.
  // At K = 32 the thread does the same for k + 16 (kVectorGroupsA), into the A tile's second
  // block of rows (kABlockRows on).
  static constexpr int kVectorLoadsA = 2;
  static constexpr int kVectorGroupsA = K / 16;
  static constexpr int kVectorThreadsA = 2 * M;  // M / 2 pairs x 4 cells; all threads at M = 128
  PETRA_HOST_DEVICE static constexpr int a_pair_row(int pair) { return pair / 8 * 16 + pair % 8; }
  PETRA_HOST_DEVICE static constexpr TileCoordinate a_vector_load(int t, int v) {
    return {a_pair_row(t / 4) + 8 * v, 4 * (t % 4)};
  }
  // The TF32 layout's B copies of 16 bytes, where the problem's B is a dense copy whose rows are
  // already in tf32_b_slot's order (conv2d.cu, Problem::kVectorB: the weights of the channels-last
  // forward and backward data): thread t copies, for v < kVectorLoadsB, the four slots 4 s .. 4 s + 3 of row k of
  // the step (b_vector_load: mn = 4 s, k), to b_tile[b_row(k)][4 s ..] as they are. A row's N / 4
  // copies are consecutive threads, so a quarter-warp's 8 fill 32 consecutive floats: 32 banks.
  static constexpr int kVectorCopiesPerRowB = N / 4;
  static constexpr int kVectorLoadsB = K * N / 4 / kThreads;  // 2 (N = 128) or 1 (N = 64)
  PETRA_HOST_DEVICE static constexpr TileCoordinate b_vector_load(int t, int v) {
    return {4 * (t % kVectorCopiesPerRowB), t / kVectorCopiesPerRowB + v * (kThreads / kVectorCopiesPerRowB)};
  }
  // In the TF32 layout a thread's k are chosen so that their rows in b_tile (tf32_b_row) are its
  // own row group t / N plus a constant of q, as the FP32 layout's k are: with k = 16 (b / 4) +
  // 4 a + b % 4 at row 4 b + a, a = q % 4 and b = (q / 4) R + t / N (R = kThreads / N row groups;
  // b < 4 at K = 16); else the row of each copy and of its rounding would be recomputed from t at
  // every step (the bit shuffle of tf32_b_row: nvcc rematerialises it rather than hold a register
  // per value).
  PETRA_HOST_DEVICE static constexpr TileCoordinate b_load(int t, int q) {
    constexpr int R = kThreads / N;
    if constexpr (kTf32 && K == 16) return {t % N, 4 * (q % 4) + (q / 4) * R + t / N};  // (b < 4: as nvcc cannot tell)
    if constexpr (kTf32) {
      const int b = (q / 4) * R + t / N;
      return {t % N, 16 * (b / 4) + 4 * (q % 4) + b % 4};
    }
    return {t % N, t / N + q * R};
  }
  // b_row(b_load(t, q).k) as the same kind of sum
  PETRA_HOST_DEVICE static constexpr int b_load_row(int t, int q) {
    constexpr int R = kThreads / N;
    if constexpr (kTf32) return 4 * ((q / 4) * R + t / N) + q % 4;
    return t / N + q * R;
  }
  // Tile row and column of thread t's output (r, q), r < kMicroM, q < kMicroN.
  PETRA_HOST_DEVICE static constexpr int micro_row(int t, int r) { return r / 4 * 64 + t / kThreadsX * 4 + r % 4; }
  PETRA_HOST_DEVICE static constexpr int micro_column(int t, int q) {
    return q / 4 * 64 + t % kThreadsX * 4 + q % 4;
  }
};

// The 64 x 64 tile: both paths' for small products; the weight gradient's split counts its tiles.
using SmallTile = TileShape<64, 64>;
inline constexpr int kTileM = SmallTile::kM;
inline constexpr int kTileN = SmallTile::kN;

// The tile for one pass's product of `rows` x `columns` per grid layer and `layers` grid layers
// (stride classes or K slices), from the shape alone, the same rule for the FP32 and the TF32
// kernels. Measured on an H200 with every tile forced (bench-cuda, docs/results-gpu.md,
// 2026-12-04 run 11, after the asynchronous-copy pipeline) on the ResNet-18 CIFAR layers at batch
// 128; the rule's sum over the 11 layers is within 1-2% of the fastest tile's per layer in each
// pass and precision:
//   - a tile never pads a product of at most 64 rows (or columns) to 128;
//   - the largest tile that still leaves enough blocks to fill the GPU's 132 multiprocessors:
//     128 x 128 with at least kMinBlocksFor128x128 blocks (kMinWeightBlocksFor128x128 in the weight
//     pass), else 128 x 64, else 64 x 128 with at least kMinBlocksForLargerTile, else 64 x 64;
//   - 128 x 64 before 64 x 128 (it was as fast or faster wherever both fit), and never 64 x 128 in
//     the weight pass (its short N: 15% slower than 64 x 64 on the 64-channel layer).
// (Until run 10, with the values going through registers and two barriers per step, 128 x 128 was
// never the fastest in FP32 and the thresholds were 256 and 384 blocks; the TF32 path had a rule of
// its own.) The tile never changes the results: each output is one thread's, or one accumulator
// element's, sum over k in the same order.
enum class ConvPass { forward, data, weight };
// k128x128_two_per_sm: the TF32 path's 128 x 128 tile compiled for two blocks per multiprocessor
// (128 registers) instead of one; an option to time (bench-cuda), never chosen by choose_tile. The
// FP32 path takes its 128 x 128 tile for it.
// k128x128_k32: the TF32 path's 128 x 128 tile with a K step of 32 (Tf32TileK32), three stages
// in dynamic shared memory; the same kind of option. The FP32 path takes its 128 x 128 for it too.
enum class TileChoice { k64x64 = 0, k64x128 = 1, k128x64 = 2, k128x128 = 3, k128x128_two_per_sm = 4, k128x128_k32 = 5 };
inline constexpr std::int64_t kMinBlocksForLargerTile = 128;
inline constexpr std::int64_t kMinBlocksFor128x128 = 128;
inline constexpr std::int64_t kMinWeightBlocksFor128x128 = 192;
inline TileChoice choose_tile(ConvPass pass, std::int64_t rows, std::int64_t columns, std::int64_t layers) {
  // A tile of m x n rows and columns: not padding 64 or fewer to 128, and leaving `min_blocks`.
  const auto fits = [&](std::int64_t m, std::int64_t n, std::int64_t min_blocks) {
    if ((m == 128 && rows <= 64) || (n == 128 && columns <= 64)) return false;
    return ceil_div(rows, m) * ceil_div(columns, n) * layers >= min_blocks;
  };
  if (fits(128, 128, pass == ConvPass::weight ? kMinWeightBlocksFor128x128 : kMinBlocksFor128x128))
    return TileChoice::k128x128;
  if (fits(128, 64, kMinBlocksForLargerTile)) return TileChoice::k128x64;
  if (pass != ConvPass::weight && fits(64, 128, kMinBlocksForLargerTile)) return TileChoice::k64x128;
  return TileChoice::k64x64;
}

// ---- the TF32 path (the three passes under conv2d_math() == Conv2dMath::tf32) -----------------

// The TF32 path's tiles: the FP32 path's K step of 16, A in the mma's operand order, B's rows padded by 8
// floats and in tf32_b_row's order, its columns in tf32_b_slot's (TileLayout::tf32), so three
// pipeline stages on the 64 x 64, 64 x 128 and 128 x 64 tiles and two on the 128 x 128
// (TileShape::kStages). Until run 9 the K step was 32
// on most tiles, meant to hide the gather's latency behind twice the products per pair of barriers
// when the values went through registers; with the copies asynchronous the pipeline's depth does
// that, and 32 would leave room for two stages only. The accumulation order (k8 products in k
// order) does not depend on the step, so neither do the results.
template <int M, int N>
using Tf32Tile = TileShape<M, N, kTileK, TileLayout::tf32>;
// The TF32 tile with a K step of 32: half the barriers, table writes and waits per product
// (TileChoice::k128x128_k32, an option to time; not picked by choose_tile).
template <int M, int N>
using Tf32TileK32 = TileShape<M, N, 2 * kTileK, TileLayout::tf32>;

// The 8 warps of a block split Tile's M x N output into kWarpsM x kWarpsN pieces of kRows x
// kColumns: warp w computes rows row(w) .. + kRows - 1 and columns column(w) .. + kColumns - 1, as
// kFragmentsM x kFragmentsN tensor-core accumulators of 16 x 8 (mma.m16n8k8). 64 x 64: 4 x 2 warps
// of 16 x 32 (1 x 4 accumulators); 128 x 64 and 64 x 128: pieces of 32 x 32 (2 x 4); 128 x 128:
// 32 x 64 (2 x 8). Per k8 step a warp loads its A rows and B columns once for kFragmentsM x
// kFragmentsN products, so the larger pieces read shared memory less per product.
template <class Tile>
struct WarpLayout {
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kWarpsM = Tile::kM == 64 && Tile::kN == 128 ? 2 : 4;
  static constexpr int kWarpsN = kWarps / kWarpsM;
  static constexpr int kRows = Tile::kM / kWarpsM, kColumns = Tile::kN / kWarpsN;
  static constexpr int kFragmentsM = kRows / 16, kFragmentsN = kColumns / 8;
  static_assert(kRows == 16 || kRows == 32, "Tf32Fragment's row order covers 1 or 2 fragments of 16 rows");
  static_assert(kColumns % 8 == 0);
  PETRA_HOST_DEVICE static constexpr int row(int warp) { return warp / kWarpsN * kRows; }
  PETRA_HOST_DEVICE static constexpr int column(int warp) { return warp % kWarpsN * kColumns; }
};

// Which tile rows and columns lane l = 4 g + t of a warp holds in its mma.m16n8k8 fragments, FM
// fragments of 16 rows (1 or 2) per warp piece. In the PTX layout, accumulator element e (0..3) of
// fragment (fm, fn) is C(row 8 (e / 2) + g of the fragment's 16, column 2 t + e % 2 of its 8), A's
// element e is A(row 8 (e % 2) + g, k t + 4 (e / 2)) and B's element e is B(k t + 4 e, column g);
// which of a K step's k the fragment's k are is the kernel's choice (tf32_b_row). Fragment fm's
// row 8 s + g is piece row 16 fm + 8 s + g, fragment fn's column c is piece column 8 fn + c. (Until
// the A tile held rows of k, a_tile[k][m], the rows were interleaved so that a lane's rows of one k
// were adjacent there; now the A tile holds a lane's operands side by side, TileShape::a_row.)
template <int FM>
struct Tf32Fragment {
  static_assert(FM == 1 || FM == 2);
  // piece row of fragment fm's row 8 s + g (s = 0, 1)
  PETRA_HOST_DEVICE static constexpr int row(int fm, int s, int g) { return 16 * fm + 8 * s + g; }
  // piece column of fragment fn's column 2 t + e (e = 0, 1)
  PETRA_HOST_DEVICE static constexpr int column(int fn, int t, int e) { return 8 * fn + 2 * t + e; }
};

// x rounded to TF32 (the 10 leading bits of the mantissa), to nearest with ties away from zero,
// as the tensor cores' conversion cvt.rna.tf32.f32 does (conv2d.cu's to_tf32). Infinities and
// NaNs are returned unchanged.
PETRA_HOST_DEVICE inline float tf32_round(float x) {
  std::uint32_t bits;
#ifdef __CUDA_ARCH__
  bits = __float_as_uint(x);
#else
  std::memcpy(&bits, &x, sizeof bits);
#endif
  if ((bits & 0x7f800000u) == 0x7f800000u) return x;
  bits = (bits + 0x1000u) & ~0x1fffu;  // add half of the 13 dropped bits' unit, then drop them
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
#endif
}

// The bits a TF32 operand is handed to the tensor cores in (conv2d.cu's tf32_operand): x's plus
// half a unit of TF32's last place where x is finite, x's own where it is not. An mma reads only
// the 19 leading bits of a .tf32 operand (it truncates: 1 + 0.75 * 2^-10 enters as 1), and those
// are tf32_round(x)'s: the rounding in one integer add behind a test of x, where cvt.rna.tf32.f32
// is three instructions on sm_80 and sm_90 (CUTLASS's round_half_ulp_truncate is the same idea).
// The test keeps a NaN from carrying into the sign bit (0x7fffffff + 0x1000 would read as -0); a
// NaN whose payload lies only in the 13 dropped bits reads as an infinity, as its truncation does.
PETRA_HOST_DEVICE constexpr std::uint32_t tf32_operand_bits(std::uint32_t bits) {
  return (bits & 0x7f800000u) == 0x7f800000u ? bits : bits + 0x1000u;
}

// ---- split-K: fixed slices of the summed dimension --------------------------------------------

// K = [0, total) cut into `slices` consecutive slices of slice_length (a multiple of kTileK, the
// last one shorter), none empty. The cut depends only on total and the number asked for.
struct SplitK {
  std::int64_t total = 0, slice_length = 0, slices = 0;

  PETRA_HOST_DEVICE std::int64_t begin(std::int64_t s) const { return s * slice_length; }
  PETRA_HOST_DEVICE std::int64_t end(std::int64_t s) const {
    const std::int64_t e = (s + 1) * slice_length;
    return e < total ? e : total;
  }
};
// At most `wanted` (>= 1) slices; fewer when K has fewer tile steps than that.
PETRA_HOST_DEVICE inline SplitK split_k(std::int64_t total, std::int64_t wanted) {
  if (total <= 0) return {total, kTileK, 1};
  const std::int64_t steps = ceil_div(total, kTileK);
  const std::int64_t per_slice = ceil_div(steps, wanted < 1 ? 1 : wanted);
  const std::int64_t length = per_slice * kTileK;
  return {total, length, ceil_div(total, length)};
}

// The weight gradient's slices, from the shape alone (so every run, and every GPU, sums in the
// same order):
//   - at least kWeightSliceMinK terms per slice (each block then runs >= 64 steps of kTileK),
//   - at most kWeightMaxSlices slices,
//   - no more slices than it takes to give about kWeightTargetBlocks blocks (more would only add
//     partials to sum),
//   - the partials (slices x weight_size floats of scratch) at most kWeightMaxPartialBytes, unless
//     one slice: then there are no partials (the block adds into dw directly).
inline constexpr std::int64_t kWeightSliceMinK = 1024;
inline constexpr std::int64_t kWeightMaxSlices = 64;
inline constexpr std::int64_t kWeightTargetBlocks = 1024;
inline constexpr std::int64_t kWeightMaxPartialBytes = std::int64_t(64) << 20;

// The rule for a sum of k terms into outputs that take `tiles` 64 x 64 tiles and `slice_bytes`
// of partials per slice (the direct weight gradient here; the Winograd one's 16 products in
// conv2d.cu).
inline SplitK weight_split(std::int64_t k, std::int64_t tiles, std::int64_t slice_bytes) {
  std::int64_t wanted = std::clamp<std::int64_t>(k / kWeightSliceMinK, 1, kWeightMaxSlices);
  wanted = std::min(wanted, std::max<std::int64_t>(1, kWeightTargetBlocks / std::max<std::int64_t>(tiles, 1)));
  wanted = std::min(wanted, std::max<std::int64_t>(1, kWeightMaxPartialBytes / std::max<std::int64_t>(slice_bytes, 1)));
  return split_k(k, wanted);
}

inline std::int64_t weight_split_slices(const Conv2dShape& s) {
  const std::int64_t n = s.in_channels * s.kernel_h * s.kernel_w;
  return weight_split(s.batch * s.out_h() * s.out_w(), ceil_div(s.out_channels, kTileM) * ceil_div(n, kTileN),
                      s.weight_size() * std::int64_t(sizeof(float)))
      .slices;
}

// ---- split-K for the forward and backward data (set_conv2d_split_k: an option to time) --------

// A product whose 128 x 128 tiles are fewer than kMinBlocksFor128x128 blocks (batch 128: the
// 512-channel 4 x 4 layers, 4 x 16 = 64 tiles for 132 multiprocessors) runs on a smaller tile,
// whose blocks do less per multiprocessor (run 12, H100: the 4 x 4 layer's TF32 forward 0.221 ms
// on 128 x 64 tiles, 0.280 on 64 tiles of 128 x 128 with half the multiprocessors idle, so ~0.14
// if they all worked; FP32 0.358 and 0.578). Cutting its K into slices gives the 128 x 128 tile
// enough blocks: each block sums one slice into partials, and a second launch adds the slices in
// order (conv2d.cu, sum_output_partials). Rule, from the product's sizes alone:
//   - only where 128 x 128 pads neither side (more than 64 rows and columns) and leaves fewer than
//     kMinBlocksFor128x128 blocks;
//   - as many slices as bring the blocks to kMinBlocksFor128x128, at most kOutputMaxSlices, each
//     but the last at least kOutputSliceMinK terms (32 K steps), else no split.
// (`min_k`: the emulated kernels take 64, so that small test shapes split; conv2d.cu.)
inline constexpr std::int64_t kOutputSliceMinK = 512;
inline constexpr std::int64_t kOutputMaxSlices = 4;
inline SplitK output_split(std::int64_t rows, std::int64_t columns, std::int64_t depth,
                           std::int64_t min_k = kOutputSliceMinK) {
  const SplitK whole{depth, depth, 1};
  if (rows <= 64 || columns <= 64 || depth <= 0) return whole;
  const std::int64_t blocks = ceil_div(rows, 128) * ceil_div(columns, 128);
  if (blocks >= kMinBlocksFor128x128) return whole;
  const std::int64_t wanted =
      std::min({ceil_div(kMinBlocksFor128x128, blocks), kOutputMaxSlices, depth / min_k});
  if (wanted < 2) return whole;
  return split_k(depth, wanted);
}
// The forward's product: out_channels x the output pixels, K = in_channels x taps (either
// orientation: the NCHW and the channels-last problems have the same tiles).
inline SplitK forward_output_split(const Conv2dShape& s, std::int64_t min_k = kOutputSliceMinK) {
  return output_split(s.out_channels, s.batch * s.out_h() * s.out_w(), s.in_channels * s.kernel_h * s.kernel_w,
                      min_k);
}
// Backward data's at stride 1 (one stride class): in_channels x the input pixels, K = out_channels x
// taps. At larger strides the grid's layers are the stride classes: no split.
inline SplitK data_output_split(const Conv2dShape& s, std::int64_t min_k = kOutputSliceMinK) {
  const std::int64_t depth = s.out_channels * s.kernel_h * s.kernel_w;
  if (s.stride_h != 1 || s.stride_w != 1) return {depth, depth, 1};
  return output_split(s.in_channels, s.batch * s.in_h * s.in_w, depth, min_k);
}

}  // namespace petra::kernels::cuda::conv2d_tiling

#if PETRA_HAVE_CUDA
namespace petra::kernels::cuda {
// conv2d_backward_weight with the weight gradient's K cut into at most `slices` slices
// (conv2d_tiling::split_k); conv2d_backward_weight itself asks for weight_split_slices(shape).
// The emulated test calls it to run the split and the partials' sum on small shapes.
void conv2d_backward_weight_split(const StreamHandle& s, const Conv2dShape& shape, const float* x,
                                  const float* dy, float* dw, std::int64_t slices);
}  // namespace petra::kernels::cuda
#endif
