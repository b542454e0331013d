// kernels/cpu/conv2d_direct_lanes.cpp: the direct AVX-512 forward convolution (float) with the
// output channels on the lanes, for the strided layers. kernels/cpu/conv2d.cpp chooses it where
// `applies` (below, with the measurements) says so: stride 2, at least 16 output channels.
// Compiled only with AVX-512 (PETRA_CONV_DIRECT).
//
// conv2d_direct_grid.cpp puts 16 output pixels on the lanes, so a tap must be 16 input values in a
// row of the padded image; at stride 2 those are every other value, and the grid first splits the
// input into 4 phase planes. Here a vector holds 16 output channels of one pixel instead:
//   y[n][o][p] = bias[o] + sum over input channels c and taps (i, j) of w[o][c][i][j] * xp[c][p's tap (i, j)],
// and for each (c, i, j) the 16 weights w[o..o+15][c][i][j] are one vector (the weight packed with
// o innermost) while x contributes one broadcast value per pixel, read at any stride for free. A
// block is 32 output channels by up to 7 consecutive pixels of an output row: 14 accumulators fed
// per tap by 2 weight loads and 7 broadcasts. The input of one image is copied with its zero
// border (xp: channels x padded rows x padded columns), so the taps never test a bound; the
// accumulators hold pixels across registers, and are written out to y's rows through a small
// transpose in scratch.
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
using ShortRowTile = Tile<4, 4>;

struct Padded {
  int64_t rows, columns;  // of one channel of the copied input
  explicit Padded(const Conv2dShape& s)
      : rows(std::max(s.in_h + 2 * s.pad_h, (s.out_h() - 1) * s.stride_h + s.kernel_h)),
        columns(std::max(s.in_w + 2 * s.pad_w, (s.out_w() - 1) * s.stride_w + s.kernel_w)) {}
  int64_t plane() const { return rows * columns; }
};

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
  return s.in_channels * Padded(s).plane() + s.out_h() * s.out_w() * block_count<Tile>(s) * Tile::channels;
}

// r[i][j] becomes r[j][i]: the four shuffle stages of a 16 x 16 transpose.
inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 4; ++i) {
      t[8 * h + i] = _mm512_shuffle_f32x4(r[8 * h + i], r[8 * h + 4 + i], 0x88);
      t[8 * h + 4 + i] = _mm512_shuffle_f32x4(r[8 * h + i], r[8 * h + 4 + i], 0xDD);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xDD);
  }
}

inline __mmask16 first_lanes(int64_t n) { return static_cast<__mmask16>(n >= kLanes ? 0xFFFFu : (1u << n) - 1); }

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
      for (int j = 0; j < columns; ++j) _mm512_mask_storeu_ps(y + (o0 + j) * pixels + p0, first_lanes(rows), r[j]);
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

// xp = image n of x with a zero border of pad_h rows and pad_w columns (and zeros to the right and
// below where the last window reaches past the border).
void pad_image(const Conv2dShape& s, const Padded& padded, const float* x, float* xp) {
  for (int64_t c = 0; c < s.in_channels; ++c) {
    float* plane = xp + c * padded.plane();
    zero_row(s.pad_h * padded.columns, plane);
    for (int64_t h = 0; h < s.in_h; ++h) {
      float* row = plane + (s.pad_h + h) * padded.columns;
      zero_row(s.pad_w, row);
      copy_row(x + (c * s.in_h + h) * s.in_w, s.in_w, row + s.pad_w);
      zero_row(padded.columns - s.pad_w - s.in_w, row + s.pad_w + s.in_w);
    }
    zero_row((padded.rows - s.pad_h - s.in_h) * padded.columns, plane + (s.pad_h + s.in_h) * padded.columns);
  }
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

// y[o0 + o][row][ow0 .. ow0 + Pixels) for the block's channels o < out_channels - o0.
// by_pixel[oh * out_w + ow0 + q][o0 .. o0 + Tile::channels) for q < Pixels.
template <class Tile, int Pixels, int Stride>
void block(const Conv2dShape& s, const Padded& padded, const float* xp, const float* panel,
           const float* bias, int64_t o0, int64_t oh, int64_t ow0, int64_t width, float* by_pixel) {
  constexpr int V = Tile::vectors;
  __m512 acc[V][Pixels];
  for (int v = 0; v < V; ++v) {
    const int64_t first = o0 + v * kLanes, valid = std::clamp<int64_t>(s.out_channels - first, 0, kLanes);
    const __m512 b = bias == nullptr || valid == 0
                         ? _mm512_setzero_ps()
                         : _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << valid) - 1), bias + first);
    for (int q = 0; q < Pixels; ++q) acc[v][q] = b;
  }
  const float* window = xp + oh * s.stride_h * padded.columns + ow0 * Stride;
  accumulate<V, Pixels, Stride>(s, padded.plane(), padded.columns, window, panel, acc);
  float* out = by_pixel + (oh * s.out_w() + ow0) * width + o0;
  for (int q = 0; q < Pixels; ++q)
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
  const Padded padded(s);
  const Scratch<float> scratch = reserve_scratch<float>(st, shared_floats<Tile>(s), thread_floats<Tile>(s));
  pack_panels<Tile>(st, s, w, scratch.shared);
  const int64_t blocks = block_count<Tile>(s), width = blocks * Tile::channels,
                out_image = s.out_channels * s.out_h() * s.out_w();
  run_threads(st, [&](int t, int threads) {
    float* xp = scratch.of_thread(t);
    float* by_pixel = xp + s.in_channels * padded.plane();
    for (int64_t n = share(s.batch, t, threads); n < share(s.batch, t + 1, threads); ++n) {
      pad_image(s, padded, x + n * s.x_image_stride(), xp);
      for (int64_t b = 0; b < blocks; ++b)
        for (int64_t oh = 0; oh < s.out_h(); ++oh)
          row_blocks<Tile, Stride>(s.out_w(), s, padded, xp, scratch.shared + b * taps(s) * Tile::channels, bias,
                                   b * Tile::channels, oh, 0, width, by_pixel);
      to_planes(by_pixel, s.out_h() * s.out_w(), width, s.out_channels, y + n * out_image);
    }
  });
}

bool short_rows(const Conv2dShape& s) { return s.out_w() <= 4 && s.out_channels >= 64; }

}  // namespace

bool applies(const Conv2dShape& s, Pass pass) {
  return pass == Pass::forward && s.stride_h == 2 && s.stride_w == 2 && s.kernel_h * s.kernel_w > 1 &&
         s.pad_h >= 0 && s.pad_w >= 0 && s.out_h() > 0 && s.out_w() > 0 && s.out_channels >= kLanes;
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
