// kernels/cpu/conv2d_winograd.cpp: the 3x3 convolution at stride 1 and padding 1 (float, AVX-512)
// by Winograd's minimal filtering F(2x2, 3x3), for the forward pass, for backward-data (which is
// the same convolution with the weight flipped and transposed: transposed_stride1) and for
// backward-weight (below `backward_weight`: the same transforms, the product's gradient).
//
// The math (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016). Cut the
// output into 2x2 tiles; each reads a 4x4 patch d of the padded input. With
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],  G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
//   A^T = [1 1 1 0; 0 1 -1 -1],
// a tile of output channel o is  Y = A^T [ sum_c (G g[o,c] G^T) .* (B^T d[c] B) ] A: for each of
// the 16 positions p of the 4x4 transformed tile, one matrix product over the input channels,
// M[p] = U[p] V[p] with U[p] (out x in) the transformed weight and V[p] (in x tiles) the
// transformed input. 16 products of in x out multiply-adds per tile of 4 outputs, where the
// direct convolution spends 4 x 9: 2.25x fewer. The transforms only add and subtract (and halve,
// exactly, in G), so the result differs from the direct sum by a few roundings, not more.
//
// The code, per block of consecutive tile rows of the batch (as many as keep V and M near half of
// L2), on one thread:
//   1. V = B^T d B, vectorised over the tiles of one tile row: the four padded input rows of the
//      tile row are two vectors each (2 * cols + 2 <= 32 floats, masked loads from x, so the
//      padding is never written anywhere); B^T's row combinations are vector adds, B's column
//      combinations pick the even and odd floats by two-source permutes. Stored as V[p][c][tile],
//      a tile row of 9 to 15 tiles on a vector of its own, of 5 to 7 on half of one (aligned
//      stores: Blocking::tile_pitch).
//   2. M[p] = U[p] V[p]: the grid kernel's register tile, 4 output channels x up to 6 vectors of
//      16 tiles, 4 broadcast weights and 6 aligned loads per 24 FMAs, the sum over c in order.
//   3. Y = A^T M A per tile row, the two outputs of a tile interleaved back into image rows by
//      permutes, + bias (odd sizes drop the last tile's extra row or column).
// U is computed once per call from w (or from w flipped, for backward-data).
//
// Deterministic: every output is the same sequence of operations whatever the thread count
// (threads take whole blocks). The weight gradient sums per thread: its bits depend on the thread
// count only. It differs from the direct kernels' bits, so a run's numbers change
// when it is chosen (Fashion-MNIST after one epoch: 89.01% against 88.90% and 89.34%, two seeds;
// docs/results-cpu.md). kernels/cpu/conv2d.cpp chooses it where `applies` says (with the
// measurements). Compiled only with AVX-512 (PETRA_CONV_DIRECT).
#include "petra/kernels/cpu/conv2d_algorithms.hpp"

#if PETRA_CONV_DIRECT
#include <algorithm>
#include <cstdint>

#include "petra/kernels/cpu/conv2d_direct.hpp"
#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu::conv2d::winograd {
namespace {

using direct::first_lanes;
using direct::kLanes;
constexpr int64_t kPositions = 16;  // the 4x4 transformed tile
constexpr int kChannels = 4;        // output channels per product micro-kernel
constexpr int kVectors = 6;         // vectors of 16 tiles per product micro-kernel

// The tiles of the batch in tile rows ("rows" below: tile row a of image n is row n * rows + a),
// and a block of consecutive rows, which one thread transforms, multiplies and transforms back
// while its V and M stay in L2: tile t of a block is column t % pitch of its row t / pitch; V and M
// keep one line of `stride` floats per (position, channel).
struct Blocking {
  int64_t rows, cols;   // tile rows and tile columns per image: ceil(out / 2)
  int64_t pitch;        // lanes per tile row in V and M (see tile_pitch)
  int64_t all_rows;     // batch * rows
  int64_t block_rows;   // tile rows per block
  int64_t stride;       // floats per line of V and M: block_rows * pitch rounded up to 16
  int64_t out_rounded;  // output channels rounded up to kChannels
  int64_t in_channels;
  int64_t v_position;   // floats from one position of V to the next: in_channels * stride, padded
  int64_t m_position;   // the same for M: out_rounded * stride, padded
  int64_t v_floats() const { return kPositions * v_position; }
  int64_t m_floats() const { return kPositions * m_position; }
  int64_t blocks() const { return (all_rows + block_rows - 1) / block_rows; }

  explicit Blocking(const Conv2dShape& s, bool packed = false)
      : rows((s.out_h() + 1) / 2),
        cols((s.out_w() + 1) / 2),
        pitch(packed ? cols : tile_pitch(cols)),
        all_rows(s.batch * rows),
        out_rounded(round_up(s.out_channels, kChannels)),
        in_channels(s.in_channels) {
    // V and M of a block near 512 KB, half of a Zen 5 core's L2 (the rest for U, the input
    // rows and the output rows): 18 tile rows of 28x28 images at 16 channels, 18 of 14x14 at
    // 32, 16 of 7x7 at 64. (256 KB measured the same; 128 KB, 1.1-1.3x slower.)
    const int64_t budget_tiles = (512 << 10) / (4 * kPositions * (in_channels + out_rounded));
    block_rows = std::clamp<int64_t>(budget_tiles / pitch, 1, all_rows);
    stride = round_up(block_rows * pitch, kLanes);
    v_position = odd_lines(in_channels * stride);
    m_position = odd_lines(out_rounded * stride);
  }
  // Lanes per tile row in V and M: rows of 9 to 15 tiles take a whole vector, rows of 5 to 7 half
  // of one (the last lanes computed from padding, never used), so that each row's stores, one per
  // position, start on a 64- or 32-byte boundary and stay inside one cache line. Packed, rows of 14
  // tiles (28x28 images) put 7 stores in 8 across two lines, each costing two stores: 16 -> 16 @28
  // forward 1.58 -> 1.37 ms, 32 -> 32 @14 1.29-1.37 -> 1.18-1.24 ms, though the padding adds 14%
  // to the products (docs/results-cpu.md §1). Others stay packed (4 tiles: no gain measured).
  static int64_t tile_pitch(int64_t cols) {
    if (cols > kLanes / 2 && cols < kLanes) return kLanes;
    if (cols > kLanes / 4 && cols < kLanes / 2) return kLanes / 2;
    return cols;
  }
  // The lanes to store of a row whose first tile is `left` tiles before the block's end: the
  // row's own where a row has its own lanes (pitch 16 / n), else the whole vector (lanes past the
  // row land on the next rows, which are stored after it).
  __mmask16 row_lanes(int64_t left) const {
    return first_lanes(kLanes % pitch == 0 ? std::min(left, pitch) : left);
  }
};

// U[p][o / 4][c][o % 4] = (G g G^T)[p] with g(o, c, i, j) the 3x3 kernel of output channel o and
// input channel c (zero for o >= out), so that the product reads the 4 weights of a channel as one
// stream, as pack_weight's panels. 4 input channels x the 4 output channels of a block make one
// vector of each position (transform_kernels_4x4, conv2d_direct.hpp).
template <class Kernel>
void transform_weight(const StreamHandle& st, int64_t out, int64_t in, int64_t out_rounded,
                      const Kernel& g, float* u) {
  const int64_t blocks = out_rounded / kChannels, groups = ceil_div(in, 4);
  run_threads(st, [&](int t, int threads) {
    for (int64_t item = share(blocks * groups, t, threads); item < share(blocks * groups, t + 1, threads); ++item) {
      const int64_t block = item / groups, c0 = item % groups * 4;
      __m512 uk[16];
      direct::transform_kernels_4x4(g, block * kChannels, out, c0, in, uk);
      const auto lanes = static_cast<__mmask16>(in - c0 >= 4 ? 0xFFFFu : (1u << (4 * (in - c0))) - 1);
      for (int p = 0; p < 16; ++p)
        direct::store_lanes(u + (p * blocks + block) * in * kChannels + c0 * kChannels, lanes, uk[p]);
    }
  });
}

// Permute indices: t[2b + k] for k = 0..3 from the two vectors of a padded row of 32 floats.
struct Picks {
  __m512i even, odd, even2, odd2;
  Picks()
      : even(_mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0)),
        odd(_mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1)),
        even2(_mm512_set_epi32(31, 30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2)),
        odd2(_mm512_set_epi32(31, 31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3)) {}
};
// Lane l of the first result is a[l / 2] for even l, b[l / 2] for odd l; the second, the same
// from lane 8 on: two rows of tile outputs back into one image row.
struct Interleave {
  __m512i low, high;
  Interleave()
      : low(_mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0)),
        high(_mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8)) {}
};

// V[p][c][first + b] for the tiles b of tile row `a` of one image channel `x` (h x w), the lanes
// of `store` (the row's tiles).
// (Inlined into its caller's loop: as a call, its eight row vectors went through the stack.)
[[gnu::always_inline]] inline void transform_input_row(const float* x, int64_t h, int64_t w, int64_t a,
                                                       const Picks& picks, float* v, int64_t position_stride,
                                                       __mmask16 store) {
  // padded rows 2a .. 2a + 3 are x rows 2a - 1 .. 2a + 2; padded column k is x column k - 1
  const __mmask16 low = static_cast<__mmask16>(first_lanes(w + 1) & 0xFFFEu), high = first_lanes(w - 15);
  __m512 lo[4], hi[4];
  for (int r = 0; r < 4; ++r) {
    const int64_t ih = 2 * a - 1 + r;
    if (ih < 0 || ih >= h) {
      lo[r] = hi[r] = _mm512_setzero_ps();
      continue;
    }
    const float* row = x + ih * w;
    lo[r] = _mm512_maskz_loadu_ps(low, row - 1);
    hi[r] = _mm512_maskz_loadu_ps(high, row + 15);
  }
  // B^T d: rows d0 - d2, d1 + d2, d2 - d1, d1 - d3
  const __m512 tlo[4] = {_mm512_sub_ps(lo[0], lo[2]), _mm512_add_ps(lo[1], lo[2]),
                         _mm512_sub_ps(lo[2], lo[1]), _mm512_sub_ps(lo[1], lo[3])};
  const __m512 thi[4] = {_mm512_sub_ps(hi[0], hi[2]), _mm512_add_ps(hi[1], hi[2]),
                         _mm512_sub_ps(hi[2], hi[1]), _mm512_sub_ps(hi[1], hi[3])};
  for (int r = 0; r < 4; ++r) {
    // (B^T d) B: columns e0 - e2, e1 + e2, e2 - e1, e1 - e3 of each tile's 4 columns
    const __m512 e0 = _mm512_permutex2var_ps(tlo[r], picks.even, thi[r]);
    const __m512 e1 = _mm512_permutex2var_ps(tlo[r], picks.odd, thi[r]);
    const __m512 e2 = _mm512_permutex2var_ps(tlo[r], picks.even2, thi[r]);
    const __m512 e3 = _mm512_permutex2var_ps(tlo[r], picks.odd2, thi[r]);
    float* to = v + r * 4 * position_stride;
    direct::store_lanes(to, store, _mm512_sub_ps(e0, e2));
    direct::store_lanes(to + position_stride, store, _mm512_add_ps(e1, e2));
    direct::store_lanes(to + 2 * position_stride, store, _mm512_sub_ps(e2, e1));
    direct::store_lanes(to + 3 * position_stride, store, _mm512_sub_ps(e1, e3));
  }
}

// m[b][v] = sum_c panel[c][b] * v[c][16 v ..]: output channels [o, o + 4) of Vectors vectors of
// tiles, at one position.
template <int Vectors>
void multiply_block(const float* panel, const float* v, int64_t v_stride, int64_t channels,
                    float* m, int64_t m_stride) {
  __m512 acc[kChannels][Vectors];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  for (int64_t c = 0; c < channels; ++c) {
    const float* w = panel + c * kChannels;
    __m512 wb[kChannels];
    for (int b = 0; b < kChannels; ++b) wb[b] = _mm512_set1_ps(w[b]);
    for (int j = 0; j < Vectors; ++j) {
      const __m512 xv = _mm512_load_ps(v + c * v_stride + j * kLanes);
      for (int b = 0; b < kChannels; ++b) acc[b][j] = _mm512_fmadd_ps(wb[b], xv, acc[b][j]);
    }
  }
  for (int b = 0; b < kChannels; ++b)
    for (int j = 0; j < Vectors; ++j) _mm512_store_ps(m + b * m_stride + j * kLanes, acc[b][j]);
}

template <int Vectors = kVectors>
void multiply_blocks(int vectors, const float* panel, const float* v, int64_t v_stride,
                     int64_t channels, float* m, int64_t m_stride) {
  if constexpr (Vectors > 1) {
    if (vectors < Vectors) {
      multiply_blocks<Vectors - 1>(vectors, panel, v, v_stride, channels, m, m_stride);
      return;
    }
  }
  multiply_block<Vectors>(panel, v, v_stride, channels, m, m_stride);
}

// Image rows 2a and 2a + 1 of one output channel (h x w, at y) from M[p][first ..] of tile row a.
void transform_output_row(const float* m, int64_t position_stride, int64_t h, int64_t w,
                          int64_t a, int64_t cols, float bias, const Interleave& il, float* y) {
  const __mmask16 tiles = first_lanes(cols);
  __m512 f[2][4];  // A^T M: rows m0 + m1 + m2 and m1 - m2 - m3, per column q
  for (int q = 0; q < 4; ++q) {
    const __m512 m0 = _mm512_maskz_loadu_ps(tiles, m + q * position_stride);
    const __m512 m1 = _mm512_maskz_loadu_ps(tiles, m + (4 + q) * position_stride);
    const __m512 m2 = _mm512_maskz_loadu_ps(tiles, m + (8 + q) * position_stride);
    const __m512 m3 = _mm512_maskz_loadu_ps(tiles, m + (12 + q) * position_stride);
    f[0][q] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
    f[1][q] = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
  }
  const __m512 b = _mm512_set1_ps(bias);
  const __mmask16 low = first_lanes(w), high = first_lanes(w - kLanes);
  for (int r = 0; r < 2 && 2 * a + r < h; ++r) {
    // (A^T M) A: columns f0 + f1 + f2 and f1 - f2 - f3; the bias last, as the direct kernels
    // start from it (the order differs anyway)
    const __m512 left = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(f[r][0], f[r][1]), f[r][2]), b);
    const __m512 right = _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(f[r][1], f[r][2]), f[r][3]), b);
    float* row = y + (2 * a + r) * w;
    const __m512 first = _mm512_permutex2var_ps(left, il.low, right);
    const __m512 second = _mm512_permutex2var_ps(left, il.high, right);
    if (r == 0 && 2 * a + 1 < h && (high != 0 ? 2 : 1) * kLanes <= 2 * w) {
      // whole vectors where what lies past the row lands on the next one, stored next
      _mm512_storeu_ps(row, first);
      if (high != 0) _mm512_storeu_ps(row + kLanes, second);
    } else {
      _mm512_mask_storeu_ps(row, low, first);
      if (high != 0) _mm512_mask_storeu_ps(row + kLanes, high, second);
    }
  }
}

// V of the tile rows [first, first + rows) of the batch, row r at lane r * pitch (Blocking::
// row_lanes says which lanes are stored). The lanes past the last tile are zeroed, so that the
// products there are finite (never read).
void transform_input_block(const Conv2dShape& s, const Blocking& k, const float* x, int64_t first,
                           int64_t rows, const Picks& picks, float* v) {
  const int64_t h = s.out_h(), w = s.out_w(), in = s.in_channels, in_image = s.x_image_stride();
  const int64_t tiles = rows * k.pitch, lanes = round_up(tiles, kLanes);
  for (int64_t c = 0; c < in; ++c)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t image = (first + r) / k.rows, a = (first + r) % k.rows;
      const float* plane = x + image * in_image + c * h * w;
      transform_input_row(plane, h, w, a, picks, v + c * k.stride + r * k.pitch, k.v_position,
                          k.row_lanes(tiles - r * k.pitch));
      if (c + 1 < in) {  // the same rows of the next channel (direct::prefetch_lines says why)
        const int64_t top = std::max<int64_t>(0, 2 * a - 1), bottom = std::min(h, 2 * a + 3);
        direct::prefetch_lines(plane + h * w + top * w, (bottom - top) * w);
      }
    }
  if (tiles < lanes)
    for (int64_t line = 0; line < kPositions * in; ++line)
      direct::zero_row(lanes - tiles, v + line / in * k.v_position + line % in * k.stride + tiles);
}

// y = conv(x, w) + bias for a 3x3 kernel at stride 1, padding 1, with U already in `u`.
void forward_transformed(const StreamHandle& st, const Conv2dShape& s, const Blocking& k,
                         const float* u, const Scratch<float>& scratch, const float* x,
                         const float* bias, float* y) {
  const int64_t h = s.out_h(), w = s.out_w(), in = s.in_channels, out = s.out_channels;
  const int64_t out_image = out * h * w;
  const int64_t blocks = k.blocks(), panels = k.out_rounded / kChannels;
  run_threads(st, [&](int t, int threads) {
    float* v = scratch.of_thread(t);
    float* m = v + k.v_floats();
    const Picks picks;
    const Interleave il;
    for (int64_t block = share(blocks, t, threads); block < share(blocks, t + 1, threads); ++block) {
      const int64_t first = block * k.block_rows, rows = std::min(k.block_rows, k.all_rows - first);
      const int64_t vectors = (rows * k.pitch + kLanes - 1) / kLanes;
      transform_input_block(s, k, x, first, rows, picks, v);
      // 2. M[p] = U[p] V[p], vector blocks of near-equal sizes up to kVectors
      const int64_t vector_blocks = (vectors + kVectors - 1) / kVectors;
      for (int64_t p = 0; p < kPositions; ++p)
        for (int64_t panel = 0; panel < panels; ++panel)
          for (int64_t vb = 0; vb < vector_blocks; ++vb) {
            const int64_t v0 = share(vectors, vb, vector_blocks), v1 = share(vectors, vb + 1, vector_blocks);
            multiply_blocks(static_cast<int>(v1 - v0), u + (p * panels + panel) * in * kChannels,
                            v + p * k.v_position + v0 * kLanes, k.stride, in,
                            m + p * k.m_position + panel * kChannels * k.stride + v0 * kLanes, k.stride);
          }
      // 3. Y
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t image = (first + r) / k.rows, a = (first + r) % k.rows;
        for (int64_t o = 0; o < out; ++o)
          transform_output_row(m + o * k.stride + r * k.pitch, k.m_position, h, w, a, k.cols,
                               bias != nullptr ? bias[o] : 0.0f, il, y + image * out_image + o * h * w);
      }
    }
  });
}

// ---- Backward-weight. With M = sum_c U[c] .* V[c] and Y = A^T M A per tile, the gradient of U
// is dU[p][o][c] = sum over tiles t of dM[p][o][t] V[p][c][t], with dM = A dY A^T (a 2x2 tile of
// dy spread over 4x4), and the kernel's gradient is dg = G^T dU G. The sum runs over all the tiles
// of the batch: done with the tiles on the lanes (as V is stored), every output would end in a
// sum across the lanes, once per block, and those reductions cost as much as the products (tried:
// 1.1-2x slower than the direct kernel). So dM is built with the output channels on the lanes,
// dM'[p][t][o], and each tile adds a rank-1 update to registers that hold dU[p][c][o..o+16]:
// broadcast V[p][c][t] (any layout serves a broadcast), times dM'[p][t][o-vector]. The registers
// go to memory once per block (hundreds of tiles), not once per 16 tiles.

// Layout of the weight pass's per-thread scratch, after V (Blocking's): dM'[p][t][o] with `outs`
// (out rounded up to 16) floats per tile, the rows of one tile row of dy with the channels on the
// lanes, and the thread's sums dU[p][c][o].
struct WeightLayout {
  int64_t outs, dm_position, sums_floats;
  static constexpr int64_t kRowFloats = 2 * 2 * kLanes * kLanes;  // 2 dy rows x 32 pixels x 16
  explicit WeightLayout(const Blocking& k)
      : outs(round_up(k.out_rounded, kLanes)),
        dm_position(odd_lines(k.stride * outs)),
        sums_floats(kPositions * k.in_channels * outs) {}
  int64_t dm_floats() const { return kPositions * dm_position; }
  int64_t thread_floats(const Blocking& k) const {
    return k.v_floats() + dm_floats() + kRowFloats + sums_floats;
  }
};

// dM'[p][first + b][o0 .. o0 + 16) of the tiles b of tile row `a` of dy's channels o0 .. o0 + 15
// (`channels` of them; an h x w image each, `plane` floats apart), through `rows` (kRowFloats).
void transform_gradient_row(const float* dy, int64_t plane, int64_t channels, int64_t h, int64_t w,
                            int64_t a, int64_t cols, float* rows, float* dm, int64_t outs,
                            int64_t position_stride) {
  // rows[r][x] = dy[o0 ..][2a + r][x] (zero past h, past w and past the channels)
  for (int r = 0; r < 2; ++r)
    for (int64_t x0 = 0; x0 < 2 * kLanes; x0 += kLanes) {
      float* to = rows + (r * 2 * kLanes + x0) * kLanes;
      __m512 v[16];
      const __mmask16 pixels = first_lanes(w - x0);
      for (int c = 0; c < 16; ++c)
        v[c] = c < channels && 2 * a + r < h && pixels != 0
                   ? _mm512_maskz_loadu_ps(pixels, dy + c * plane + (2 * a + r) * w + x0)
                   : _mm512_setzero_ps();
      if (x0 == 0)  // the rows of the next tile row, two further on (direct::prefetch_lines says why)
        for (int c = 0; c < channels; ++c) direct::prefetch_lines(dy + c * plane + (2 * a + 2 + r) * w, w);
      direct::transpose16(v);  // to 16 pixels' 16 channels
      for (int i = 0; i < 16; ++i) _mm512_store_ps(to + i * kLanes, v[i]);
    }
  for (int64_t b = 0; b < cols; ++b) {
    __m512 col[2][4];  // per dy row: dy A^T, columns d0, d0 + d1, d0 - d1, -d1
    for (int r = 0; r < 2; ++r) {
      const float* row = rows + r * 2 * kLanes * kLanes;
      const __m512 d0 = _mm512_load_ps(row + 2 * b * kLanes), d1 = _mm512_load_ps(row + (2 * b + 1) * kLanes);
      col[r][0] = d0;
      col[r][1] = _mm512_add_ps(d0, d1);
      col[r][2] = _mm512_sub_ps(d0, d1);
      col[r][3] = _mm512_sub_ps(_mm512_setzero_ps(), d1);
    }
    float* to = dm + b * outs;
    for (int q = 0; q < 4; ++q) {  // A (dy A^T): rows r0, r0 + r1, r0 - r1, -r1
      _mm512_store_ps(to + q * position_stride, col[0][q]);
      _mm512_store_ps(to + (4 + q) * position_stride, _mm512_add_ps(col[0][q], col[1][q]));
      _mm512_store_ps(to + (8 + q) * position_stride, _mm512_sub_ps(col[0][q], col[1][q]));
      _mm512_store_ps(to + (12 + q) * position_stride, _mm512_sub_ps(_mm512_setzero_ps(), col[1][q]));
    }
  }
}

Scratch<float> reserve(const StreamHandle& st, const Blocking& k) {
  return reserve_scratch<float>(st, kPositions * k.out_rounded * k.in_channels, k.v_floats() + k.m_floats());
}

}  // namespace

// Where it beats the direct kernels (bench-conv-shapes, 1 thread, RevNet18 width 16, batch 64,
// forward and backward-data; docs/results-cpu.md): 16 -> 16 @28 1.50 -> 0.97 ms, 32 -> 32 @14
// 1.49 -> 0.94 ms, 64 -> 64 @7 1.47 -> 1.10 ms; not 128 -> 128 @4 (1.43-1.64 -> 1.67 ms), whose
// U (16 x 128 x 128 floats, 1 MB) no longer stays in L2 beside V and M. So: a 3x3 kernel at stride
// 1 with padding 1 (the output as large as the input), rows of 7 to 30 pixels (at least 4 tiles to
// a row; a padded row is at most two vectors), at least 16 channels in and out (the transforms
// cost per tile and channel what the product costs per channel pair: they need channels to
// amortise), and a U of at most 256 KB (in x out <= 4096).
bool applies(const Conv2dShape& s) {
  return s.kernel_h == 3 && s.kernel_w == 3 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h == 1 &&
         s.pad_w == 1 && s.in_w >= 7 && s.in_w <= 30 && s.in_h >= 1 && s.in_channels >= 16 &&
         s.out_channels >= 16 && s.in_channels * s.out_channels <= 4096;
}

// Backward-weight where the forward applies and rows are at most 16 pixels. In a training step
// (`petra-train --profile`, 1 thread, ms per call, direct -> Winograd): 32 -> 32 @14 1.47-1.56 ->
// 1.27-1.39, 64 -> 64 @7 1.50-1.59 -> 1.33-1.41; not 16 -> 16 @28, 1.35-1.47 -> 1.65-1.69 (isolated
// it is 1.17 -> 1.11: in a step its x and dy come from memory, and the direct kernel hides that
// better). Measured again on the Zen 5 host, 2026-12-04 23:50 UTC (with a training run on the
// other core): 16 -> 16 @28 1.51-1.62 -> 1.88-2.35 ms in the step; still not.
bool applies_weight(const Conv2dShape& s) { return applies(s) && s.in_w <= 16; }

void forward(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* w,
             const float* bias, float* y) {
  const Blocking k(s);
  const Scratch<float> scratch = reserve(st, k);
  transform_weight(st, s.out_channels, s.in_channels, k.out_rounded, Taps3x3{w, s.in_channels}, scratch.shared);
  forward_transformed(st, s, k, scratch.shared, scratch, x, bias, y);
}

void backward_data(const StreamHandle& st, const Conv2dShape& s, const float* dy, const float* w,
                   float* dx) {
  const Conv2dShape t = transposed_stride1(s);
  const Blocking k(t);
  const Scratch<float> scratch = reserve(st, k);
  transform_weight(st, t.out_channels, t.in_channels, k.out_rounded, FlippedTaps3x3{w, s.in_channels}, scratch.shared);
  forward_transformed(st, t, k, scratch.shared, scratch, dy, nullptr, dx);
}

// dw += the weight gradient: each thread sums its blocks' dU (rank-1 updates per tile, see above),
// the threads' sums are added in thread order (so the bits depend on the thread count, as the
// direct weight kernels'), and dw[o][c] += G^T dU G.
void backward_weight(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* dy,
                     float* dw) {
  const Blocking k(s, /*packed=*/true);
  const WeightLayout layout(k);
  const Scratch<float> scratch = reserve_scratch<float>(st, 0, layout.thread_floats(k));
  const int64_t h = s.out_h(), w = s.out_w(), in = s.in_channels, out = s.out_channels;
  const int64_t plane = h * w, outs = layout.outs;
  auto sums_of = [&](int t) {
    return scratch.of_thread(t) + k.v_floats() + layout.dm_floats() + WeightLayout::kRowFloats;
  };
  int used_threads = 1;
  run_threads(st, [&](int t, int threads) {
    if (t == 0) used_threads = threads;
    float* v = scratch.of_thread(t);
    float* dm = v + k.v_floats();
    float* rows = dm + layout.dm_floats();
    float* sums = sums_of(t);
    std::fill(sums, sums + layout.sums_floats, 0.0f);
    const Picks picks;
    for (int64_t block = share(k.blocks(), t, threads); block < share(k.blocks(), t + 1, threads); ++block) {
      const int64_t first = block * k.block_rows, rows_here = std::min(k.block_rows, k.all_rows - first);
      const int64_t tiles = rows_here * k.cols;
      transform_input_block(s, k, x, first, rows_here, picks, v);
      for (int64_t r = 0; r < rows_here; ++r) {
        const int64_t image = (first + r) / k.rows, a = (first + r) % k.rows;
        for (int64_t o0 = 0; o0 < outs; o0 += kLanes)
          transform_gradient_row(dy + (image * out + o0) * plane, plane, std::min<int64_t>(kLanes, out - o0), h, w,
                                 a, k.cols, rows, dm + r * k.cols * outs + o0, outs, layout.dm_position);
      }
      for (int64_t p = 0; p < kPositions; ++p)
        direct::weight_products(in, v + p * k.v_position, k.stride, dm + p * layout.dm_position, outs, tiles,
                                sums + p * in * outs);
    }
  });
  // dw[o][c] += G^T dU G, dU summed over the threads in order
  run_threads(st, [&](int t, int threads) {
    for (int64_t oc = share(out * in, t, threads); oc < share(out * in, t + 1, threads); ++oc) {
      const int64_t o = oc / in, c = oc % in;
      double du[4][4];
      for (int p = 0; p < kPositions; ++p) {
        float sum = 0.0f;
        for (int u = 0; u < used_threads; ++u) sum += sums_of(u)[(p * in + c) * outs + o];
        du[p / 4][p % 4] = sum;
      }
      add_winograd_weight_gradient(du, dw + oc * 9);
    }
  });
}

int64_t backward_weight_scratch_floats(const Conv2dShape& s, int threads) {
  const Blocking k(s);
  return conv2d::scratch_floats(0, WeightLayout(k).thread_floats(k), threads);
}

int64_t scratch_floats(const Conv2dShape& s, int threads) {
  const Blocking k(s);
  return conv2d::scratch_floats(kPositions * k.out_rounded * k.in_channels, k.v_floats() + k.m_floats(), threads);
}

}  // namespace petra::kernels::cpu::conv2d::winograd
#endif  // PETRA_CONV_DIRECT
