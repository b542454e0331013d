// kernels/cpu/conv2d_direct.hpp: what the direct AVX-512 convolutions (kernels/cpu/conv2d_direct_*.cpp)
// and Winograd's (conv2d_winograd.cpp) share: the micro-kernels' block sizes, short row copies, a
// 16 x 16 transpose, the reduction of 16-lane partial sums, and the weight packed in panels of 4
// output channels. Internal, not installed; include it only where PETRA_CONV_DIRECT is 1 (AVX-512
// compiled in).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "petra/kernels/cpu/conv2d_algorithms.hpp"
#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu::conv2d::direct {
// Internal linkage, as when both algorithms lived in one file: each includer gets its own copy,
// and the compiler inlines these helpers (add_lane_sums into the micro-kernels, which keeps their
// accumulators in registers) as it did there.
namespace {

using std::int64_t;

constexpr int64_t kLanes = 16;
constexpr int kChannelBlock = 4;  // output channels per micro-kernel (rows of broadcast weights)
constexpr int kTapBlock = 6;      // taps per backward-weight micro-kernel (4 x 6 accumulators)

// to[0, n) = from[0, n) and to[0, n) = 0, inline: the rows are short, and a call to memmove or
// memset costs more than them.
inline void copy_row(const float* from, int64_t n, float* to) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) _mm512_storeu_ps(to + i, _mm512_loadu_ps(from + i));
  if (i < n) {
    const auto tail = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(to + i, tail, _mm512_maskz_loadu_ps(tail, from + i));
  }
}
inline void zero_row(int64_t n, float* to) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) _mm512_storeu_ps(to + i, _mm512_setzero_ps());
  if (i < n)
    _mm512_mask_storeu_ps(to + i, static_cast<__mmask16>((1u << (n - i)) - 1), _mm512_setzero_ps());
}

// Prefetches into L1 the lines of floats [from, from + n). For the kernels that read a few short
// rows from each of many planes (a plane per channel or per image): the hardware prefetcher
// follows long runs, not these, and a kernel whose input comes from DRAM (as in a training step)
// waits on each line unless the next rows are asked for while the current ones are used.
inline void prefetch_lines(const float* from, int64_t n) {
  const auto first = reinterpret_cast<std::uintptr_t>(from) & ~std::uintptr_t(63);
  const auto last = reinterpret_cast<std::uintptr_t>(from + n - 1);
  for (std::uintptr_t line = first; line <= last; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
}

// Part `part` of `parts` of the lines of [from, from + n), prefetched: for reading into L2
// (`prefetcht1`), or for writing (`prefetchw`: without it a store to a line not in the cache first
// waits for the line). The kernels
// that take one image at a time call it once per step of an image's work, with the next image's
// input and output: when those come from DRAM, a few lines per step are fetched while the
// products run instead of all of them at the image's start.
inline void prefetch_part(const float* from, int64_t n, int64_t part, int64_t parts, bool write) {
  const int64_t lines = (n + kLanes - 1) / kLanes;
  for (int64_t line = lines * part / parts; line < lines * (part + 1) / parts; ++line) {
    if (write)
      _m_prefetchw(const_cast<float*>(from + line * kLanes));
    else
      _mm_prefetch(reinterpret_cast<const char*>(from + line * kLanes), _MM_HINT_T1);
  }
}

// The mask of the first n lanes (none for n <= 0, all for n >= 16).
inline __mmask16 first_lanes(int64_t n) {
  return static_cast<__mmask16>(n >= kLanes ? 0xFFFFu : (1u << std::max<int64_t>(n, 0)) - 1u);
}

// Stores the lanes of `mask`; a whole vector by a plain store: on this CPU (Zen 5) a masked store
// costs more even with all 16 lanes set (Winograd's input transform of a tile row of 28 pixels:
// 18.7 ns with masked stores, 13.7 with plain ones; docs/results-cpu.md §1).
inline void store_lanes(float* to, __mmask16 mask, __m512 values) {
  if (mask == 0xFFFF)
    _mm512_storeu_ps(to, values);
  else
    _mm512_mask_storeu_ps(to, mask, values);
}

// to[t] = from[2t] for t in [0, n): the even floats of from[0, 2n - 1), de-interleaved 16 at a time
// by two loads and a permute (a stride-2 convolution's phase planes). The tail's loads are masked,
// so nothing beyond from[2n - 2] is read.
inline void copy_even(const float* from, int64_t n, float* to) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  int64_t t = 0;
  for (; t + kLanes < n; t += kLanes)  // reads up to from[2t + 31] < from[2n - 2]
    _mm512_storeu_ps(to + t, _mm512_permutex2var_ps(_mm512_loadu_ps(from + 2 * t), even,
                                                    _mm512_loadu_ps(from + 2 * t + kLanes)));
  if (t == n) return;
  const int64_t left = n - t, floats = 2 * left - 1;  // 1 to 16 values from 1 to 31 floats
  const auto low = static_cast<__mmask16>(floats >= kLanes ? 0xFFFFu : (1u << floats) - 1);
  const auto high = static_cast<__mmask16>(floats > kLanes ? (1u << (floats - kLanes)) - 1 : 0u);
  const __m512 values = _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(low, from + 2 * t), even,
                                               _mm512_maskz_loadu_ps(high, from + 2 * t + kLanes));
  store_lanes(to + t, static_cast<__mmask16>(left >= kLanes ? 0xFFFFu : (1u << left) - 1), values);
}

// to[0, 16) += the 16 lanes of `sums`, in double: the float partial sums of a weight gradient added
// to its double sums. (The zero-masking forms with every lane set are the plain instructions; GCC
// 12 warns, in some callers, about the undefined source of the unmasked intrinsics.)
inline void add_to_doubles(__m512 sums, double* to) {
  const __m512d low = _mm512_maskz_cvtps_pd(0xFF, _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, _mm512_castps_pd(sums), 0)));
  const __m512d high = _mm512_maskz_cvtps_pd(0xFF, _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, _mm512_castps_pd(sums), 1)));
  _mm512_storeu_pd(to, _mm512_add_pd(_mm512_loadu_pd(to), low));
  _mm512_storeu_pd(to + 8, _mm512_add_pd(_mm512_loadu_pd(to + 8), high));
}

// Packs `images` images of `image_floats` floats, `stride` floats apart from `from` (a channel
// slice of a larger tensor when stride > image_floats, Conv2dShape::in_image_stride), into `to`.
inline void copy_strided_images(const float* from, int64_t stride, int64_t images, int64_t image_floats, float* to) {
  if (stride == image_floats) {
    copy_row(from, images * image_floats, to);
    return;
  }
  for (int64_t n = 0; n < images; ++n) copy_row(from + n * stride, image_floats, to + n * image_floats);
}

// r[i][j] becomes r[j][i]: the four shuffle stages of a 16 x 16 transpose.
inline void transpose16(__m512 (&r)[16]) {
  // The zero-masking forms with every lane set are the plain instructions; GCC 12 warns, in some
  // callers, about the undefined source of the unmasked intrinsics.
  constexpr __mmask16 all = 0xFFFF;
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_maskz_unpacklo_ps(all, r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_maskz_unpackhi_ps(all, r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_maskz_shuffle_ps(all, t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_maskz_shuffle_ps(all, t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_maskz_shuffle_ps(all, t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_maskz_shuffle_ps(all, t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 4; ++i) {
      t[8 * h + i] = _mm512_maskz_shuffle_f32x4(all, r[8 * h + i], r[8 * h + 4 + i], 0x88);
      t[8 * h + 4 + i] = _mm512_maskz_shuffle_f32x4(all, r[8 * h + i], r[8 * h + 4 + i], 0xDD);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_maskz_shuffle_f32x4(all, t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_maskz_shuffle_f32x4(all, t[i], t[8 + i], 0xDD);
  }
}

// Lane i of the result = the sum of the 16 lanes of v[i] (a transposing tree: 45 instructions for
// 16 sums, where one horizontal sum at a time takes 8 each). (The zero-masking forms with every
// lane set are the plain instructions; GCC 12 warns about the undefined source of the others.)
inline __m512 sum_lanes_16(const __m512 (&v)[16]) {
  constexpr __mmask16 all = 0xFFFF;
  __m512 pairs[8], quads[4], halves[2];
  // pairs[i], per 128-bit block: (a0 + a2, b0 + b2, a1 + a3, b1 + b3) of a = v[2i], b = v[2i + 1]
  for (int i = 0; i < 8; ++i)
    pairs[i] = _mm512_add_ps(_mm512_maskz_unpacklo_ps(all, v[2 * i], v[2 * i + 1]),
                             _mm512_maskz_unpackhi_ps(all, v[2 * i], v[2 * i + 1]));
  // quads[i], per 128-bit block: a partial sum of each of v[4i .. 4i + 3]
  for (int i = 0; i < 4; ++i)
    quads[i] = _mm512_add_ps(_mm512_maskz_shuffle_ps(all, pairs[2 * i], pairs[2 * i + 1], 0x44),
                             _mm512_maskz_shuffle_ps(all, pairs[2 * i], pairs[2 * i + 1], 0xEE));
  // halves[i]: blocks 0 + 2 and 1 + 3 of quads[2i], then the same of quads[2i + 1]
  for (int i = 0; i < 2; ++i)
    halves[i] =
        _mm512_add_ps(_mm512_maskz_shuffle_f32x4(all, quads[2 * i], quads[2 * i + 1], 0x44),
                      _mm512_maskz_shuffle_f32x4(all, quads[2 * i], quads[2 * i + 1], 0xEE));
  return _mm512_add_ps(_mm512_maskz_shuffle_f32x4(all, halves[0], halves[1], 0x88),
                       _mm512_maskz_shuffle_f32x4(all, halves[0], halves[1], 0xDD));
}

// sums[b * stride + t] += the sum of the lanes of acc[b][t], for b < rows.
// (acc is read once, with constant indices: any other access would keep the accumulators of the
// caller's loop in memory instead of registers.)
template <int Count, class Sum>
void add_lane_sums(const __m512 (&acc)[kChannelBlock][Count], int64_t rows, Sum* sums,
                   int64_t stride) {
  constexpr int n = kChannelBlock * Count;
  __m512 flat[round_up(n, 16)];
  for (int b = 0; b < kChannelBlock; ++b)
    for (int t = 0; t < Count; ++t) flat[b * Count + t] = acc[b][t];
  for (int i = n; i < round_up(n, 16); ++i) flat[i] = _mm512_setzero_ps();
  for (int first = 0; first < n; first += 16) {
    __m512 group[16];
    for (int i = 0; i < 16; ++i) group[i] = flat[first + i];
    alignas(64) float total[16];
    _mm512_store_ps(total, sum_lanes_16(group));
    for (int i = 0; i < 16 && first + i < n; ++i)
      if ((first + i) / Count < rows)
        sums[(first + i) / Count * stride + (first + i) % Count] += Sum(total[i]);
  }
}

// Output channels rounded up to the micro-kernels' blocks of Block (the extra ones read zero weights).
template <int Block = kChannelBlock>
int64_t rounded_channels(const Conv2dShape& s) { return round_up(s.out_channels, Block); }

// The weight in panels of Block output channels: panels[o / Block][k][o % Block] = w[o][k] for the
// taps k = (c, i, j), zero for o >= out_channels, so that a micro-kernel reads its Block weights of
// a tap from one place and its panel as one stream.
template <int Block = kChannelBlock>
void pack_weight(const StreamHandle& st, const Conv2dShape& s, const float* w, float* panels) {
  const int64_t taps = s.in_channels * s.kernel_h * s.kernel_w,
                blocks = rounded_channels<Block>(s) / Block;
  run_threads(st, [&](int t, int threads) {
    for (int64_t block = share(blocks, t, threads); block < share(blocks, t + 1, threads);
         ++block) {
      float* to = panels + block * taps * Block;
      for (int64_t k = 0; k < taps; ++k)
        for (int64_t b = 0; b < Block; ++b) {
          const int64_t o = block * Block + b;
          *to++ = o < s.out_channels ? w[o * taps + k] : 0.0f;
        }
    }
  });
}
// The same for the stride-1 backward-data conv (transposed_stride1(s)), straight from s's weight:
// its output channel c and tap k = (o, i, j) read w[o, c, kh - 1 - i, kw - 1 - j].
template <int Block = kChannelBlock>
void pack_flipped_weight(const StreamHandle& st, const Conv2dShape& s, const float* w,
                         float* panels) {
  const int64_t kh = s.kernel_h, kw = s.kernel_w, taps = s.out_channels * kh * kw;
  const int64_t blocks = round_up(s.in_channels, Block) / Block;
  run_threads(st, [&](int t, int threads) {
    for (int64_t block = share(blocks, t, threads); block < share(blocks, t + 1, threads);
         ++block) {
      float* to = panels + block * taps * Block;
      for (int64_t o = 0; o < s.out_channels; ++o)
        for (int64_t i = 0; i < kh; ++i)
          for (int64_t j = 0; j < kw; ++j)
            for (int64_t b = 0; b < Block; ++b) {
              const int64_t c = block * Block + b;
              *to++ = c < s.in_channels
                          ? w[((o * s.in_channels + c) * kh + kh - 1 - i) * kw + kw - 1 - j]
                          : 0.0f;
            }
    }
  });
}

// Shared scratch of the forward passes, in floats: the packed weight.
template <int Block = kChannelBlock>
int64_t forward_shared(const Conv2dShape& s) {
  return s.in_channels * s.kernel_h * s.kernel_w * rounded_channels<Block>(s);
}

// Winograd's weight transform u = G g G^T (winograd_transform_kernel) of 16 kernels at once:
// lane l of the 4 x 4 kernels in a vector is 4 first-argument values (o) by 4 second-argument
// values (c) of the Taps: l = 4 (c - c0) + (o - o0). Each lane does the scalar arithmetic, so the
// bits are the scalar transform's. Lanes with o >= o_end or c >= c_end get zeros. u[4 r + q] is
// position (r, q).
template <class Taps>
void transform_kernels_4x4(const Taps& g, int64_t o0, int64_t o_end, int64_t c0, int64_t c_end, __m512 (&u)[16]) {
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i o = _mm512_and_si512(lane, _mm512_set1_epi32(3)), c = _mm512_srli_epi32(lane, 2);
  const __mmask16 valid = _mm512_cmplt_epi32_mask(o, _mm512_set1_epi32(int(std::min<int64_t>(o_end - o0, 4)))) &
                          _mm512_cmplt_epi32_mask(c, _mm512_set1_epi32(int(std::min<int64_t>(c_end - c0, 4))));
  const __m512i index = _mm512_add_epi32(_mm512_mullo_epi32(o, _mm512_set1_epi32(int(g.first_stride()))),
                                         _mm512_mullo_epi32(c, _mm512_set1_epi32(int(g.second_stride()))));
  const float* base = g.w + o0 * g.first_stride() + c0 * g.second_stride();
  auto tap = [&](int i, int j) {
    return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), valid, index, base + Taps::offset(i, j), 4);
  };
  const __m512 half = _mm512_set1_ps(0.5f);
  // 0.5 (a + b + e) and 0.5 (a - b + e), evaluated as the scalar code does
  auto plus = [&](__m512 a, __m512 b, __m512 e) { return _mm512_mul_ps(half, _mm512_add_ps(_mm512_add_ps(a, b), e)); };
  auto minus = [&](__m512 a, __m512 b, __m512 e) { return _mm512_mul_ps(half, _mm512_add_ps(_mm512_sub_ps(a, b), e)); };
  __m512 gg[4][3];  // G g
  for (int j = 0; j < 3; ++j) {
    const __m512 a = tap(0, j), b = tap(1, j), e = tap(2, j);
    gg[0][j] = a;
    gg[1][j] = plus(a, b, e);
    gg[2][j] = minus(a, b, e);
    gg[3][j] = e;
  }
  for (int i = 0; i < 4; ++i) {  // (G g) G^T
    const __m512 a = gg[i][0], b = gg[i][1], e = gg[i][2];
    u[4 * i] = a;
    u[4 * i + 1] = plus(a, b, e);
    u[4 * i + 2] = minus(a, b, e);
    u[4 * i + 3] = e;
  }
}

// The products of Winograd's weight gradients (conv2d_winograd.cpp's F(2x2), conv2d_winograd_f4.cpp's
// F(4x4)): at one transformed position, sums[c][16 j ..] += sum over `tiles` terms t of v[c][t] *
// dm[t][16 j ..], for Channels input channels (lines of V `v_stride` apart) and Vectors vectors of
// output channels (dm's rows `outs` floats long, output channels on the lanes).
template <int Channels, int Vectors>
void weight_tile(const float* v, int64_t v_stride, const float* dm, int64_t outs, int64_t tiles,
                 float* sums) {
  // The loops over acc are unrolled so that GCC indexes it by constants and keeps it in registers
  // (else it zeroes acc on the stack and copies it in and out around the product loop).
  __m512 acc[Channels][Vectors];
#pragma GCC unroll 16
  for (int c = 0; c < Channels; ++c)
#pragma GCC unroll 4
    for (int j = 0; j < Vectors; ++j) acc[c][j] = _mm512_setzero_ps();
  for (int64_t t = 0; t < tiles; ++t) {
    __m512 d[Vectors];
    for (int j = 0; j < Vectors; ++j) d[j] = _mm512_load_ps(dm + t * outs + j * kLanes);
    for (int c = 0; c < Channels; ++c) {
      const __m512 xv = _mm512_set1_ps(v[c * v_stride + t]);
      for (int j = 0; j < Vectors; ++j) acc[c][j] = _mm512_fmadd_ps(xv, d[j], acc[c][j]);
    }
  }
#pragma GCC unroll 16
  for (int c = 0; c < Channels; ++c)
#pragma GCC unroll 4
    for (int j = 0; j < Vectors; ++j) {
      float* to = sums + c * outs + j * kLanes;
      _mm512_store_ps(to, _mm512_add_ps(_mm512_load_ps(to), acc[c][j]));
    }
}

// The same for `channels` <= Channels input channels (fewer registers for a last partial group).
template <int Vectors, int Channels>
void weight_tiles(int channels, const float* v, int64_t v_stride, const float* dm, int64_t outs,
                  int64_t tiles, float* sums) {
  if constexpr (Channels > 1) {
    if (channels < Channels) {
      weight_tiles<Vectors, Channels - 1>(channels, v, v_stride, dm, outs, tiles, sums);
      return;
    }
  }
  weight_tile<Channels, Vectors>(v, v_stride, dm, outs, tiles, sums);
}

// One position's products of a block: every input channel against output vectors [j0, j0 +
// Vectors), in groups of 16 channels for one vector, 24 / Vectors for more (16 or 24
// accumulators, the other registers for the loads).
template <int Vectors>
void weight_position(int64_t in, const float* v, int64_t v_stride, const float* dm, int64_t outs,
                     int64_t tiles, float* sums) {
  constexpr int kGroup = Vectors == 1 ? 16 : 24 / Vectors;
  for (int64_t c0 = 0; c0 < in; c0 += kGroup)
    weight_tiles<Vectors, kGroup>(static_cast<int>(std::min<int64_t>(kGroup, in - c0)), v + c0 * v_stride,
                                  v_stride, dm, outs, tiles, sums + c0 * outs);
}

// One position's products for every output vector (outs / 16 of them), four vectors at a time.
inline void weight_products(int64_t in, const float* v, int64_t v_stride, const float* dm, int64_t outs,
                            int64_t tiles, float* sums) {
  for (int64_t j0 = 0; j0 < outs / kLanes; j0 += 4) {
    const float* dmj = dm + j0 * kLanes;
    float* sj = sums + j0 * kLanes;
    switch (std::min<int64_t>(4, outs / kLanes - j0)) {
      case 1: weight_position<1>(in, v, v_stride, dmj, outs, tiles, sj); break;
      case 2: weight_position<2>(in, v, v_stride, dmj, outs, tiles, sj); break;
      case 3: weight_position<3>(in, v, v_stride, dmj, outs, tiles, sj); break;
      default: weight_position<4>(in, v, v_stride, dmj, outs, tiles, sj); break;
    }
  }
}

}  // namespace
}  // namespace petra::kernels::cpu::conv2d::direct
