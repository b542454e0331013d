// kernels/cpu/conv2d_direct_lanes.cpp: direct AVX-512 convolutions (float) of the strided layers
// with channels on the lanes: the forward (output channels on the lanes) and the backward-data
// (input channels on the lanes, `data` below). kernels/cpu/conv2d.cpp chooses them where
// `applies` and `applies_backward_data` (below, with the measurements) say so: stride 2, kernels
// larger than 1x1, at least 16 output channels (forward), at least 32 input channels and rows of
// 14 or more, or 16 to 31 input channels and rows of 28 or more (backward-data). Compiled only with AVX-512 (PETRA_CONV_DIRECT).
//
// conv2d_direct_grid.cpp puts 16 output pixels on the lanes, so a tap must be 16 input values in a
// row of the padded image; at stride 2 those are every other value, and the grid first splits the
// input into 4 phase planes. Here a vector holds 16 output channels of one pixel instead:
//   y[n][o][p] = bias[o] + sum over input channels c and taps (i, j) of w[o][c][i][j] * xp[c][p's tap (i, j)],
// and for each (c, i, j) the 16 weights w[o..o+15][c][i][j] are one vector (the weight packed with
// o innermost) while x contributes one broadcast value per pixel, read at any stride for free. A
// block is 32 output channels by up to 7 consecutive pixels of an output row: 14 accumulators fed
// per tap by 2 weight loads and 7 broadcasts. The input of one image is copied with its zero
// border (xp: channels x padded rows x padded columns), so the taps never test a bound. The
// accumulators hold one pixel's channels each: they are stored pixel by pixel into a buffer of the
// image (by_pixel), which is transposed into y's planes 16 x 16 at a time in registers.
#include "petra/kernels/cpu/conv2d_algorithms.hpp"

#if PETRA_CONV_DIRECT
#include <algorithm>
#include <cstdint>

#include "petra/kernels/cpu/conv2d_direct.hpp"
#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu::conv2d::direct::lanes {
namespace {

// A block's register tile: Vectors x 16 output channels by up to Pixels pixels of a row. 2 x 7 on
// rows of 7 pixels or more; 4 x 4 on rows of 4 (a 7x7 input at stride 2), where 2 x 4 would
// load 2 weights and 4 values per 8 FMAs.
template <int V, int P>
struct Tile {
  static constexpr int vectors = V, pixels = P;
  static constexpr int64_t channels = V * kLanes;
};
using RowTile = Tile<2, 7>;
constexpr int64_t kPixelsPerRow = RowTile::pixels;
using ShortRowTile = Tile<4, 4>;
// Backward-data with 16 input channels (one vector): 14 pixels of a row parity (a row of 28) per
// block, so that each weight vector loaded serves 14 FMAs, whose broadcast dy values are the FMAs'
// memory operands.
using NarrowRowTile = Tile<1, 14>;

// The copy of a stack of planes with a border of zeros: plane (h, w) goes to (top + h, left + w) of
// a rows x columns plane. The forward's input: the convolution's padding, and zeros further right
// and below where the last window reaches past it; the backward-data's dy: a border wide enough
// for any tap's shift.
struct Padded {
  int64_t rows, columns, top, left;
  int64_t plane() const { return rows * columns; }
};

Padded padded_input(const Conv2dShape& s) {
  return {std::max(s.in_h + 2 * s.pad_h, (s.out_h() - 1) * s.stride_h + s.kernel_h),
          std::max(s.in_w + 2 * s.pad_w, (s.out_w() - 1) * s.stride_w + s.kernel_w), s.pad_h, s.pad_w};
}

// to = `count` planes of height x width from `from` (packed), each copied into `padded`'s frame.
void pad_planes(int64_t count, int64_t height, int64_t width, const Padded& padded, const float* from, float* to) {
  const int64_t below = padded.rows - padded.top - height, right = padded.columns - padded.left - width;
  for (int64_t c = 0; c < count; ++c) {
    float* plane = to + c * padded.plane();
    zero_row(padded.top * padded.columns, plane);
    for (int64_t h = 0; h < height; ++h) {
      float* row = plane + (padded.top + h) * padded.columns;
      zero_row(padded.left, row);
      copy_row(from + (c * height + h) * width, width, row + padded.left);
      zero_row(right, row + padded.left + width);
    }
    zero_row(below * padded.columns, plane + (padded.top + height) * padded.columns);
  }
}

template <class Tile>
int64_t block_count(const Conv2dShape& s) { return (s.out_channels + Tile::channels - 1) / Tile::channels; }
int64_t taps(const Conv2dShape& s) { return s.in_channels * s.kernel_h * s.kernel_w; }

// Shared: the weight as panels[block][c][i][j][Tile::channels] (output channel innermost, zero
// beyond out_channels). Per thread: one image's padded copy, and its output pixel by pixel
// (channels innermost, in whole blocks).
template <class Tile>
int64_t shared_floats(const Conv2dShape& s) { return block_count<Tile>(s) * taps(s) * Tile::channels; }
template <class Tile>
int64_t thread_floats(const Conv2dShape& s) {
  return s.in_channels * padded_input(s).plane() + s.out_h() * s.out_w() * block_count<Tile>(s) * Tile::channels;
}

// y[o][p] = by_pixel[p][o] for p < pixels, o < channels (by_pixel's rows are `width` floats):
// 16 x 16 tiles, the partial ones through masks.
void to_planes(const float* by_pixel, int64_t pixels, int64_t width, int64_t channels, float* y) {
  for (int64_t p0 = 0; p0 < pixels; p0 += kLanes) {
    const int64_t rows = std::min<int64_t>(kLanes, pixels - p0);
    for (int64_t o0 = 0; o0 < channels; o0 += kLanes) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = i < rows ? _mm512_loadu_ps(by_pixel + (p0 + i) * width + o0) : _mm512_setzero_ps();
      transpose16(r);
      const int64_t columns = std::min<int64_t>(kLanes, channels - o0);
      for (int j = 0; j < columns; ++j) store_lanes(y + (o0 + j) * pixels + p0, first_lanes(rows), r[j]);
    }
  }
}

template <class Tile>
void pack_panels(const StreamHandle& st, const Conv2dShape& s, const float* w, float* panels) {
  const int64_t k = taps(s), blocks = block_count<Tile>(s);
  run_threads(st, [&](int t, int threads) {
    for (int64_t b = share(blocks, t, threads); b < share(blocks, t + 1, threads); ++b)
      for (int64_t tap = 0; tap < k; ++tap)
        for (int64_t lane = 0; lane < Tile::channels; ++lane) {
          const int64_t o = b * Tile::channels + lane;
          panels[(b * k + tap) * Tile::channels + lane] = o < s.out_channels ? w[o * k + tap] : 0.0f;
        }
  });
}

// acc[v][q] += sum over the taps of panel[tap][16v..16v + 15] * the tap's value for pixel q, where
// `window` is tap (0, 0) of pixel 0 and pixel q's window starts `Stride` * q columns further.
template <int V, int Pixels, int Stride>
inline void accumulate(const Conv2dShape& s, int64_t plane, int64_t columns, const float* window,
                       const float* panel, __m512 (&acc)[V][Pixels]) {
  for (int64_t c = 0; c < s.in_channels; ++c)
    for (int64_t i = 0; i < s.kernel_h; ++i) {
      const float* row = window + c * plane + i * columns;
      for (int64_t j = 0; j < s.kernel_w; ++j, panel += V * kLanes) {
        __m512 wv[V];
        for (int v = 0; v < V; ++v) wv[v] = _mm512_loadu_ps(panel + v * kLanes);
        for (int q = 0; q < Pixels; ++q) {
          const __m512 xb = _mm512_set1_ps(row[j + q * Stride]);
          for (int v = 0; v < V; ++v) acc[v][q] = _mm512_fmadd_ps(wv[v], xb, acc[v][q]);
        }
      }
    }
}

// by_pixel[oh * out_w + ow0 + q][o0 .. o0 + Tile::channels) = the block's outputs, for q < Pixels
// (the channels beyond out_channels hold zero weights: to_planes drops them).
template <class Tile, int Pixels, int Stride>
void block(const Conv2dShape& s, const Padded& padded, const float* xp, const float* panel,
           const float* bias, int64_t o0, int64_t oh, int64_t ow0, int64_t width, float* by_pixel) {
  constexpr int V = Tile::vectors;
  __m512 acc[V][Pixels];  // the loops over it unrolled: constant indices keep it in registers
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) {
    const int64_t first = o0 + v * kLanes, valid = std::clamp<int64_t>(s.out_channels - first, 0, kLanes);
    const __m512 b = bias == nullptr || valid == 0
                         ? _mm512_setzero_ps()
                         : _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << valid) - 1), bias + first);
#pragma GCC unroll 16
    for (int q = 0; q < Pixels; ++q) acc[v][q] = b;
  }
  const float* window = xp + oh * s.stride_h * padded.columns + ow0 * Stride;
  accumulate<V, Pixels, Stride>(s, padded.plane(), padded.columns, window, panel, acc);
  float* out = by_pixel + (oh * s.out_w() + ow0) * width + o0;
#pragma GCC unroll 16
  for (int q = 0; q < Pixels; ++q)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(out + q * width + v * kLanes, acc[v][q]);
}

// The blocks of output row oh from column ow0 on: Pixels at a time, the rest by a narrower block.
template <class Tile, int Stride, int Pixels = Tile::pixels>
void row_blocks(int64_t left, const Conv2dShape& s, const Padded& padded, const float* xp, const float* panel,
                const float* bias, int64_t o0, int64_t oh, int64_t ow0, int64_t width, float* by_pixel) {
  for (; left >= Pixels; left -= Pixels, ow0 += Pixels)
    block<Tile, Pixels, Stride>(s, padded, xp, panel, bias, o0, oh, ow0, width, by_pixel);
  if constexpr (Pixels > 1) {
    if (left > 0)
      row_blocks<Tile, Stride, Pixels - 1>(left, s, padded, xp, panel, bias, o0, oh, ow0, width, by_pixel);
  }
}

template <class Tile, int Stride>
void forward_with(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* w,
                  const float* bias, float* y) {
  const Padded padded = padded_input(s);
  const Scratch<float> scratch = reserve_scratch<float>(st, shared_floats<Tile>(s), thread_floats<Tile>(s));
  pack_panels<Tile>(st, s, w, scratch.shared);
  const int64_t blocks = block_count<Tile>(s), width = blocks * Tile::channels,
                out_image = s.out_channels * s.out_h() * s.out_w();
  run_threads(st, [&](int t, int threads) {
    float* xp = scratch.of_thread(t);
    float* by_pixel = xp + s.in_channels * padded.plane();
    const int64_t end = share(s.batch, t + 1, threads), in_floats = s.in_channels * s.in_h * s.in_w;
    const int64_t steps = blocks * s.out_h();
    for (int64_t n = share(s.batch, t, threads); n < end; ++n) {
      pad_planes(s.in_channels, s.in_h, s.in_w, padded, x + n * s.x_image_stride(), xp);
      for (int64_t b = 0; b < blocks; ++b)
        for (int64_t oh = 0; oh < s.out_h(); ++oh) {
          row_blocks<Tile, Stride>(s.out_w(), s, padded, xp, scratch.shared + b * taps(s) * Tile::channels, bias,
                                   b * Tile::channels, oh, 0, width, by_pixel);
          if (n + 1 < end) {  // the next image, a share per step (direct::prefetch_part says why)
            prefetch_part(x + (n + 1) * s.x_image_stride(), in_floats, b * s.out_h() + oh, steps, false);
            prefetch_part(y + (n + 1) * out_image, out_image, b * s.out_h() + oh, steps, true);
          }
        }
      to_planes(by_pixel, s.out_h() * s.out_w(), width, s.out_channels, y + n * out_image);
    }
  });
}

bool short_rows(const Conv2dShape& s) { return s.out_w() <= 4 && s.out_channels >= 64; }

// ---- Backward-data at stride 2, the input channels on the lanes.
// dx[c][ih][iw] = sum over o and the taps (i, j) with ih = 2 oh - pad_h + i, iw = 2 ow - pad_w + j
// of w[o][c][i][j] * dy[o][oh][ow]. A pixel of dx gets the taps i of the parity of ih + pad_h and
// j of the parity of iw + pad_w (1 to 4 of a 3x3 kernel), so a block takes up to Tile::pixels
// pixels of one row of dx with the same column parity (iw = b, b + 2, ...): they share their taps,
// and tap j of pixel t reads dy at column t + (b + pad_w - j) / 2, consecutive columns. dy is
// copied per image with a border of zeros wide enough for every tap (dyp), the weight is packed
// with the input channel innermost, and the outputs go to planes through by_pixel as in the forward.
namespace data {

// dyp[o][oh + top][ow + left] = dy[o][oh][ow], with room for every tap's shift.
Padded padded_dy(const Conv2dShape& s) {
  return {s.out_h() + 2 * s.kernel_h + 2, s.out_w() + 2 * s.kernel_w + 2, s.kernel_h + 1, s.kernel_w + 1};
}

template <class Tile>
int64_t block_count(const Conv2dShape& s) { return (s.in_channels + Tile::channels - 1) / Tile::channels; }
int64_t taps(const Conv2dShape& s) { return s.out_channels * s.kernel_h * s.kernel_w; }

template <class Tile>
int64_t shared_floats(const Conv2dShape& s) { return block_count<Tile>(s) * taps(s) * Tile::channels; }
template <class Tile>
int64_t thread_floats(const Conv2dShape& s) {
  return s.out_channels * padded_dy(s).plane() + s.in_h * s.in_w * block_count<Tile>(s) * Tile::channels;
}

// panels[block][o][i][j][lane] = w[o][block * Tile::channels + lane][i][j] (zero beyond in_channels).
template <class Tile>
void pack_panels(const StreamHandle& st, const Conv2dShape& s, const float* w, float* panels) {
  const int64_t blocks = block_count<Tile>(s), kernel = s.kernel_h * s.kernel_w;
  run_threads(st, [&](int t, int threads) {
    for (int64_t b = share(blocks, t, threads); b < share(blocks, t + 1, threads); ++b)
      for (int64_t o = 0; o < s.out_channels; ++o)
        for (int64_t k = 0; k < kernel; ++k)
          for (int64_t lane = 0; lane < Tile::channels; ++lane) {
            const int64_t c = b * Tile::channels + lane;
            panels[((b * s.out_channels + o) * kernel + k) * Tile::channels + lane] =
                c < s.in_channels ? w[(o * s.in_channels + c) * kernel + k] : 0.0f;
          }
  });
}

// The taps of one parity: up to 2 of a 3x3 kernel at stride 2 (kernels up to 8 wide).
struct Taps {
  int count = 0;
  int64_t index[4] = {};   // i (or j)
  int64_t shift[4] = {};   // (parity + pad - i) / 2: the dy row (column) offset
};
Taps taps_of(int64_t parity, int64_t pad, int64_t kernel) {
  Taps t;
  for (int64_t i = (parity + pad) % 2; i < kernel; i += 2) {
    t.index[t.count] = i;
    t.shift[t.count] = (parity + pad - i) / 2;
    ++t.count;
  }
  return t;
}

// by_pixel[ih * in_w + b + 2 (t0 + q)][c0 ..] for q < Pixels: the block's sums over o and the taps.
template <class Tile, int Pixels>
void block(const Conv2dShape& s, const Padded& padded, const float* dyp, const float* panel, const Taps& rows,
           const Taps& columns, int64_t oh0, int64_t t0, float* out, int64_t width) {
  constexpr int V = Tile::vectors;
  __m512 acc[V][Pixels];  // the loops over it unrolled, as in the forward's block
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v)
#pragma GCC unroll 16
    for (int q = 0; q < Pixels; ++q) acc[v][q] = _mm512_setzero_ps();
  const int64_t weight_step = s.kernel_h * s.kernel_w * Tile::channels, plane = padded.plane();
  for (int a = 0; a < rows.count; ++a)
    for (int b = 0; b < columns.count; ++b) {
      // tap (i, j) = (rows.index[a], columns.index[b]) of every output channel o, o innermost
      const float* w = panel + (rows.index[a] * s.kernel_w + columns.index[b]) * Tile::channels;
      const float* x =
          dyp + (padded.top + oh0 + rows.shift[a]) * padded.columns + padded.left + t0 + columns.shift[b];
      for (int64_t o = 0; o < s.out_channels; ++o, w += weight_step, x += plane) {
        __m512 wv[V];
        for (int v = 0; v < V; ++v) wv[v] = _mm512_loadu_ps(w + v * kLanes);
        for (int q = 0; q < Pixels; ++q) {
          const __m512 xb = _mm512_set1_ps(x[q]);
          for (int v = 0; v < V; ++v) acc[v][q] = _mm512_fmadd_ps(wv[v], xb, acc[v][q]);
        }
      }
    }
#pragma GCC unroll 16
  for (int q = 0; q < Pixels; ++q)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(out + 2 * q * width + v * kLanes, acc[v][q]);
}

template <class Tile, int Pixels = Tile::pixels>
void parity_blocks(int64_t left, const Conv2dShape& s, const Padded& padded, const float* dyp, const float* panel,
                   const Taps& rows, const Taps& columns, int64_t oh0, int64_t t0, float* out, int64_t width) {
  for (; left >= Pixels; left -= Pixels, t0 += Pixels, out += 2 * Pixels * width)
    block<Tile, Pixels>(s, padded, dyp, panel, rows, columns, oh0, t0, out, width);
  if constexpr (Pixels > 1) {
    if (left > 0) parity_blocks<Tile, Pixels - 1>(left, s, padded, dyp, panel, rows, columns, oh0, t0, out, width);
  }
}

template <class Tile>
void backward_data_with(const StreamHandle& st, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  const Padded padded = padded_dy(s);
  const Scratch<float> scratch = reserve_scratch<float>(st, shared_floats<Tile>(s), thread_floats<Tile>(s));
  pack_panels<Tile>(st, s, w, scratch.shared);
  const int64_t blocks = block_count<Tile>(s), width = blocks * Tile::channels, pixels = s.in_h * s.in_w;
  const Taps column_taps[2] = {taps_of(0, s.pad_w, s.kernel_w), taps_of(1, s.pad_w, s.kernel_w)};
  run_threads(st, [&](int t, int threads) {
    float* dyp = scratch.of_thread(t);
    float* by_pixel = dyp + s.out_channels * padded.plane();
    const int64_t end = share(s.batch, t + 1, threads), dy_floats = s.out_channels * s.out_h() * s.out_w();
    const int64_t dx_floats = s.in_channels * pixels, steps = blocks * s.in_h;
    for (int64_t n = share(s.batch, t, threads); n < end; ++n) {
      pad_planes(s.out_channels, s.out_h(), s.out_w(), padded, dy + n * dy_floats, dyp);
      for (int64_t cb = 0; cb < blocks; ++cb) {
        const float* panel = scratch.shared + cb * taps(s) * Tile::channels;
        for (int64_t ih = 0; ih < s.in_h; ++ih) {
          if (n + 1 < end) {  // the next image, as the forward's
            prefetch_part(dy + (n + 1) * dy_floats, dy_floats, cb * s.in_h + ih, steps, false);
            prefetch_part(dx + (n + 1) * dx_floats, dx_floats, cb * s.in_h + ih, steps, true);
          }
          const Taps rows = taps_of(ih % 2, s.pad_h, s.kernel_h);
          const int64_t oh0 = (ih - ih % 2) / 2;  // dy row = oh0 + rows.shift[a]
          for (int64_t b = 0; b < 2 && b < s.in_w; ++b)
            parity_blocks<Tile>((s.in_w - b + 1) / 2, s, padded, dyp, panel, rows, column_taps[b], oh0, 0,
                                by_pixel + (ih * s.in_w + b) * width + cb * Tile::channels, width);
        }
      }
      to_planes(by_pixel, pixels, width, s.in_channels, dx + n * s.in_channels * pixels);
    }
  });
}

}  // namespace data

}  // namespace

// Measured against the grid of phase planes (rows of 7 and more) and im2col (rows of 4),
// bench-conv-shapes, batch 64, 1 thread, 2026-12-02: 16->32 @28 1.20-1.28 -> 0.84-0.88 ms, 32->64
// @14 1.10-1.18 -> 0.77-0.80, 64->128 @7 1.26-1.30 -> 0.97-1.02; on 2 threads 0.61 -> 0.53, 0.57
// -> 0.51, 0.65 -> 0.65. 1x1 kernels stay with im2col (0.23 -> 0.25-0.31 ms: the padded copy of
// the whole image costs more than the few products).
bool applies(const Conv2dShape& s, Pass pass) {
  return pass == Pass::forward && s.stride_h == 2 && s.stride_w == 2 && s.kernel_h * s.kernel_w > 1 &&
         s.pad_h >= 0 && s.pad_w >= 0 && s.out_h() > 0 && s.out_w() > 0 && s.out_channels >= kLanes;
}

// Measured against col2im (bench-conv-shapes, batch 64, 2026-12-02): 32->64 @14 1.27-1.36 ->
// 0.95-0.96 ms on 1 thread, 0.68 -> 0.69 on 2; on rows of 7 (64->128 @7, a 4 x 4 tile of 64
// channels) 1.28-1.29 -> 1.15-1.22 on 1 thread but 0.70 -> 0.80 on 2, so rows shorter than 14
// stay with col2im. 16 to 31 input channels take one vector per block and 14 pixels (rows of 28
// or more): 16->32 @28 2.24 -> 1.01 ms on 1 thread, 1.17 -> 0.67 on 2 (2026-12-02 18:20, a
// slower window than the others: col2im had measured 1.64 ms there before).
namespace {
// 16 to 31 input channels: one vector of them per block (NarrowRowTile).
bool narrow(const Conv2dShape& s) { return s.in_channels < 2 * kLanes; }
}  // namespace

bool applies_backward_data(const Conv2dShape& s) {
  const bool wide_enough = narrow(s) ? s.in_channels >= kLanes && s.in_w >= 2 * NarrowRowTile::pixels
                                     : s.in_w >= 2 * kPixelsPerRow;
  return s.stride_h == 2 && s.stride_w == 2 && s.kernel_h * s.kernel_w > 1 && s.kernel_h <= 8 && s.kernel_w <= 8 &&
         s.pad_h >= 0 && s.pad_w >= 0 && s.out_h() > 0 && s.out_w() > 0 && wide_enough;
}

void backward_data(const StreamHandle& st, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  if (narrow(s)) data::backward_data_with<NarrowRowTile>(st, s, dy, w, dx);
  else data::backward_data_with<RowTile>(st, s, dy, w, dx);
}

int64_t backward_data_scratch_floats(const Conv2dShape& s, int threads) {
  return narrow(s) ? scratch_floats(data::shared_floats<NarrowRowTile>(s), data::thread_floats<NarrowRowTile>(s), threads)
                   : scratch_floats(data::shared_floats<RowTile>(s), data::thread_floats<RowTile>(s), threads);
}

void forward(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* w, const float* bias,
             float* y) {
  if (short_rows(s)) forward_with<ShortRowTile, 2>(st, s, x, w, bias, y);
  else forward_with<RowTile, 2>(st, s, x, w, bias, y);
}

int64_t forward_scratch_floats(const Conv2dShape& s, int threads) {
  return short_rows(s) ? scratch_floats(shared_floats<ShortRowTile>(s), thread_floats<ShortRowTile>(s), threads)
                       : scratch_floats(shared_floats<RowTile>(s), thread_floats<RowTile>(s), threads);
}

}  // namespace petra::kernels::cpu::conv2d::direct::lanes
#endif  // PETRA_CONV_DIRECT
