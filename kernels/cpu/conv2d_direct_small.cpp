// kernels/cpu/conv2d_direct_small.cpp: the direct AVX-512 convolution (float) of images of 16
// pixels (4x4, as in ResNet-18's last stage on CIFAR), stride 1, output as large as the input.
// kernels/cpu/conv2d.cpp chooses it before the other algorithms wherever `applies` (below, with the
// measurements) says so: at least 4 output channels (forward, backward-data); backward-weight of
// 3x3 kernels with at least 16 output channels (`lanes`, below; also a 7x7 input at stride 2, whose
// output is 4x4 too), of the others with at most 512 KB of input in the batch. Compiled only with
// AVX-512 (PETRA_CONV_DIRECT).
//
// One channel of an image is then one vector, and tap (i, j) of all its output pixels is that
// vector shifted by (i - pad_h) * in_w + j - pad_w: one load, with the lanes that would read
// outside the image (or across a row edge) masked to zero. So there is neither im2col nor a grid,
// and every lane is an output pixel. Forward: acc[4 channels][6 images] += w (x) x;
// backward-weight: acc[4 channels][6 taps] += dy (x) x over the whole batch, reduced once. The
// input is copied with a margin of zeros before and after, so that the shifted loads stay inside
// one buffer. The 3x3 backward-weight puts 16 output channels on the lanes instead (`lanes`):
// no sum across lanes at the end, 1.5x faster (measured where it is defined).
#include "petra/kernels/cpu/conv2d_algorithms.hpp"

#if PETRA_CONV_DIRECT
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "petra/kernels/cpu/conv2d_direct.hpp"
#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu::conv2d::direct::small {
namespace {

constexpr int kImageBlock = 6;  // images per forward micro-kernel (4 x 6 accumulators)

struct Taps {
  int64_t image;                 // in_channels * 16: floats per input image
  int64_t margin;                // zeros before and after the copied images (a multiple of 16)
  std::vector<int64_t> offsets;  // per tap k = (c, i, j): c * 16 + the shift
  std::vector<__mmask16> masks;  // per tap: the output pixels whose read is inside the image

  explicit Taps(const Conv2dShape& s)
      : image(s.in_channels * kLanes),
        margin(round_up(std::max(s.pad_h * s.in_w + s.pad_w,
                                 (s.kernel_h - 1 - s.pad_h) * s.in_w + s.kernel_w - 1 - s.pad_w),
                        kLanes)) {
    for (int64_t c = 0; c < s.in_channels; ++c)
      for (int64_t i = 0; i < s.kernel_h; ++i)
        for (int64_t j = 0; j < s.kernel_w; ++j) {
          offsets.push_back(c * kLanes + (i - s.pad_h) * s.in_w + j - s.pad_w);
          unsigned mask = 0;
          for (int64_t p = 0; p < kLanes; ++p) {
            const int64_t ih = p / s.in_w + i - s.pad_h, iw = p % s.in_w + j - s.pad_w;
            if (ih >= 0 && ih < s.in_h && iw >= 0 && iw < s.in_w) mask |= 1u << p;
          }
          masks.push_back(static_cast<__mmask16>(mask));
        }
  }
  int64_t count() const { return static_cast<int64_t>(offsets.size()); }
  // floats of a copy of `images` images with its margins
  int64_t copy_size(int64_t images) const {
    return margin + round_up(images * image, kLanes) + margin;
  }
};

// Copies `images` images, `x_stride` floats apart from x, into `to` after the margin, packed, with
// zeros in the margins; returns where the first image starts.
float* copy_images(const Taps& taps, const float* x, int64_t x_stride, int64_t images, float* to) {
  zero_row(taps.margin, to);
  copy_strided_images(x, x_stride, images, taps.image, to + taps.margin);
  float* end = to + taps.margin + images * taps.image;
  zero_row(to + taps.copy_size(images) - end, end);
  return to + taps.margin;
}

// The 16 pixels' values of a tap, zero where the tap reads outside the image. (A full load and a
// zeroing move rather than a masked load: GCC 12 treats the masked load as writing memory, which
// keeps the accumulators of the loops around it in memory; the margins make the load safe.)
inline __m512 load_tap(__mmask16 mask, const float* from) {
  return _mm512_maskz_mov_ps(mask, _mm512_loadu_ps(from));
}

// acc[b][v] += sum_k panel[k][b] * (tap k of image v); x: image 0's copy.
// (Plain pointers and counts, not the Taps: __m512 may alias anything, so with the accumulators
// spilled the vectors' internals would have to be reloaded, and GCC then keeps acc in memory.)
template <int Images>
inline void accumulate_outputs(const int64_t* offsets, const __mmask16* masks, int64_t taps,
                               int64_t image, const float* x, const float* panel,
                               __m512 (&acc)[kChannelBlock][Images]) {
  for (int64_t k = 0; k < taps; ++k) {
    const float* from = x + offsets[k];
    const __mmask16 mask = masks[k];
    const float* w = panel + k * kChannelBlock;
    __m512 wb[kChannelBlock];
    for (int b = 0; b < kChannelBlock; ++b) wb[b] = _mm512_set1_ps(w[b]);
    for (int v = 0; v < Images; ++v) {
      const __m512 xv = load_tap(mask, from + v * image);
      for (int b = 0; b < kChannelBlock; ++b) acc[b][v] = _mm512_fmadd_ps(wb[b], xv, acc[b][v]);
    }
  }
}

// y of output channels [o0, o0 + 4) of `Images` consecutive images (x: the first one's copy).
template <int Images>
void forward_block(const Conv2dShape& s, const Taps& taps, const float* x, const float* panels,
                   const float* bias, int64_t o0, float* y) {
  // (Loops over acc with constant trip counts only, so that GCC keeps it in registers.)
  const int64_t rows = std::min<int64_t>(kChannelBlock, s.out_channels - o0);
  __m512 acc[kChannelBlock][Images];
  for (int b = 0; b < kChannelBlock; ++b)
    for (int v = 0; v < Images; ++v)
      acc[b][v] = _mm512_set1_ps(bias != nullptr && b < rows ? bias[o0 + b] : 0.0f);
  accumulate_outputs(taps.offsets.data(), taps.masks.data(), taps.count(), taps.image, x,
                     panels + o0 * taps.count(), acc);
  const int64_t out_image = s.out_channels * kLanes;
  for (int b = 0; b < kChannelBlock; ++b)
    for (int v = 0; v < Images; ++v)
      if (b < rows) _mm512_storeu_ps(y + v * out_image + (o0 + b) * kLanes, acc[b][v]);
}

template <int Images = kImageBlock>
void forward_blocks(int images, const Conv2dShape& s, const Taps& taps, const float* x,
                    const float* panels, const float* bias, int64_t o0, float* y) {
  if constexpr (Images > 1) {
    if (images < Images) {
      forward_blocks<Images - 1>(images, s, taps, x, panels, bias, o0, y);
      return;
    }
  }
  forward_block<Images>(s, taps, x, panels, bias, o0, y);
}

// Per thread, in floats: a copy of kImageBlock images.
int64_t forward_scratch(const Conv2dShape& s) { return Taps(s).copy_size(kImageBlock); }

// y = conv(x, w) + bias, pack(panels) writing the packed weight (pack_weight or
// pack_flipped_weight, kernels/cpu/conv2d_direct.hpp).
template <class Pack>
void forward_packed(const StreamHandle& st, const Conv2dShape& s, const float* x, Pack&& pack,
                    const float* bias, float* y) {
  const Taps taps(s);
  const Scratch<float> scratch =
      reserve_scratch<float>(st, forward_shared(s), taps.copy_size(kImageBlock));
  pack(scratch.shared);
  const float* panels = scratch.shared;
  const int64_t out_image = s.out_channels * kLanes;
  run_threads(st, [&](int t, int threads) {
    const int64_t end = share(s.batch, t + 1, threads);
    for (int64_t image = share(s.batch, t, threads); image < end; image += kImageBlock) {
      const int64_t images = std::min<int64_t>(kImageBlock, end - image);
      const int64_t stride = s.x_image_stride();
      const float* copy = copy_images(taps, x + image * stride, stride, images, scratch.of_thread(t));
      for (int64_t o0 = 0; o0 < s.out_channels; o0 += kChannelBlock)
        forward_blocks(static_cast<int>(images), s, taps, copy, panels, bias, o0,
                       y + image * out_image);
    }
  });
}

// dw[o0 + b][k0 + t] += sum over the images of dy channel o0 + b times x at tap k0 + t.
template <int Count>
void weight_block(const Conv2dShape& s, const Taps& taps, const float* x, const float* dy,
                  int64_t o0, int64_t k0, float* dw) {
  const int64_t rows = std::min<int64_t>(kChannelBlock, s.out_channels - o0),
                out_image = s.out_channels * kLanes;
  const float* from[Count];
  __mmask16 mask[Count];
  for (int t = 0; t < Count; ++t) {
    from[t] = x + taps.offsets[k0 + t];
    mask[t] = taps.masks[k0 + t];
  }
  const float* grad = dy + o0 * kLanes;
  __m512 acc[kChannelBlock][Count];
  for (int b = 0; b < kChannelBlock; ++b)
    for (int t = 0; t < Count; ++t) acc[b][t] = _mm512_setzero_ps();
  for (int64_t image = 0; image < s.batch; ++image) {
    __m512 d[kChannelBlock];
    for (int b = 0; b < kChannelBlock; ++b)
      d[b] =
          b < rows ? _mm512_loadu_ps(grad + image * out_image + b * kLanes) : _mm512_setzero_ps();
    for (int t = 0; t < Count; ++t) {
      const __m512 xv = load_tap(mask[t], from[t] + image * taps.image);
      for (int b = 0; b < kChannelBlock; ++b) acc[b][t] = _mm512_fmadd_ps(d[b], xv, acc[b][t]);
    }
  }
  add_lane_sums(acc, rows, dw + o0 * taps.count() + k0, taps.count());
}

template <int Count = kTapBlock>
void weight_blocks(int count, const Conv2dShape& s, const Taps& taps, const float* x,
                   const float* dy, int64_t o0, int64_t k0, float* dw) {
  if constexpr (Count > 1) {
    if (count < Count) {
      weight_blocks<Count - 1>(count, s, taps, x, dy, o0, k0, dw);
      return;
    }
  }
  weight_block<Count>(s, taps, x, dy, o0, k0, dw);
}

// Shared, in floats: a copy of the whole batch.
int64_t weight_shared(const Conv2dShape& s) { return Taps(s).copy_size(s.batch); }

// ---- Backward-weight of the 3x3 layers, output channels on the lanes.
// dw[o][c][i][j] = sum over images n and pixels p = (h, w) of dy[n][o][p] * x[n][c][h + i - 1][w + j - 1].
// weight_block above puts the pixels on the lanes: each of its 4 x 6 sums is a vector that must be
// summed across its lanes at the end, and over a batch of 64 that tail costs as much as the sums.
// Here the lanes are 16 output channels: dy is transposed once to dyt[n][p][o] (o contiguous), x
// is copied once with its zero border to planes of 6 x 6 (xp[c][n][6][6]), and each product is a
// vector of dy times one broadcast value of x. A block is 32 output channels by the 9 taps of one
// input channel: 18 accumulators, 2 vector loads and 9 broadcasts per pixel for 18 FMAs, and no
// sum across lanes. The sums run over 8 images (128 products) in the registers, then are added to
// the block's totals, which keeps their rounding error near the pixel-lane kernel's.
// The same serves a 7x7 input at stride 2 (also 4x4 outputs: ResNet-18's last transition here),
// with 9x9 copies: pixel (h, w)'s window starts at (2h, 2w) of the copy instead of (h, w).
namespace lanes {

constexpr int kSide = 4;   // 4x4 outputs
constexpr int kTaps = 9;   // 3x3
constexpr int kImagesPerSum = 8;

// The copies of x: 6x6 planes of a 4x4 input (stride 1), 9x9 of a 7x7 input (stride 2).
template <int Stride>
struct Copy {
  static constexpr int padded = Stride == 1 ? kSide + 2 : 2 * kSide + 1, plane = padded * padded;
};

bool applies(const Conv2dShape& s) {
  const bool stride1 = s.in_h == kSide && s.in_w == kSide && s.stride_h == 1 && s.stride_w == 1;
  const bool stride2 = s.in_h == 2 * kSide - 1 && s.in_w == 2 * kSide - 1 && s.stride_h == 2 && s.stride_w == 2;
  return (stride1 || stride2) && s.kernel_h == 3 && s.kernel_w == 3 && s.pad_h == 1 && s.pad_w == 1 &&
         s.out_channels >= kLanes;
}
int plane_floats(const Conv2dShape& s) { return s.stride_h == 1 ? Copy<1>::plane : Copy<2>::plane; }

int64_t padded_channels(const Conv2dShape& s) { return round_up(s.out_channels, kLanes); }
int64_t dyt_floats(const Conv2dShape& s) { return s.batch * kLanes * padded_channels(s); }
int64_t shared_floats(const Conv2dShape& s) {
  return dyt_floats(s) + s.in_channels * s.batch * plane_floats(s) + kLanes;
}

// dyt[p][o] = dy[o][p] for one image: 16 channels at a time, gathered (o >= out_channels: zero).
void transpose_image(const float* dy, int64_t channels, int64_t padded, float* dyt) {
  const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(kLanes));
  for (int64_t o0 = 0; o0 < padded; o0 += kLanes) {
    const int64_t valid = std::min<int64_t>(kLanes, channels - o0);
    const auto mask = static_cast<__mmask16>(valid >= kLanes ? 0xFFFFu : (1u << valid) - 1);
    for (int p = 0; p < kLanes; ++p)
      _mm512_storeu_ps(dyt + p * padded + o0,
                       _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mask, rows, dy + o0 * kLanes + p, 4));
  }
}

// Where pad_plane takes each float of a 6x6 plane from: to[q] = x[index[q]] for the q = (h + 1) *
// 6 + w + 1 with h, w in [0, 4) (the bits of `inside`), zero elsewhere. Built once, at compile time.
struct PadTable {
  alignas(64) int32_t index[48] = {};
  std::uint64_t inside = 0;
  constexpr PadTable() {
    for (int h = 0; h < kSide; ++h)
      for (int w = 0; w < kSide; ++w) {
        const int q = (h + 1) * Copy<1>::padded + w + 1;
        index[q] = h * kSide + w;
        inside |= std::uint64_t(1) << q;
      }
  }
};
constexpr PadTable kPadTable;

// The 6x6 copy with a zero border of one 4x4 channel: three permutes of its one vector.
void pad_plane(const float* x, float* to, std::integral_constant<int, 1>) {
  const __m512 v = _mm512_loadu_ps(x);
  for (int part = 0; part < 3; ++part) {
    const auto m = static_cast<__mmask16>(kPadTable.inside >> (16 * part));
    const __m512 values = _mm512_maskz_permutexvar_ps(m, _mm512_load_si512(kPadTable.index + 16 * part), v);
    if (part < 2) _mm512_storeu_ps(to + 16 * part, values);
    else _mm512_mask_storeu_ps(to + 32, 0x000F, values);  // floats 32-35
  }
}

// The 9x9 copy with a zero border of one 7x7 channel: zeros, then its seven rows.
void pad_plane(const float* x, float* to, std::integral_constant<int, 2>) {
  constexpr int padded = Copy<2>::padded;
  for (int q = 0; q + kLanes <= Copy<2>::plane; q += kLanes) _mm512_storeu_ps(to + q, _mm512_setzero_ps());
  to[Copy<2>::plane - 1] = 0.0f;  // 81 = 5 x 16 + 1
  for (int h = 0; h < padded - 2; ++h)
    _mm256_mask_storeu_ps(to + (h + 1) * padded + 1, 0x7F, _mm256_maskz_loadu_ps(0x7F, x + h * (padded - 2)));
}

// acc[v][t] += sum over `images` images and the 16 pixels of dyt (output channels 16v..16v + 15 of
// the block) times tap t of x's plane; dyt: image 0, first channel of the block; xc: image 0's plane.
template <int Stride, int V>
inline void add_products(const float* dyt, int64_t padded, const float* xc, int64_t images,
                         __m512 (&acc)[V][kTaps]) {
  constexpr int side = Copy<Stride>::padded;
  for (int64_t n = 0; n < images; ++n) {
    const float* d = dyt + n * kLanes * padded;
    const float* x = xc + n * Copy<Stride>::plane;
#pragma GCC unroll 1
    for (int p = 0; p < kLanes; ++p) {
      const float* window = x + Stride * ((p / kSide) * side + p % kSide);  // tap (0, 0) of pixel p
      __m512 dv[V];
      for (int v = 0; v < V; ++v) dv[v] = _mm512_loadu_ps(d + p * padded + v * kLanes);
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) {
          const __m512 xb = _mm512_set1_ps(window[i * side + j]);
          for (int v = 0; v < V; ++v) acc[v][i * 3 + j] = _mm512_fmadd_ps(dv[v], xb, acc[v][i * 3 + j]);
        }
    }
  }
}

// dw[o0 + o][c][t] += the block's sums, for the channels o < out_channels - o0.
template <int Stride, int V>
void block(const Conv2dShape& s, const float* dyt, const float* xp, int64_t c, int64_t o0, float* dw) {
  constexpr int plane = Copy<Stride>::plane;
  const int64_t padded = padded_channels(s);
  const float* xc = xp + c * s.batch * plane;
  __m512 total[V][kTaps];
  for (int v = 0; v < V; ++v)
    for (int t = 0; t < kTaps; ++t) total[v][t] = _mm512_setzero_ps();
  for (int64_t n = 0; n < s.batch; n += kImagesPerSum) {
    __m512 acc[V][kTaps];
    for (int v = 0; v < V; ++v)
      for (int t = 0; t < kTaps; ++t) acc[v][t] = _mm512_setzero_ps();
    add_products<Stride, V>(dyt + n * kLanes * padded + o0, padded, xc + n * plane,
                    std::min<int64_t>(kImagesPerSum, s.batch - n), acc);
    for (int v = 0; v < V; ++v)
      for (int t = 0; t < kTaps; ++t) total[v][t] = _mm512_add_ps(total[v][t], acc[v][t]);
  }
  const int64_t row = s.in_channels * kTaps;  // floats per output channel of dw
  for (int v = 0; v < V; ++v)
    for (int t = 0; t < kTaps; ++t) {
      alignas(64) float sums[kLanes];
      _mm512_store_ps(sums, total[v][t]);
      for (int64_t lane = 0; lane < kLanes && o0 + v * kLanes + lane < s.out_channels; ++lane)
        dw[(o0 + v * kLanes + lane) * row + c * kTaps + t] += sums[lane];
    }
}

// The threads share dyt and xp and split the input channels: each dw value is one thread's sum,
// in the same order whatever the thread count.
template <int Stride>
void backward_weight(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* dy, float* dw) {
  constexpr int plane = Copy<Stride>::plane;
  const Scratch<float> scratch = reserve_scratch<float>(st, shared_floats(s), 0);
  float* dyt = scratch.shared;
  float* xp = dyt + dyt_floats(s);
  const int64_t padded = padded_channels(s), out_image = s.out_channels * kLanes;
  run_threads(st, [&](int t, int threads) {
    for (int64_t n = share(s.batch, t, threads); n < share(s.batch, t + 1, threads); ++n) {
      transpose_image(dy + n * out_image, s.out_channels, padded, dyt + n * kLanes * padded);
      for (int64_t c = 0; c < s.in_channels; ++c)
        pad_plane(x + n * s.x_image_stride() + c * s.in_h * s.in_w, xp + (c * s.batch + n) * plane,
                  std::integral_constant<int, Stride>{});
    }
  });
  run_threads(st, [&](int t, int threads) {
    const int64_t first = share(s.in_channels, t, threads), end = share(s.in_channels, t + 1, threads);
    int64_t o0 = 0;
    for (; o0 + 2 * kLanes <= padded; o0 += 2 * kLanes)
      for (int64_t c = first; c < end; ++c) block<Stride, 2>(s, dyt, xp, c, o0, dw);
    if (o0 < padded)
      for (int64_t c = first; c < end; ++c) block<Stride, 1>(s, dyt, xp, c, o0, dw);
  });
}

void backward_weight(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* dy, float* dw) {
  if (s.stride_h == 1)
    backward_weight<1>(st, s, x, dy, dw);
  else
    backward_weight<2>(st, s, x, dy, dw);
}

}  // namespace lanes

}  // namespace

// Measured (Zen 5, 128 channels, 4x4, 3x3, batch 64, against im2col + GEMM): forward and
// backward-data 1.15x faster on 1 thread and 1.1x on 2, backward-weight 1.05x on both. Every
// block of backward-weight reads the copy of the whole batch's input: beyond L2 (512 channels at
// batch 64: 2 MB) it waits on memory, and the GEMM is faster. The 3x3 backward-weight with the
// output channels on the lanes (2026-12-02, bench-conv-shapes / bench-kernels, 1 thread): 128
// channels at batch 64 2.62-2.79 -> 1.70-1.75 ms (this file's pixel-lane kernel before), at batch
// 128 5.19 -> 3.88 ms (im2col before), 512 channels at batch 64 35-41 -> 29-31 ms (im2col).
// At stride 2 from 7x7 (2026-12-03): 64 -> 128 channels at batch 64, 1.14 -> 0.82 ms isolated
// (im2col + GEMM before), 1.30-1.34 -> 1.09 in a training step (`--profile`, 1 thread).
bool applies(const Conv2dShape& s, Pass pass) {
  if (pass == Pass::weight && lanes::applies(s)) return true;
  return s.stride_h == 1 && s.stride_w == 1 && s.pad_h >= 0 && s.pad_w >= 0 &&
         s.out_h() == s.in_h && s.out_w() == s.in_w && s.in_h * s.in_w == kLanes &&
         (pass == Pass::weight ? s.batch * s.in_channels * kLanes <= (128 << 10)  // 512 KB
                               : s.out_channels >= kChannelBlock);
}

void forward(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* w,
             const float* bias, float* y) {
  forward_packed(st, s, x, [&](float* panels) { pack_weight(st, s, w, panels); }, bias, y);
}

void backward_data(const StreamHandle& st, const Conv2dShape& s, const float* dy, const float* w,
                   float* dx) {
  forward_packed(
      st, transposed_stride1(s), dy, [&](float* panels) { pack_flipped_weight(st, s, w, panels); },
      nullptr, dx);
}

// dw += dy (x) x over the batch. The threads share the copy of the input and split the output
// channels, so that each sum over the batch is made whole by one thread and added to dw once.
void backward_weight(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* dy,
                     float* dw) {
  if (lanes::applies(s)) {
    lanes::backward_weight(st, s, x, dy, dw);
    return;
  }
  const Taps taps(s);
  const Scratch<float> scratch = reserve_scratch<float>(st, taps.copy_size(s.batch), 0);
  float* copy = scratch.shared + taps.margin;
  run_threads(st, [&](int t, int threads) {
    const int64_t first = share(s.batch, t, threads), end = share(s.batch, t + 1, threads);
    copy_strided_images(x + first * s.x_image_stride(), s.x_image_stride(), end - first, taps.image,
                        copy + first * taps.image);
    if (t == 0) {
      zero_row(taps.margin, scratch.shared);
      float* after = copy + s.batch * taps.image;
      zero_row(scratch.shared + taps.copy_size(s.batch) - after, after);
    }
  });
  const int64_t blocks = (s.out_channels + kChannelBlock - 1) / kChannelBlock;
  run_threads(st, [&](int t, int threads) {
    for (int64_t block = share(blocks, t, threads); block < share(blocks, t + 1, threads); ++block)
      for (int64_t k0 = 0; k0 < taps.count(); k0 += kTapBlock)
        weight_blocks(static_cast<int>(std::min<int64_t>(kTapBlock, taps.count() - k0)), s, taps,
                      copy, dy, block * kChannelBlock, k0, dw);
  });
}

int64_t forward_scratch_floats(const Conv2dShape& s, int threads) {
  return scratch_floats(forward_shared(s), forward_scratch(s), threads);
}

int64_t backward_weight_scratch_floats(const Conv2dShape& s, int threads) {
  if (lanes::applies(s)) return scratch_floats(lanes::shared_floats(s), 0, threads);
  return scratch_floats(weight_shared(s), 0, threads);
}

}  // namespace petra::kernels::cpu::conv2d::direct::small
#endif  // PETRA_CONV_DIRECT
