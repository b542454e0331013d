// kernels/cpu/conv2d_winograd_small.cpp: Winograd's F(2x2, 3x3) (float, AVX-512) for images of
// 4x4 pixels (ResNet-18's last stage on 28x28 or 32x32 inputs), 3x3 kernel, stride 1, padding 1:
// the forward pass, backward-data (the forward of transposed_stride1, the same shape) and
// backward-weight (below `backward_weight`).
//
// The math is conv2d_winograd.cpp's (read it first): 2x2 output tiles, V = B^T d B per 4x4 input
// patch, M = U .* V summed over the input channels per position p of the 4x4 transformed tile,
// Y = A^T M A. What differs is the layout. There, the tiles of one tile row fill a vector; a 4x4
// image has two tiles to a row, so 14 of 16 lanes would idle. Here one image channel is one
// vector (its 16 pixels), and its transform is four vectors: vector i holds the positions
// (i, 0..3) of its four tiles, lane 4 * tile + j for position (i, j). Then:
//   1. V: per image channel, one load and eight permutes (the 4x4 patches of the four tiles,
//      zero outside the image), then adds and subtracts: four vectors.
//   2. M[o][image][i] = sum_c U[o][c][i] .* V[c][image][i], where U[o][c][i] is the four
//      positions (i, 0..3) of the transformed weight repeated for the four tiles: one 16-byte
//      broadcast load. The micro-kernel is the grid kernel's 4 output channels x 6 images (24
//      FMAs per 4 broadcasts and 6 loads); no weight is repeated in memory (U: 16 x out x in).
//   3. Y: S = A^T M across the four vectors, then the columns' A by two-source permutes into the
//      16 output pixels, + bias.
// Each thread takes an equal share of the images (at 2 threads and a batch of 64, 32 and 32, not
// blocks of 36 and 28: 128->128 @4 forward 0.75-0.86 -> 0.73-0.75 ms), in blocks (V of a block in
// L2); per block and panel of 4 output channels, M for the panel, then its outputs. Deterministic:
// each output is computed by one thread in the same order whatever the thread count.
#include "petra/kernels/cpu/conv2d_algorithms.hpp"

#if PETRA_CONV_DIRECT
#include <algorithm>
#include <cstdint>

#include "petra/kernels/cpu/conv2d_direct.hpp"
#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu::conv2d::winograd_small {
namespace {

using direct::kLanes;
constexpr int kChannels = 4;     // output channels per product micro-kernel
constexpr int kImageGroup = 6;   // images per product micro-kernel
constexpr int64_t kTile = 64;    // floats of one image channel's transform (4 vectors)

// Images per block: V of a block (in x images x 64 floats) near 384 KB, a multiple of the group
// (U, 1 MB at 128 channels, streams through L2 once per block).
int64_t block_images(const Conv2dShape& s) {
  const int64_t fit = (384 << 10) / (4 * kTile * s.in_channels);
  return std::clamp<int64_t>(fit / kImageGroup * kImageGroup, kImageGroup, round_up(s.batch, kImageGroup));
}

// The permutes of the transforms and their masks, built by each thread once per call.
struct Tables {
  // Input: for patch row r, R_r = A_r - or + B_r with A_r, B_r picks of the image vector, zero
  // outside the image: lane 4 * tile + j of R_r = sum_s B^T[j][s] d[r][s].
  __m512i pick_a[4], pick_b[4];
  __mmask16 inside_a[4], inside_b[4];
  __mmask16 minus_b;  // lanes (j = 0, 2, 3) where B_r is subtracted
  // Output: T_j = lane (tile, j) of S_u for the output pixel's tile and row u; Y's columns v = 0, 1.
  __m512i pick_out[4];
  __mmask16 column_one;
  // Weight gradient: lane (tile, j) of dy's pixel (2 ty + u, 2 tx + v), and the lanes by j.
  __m512i pick_dy[2][2];
  __mmask16 j_not_3, j_not_0, j_2_3;

  Tables() {
    constexpr int s_a[4] = {0, 1, 2, 1}, s_b[4] = {2, 2, 1, 3};
    alignas(64) int32_t a[16], b[16], out[4][16];
    minus_b = 0;
    column_one = 0;
    for (int r = 0; r < 4; ++r) {
      unsigned in_a = 0, in_b = 0;
      for (int lane = 0; lane < 16; ++lane) {
        const int tile = lane / 4, j = lane % 4, ty = tile / 2, tx = tile % 2;
        const int row = 2 * ty - 1 + r, col_a = 2 * tx - 1 + s_a[j], col_b = 2 * tx - 1 + s_b[j];
        const bool row_in = row >= 0 && row < 4;
        a[lane] = row_in && col_a >= 0 && col_a < 4 ? 4 * row + col_a : 0;
        b[lane] = row_in && col_b >= 0 && col_b < 4 ? 4 * row + col_b : 0;
        if (row_in && col_a >= 0 && col_a < 4) in_a |= 1u << lane;
        if (row_in && col_b >= 0 && col_b < 4) in_b |= 1u << lane;
        if (r == 0 && j != 1) minus_b |= static_cast<__mmask16>(1u << lane);
      }
      pick_a[r] = _mm512_load_si512(a);
      pick_b[r] = _mm512_load_si512(b);
      inside_a[r] = static_cast<__mmask16>(in_a);
      inside_b[r] = static_cast<__mmask16>(in_b);
    }
    for (int pixel = 0; pixel < 16; ++pixel) {
      const int y = pixel / 4, x = pixel % 4, tile = 2 * (y / 2) + x / 2, u = y % 2, v = x % 2;
      for (int j = 0; j < 4; ++j) out[j][pixel] = 16 * u + 4 * tile + j;
      if (v == 1) column_one |= static_cast<__mmask16>(1u << pixel);
    }
    for (int j = 0; j < 4; ++j) pick_out[j] = _mm512_load_si512(out[j]);
    alignas(64) int32_t dy[16];
    for (int u = 0; u < 2; ++u)
      for (int v = 0; v < 2; ++v) {
        for (int lane = 0; lane < 16; ++lane) {
          const int tile = lane / 4;
          dy[lane] = 4 * (2 * (tile / 2) + u) + 2 * (tile % 2) + v;
        }
        pick_dy[u][v] = _mm512_load_si512(dy);
      }
    j_not_3 = j_not_0 = j_2_3 = 0;
    for (int lane = 0; lane < 16; ++lane) {
      const auto bit = static_cast<__mmask16>(1u << lane);
      if (lane % 4 != 3) j_not_3 |= bit;
      if (lane % 4 != 0) j_not_0 |= bit;
      if (lane % 4 >= 2) j_2_3 |= bit;
    }
  }
};

// The four vectors of V for one image channel x (16 pixels).
inline void transform_input(const Tables& t, __m512 x, float* v) {
  __m512 rows[4];
  for (int r = 0; r < 4; ++r) {
    const __m512 a = _mm512_maskz_permutexvar_ps(t.inside_a[r], t.pick_a[r], x);
    const __m512 b = _mm512_maskz_permutexvar_ps(t.inside_b[r], t.pick_b[r], x);
    rows[r] = _mm512_mask_sub_ps(_mm512_add_ps(a, b), t.minus_b, a, b);
  }
  // B^T across the rows: R0 - R2, R1 + R2, R2 - R1, R1 - R3
  _mm512_store_ps(v, _mm512_sub_ps(rows[0], rows[2]));
  _mm512_store_ps(v + kLanes, _mm512_add_ps(rows[1], rows[2]));
  _mm512_store_ps(v + 2 * kLanes, _mm512_sub_ps(rows[2], rows[1]));
  _mm512_store_ps(v + 3 * kLanes, _mm512_sub_ps(rows[1], rows[3]));
}

// One output channel of one image (16 pixels) from its four vectors of M.
inline __m512 transform_output(const Tables& t, const float* m, float bias) {
  const __m512 m0 = _mm512_load_ps(m), m1 = _mm512_load_ps(m + kLanes), m2 = _mm512_load_ps(m + 2 * kLanes),
               m3 = _mm512_load_ps(m + 3 * kLanes);
  const __m512 s0 = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);  // A^T's rows: 1 1 1 0 and 0 1 -1 -1
  const __m512 s1 = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
  __m512 c[4];
  for (int j = 0; j < 4; ++j) c[j] = _mm512_permutex2var_ps(s0, t.pick_out[j], s1);
  // columns: v = 0 takes c0 + c1 + c2, v = 1 takes c1 - c2 - c3
  const __m512 left = _mm512_add_ps(c[1], _mm512_add_ps(c[0], c[2]));
  const __m512 y = _mm512_mask_sub_ps(left, t.column_one, c[1], _mm512_add_ps(c[2], c[3]));
  return _mm512_add_ps(y, _mm512_set1_ps(bias));
}

// m[b][i][..16] = sum_c u[c][b][..4 repeated] .* v[c][i][..16]: output channels b of a panel,
// Images images of a block, one row i of the transformed tiles.
template <int Images>
void multiply(const float* u, const float* v, int64_t v_stride, int64_t channels, float* m,
              int64_t m_stride) {
  __m512 acc[kChannels][Images];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  for (int64_t c = 0; c < channels; ++c) {
    __m512 ub[kChannels];
    for (int b = 0; b < kChannels; ++b) ub[b] = _mm512_broadcast_f32x4(_mm_load_ps(u + c * 16 + b * 4));
    for (int i = 0; i < Images; ++i) {
      const __m512 xv = _mm512_load_ps(v + c * v_stride + i * kTile);
      for (int b = 0; b < kChannels; ++b) acc[b][i] = _mm512_fmadd_ps(ub[b], xv, acc[b][i]);
    }
  }
  for (int b = 0; b < kChannels; ++b)
    for (int i = 0; i < Images; ++i) _mm512_store_ps(m + b * m_stride + i * kTile, acc[b][i]);
}

template <int Images = kImageGroup>
void multiply_group(int images, const float* u, const float* v, int64_t v_stride, int64_t channels,
                    float* m, int64_t m_stride) {
  if constexpr (Images > 1) {
    if (images < Images) {
      multiply_group<Images - 1>(images, u, v, v_stride, channels, m, m_stride);
      return;
    }
  }
  multiply<Images>(u, v, v_stride, channels, m, m_stride);
}

// u[((i * panels + o / 4) * in + c) * 16 + (o % 4) * 4 + j] = (G g G^T)[i][j] of output channel o
// and input channel c (zero for o >= out).
template <class Kernel>
void transform_weight(const StreamHandle& st, int64_t out, int64_t in, int64_t panels, Kernel&& g,
                      float* u) {
  run_threads(st, [&](int t, int threads) {
    for (int64_t o = share(panels * kChannels, t, threads); o < share(panels * kChannels, t + 1, threads); ++o)
      for (int64_t c = 0; c < in; ++c) {
        float uk[4][4];
        winograd_transform_kernel([&](int i, int j) { return o < out ? g(o, c, i, j) : 0.0f; }, uk);
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 4; ++j)
            u[((i * panels + o / kChannels) * in + c) * 16 + (o % kChannels) * 4 + j] = uk[i][j];
      }
  });
}

// Shared scratch: U. Per thread: V of a block, M of one panel of the block.
struct Layout {
  int64_t images;  // per block
  int64_t panels;  // of kChannels output channels
  int64_t in;      // input channels
  explicit Layout(const Conv2dShape& s)
      : images(block_images(s)), panels((s.out_channels + kChannels - 1) / kChannels), in(s.in_channels) {}
  int64_t u_floats() const { return 16 * panels * kChannels * in; }
  int64_t v_floats() const { return in * images * kTile; }
  int64_t m_floats() const { return kChannels * images * kTile; }
};

void forward_transformed(const StreamHandle& st, const Conv2dShape& s, const Layout& k, const float* u,
                         const Scratch<float>& scratch, const float* x, const float* bias, float* y) {
  const int64_t in = s.in_channels, out = s.out_channels, in_image = s.x_image_stride();
  run_threads(st, [&](int t, int threads) {
    float* v = scratch.of_thread(t);
    float* m = v + k.v_floats();
    const Tables tables;
    const int64_t end = share(s.batch, t + 1, threads);
    for (int64_t first = share(s.batch, t, threads); first < end; first += k.images) {
      const int64_t images = std::min(k.images, end - first);
      for (int64_t c = 0; c < in; ++c)
        for (int64_t n = 0; n < images; ++n)
          transform_input(tables, _mm512_loadu_ps(x + (first + n) * in_image + c * kLanes),
                          v + (c * k.images + n) * kTile);
      for (int64_t panel = 0; panel < k.panels; ++panel) {
        for (int64_t i = 0; i < 4; ++i)
          for (int64_t n0 = 0; n0 < images; n0 += kImageGroup)
            multiply_group(static_cast<int>(std::min<int64_t>(kImageGroup, images - n0)),
                           u + (i * k.panels + panel) * in * 16, v + n0 * kTile + i * kLanes,
                           k.images * kTile, in, m + n0 * kTile + i * kLanes, k.images * kTile);
        for (int64_t b = 0; b < kChannels && panel * kChannels + b < out; ++b) {
          const int64_t o = panel * kChannels + b;
          for (int64_t n = 0; n < images; ++n)
            _mm512_storeu_ps(y + ((first + n) * out + o) * kLanes,
                             transform_output(tables, m + (b * k.images + n) * kTile,
                                              bias != nullptr ? bias[o] : 0.0f));
        }
      }
    }
  });
}

// ---- Backward-weight. dU[i][j][o][c] = sum over images and tiles of dM[o][i][j] V[c][i][j], with
// dM = A dY A^T per tile (dy's 2x2 tile spread over 4x4), then dw[o][c] += G^T dU G. In this layout
// dM is four vectors per output channel of an image, like V, so the product is vector FMAs over
// the images of a block; at the end of a block each accumulator's four tile groups are summed
// (three shuffles and adds per four accumulators) into dU[i][o][c][j]. Each thread owns whole
// chunks of output channels, over all the images: no sum across threads, the same bits at any
// thread count. V is transformed again for each chunk (cheap: 25 instructions per image channel).

// dM's four vectors for one output channel of dy (16 pixels).
inline void transform_gradient(const Tables& t, __m512 dy, float* m) {
  __m512 columns[2];  // per dy row u: dY A^T, lanes (tile, j): d0, d0 + d1, d0 - d1, -d1
  for (int u = 0; u < 2; ++u) {
    const __m512 a = _mm512_maskz_permutexvar_ps(t.j_not_3, t.pick_dy[u][0], dy);
    const __m512 b = _mm512_maskz_permutexvar_ps(t.j_not_0, t.pick_dy[u][1], dy);
    columns[u] = _mm512_mask_sub_ps(_mm512_add_ps(a, b), t.j_2_3, a, b);
  }
  // A across the rows: C0, C0 + C1, C0 - C1, -C1
  _mm512_store_ps(m, columns[0]);
  _mm512_store_ps(m + kLanes, _mm512_add_ps(columns[0], columns[1]));
  _mm512_store_ps(m + 2 * kLanes, _mm512_sub_ps(columns[0], columns[1]));
  _mm512_store_ps(m + 3 * kLanes, _mm512_sub_ps(_mm512_setzero_ps(), columns[1]));
}

// sums[b][c][0..4) += the four tile groups of sum over `images` images of dm[b][n] .* v[c][n], for
// 4 output channels b and 4 input channels c, at one row of positions (vectors kTile apart per image).
inline void weight_tile(const float* dm, const float* v, int64_t stride, int64_t images, float* sums,
                        int64_t sums_stride) {
  __m512 acc[4][4];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  for (int64_t n = 0; n < images; ++n) {
    __m512 d[4], x[4];
    for (int b = 0; b < 4; ++b) d[b] = _mm512_load_ps(dm + b * stride + n * kTile);
    for (int c = 0; c < 4; ++c) x[c] = _mm512_load_ps(v + c * stride + n * kTile);
    for (int b = 0; b < 4; ++b)
      for (int c = 0; c < 4; ++c) acc[b][c] = _mm512_fmadd_ps(d[b], x[c], acc[b][c]);
  }
  for (int b = 0; b < 4; ++b) {
    // 128-bit groups: [c0 g0+g2, c0 g1+g3, c1 ..], then [c0, c1, c2, c3] each summed over g
    const __m512 low = _mm512_add_ps(_mm512_shuffle_f32x4(acc[b][0], acc[b][1], 0x44),
                                     _mm512_shuffle_f32x4(acc[b][0], acc[b][1], 0xEE));
    const __m512 high = _mm512_add_ps(_mm512_shuffle_f32x4(acc[b][2], acc[b][3], 0x44),
                                      _mm512_shuffle_f32x4(acc[b][2], acc[b][3], 0xEE));
    const __m512 sum = _mm512_add_ps(_mm512_shuffle_f32x4(low, high, 0x88), _mm512_shuffle_f32x4(low, high, 0xDD));
    float* to = sums + b * sums_stride;
    _mm512_storeu_ps(to, _mm512_add_ps(_mm512_loadu_ps(to), sum));
  }
}

// The weight pass's blocking: chunks of output channels (a thread's unit), blocks of images (V of
// a block near 384 KB, as the forward's), and per thread V, dM of a chunk and block, dU of a chunk.
struct WeightLayout {
  int64_t chunk, images, in;
  explicit WeightLayout(const Conv2dShape& s)
      : chunk(std::min<int64_t>(s.out_channels, 32)),
        images(std::clamp<int64_t>((384 << 10) / (4 * kTile * s.in_channels), 1, s.batch)),
        in(s.in_channels) {}
  int64_t v_floats() const { return in * images * kTile; }
  int64_t dm_floats() const { return chunk * images * kTile; }
  int64_t sums_floats() const { return 16 * chunk * in; }
  int64_t thread_floats() const { return v_floats() + dm_floats() + sums_floats(); }
};

Scratch<float> reserve(const StreamHandle& st, const Layout& k) {
  return reserve_scratch<float>(st, k.u_floats(), k.v_floats() + k.m_floats());
}

}  // namespace

// 4x4 images, 3x3 at stride 1 with padding 1, 16 channels or more in and out. RevNet18 width 16's
// 128 -> 128 @4 (`bench-conv-shapes --threads 1`, ms per call, direct::small -> this): forward
// 1.47 -> 0.88-0.99, backward-data 1.55 -> 0.88-1.00; in a training step (`petra-train --profile`)
// 1.62 -> 1.14 and 1.79 -> 1.09. Blocks of V near 192, 384 and 768 KB: 0.88, 0.88, 0.93 ms.
bool applies(const Conv2dShape& s) {
  return s.kernel_h == 3 && s.kernel_w == 3 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h == 1 &&
         s.pad_w == 1 && s.in_h == 4 && s.in_w == 4 && s.in_channels >= 16 && s.out_channels >= 16;
}

void forward(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* w,
             const float* bias, float* y) {
  const Layout k(s);
  const Scratch<float> scratch = reserve(st, k);
  transform_weight(st, s.out_channels, s.in_channels, k.panels, Taps3x3{w, s.in_channels}, scratch.shared);
  forward_transformed(st, s, k, scratch.shared, scratch, x, bias, y);
}

void backward_data(const StreamHandle& st, const Conv2dShape& s, const float* dy, const float* w,
                   float* dx) {
  const Conv2dShape t = transposed_stride1(s);
  const Layout k(t);
  const Scratch<float> scratch = reserve(st, k);
  transform_weight(st, t.out_channels, t.in_channels, k.panels, FlippedTaps3x3{w, s.in_channels}, scratch.shared);
  forward_transformed(st, t, k, scratch.shared, scratch, dy, nullptr, dx);
}

// Where the forward applies and both channel counts are multiples of 4 (the weight tile's 4 x 4).
// 128 -> 128 @4 (ms per call, direct::small's lanes kernel -> this): isolated 1.52-1.65 ->
// 1.01-1.08, in a training step (`--profile`, 1 thread) 1.78-1.82 -> 1.18-1.35.
bool applies_weight(const Conv2dShape& s) {
  return applies(s) && s.in_channels % 4 == 0 && s.out_channels % 4 == 0;
}

void backward_weight(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* dy,
                     float* dw) {
  const WeightLayout k(s);
  const Scratch<float> scratch = reserve_scratch<float>(st, 0, k.thread_floats());
  const int64_t in = s.in_channels, out = s.out_channels, in_image = s.x_image_stride();
  const int64_t chunks = (out + k.chunk - 1) / k.chunk, stride = k.images * kTile;
  run_threads(st, [&](int t, int threads) {
    float* v = scratch.of_thread(t);
    float* dm = v + k.v_floats();
    float* sums = dm + k.dm_floats();
    const Tables tables;
    for (int64_t chunk = share(chunks, t, threads); chunk < share(chunks, t + 1, threads); ++chunk) {
      const int64_t o0 = chunk * k.chunk, outs = std::min(k.chunk, out - o0);
      std::fill(sums, sums + 16 * outs * in, 0.0f);
      for (int64_t first = 0; first < s.batch; first += k.images) {
        const int64_t images = std::min(k.images, s.batch - first);
        for (int64_t c = 0; c < in; ++c)
          for (int64_t n = 0; n < images; ++n)
            transform_input(tables, _mm512_loadu_ps(x + (first + n) * in_image + c * kLanes),
                            v + c * stride + n * kTile);
        for (int64_t b = 0; b < outs; ++b)
          for (int64_t n = 0; n < images; ++n)
            transform_gradient(tables, _mm512_loadu_ps(dy + ((first + n) * out + o0 + b) * kLanes),
                               dm + b * stride + n * kTile);
        for (int64_t i = 0; i < 4; ++i)
          for (int64_t b0 = 0; b0 < outs; b0 += 4)
            for (int64_t c0 = 0; c0 < in; c0 += 4)
              weight_tile(dm + b0 * stride + i * kLanes, v + c0 * stride + i * kLanes, stride, images,
                          sums + ((i * outs + b0) * in + c0) * 4, in * 4);
      }
      for (int64_t b = 0; b < outs; ++b)
        for (int64_t c = 0; c < in; ++c) {
          double du[4][4];
          for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) du[i][j] = sums[((i * outs + b) * in + c) * 4 + j];
          add_winograd_weight_gradient(du, dw + ((o0 + b) * in + c) * 9);
        }
    }
  });
}

int64_t backward_weight_scratch_floats(const Conv2dShape& s, int threads) {
  return conv2d::scratch_floats(0, WeightLayout(s).thread_floats(), threads);
}

int64_t scratch_floats(const Conv2dShape& s, int threads) {
  const Layout k(s);
  return conv2d::scratch_floats(k.u_floats(), k.v_floats() + k.m_floats(), threads);
}

}  // namespace petra::kernels::cpu::conv2d::winograd_small
#endif  // PETRA_CONV_DIRECT
