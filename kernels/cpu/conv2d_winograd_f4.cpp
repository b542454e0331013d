// kernels/cpu/conv2d_winograd_f4.cpp: Winograd's F(4x4, 3x3) (float, AVX-512) for images with
// rows of up to 28 pixels (every stage of ResNet-18 on 28x28 inputs: 28x28, 14x14, 7x7 and 4x4),
// 3x3 kernel, stride 1, padding 1: the forward pass, backward-data (the forward of
// transposed_stride1, the same shape) and backward-weight (below "Backward-weight": the same V,
// the adjoint of the output transform on dy, F(2x2)'s products).
//
// The math. A 4x4 tile of outputs needs a 6x6 patch d of the padded input; with
//   B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0; 0 4 0 -5 0 1],
//   G   = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1],
//   A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1]
// (Lavin and Gray 2016, points 0, +-1, +-2), a tile's outputs are
//   Y = A^T [ sum over input channels c of U[c] .* V[c] ] A,  U = G g G^T,  V = B^T d B:
// 36 products per tile and channel pair where the direct convolution takes 144 and F(2x2, 3x3)
// 64 (four 2x2 tiles): 1.78x fewer. The price is larger transforms and rounding: B and A hold 4, 5
// and 8, G sixths, so outputs carry a relative error of ~1e-6 where F(2x2) gives ~2e-7 (the
// comparison with ref:: in double, bench-conv-shapes' rel.err column).
//
// The layout: 16 images on the lanes. A tile's 36 positions of one channel are 36 vectors, each
// holding that position for 16 images, so every product is a plain vector FMA, for any image size
// (F(2x2)'s kernels put tiles or positions on the lanes, and 36 positions fill no whole vectors).
// A unit of work is one tile row of one group of 16 images:
//   1. U[p][o / 8][c][o % 8] (36 x in x out floats, shared): G g G^T in float, 16 output channels
//      at a time (their taps gathered).
//   2. V[p][c][column] (a column: one tile of a unit; a chunk holds up to 6 columns of whole units,
//      or one unit of 7 tiles): per input channel and unit, the 6 rows of the unit's patches go
//      onto the lanes by 16 x 16 transposes into a buffer with a zero border (no bounds tested in
//      the transform), then B^T d B per tile.
//   3. M[p][o][column] = sum_c U[p][c][o] V[p][c][column], a position at a time (its V stays in
//      L1 across all output channels): R x N accumulators (N <= 6 columns, R = 8 or 4 output
//      channels, 16 to 24 registers), N loads of V and R broadcasts of U per input channel.
//   4. Y = A^T M A + bias per output channel and tile, transposed back to the images' planes.
// Each thread takes whole units, so every output is summed by one thread in one order: the same
// bits at any thread count.
#include "petra/kernels/cpu/conv2d_algorithms.hpp"

#if PETRA_CONV_DIRECT
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "petra/kernels/cpu/conv2d_direct.hpp"
#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu::conv2d::winograd_f4 {
namespace {

using direct::first_lanes;
using direct::kLanes;
constexpr int kPositions = 36;     // of a transformed 6x6 tile
constexpr int64_t kMaxColumns = 6; // columns per product micro-kernel
constexpr int64_t kMaxWidth = 28;  // image columns (see applies)

// The geometry of a call on `threads` threads. A unit of work is one tile row of one group of 16
// images (up to 4 tiles); a chunk is up to kMaxColumns columns of whole units, each column one tile
// of a unit, and no more units than a thread gets (its V and M are sized by the chunk).
struct Geometry {
  int64_t h, w, tiles_h, tiles_w, groups, units, chunk_units;
  Geometry(const Conv2dShape& s, int threads)
      : h(s.in_h), w(s.in_w), tiles_h((s.in_h + 3) / 4), tiles_w((s.in_w + 3) / 4),
        groups((s.batch + kLanes - 1) / kLanes), units(groups * tiles_h),
        chunk_units(std::clamp<int64_t>(kMaxColumns / tiles_w, 1, (units + threads - 1) / threads)) {}
  int64_t max_columns() const { return chunk_units * tiles_w; }
  // A unit's patches: 6 rows of the image with a border of zeros, `padded_w` pixels each.
  int64_t padded_w() const { return 4 * tiles_w + 2; }
  // Vectors for one unit's padded patch rows or its outputs (4 rows of w).
  int64_t plane_vectors() const { return std::max(6 * padded_w(), 4 * w); }
};

// Output channels of one panel of U (out rounded up to it, zero weights beyond out).
constexpr int64_t kPanel = 8;

// Floats from one position's V (or M) to the next's: its channels x columns vectors, rounded up
// to an odd number of lines (odd_lines). Unpadded, the 36 positions lay a multiple of 4 KB apart
// whenever channels x columns is even (32->32 @14: 8 KB, 64->64 @7: 24 KB, 128->128 @4: 32 KB),
// and a tile's 36 stores to V (and its 36 loads from M) fell in one L1 set.
int64_t position_stride(int64_t channels, int64_t columns) { return odd_lines(channels * columns * kLanes); }

// The call's geometry and scratch. Shared: U[p][panel][c][8]. Per thread: V and M of a chunk (every
// output channel), the pixels of one unit (images on the lanes, in and out).
struct Layout {
  Geometry g;
  int64_t in, out_rounded, v_floats, m_floats, planes_floats;
  Layout(const Conv2dShape& s, int threads)
      : g(s, std::max(1, threads)), in(s.in_channels), out_rounded(round_up(s.out_channels, kPanel)),
        v_floats(kPositions * position_stride(s.in_channels, g.max_columns())),
        m_floats(kPositions * position_stride(out_rounded, g.max_columns())), planes_floats(g.plane_vectors() * kLanes) {}
  int64_t u_floats() const { return kPositions * out_rounded * in; }
  int64_t thread_floats() const { return v_floats + m_floats + planes_floats; }
};

// patch[b * padded_w + 1 + col] = pixel (4 ty - 1 + b, col) of channel plane `x` (h x w) of 16
// images `image_stride` apart (lanes past `images` zero), for the 6 rows b of tile row ty's
// patches, with zeros around them (the padding, and past the image's last row and column): the
// images go onto the lanes through 16 x 16 transposes of the rows' pixels.
// Each line read is also prefetched `prefetch` floats further on (0: none): the caller's next
// gather, the same rows of the next channel. The 16 images' rows are 16 short runs on 16 pages, which
// the hardware prefetcher does not catch: when x comes from DRAM, as in a training step, the
// gathers waited on every line.
void gather_patch_rows(const float* x, int64_t image_stride, int64_t images, int64_t h, int64_t w, int64_t ty,
                       int64_t padded_w, int64_t prefetch, __m512* patch) {
  const __m512 zero = _mm512_setzero_ps();
  const int64_t top = 4 * ty - 1, row0 = std::max<int64_t>(0, top), row1 = std::min(h, top + 6);
  for (int64_t b = 0; b < 6; ++b) {
    __m512* row = patch + b * padded_w;
    if (top + b < 0 || top + b >= h) {
      for (int64_t q = 0; q < padded_w; ++q) row[q] = zero;
    } else {
      row[0] = zero;
      for (int64_t q = w + 1; q < padded_w; ++q) row[q] = zero;
    }
  }
  const int64_t pixels = (row1 - row0) * w;
  const float* from = x + row0 * w;
  int64_t row = row0 - top, col = 0;  // where pixel k goes: patch row, image column
  for (int64_t k0 = 0; k0 < pixels; k0 += kLanes) {
    const __mmask16 valid = first_lanes(pixels - k0);
    __m512 r[16];
    for (int i = 0; i < 16; ++i)
      r[i] = i < images ? _mm512_maskz_loadu_ps(valid, from + i * image_stride + k0) : zero;
    if (prefetch != 0)
      for (int i = 0; i < images; ++i)
        _mm_prefetch(reinterpret_cast<const char*>(from + i * image_stride + k0 + prefetch), _MM_HINT_T0);
    direct::transpose16(r);
    for (int j = 0; j < 16 && k0 + j < pixels; ++j) {
      patch[row * padded_w + 1 + col] = r[j];
      if (++col == w) {
        col = 0;
        ++row;
      }
    }
  }
}

// The planes of images first .. first + images - 1 (out_image floats apart) = planes[q], pixel q
// of each image on its lane.
// Each line written is also prefetched for writing `prefetch` floats further on (0: none), the
// caller's next scatter (as gather_patch_rows, for the same reason).
void scatter_images(const __m512* planes, int64_t images, int64_t pixels, int64_t out_image, int64_t prefetch,
                    float* y) {
  for (int64_t slab = 0; slab * kLanes < pixels; ++slab) {
    const int64_t count = std::min<int64_t>(kLanes, pixels - slab * kLanes);
    __m512 r[16];
    for (int j = 0; j < 16; ++j) r[j] = j < count ? planes[slab * kLanes + j] : _mm512_setzero_ps();
    direct::transpose16(r);
    const __mmask16 valid = first_lanes(count);
    for (int i = 0; i < images; ++i) _mm512_mask_storeu_ps(y + i * out_image + slab * kLanes, valid, r[i]);
    if (prefetch != 0)
      for (int i = 0; i < images; ++i) _m_prefetchw(y + i * out_image + slab * kLanes + prefetch);
  }
}

// r = B^T d for six values d (a column or a row of a patch).
inline void input_transform6(const __m512 (&d)[6], __m512 (&r)[6]) {
  const __m512 four = _mm512_set1_ps(4.0f), five = _mm512_set1_ps(5.0f), two = _mm512_set1_ps(2.0f);
  r[0] = _mm512_fmadd_ps(four, d[0], _mm512_fnmadd_ps(five, d[2], d[4]));
  r[1] = _mm512_fnmadd_ps(four, _mm512_add_ps(d[1], d[2]), _mm512_add_ps(d[3], d[4]));
  r[2] = _mm512_fmadd_ps(four, _mm512_sub_ps(d[1], d[2]), _mm512_sub_ps(d[4], d[3]));
  r[3] = _mm512_fmadd_ps(two, _mm512_sub_ps(d[3], d[1]), _mm512_sub_ps(d[4], d[2]));
  r[4] = _mm512_fmadd_ps(two, _mm512_sub_ps(d[1], d[3]), _mm512_sub_ps(d[4], d[2]));
  r[5] = _mm512_fmadd_ps(four, d[1], _mm512_fnmadd_ps(five, d[3], d[5]));
}

// y = A^T m for six values m.
inline void output_transform6(const __m512 (&m)[6], __m512 (&y)[4]) {
  const __m512 s12 = _mm512_add_ps(m[1], m[2]), d12 = _mm512_sub_ps(m[1], m[2]);
  const __m512 s34 = _mm512_add_ps(m[3], m[4]), d34 = _mm512_sub_ps(m[3], m[4]);
  y[0] = _mm512_add_ps(_mm512_add_ps(m[0], s12), s34);
  y[1] = _mm512_fmadd_ps(_mm512_set1_ps(2.0f), d34, d12);
  y[2] = _mm512_fmadd_ps(_mm512_set1_ps(4.0f), s34, s12);
  y[3] = _mm512_add_ps(_mm512_fmadd_ps(_mm512_set1_ps(8.0f), d34, d12), m[5]);
}

// v[p * v_stride] (p = 6 i + j) = (B^T d B)[i][j] for tile tx of a unit, d its 6x6 patch: columns
// 4 tx .. 4 tx + 5 of the padded patch rows (gather_patch_rows).
void transform_tile(const __m512* patch, int64_t padded_w, int64_t tx, float* v, int64_t v_stride) {
  __m512 t[6][6];  // t[i][q] = (B^T d)[i][q]
  for (int q = 0; q < 6; ++q) {
    __m512 d[6];
    for (int r = 0; r < 6; ++r) d[r] = patch[r * padded_w + 4 * tx + q];
    __m512 column[6];
    input_transform6(d, column);
    for (int i = 0; i < 6; ++i) t[i][q] = column[i];
  }
  for (int i = 0; i < 6; ++i) {
    __m512 row[6];
    input_transform6(t[i], row);
    for (int j = 0; j < 6; ++j) _mm512_store_ps(v + (6 * i + j) * v_stride, row[j]);
  }
}

// planes[a * w + 4 tx + b] = (A^T M A)[a][b] + bias for the output pixels (4 ty + a, 4 tx + b) inside
// the h x w image, from the tile's 36 positions m[p * m_stride].
void transform_output_tile(const float* m, int64_t m_stride, int64_t h, int64_t w, int64_t ty, int64_t tx,
                           __m512 bias, __m512* planes) {
  __m512 t[4][6];  // t[a][j] = (A^T M)[a][j]
  for (int j = 0; j < 6; ++j) {
    __m512 column[6];
    for (int i = 0; i < 6; ++i) column[i] = _mm512_load_ps(m + (6 * i + j) * m_stride);
    __m512 out[4];
    output_transform6(column, out);
    for (int a = 0; a < 4; ++a) t[a][j] = out[a];
  }
  for (int a = 0; a < 4 && 4 * ty + a < h; ++a) {
    __m512 out[4];
    output_transform6(t[a], out);
    for (int b = 0; b < 4 && 4 * tx + b < w; ++b) planes[a * w + 4 * tx + b] = _mm512_add_ps(out[b], bias);
  }
}

// m[r * m_row + n * 16] = sum over c < in of u[c * u_stride + r] * v[c * v_stride + n * 16], for R
// output channels and N columns: R x N accumulators, N loads and R broadcasts per input channel.
template <int R, int N>
void multiply(const float* u, int64_t u_stride, const float* v, int64_t v_stride, int64_t in, float* m,
              int64_t m_row) {
  // The loops over acc are unrolled so that it is indexed by constants only: otherwise GCC keeps acc
  // on the stack, zeroing it there first and copying it out last (16-24 stores and loads more
  // per call, 16 input channels deep at 28x28; docs/results-cpu.md §1, 2026-12-05).
  __m512 acc[R][N];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 6
    for (int n = 0; n < N; ++n) acc[r][n] = _mm512_setzero_ps();
  for (int64_t c = 0; c < in; ++c, u += u_stride, v += v_stride) {
    __m512 vv[N];
    for (int n = 0; n < N; ++n) vv[n] = _mm512_load_ps(v + n * kLanes);
    for (int r = 0; r < R; ++r) {
      const __m512 ub = _mm512_set1_ps(u[r]);
      for (int n = 0; n < N; ++n) acc[r][n] = _mm512_fmadd_ps(ub, vv[n], acc[r][n]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 6
    for (int n = 0; n < N; ++n) _mm512_store_ps(m + r * m_row + n * kLanes, acc[r][n]);
}

// The products of one position for R output channels and `columns` columns (1 to kMaxColumns;
// rows_per_product gives R = 8 only up to 3): multiply<R, N> with N = columns, instantiated only
// up to 24 accumulators (more would not fit the 32 vector registers beside the loads).
template <int R, int N = 1>
void multiply_columns(int64_t columns, const float* u, int64_t u_stride, const float* v, int64_t v_stride,
                      int64_t in, float* m, int64_t m_row) {
  if constexpr (R * (N + 1) <= 24 && N < kMaxColumns) {
    if (columns > N) {
      multiply_columns<R, N + 1>(columns, u, u_stride, v, v_stride, in, m, m_row);
      return;
    }
  }
  multiply<R, N>(u, u_stride, v, v_stride, in, m, m_row);
}

// r = G g for the three taps g of a kernel column (or row of G g): 16 output channels on the lanes.
inline void kernel_transform3(const __m512 (&g)[3], __m512 (&r)[6]) {
  const __m512 sixth = _mm512_set1_ps(1.0f / 6), twelfth = _mm512_set1_ps(1.0f / 12);
  const __m512 outer = _mm512_add_ps(g[0], g[2]);  // g0 + g2
  const __m512 quarter_g0 = _mm512_mul_ps(_mm512_set1_ps(0.25f), g[0]);
  const __m512 even = _mm512_fmadd_ps(quarter_g0, sixth, _mm512_mul_ps(g[2], sixth));  // g0/24 + g2/6
  r[0] = quarter_g0;
  r[1] = _mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), sixth), _mm512_add_ps(outer, g[1]));
  r[2] = _mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), sixth), _mm512_sub_ps(outer, g[1]));
  r[3] = _mm512_fmadd_ps(g[1], twelfth, even);
  r[4] = _mm512_fnmadd_ps(g[1], twelfth, even);
  r[5] = g[2];
}

// Input channels whose transformed kernels transform_weight keeps before writing them to U.
constexpr int64_t kWeightBlock = 8;

// u[((p * panels + o / 8) * in + c) * 8 + o % 8] = (G g G^T)[p / 6][p % 6] of output channel o and
// input channel c (zero for o >= out), 16 output channels at a time: their taps gathered through
// Taps' strides, G applied to the columns, then to the rows, in float.
// The 36 positions of one kernel land in 36 (72 with the second panel) places of U that lie
// panels * in * 32 bytes apart: a multiple of 4 KB, so the same L1 and L2 sets. Written kernel by
// kernel they evicted one another's lines between the two 32-byte halves of each line (128->128:
// 72 lines in one 12-way L1 set and one 16-way L2 set). So up to kWeightBlock consecutive input
// channels of one group of 16 output channels are transformed into `block` (18 KB, in L1) first,
// then each (position, panel) is copied to U as one run of whole lines.
template <class Taps>
void transform_weight(const StreamHandle& st, int64_t out, int64_t out_rounded, int64_t in, const Taps& taps,
                      float* u) {
  const int64_t panels = out_rounded / kPanel, vectors = (out + kLanes - 1) / kLanes;
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  run_threads(st, [&](int t, int threads) {
    alignas(64) float block[kPositions][2][kWeightBlock][kPanel];
    const int64_t end = share(vectors * in, t + 1, threads);
    for (int64_t vc = share(vectors * in, t, threads); vc < end;) {
      const int64_t o0 = vc / in * kLanes, c0 = vc % in;
      const int64_t count = std::min({kWeightBlock, end - vc, in - c0});
      const int halves = o0 + kPanel < out_rounded ? 2 : 1;
      const __mmask16 valid = first_lanes(out - o0);
      const __m512i index = _mm512_mullo_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(o0))),
                                               _mm512_set1_epi32(static_cast<int>(taps.first_stride())));
      for (int64_t k = 0; k < count; ++k) {
        const float* base = taps.w + (c0 + k) * taps.second_stride();
        __m512 gg[6][3];  // (G g)[i][j]
        for (int j = 0; j < 3; ++j) {
          __m512 column[3];
          for (int i = 0; i < 3; ++i)
            column[i] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), valid, index, base + Taps::offset(i, j), 4);
          __m512 r[6];
          kernel_transform3(column, r);
          for (int i = 0; i < 6; ++i) gg[i][j] = r[i];
        }
        for (int i = 0; i < 6; ++i) {
          __m512 r[6];
          kernel_transform3(gg[i], r);  // (G g) G^T, row i
          for (int j = 0; j < 6; ++j) {
            _mm256_store_ps(block[6 * i + j][0][k], _mm512_castps512_ps256(r[j]));
            _mm256_store_ps(block[6 * i + j][1][k],
                            _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(r[j]), 1)));
          }
        }
      }
      for (int p = 0; p < kPositions; ++p)
        for (int half = 0; half < halves; ++half)
          std::memcpy(u + ((p * panels + o0 / kPanel + half) * in + c0) * kPanel, block[p][half],
                      sizeof(float) * std::size_t(count * kPanel));
      vc += count;
    }
  });
}

// Output channels per product micro-kernel: 8 (a whole panel) where the columns are few (up to 24
// accumulators), else 4.
int rows_per_product(int64_t columns) { return columns <= 3 ? 8 : 4; }

// M[p][o][column] for every position and (rounded) output channel of a chunk, `columns` wide: a
// position at a time (its V stays in L1 across the output channels), in runs of up to kMaxColumns
// columns of near-equal sizes.
void multiply_chunk(const Layout& k, const float* u, const float* v, int64_t columns, float* m) {
  const int64_t in = k.in, panels = k.out_rounded / kPanel, m_stride = position_stride(k.out_rounded, columns);
  const int64_t runs = (columns + kMaxColumns - 1) / kMaxColumns;
  for (int p = 0; p < kPositions; ++p) {
    const float* vp = v + p * position_stride(in, columns);
    for (int64_t run = 0; run < runs; ++run) {
      const int64_t n0 = share(columns, run, runs), n = share(columns, run + 1, runs) - n0;
      const int rows = rows_per_product(n);
      for (int64_t o0 = 0; o0 < k.out_rounded; o0 += rows) {
        const float* up = u + (p * panels + o0 / kPanel) * in * kPanel + o0 % kPanel;
        float* mp = m + p * m_stride + (o0 * columns + n0) * kLanes;
        if (rows == 8) multiply_columns<8>(n, up, kPanel, vp + n0 * kLanes, columns * kLanes, in, mp, columns * kLanes);
        else multiply_columns<4>(n, up, kPanel, vp + n0 * kLanes, columns * kLanes, in, mp, columns * kLanes);
      }
    }
  }
}

void forward_transformed(const StreamHandle& st, const Conv2dShape& s, const Layout& k, const float* u,
                         const Scratch<float>& scratch, const float* x, const float* bias, float* y) {
  const Geometry& g = k.g;
  const int64_t in = s.in_channels, out = s.out_channels, in_image = s.x_image_stride();
  const int64_t plane = g.h * g.w, out_image = out * plane;
  run_threads(st, [&](int t, int threads) {
    float* v = scratch.of_thread(t);
    float* m = v + k.v_floats;
    auto* planes = reinterpret_cast<__m512*>(m + k.m_floats);
    const int64_t unit_end = share(g.units, t + 1, threads);
    for (int64_t unit0 = share(g.units, t, threads); unit0 < unit_end; unit0 += g.chunk_units) {
      const int64_t units = std::min(g.chunk_units, unit_end - unit0), columns = units * g.tiles_w;
      // V[p][c][column], column = unit * tiles_w + tx: per input channel and unit, the patches' rows
      // of the unit's 16 images with the images on the lanes, then each tile's B^T d B
      for (int64_t c = 0; c < in; ++c)
        for (int64_t ui = 0; ui < units; ++ui) {
          const int64_t group = (unit0 + ui) / g.tiles_h, ty = (unit0 + ui) % g.tiles_h;
          const int64_t first = group * kLanes, images = std::min<int64_t>(kLanes, s.batch - first);
          gather_patch_rows(x + first * in_image + c * plane, in_image, images, g.h, g.w, ty, g.padded_w(),
                            c + 1 < in ? plane : 0, planes);
          for (int64_t tx = 0; tx < g.tiles_w; ++tx)
            transform_tile(planes, g.padded_w(), tx, v + (c * columns + ui * g.tiles_w + tx) * kLanes,
                           position_stride(in, columns));
        }
      multiply_chunk(k, u, v, columns, m);
      // Y = A^T M A + bias, back to the images' planes, a unit's output rows at a time
      const int64_t m_stride = position_stride(k.out_rounded, columns);
      for (int64_t o = 0; o < out; ++o) {
        const __m512 b = _mm512_set1_ps(bias != nullptr ? bias[o] : 0.0f);
        for (int64_t ui = 0; ui < units; ++ui) {
          const int64_t group = (unit0 + ui) / g.tiles_h, ty = (unit0 + ui) % g.tiles_h;
          const int64_t first = group * kLanes, images = std::min<int64_t>(kLanes, s.batch - first);
          for (int64_t tx = 0; tx < g.tiles_w; ++tx)
            transform_output_tile(m + (o * columns + ui * g.tiles_w + tx) * kLanes, m_stride, g.h, g.w, ty, tx, b,
                                  planes);
          const int64_t pixels = (std::min(g.h, 4 * ty + 4) - 4 * ty) * g.w;
          scatter_images(planes, images, pixels, out_image, o + 1 < out ? plane : 0,
                         y + first * out_image + o * plane + 4 * ty * g.w);
        }
      }
    }
  });
}

// ---- Backward-weight.
// With Y = A^T [sum_c U[c] .* V[c]] A and U = G g G^T, the gradient of the kernel g of output
// channel o and input channel c is dg = G^T dU G, where dU = sum over the images and tiles of
// dM .* V[c] and dM = A dY A^T, the adjoint of the output transform, applied to the tile's 4x4
// gradient dY (zero outside the image). V is the forward's (images on the lanes). dM has the output
// channels on the lanes (16 channel rows of dy through a 16 x 16 transpose), so that the products
// are F(2x2)'s (direct::weight_products): at each position, sums[c][o] += V's value of one image
// and tile (broadcast) times dM's vector of that image and tile, over all of a chunk's images and
// tiles ("terms"). Each thread sums its units into its own float sums; the threads' sums are added
// in thread order (in float), then G^T dU G runs in double: the bits depend on the thread count
// only, as F(2x2)'s and direct::channels' weight gradients.

// Terms (16 images x tiles) per chunk: at least this many where the units are short (rows of 4 to
// 12 pixels), so that each product's accumulators sum a long run before they are added to sums.
constexpr int64_t kMinWeightTerms = 64;

// Pixels per row of the gather of dy (gather_gradient_rows: a tile row's 4 rows, 16 output
// channels per vector; two transposes per row, the second all zero where rows are 16 pixels or less).
constexpr int64_t kGradientRowPixels = 32;

struct WeightLayout {
  Geometry g;
  int64_t in, outs, chunk_units, max_terms;
  WeightLayout(const Conv2dShape& s, int threads)
      : g(s, std::max(1, threads)), in(s.in_channels), outs(round_up(s.out_channels, kLanes)),
        chunk_units(std::clamp<int64_t>((kMinWeightTerms / kLanes + g.tiles_w - 1) / g.tiles_w, 1,
                                        (g.units + std::max(1, threads) - 1) / std::max(1, threads))),
        max_terms(chunk_units * g.tiles_w * kLanes) {}
  // V[p][c][term] and dM[p][term][o], positions odd_lines apart (position_stride's reason).
  static int64_t v_stride(int64_t in, int64_t terms) { return odd_lines(in * terms); }
  static int64_t dm_stride(int64_t outs, int64_t terms) { return odd_lines(terms * outs); }
  int64_t v_floats() const { return kPositions * v_stride(in, max_terms); }
  int64_t dm_floats() const { return kPositions * dm_stride(outs, max_terms); }
  int64_t planes_floats() const { return std::max(g.plane_vectors(), 4 * kGradientRowPixels) * kLanes; }
  int64_t sums_floats() const { return kPositions * in * outs; }
  int64_t thread_floats() const { return v_floats() + dm_floats() + planes_floats() + sums_floats(); }
};

// to[k] = lane k of the first `count` rows `stride` floats apart from `from` (the lanes of `valid`):
// 16 rows of 16 floats transposed, zero past `count` rows. Each row's line `prefetch` floats
// further on is prefetched (0: none), as in gather_patch_rows.
void load_transposed(const float* from, int64_t stride, int64_t count, __mmask16 valid, int64_t prefetch,
                     __m512* to) {
  __m512 v[16];
  for (int c = 0; c < 16; ++c) v[c] = c < count ? _mm512_maskz_loadu_ps(valid, from + c * stride) : _mm512_setzero_ps();
  if (prefetch != 0)
    for (int64_t c = 0; c < count; ++c)
      _mm_prefetch(reinterpret_cast<const char*>(from + c * stride + prefetch), _MM_HINT_T0);
  direct::transpose16(v);
  for (int k = 0; k < 16; ++k) to[k] = v[k];
}

// rows[r * 32 + k] = dy at row 4 ty + r and column k of `channels` (up to 16) planes `plane` floats
// apart, the channels on the lanes: zero for the other lanes, rows past h and columns past w. The
// same lines `prefetch` floats further on (the caller's next gather; 0: none) are prefetched.
void gather_gradient_rows(const float* dy, int64_t plane, int64_t channels, int64_t h, int64_t w, int64_t ty,
                          int64_t prefetch, __m512* rows) {
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t k0 = 0; k0 < kGradientRowPixels; k0 += kLanes) {
      const int64_t row = 4 * ty + r;
      __m512* to = rows + r * kGradientRowPixels + k0;
      if (row < h)
        load_transposed(dy + row * w + k0, plane, channels, first_lanes(w - k0), k0 < w ? prefetch : 0, to);
      else
        std::fill(to, to + kLanes, _mm512_setzero_ps());
    }
}

// t = A y for four values y (a row or a column of a tile of dy), A = (A^T)^T.
inline void gradient_transform4(const __m512 (&y)[4], __m512 (&t)[6]) {
  const __m512 s02 = _mm512_add_ps(y[0], y[2]), s13 = _mm512_add_ps(y[1], y[3]);
  const __m512 even = _mm512_fmadd_ps(_mm512_set1_ps(4.0f), y[2], y[0]);                         // y0 + 4 y2
  const __m512 odd = _mm512_fmadd_ps(_mm512_set1_ps(8.0f), y[3], _mm512_add_ps(y[1], y[1]));  // 2 y1 + 8 y3
  t[0] = y[0];
  t[1] = _mm512_add_ps(s02, s13);
  t[2] = _mm512_sub_ps(s02, s13);
  t[3] = _mm512_add_ps(even, odd);
  t[4] = _mm512_sub_ps(even, odd);
  t[5] = y[3];
}

// dm[p * dm_stride] (p = 6 i + j) = (A dY A^T)[i][j] for tile tx, dY[a][b] = rows[a * 32 + 4 tx + b].
void transform_gradient_tile(const __m512* rows, int64_t tx, float* dm, int64_t dm_stride) {
  __m512 t[4][6];  // t[a][j] = (dY A^T)[a][j]
  for (int a = 0; a < 4; ++a) {
    const __m512* row = rows + a * kGradientRowPixels + 4 * tx;
    const __m512 y[4] = {row[0], row[1], row[2], row[3]};
    gradient_transform4(y, t[a]);
  }
  for (int j = 0; j < 6; ++j) {
    const __m512 column[4] = {t[0][j], t[1][j], t[2][j], t[3][j]};
    __m512 r[6];
    gradient_transform4(column, r);
    for (int i = 0; i < 6; ++i) _mm512_store_ps(dm + (6 * i + j) * dm_stride, r[i]);
  }
}

// r = G^T d for six values d (a column or a row of dU), in double.
inline void kernel_gradient_transform6(const __m512d (&d)[6], __m512d (&r)[3]) {
  const __m512d sixth = _mm512_set1_pd(1.0 / 6), twelfth = _mm512_set1_pd(1.0 / 12);
  const __m512d s12 = _mm512_add_pd(d[1], d[2]), s34 = _mm512_add_pd(d[3], d[4]);
  // d0/4 - (d1 + d2)/6 + (d3 + d4)/24
  r[0] = _mm512_fmadd_pd(_mm512_set1_pd(0.25), d[0],
                         _mm512_mul_pd(sixth, _mm512_fmadd_pd(_mm512_set1_pd(0.25), s34, _mm512_sub_pd(_mm512_setzero_pd(), s12))));
  // (d2 - d1)/6 + (d3 - d4)/12
  r[1] = _mm512_fmadd_pd(sixth, _mm512_sub_pd(d[2], d[1]), _mm512_mul_pd(twelfth, _mm512_sub_pd(d[3], d[4])));
  // (d3 + d4 - d1 - d2)/6 + d5
  r[2] = _mm512_fmadd_pd(sixth, _mm512_sub_pd(s34, s12), d[5]);
}

// dg = G^T du G for eight output channels (the lanes) of one input channel; dg[3 k + l][lane].
void kernel_gradient(const __m512d (&du)[kPositions], __m512d (&dg)[9]) {
  __m512d t[3][6];  // t[k][j] = (G^T dU)[k][j]
  for (int j = 0; j < 6; ++j) {
    const __m512d column[6] = {du[j], du[6 + j], du[12 + j], du[18 + j], du[24 + j], du[30 + j]};
    __m512d r[3];
    kernel_gradient_transform6(column, r);
    for (int k = 0; k < 3; ++k) t[k][j] = r[k];
  }
  for (int k = 0; k < 3; ++k) {
    __m512d r[3];
    kernel_gradient_transform6(t[k], r);
    for (int l = 0; l < 3; ++l) dg[3 * k + l] = r[l];
  }
}

}  // namespace

// Where it replaces F(2x2, 3x3), measured with `bench-conv-shapes --cold` (1 thread, batch 64, ms
// per call, forward / backward-data) and inside PETRA's step (`petra-train --profile`):
// 128->128 @4 1.46 / 1.45 -> 1.00 / 1.12, 64->64 @7 1.54 / 1.53 -> 0.85 / 0.87, 32->32 @14 1.35 /
// 1.37 -> 1.04 / 1.05. Rows of 28 (16->16 @28: one unit of 7 tiles per chunk) were left to F(2x2)
// from 2026-12-03 to 2026-12-04 on an Intel Xeon host, where F(4x4) was faster alone but slower in a
// step (forward 1.58 -> 1.87 ms); on the AMD Zen 5 host since, it is faster in both: alone 1.58 /
// 1.61 -> 1.16 / 1.15, in a backprop step 1.53 / 1.25 -> 1.03 / 0.87, and the steady step of
// backprop (1 and 2 threads) and PETRA (2 workers) is as fast or faster in every interleaved round
// (docs/results-cpu.md §1, "F(4x4) on rows of 28 again"). Wider rows (30, 32) were not measured and
// keep F(2x2). Outputs in multiples of 4 (the products' row blocks).
bool applies(const Conv2dShape& s) {
  return s.kernel_h == 3 && s.kernel_w == 3 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h == 1 &&
         s.pad_w == 1 && s.in_h >= 1 && s.in_w >= 1 && s.in_w <= kMaxWidth &&
         s.in_channels >= 16 && s.out_channels >= 16 && s.out_channels % 4 == 0;
}

void forward(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* w, const float* bias,
             float* y) {
  const Layout k(s, st.num_threads);
  const Scratch<float> scratch = reserve_scratch<float>(st, k.u_floats(), k.thread_floats());
  transform_weight(st, s.out_channels, k.out_rounded, s.in_channels, Taps3x3{w, s.in_channels}, scratch.shared);
  forward_transformed(st, s, k, scratch.shared, scratch, x, bias, y);
}

void backward_data(const StreamHandle& st, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  const Conv2dShape t = transposed_stride1(s);
  const Layout k(t, st.num_threads);
  const Scratch<float> scratch = reserve_scratch<float>(st, k.u_floats(), k.thread_floats());
  transform_weight(st, t.out_channels, k.out_rounded, t.in_channels, FlippedTaps3x3{w, s.in_channels},
                   scratch.shared);
  forward_transformed(st, t, k, scratch.shared, scratch, dy, nullptr, dx);
}

// The weight gradient where the forward applies. Measured against F(2x2) and the direct kernels in
// docs/results-cpu.md §1 ("F(4x4) for the weight gradient").
bool applies_weight(const Conv2dShape& s) { return applies(s); }

void backward_weight(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* dy, float* dw) {
  const WeightLayout k(s, st.num_threads);
  const Geometry& g = k.g;
  const Scratch<float> scratch = reserve_scratch<float>(st, 0, k.thread_floats());
  const int64_t in = s.in_channels, out = s.out_channels, outs = k.outs, in_image = s.x_image_stride();
  const int64_t plane = g.h * g.w, out_image = out * plane;
  const auto sums_of = [&](int t) { return scratch.of_thread(t) + k.v_floats() + k.dm_floats() + k.planes_floats(); };
  int used_threads = 1;
  run_threads(st, [&](int t, int threads) {
    if (t == 0) used_threads = threads;
    float* v = scratch.of_thread(t);
    float* dm = v + k.v_floats();
    auto* planes = reinterpret_cast<__m512*>(dm + k.dm_floats());
    float* sums = sums_of(t);
    std::fill(sums, sums + k.sums_floats(), 0.0f);
    const int64_t unit_end = share(g.units, t + 1, threads);
    for (int64_t unit0 = share(g.units, t, threads); unit0 < unit_end; unit0 += k.chunk_units) {
      const int64_t units = std::min(k.chunk_units, unit_end - unit0), terms = units * g.tiles_w * kLanes;
      const int64_t v_stride = WeightLayout::v_stride(in, terms), dm_stride = WeightLayout::dm_stride(outs, terms);
      // V[p][c][term], term = (unit * tiles_w + tx) * 16 + image: the forward's transform of x
      for (int64_t c = 0; c < in; ++c)
        for (int64_t ui = 0; ui < units; ++ui) {
          const int64_t group = (unit0 + ui) / g.tiles_h, ty = (unit0 + ui) % g.tiles_h;
          const int64_t first = group * kLanes, images = std::min<int64_t>(kLanes, s.batch - first);
          gather_patch_rows(x + first * in_image + c * plane, in_image, images, g.h, g.w, ty, g.padded_w(),
                            c + 1 < in ? plane : 0, planes);
          for (int64_t tx = 0; tx < g.tiles_w; ++tx)
            transform_tile(planes, g.padded_w(), tx, v + c * terms + (ui * g.tiles_w + tx) * kLanes, v_stride);
        }
      // dM[p][term][o]: per image of the unit and 16 output channels, the tiles' A dY A^T (zero
      // for the lanes of images past the batch, whose V is zero: 0 times what scratch held
      // could be NaN)
      for (int64_t ui = 0; ui < units; ++ui) {
        const int64_t group = (unit0 + ui) / g.tiles_h, ty = (unit0 + ui) % g.tiles_h;
        const int64_t first = group * kLanes, images = std::min<int64_t>(kLanes, s.batch - first);
        for (int64_t i = 0; i < kLanes; ++i) {
          const int64_t term0 = ui * g.tiles_w * kLanes + i;
          if (i >= images) {
            for (int p = 0; p < kPositions; ++p)
              for (int64_t tx = 0; tx < g.tiles_w; ++tx)
                direct::zero_row(outs, dm + p * dm_stride + (term0 + tx * kLanes) * outs);
            continue;
          }
          for (int64_t o0 = 0; o0 < outs; o0 += kLanes) {
            // the next gather: 16 channels further on, or the next image's first 16
            const int64_t next = o0 + kLanes < outs ? kLanes * plane : i + 1 < images ? out_image - o0 * plane : 0;
            gather_gradient_rows(dy + (first + i) * out_image + o0 * plane, plane, std::min<int64_t>(kLanes, out - o0),
                                 g.h, g.w, ty, next, planes);
            for (int64_t tx = 0; tx < g.tiles_w; ++tx)
              transform_gradient_tile(planes, tx, dm + (term0 + tx * kLanes) * outs + o0, dm_stride);
          }
        }
      }
      for (int p = 0; p < kPositions; ++p)
        direct::weight_products(in, v + p * v_stride, terms, dm + p * dm_stride, outs, terms, sums + p * in * outs);
    }
  });
  // dw[o][c] += G^T dU G, dU the threads' sums added in thread order; 8 output channels at a time
  const int64_t octets = outs / 8;
  run_threads(st, [&](int t, int threads) {
    for (int64_t e = share(in * octets, t, threads); e < share(in * octets, t + 1, threads); ++e) {
      const int64_t c = e / octets, o0 = e % octets * 8;
      __m512d du[kPositions];
      for (int p = 0; p < kPositions; ++p) {
        __m256 sum = _mm256_loadu_ps(sums_of(0) + (p * in + c) * outs + o0);
        for (int u = 1; u < used_threads; ++u)
          sum = _mm256_add_ps(sum, _mm256_loadu_ps(sums_of(u) + (p * in + c) * outs + o0));
        du[p] = _mm512_cvtps_pd(sum);
      }
      __m512d dg[9];
      kernel_gradient(du, dg);
      alignas(64) double taps[9][8];
      for (int q = 0; q < 9; ++q) _mm512_store_pd(taps[q], dg[q]);
      for (int64_t o = o0; o < std::min(out, o0 + 8); ++o)
        for (int q = 0; q < 9; ++q) {
          float& to = dw[(o * in + c) * 9 + q];
          to = static_cast<float>(to + taps[q][o - o0]);
        }
    }
  });
}

int64_t backward_weight_scratch_floats(const Conv2dShape& s, int threads) {
  return conv2d::scratch_floats(0, WeightLayout(s, threads).thread_floats(), threads);
}

int64_t scratch_floats(const Conv2dShape& s, int threads) {
  const Layout k(s, threads);
  return conv2d::scratch_floats(k.u_floats(), k.thread_floats(), threads);
}

}  // namespace petra::kernels::cpu::conv2d::winograd_f4
#endif  // PETRA_CONV_DIRECT
