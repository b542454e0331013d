// kernels/cpu/conv2d_direct_channels.cpp: the backward-weight pass of the convolution (float,
// AVX-512) with the input channels in the vector lanes, for the narrow 3-column kernels of the
// benchmark network (16 to 64 input channels, 28x28 to 7x7 images). kernels/cpu/conv2d.cpp chooses
// it before the other backward-weight algorithms wherever `applies` (below, with the measurements)
// says so. Compiled only with AVX-512 (PETRA_CONV_DIRECT).
//
// The math: dw[o, c, i, j] = sum over images and output pixels (oh, ow) of
// dy[o, oh, ow] * xpad[c, oh * stride_h + i, ow * stride_w + j]: a matrix product whose result
// (out_channels x in_channels * 9 values, 9K for 32 -> 32 channels) is small and whose sum runs
// over batch * out_h * out_w (50K) terms.
//
// Why not the grid kernel (conv2d_direct_grid.cpp), which puts 16 output pixels in the lanes: then
// every dw value is a sum of lanes, so its 4 x 6 register tile of partial sums holds only 24 dw
// values, and every tile has to stream the whole batch's input and dy again (from L2: about six new
// cache lines per 24 multiply-adds). bench-conv-shapes measured it at 15-17% of the FMA peak on the
// 16- and 32-channel layers, a third of its own forward pass.
//
// Here the lanes are 16 input channels instead: the input of one image is copied once into a
// zero-padded channels-last plane per group of 16 channels (x_cl[r][t][16 lanes]), so that tap
// (i, j) of output pixel (oh, ow) is one aligned vector load, and the register tile is 8 output
// channels x the 3 taps j of one kernel row i: 24 accumulators of 16 dw values each (384 values),
// 3 loads and 8 broadcasts of dy per 24 multiply-adds, and one new cache line per pixel at stride 1
// (the loads of taps j = 1, 2 were the next pixel's j = 0, 1). The float accumulators are added to
// double sums after every chunk of images (about 1024 terms per float sum, images_per_chunk), so the
// precision is that of the other algorithms.
//
// Determinism: each thread takes a fixed range of images and keeps its own double sums, which are
// added to dw in thread order: the result depends on the thread count only (as the grid's).
#include "petra/kernels/cpu/conv2d_algorithms.hpp"

#if PETRA_CONV_DIRECT
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "petra/kernels/cpu/conv2d_direct.hpp"
#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu::conv2d::direct::channels {
namespace {

using std::int64_t;

constexpr int kOutputBlock = 8;      // output channels per register tile
constexpr int kKernelWidth = 3;      // taps j per register tile (the kernel's width)

// The zero-padded channels-last copy of one image: group g of 16 input channels is the plane
// planes + g * plane, position (r, t) of the padded image at ((r * padded_w) + t) * 16.
struct Layout {
  int64_t padded_h, padded_w;  // in_h + 2 pad_h, in_w + 2 pad_w
  int64_t groups;              // in_channels / 16
  int64_t plane;               // floats per group: padded_h * padded_w * 16
  explicit Layout(const Conv2dShape& s)
      : padded_h(s.in_h + 2 * s.pad_h),
        padded_w(s.in_w + 2 * s.pad_w),
        groups(s.in_channels / kLanes),
        plane(padded_h * padded_w * kLanes) {}
  int64_t floats() const { return groups * plane; }
};

// rows[c] (16 floats each) -> columns: columns[j] lane c = rows[c][j], a 16 x 16 transpose in
// four rounds of interleaves (32-bit, 64-bit, then two of 128-bit blocks).
inline void transpose_16x16(const __m512 (&rows)[16], __m512 (&columns)[16]) {
  __m512 t[16], u[16], p[8];
  for (int k = 0; k < 8; ++k) {  // t[2k] per 128-bit block: a0 b0 a1 b1; t[2k + 1]: a2 b2 a3 b3
    t[2 * k] = _mm512_unpacklo_ps(rows[2 * k], rows[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_ps(rows[2 * k], rows[2 * k + 1]);
  }
  for (int k = 0; k < 4; ++k) {  // u[4k + j], block L: rows 4k .. 4k + 3 at column 4L + j
    const __m512d a = _mm512_castps_pd(t[4 * k]), b = _mm512_castps_pd(t[4 * k + 1]),
                  c = _mm512_castps_pd(t[4 * k + 2]), d = _mm512_castps_pd(t[4 * k + 3]);
    u[4 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // p[h * 4 + j] for the rows 8h .. 8h + 7: blocks 0 and 2 of u (columns j, 8 + j), then p[...+ 8]
  // would be blocks 1 and 3 (columns 4 + j, 12 + j); done in two halves to keep 16 live vectors.
  for (int half = 0; half < 2; ++half) {
    const int select = half == 0 ? 0x88 : 0xDD;  // blocks (0, 2) or (1, 3) of each operand
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 4; ++j)
        p[h * 4 + j] = select == 0x88 ? _mm512_shuffle_f32x4(u[8 * h + j], u[8 * h + 4 + j], 0x88)
                                      : _mm512_shuffle_f32x4(u[8 * h + j], u[8 * h + 4 + j], 0xDD);
    for (int j = 0; j < 4; ++j) {
      columns[4 * half + j] = _mm512_shuffle_f32x4(p[j], p[4 + j], 0x88);
      columns[4 * half + 8 + j] = _mm512_shuffle_f32x4(p[j], p[4 + j], 0xDD);
    }
  }
}

// planes = the channels-last, zero-padded copy of image x (NCHW, in_channels x in_h x in_w): per
// group of 16 channels and image row, blocks of 16 pixels are loaded from the 16 channel planes
// and transposed (transpose_16x16).
void copy_channels_last(const Conv2dShape& s, const Layout& l, const float* x, float* planes) {
  const int64_t pixels = s.in_h * s.in_w;
  for (int64_t g = 0; g < l.groups; ++g) {
    const float* group = x + g * kLanes * pixels;
    float* to = planes + g * l.plane;
    for (int64_t r = 0; r < l.padded_h; ++r) {
      const int64_t ih = r - s.pad_h;
      float* row = to + r * l.padded_w * kLanes;
      if (ih < 0 || ih >= s.in_h) {
        for (int64_t t = 0; t < l.padded_w; ++t) _mm512_storeu_ps(row + t * kLanes, _mm512_setzero_ps());
        continue;
      }
      for (int64_t t = 0; t < s.pad_w; ++t) {
        _mm512_storeu_ps(row + t * kLanes, _mm512_setzero_ps());
        _mm512_storeu_ps(row + (l.padded_w - 1 - t) * kLanes, _mm512_setzero_ps());
      }
      for (int64_t iw0 = 0; iw0 < s.in_w; iw0 += kLanes) {
        const int64_t count = std::min(kLanes, s.in_w - iw0);
        const auto mask = static_cast<__mmask16>((1u << count) - 1);
        __m512 rows[16], columns[16];
        for (int c = 0; c < 16; ++c) {  // and the row two further on: 16 planes at once (prefetch_lines says why)
          rows[c] = _mm512_maskz_loadu_ps(mask, group + c * pixels + ih * s.in_w + iw0);
          _mm_prefetch(reinterpret_cast<const char*>(group + c * pixels + (ih + 2) * s.in_w + iw0), _MM_HINT_T0);
        }
        transpose_16x16(rows, columns);
        float* out = row + (s.pad_w + iw0) * kLanes;
        for (int j = 0; j < 16; ++j)
          if (j < count) _mm512_storeu_ps(out + j * kLanes, columns[j]);
      }
    }
  }
}

// acc[b][j] (16 input channels each) = sum over the image's output pixels of
// dy[o0 + b, pixel] * x_cl[pixel's tap (i, j)], for one group's plane and one kernel row i.
// (Plain pointers and counts: the accumulators stay in registers only when nothing the loop reads
// may alias them.)
template <int64_t StrideW>
inline void accumulate_row_taps(const float* plane, int64_t padded_w, int64_t stride_h,
                                int64_t stride_w, int64_t out_h, int64_t out_w, int64_t i,
                                const float* dy, int64_t dy_channel,
                                __m512 (&acc)[kOutputBlock][kKernelWidth]) {
  const int64_t step = (StrideW > 0 ? StrideW : stride_w) * kLanes;
  for (int64_t oh = 0; oh < out_h; ++oh) {
    const float* x = plane + (oh * stride_h + i) * padded_w * kLanes;
    const float* d = dy + oh * out_w;
    for (int b = 0; b < kOutputBlock; ++b) {  // the output channels' rows two further on, as the copy's
      _mm_prefetch(reinterpret_cast<const char*>(d + b * dy_channel + 2 * out_w), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(d + b * dy_channel + 2 * out_w + kLanes), _MM_HINT_T0);
    }
    for (int64_t ow = 0; ow < out_w; ++ow, x += step) {
      const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + kLanes),
                   x2 = _mm512_loadu_ps(x + 2 * kLanes);
      for (int b = 0; b < kOutputBlock; ++b) {
        const __m512 g = _mm512_set1_ps(d[b * dy_channel + ow]);
        acc[b][0] = _mm512_fmadd_ps(g, x0, acc[b][0]);
        acc[b][1] = _mm512_fmadd_ps(g, x1, acc[b][1]);
        acc[b][2] = _mm512_fmadd_ps(g, x2, acc[b][2]);
      }
    }
  }
}

// sums[((o0 + b) * kernel_h + i) * 3 + j][g * 16 .. + 15] += acc[b][j], in double.
inline void add_to_sums(const __m512 (&acc)[kOutputBlock][kKernelWidth], double* sums,
                        int64_t row_stride, int64_t in_channels) {
  for (int b = 0; b < kOutputBlock; ++b)
    for (int j = 0; j < kKernelWidth; ++j) add_to_doubles(acc[b][j], sums + b * row_stride + j * in_channels);
}

// Images whose terms one float accumulator sums before it is added to the double sums: about
// 1024 terms (output pixels), at most 16 images. Small images need several, else the tile's
// set-up and its addition to the double sums cost as much as its multiply-adds (4x4 outputs: 16
// pixels per image).
int64_t images_per_chunk(const Conv2dShape& s) {
  return std::clamp<int64_t>(1024 / std::max<int64_t>(1, s.out_h() * s.out_w()), 1, 16);
}

// The contribution of `images` images to sums (double, [o][i][j][c]), their inputs already in
// planes (one Layout after the other), dy pointing at the first one's gradient.
void add_images(const Conv2dShape& s, const Layout& l, int64_t images, const float* planes,
                const float* dy, double* sums) {
  const int64_t out_h = s.out_h(), out_w = s.out_w(), dy_channel = out_h * out_w;
  const int64_t out_image = s.out_channels * dy_channel;
  const int64_t row_stride = s.kernel_h * kKernelWidth * s.in_channels;  // sums per o
  for (int64_t g = 0; g < l.groups; ++g)
    for (int64_t i = 0; i < s.kernel_h; ++i)
      for (int64_t o0 = 0; o0 < s.out_channels; o0 += kOutputBlock) {
        __m512 acc[kOutputBlock][kKernelWidth];
        for (auto& a : acc)
          for (auto& v : a) v = _mm512_setzero_ps();
        for (int64_t n = 0; n < images; ++n) {
          const float* plane = planes + n * l.floats() + g * l.plane;
          const float* grad = dy + n * out_image + o0 * dy_channel;
          if (s.stride_w == 1)
            accumulate_row_taps<1>(plane, l.padded_w, s.stride_h, 1, out_h, out_w, i, grad,
                                   dy_channel, acc);
          else
            accumulate_row_taps<0>(plane, l.padded_w, s.stride_h, s.stride_w, out_h, out_w, i,
                                   grad, dy_channel, acc);
        }
        add_to_sums(acc, sums + (o0 * s.kernel_h + i) * kKernelWidth * s.in_channels + g * kLanes,
                    row_stride, s.in_channels);
      }
}

// Per thread, in floats: the copies of a chunk of images and the double sums of the whole weight.
int64_t thread_floats(const Conv2dShape& s) {
  return images_per_chunk(s) * Layout(s).floats() + 2 * s.weight_size();
}

}  // namespace

// Where it beats the grid kernel, measured with bench-conv-shapes (1 thread, batch 64, fastest of
// 15 runs, interleaved with main's kernels on a loaded machine; docs/results-cpu.md §1): 1.7x on
// 16 -> 16 channels at 28x28, 2.7x on 16 -> 32 at 28x28 stride 2, 1.6x on 32 -> 32 at 14x14, 1.4x
// on 32 -> 64 at 14x14 stride 2, 1.35x on 64 -> 64 at 7x7 (with gathers instead of the transposes
// the copy cost 1.2-1.3x of that). With 4x4 outputs it was 0.94-1.0x (64 -> 128 stride 2 against
// im2col, 128 -> 128 against direct::small): too little work per image for its copy, so it needs
// an output at least 7 columns wide. It also needs whole vectors of input channels, whole tiles of
// output channels and a 3-column kernel.
bool applies(const Conv2dShape& s, Pass pass) {
  return pass == Pass::weight && s.in_channels % kLanes == 0 && s.in_channels > 0 &&
         s.out_channels % kOutputBlock == 0 && s.out_channels > 0 && s.kernel_w == kKernelWidth &&
         s.kernel_h >= 1 && s.pad_h >= 0 && s.pad_w >= 0 && s.out_h() > 0 && s.out_w() >= 7 &&
         s.stride_h >= 1 && s.stride_w >= 1;
}

// dw += dy (x) x over the batch: each thread sums its images into its own double sums ([o][i][j][c]),
// added to dw ([o][c][i][j]) in thread order.
void backward_weight(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* dy,
                     float* dw) {
  const Layout l(s);
  const Scratch<float> scratch = reserve_scratch<float>(st, 0, thread_floats(s));
  const int64_t in_image = s.x_image_stride(), out_image = s.out_channels * s.out_h() * s.out_w();
  const int64_t weights = s.weight_size();
  const int64_t chunk = images_per_chunk(s);
  auto sums_of = [&](int t) {
    return reinterpret_cast<double*>(scratch.of_thread(t) + chunk * l.floats());
  };
  int used_threads = 1;
  run_threads(st, [&](int t, int threads) {
    if (t == 0) used_threads = threads;
    float* planes = scratch.of_thread(t);
    double* sums = sums_of(t);
    std::fill(sums, sums + weights, 0.0);
    const int64_t end = share(s.batch, t + 1, threads);
    for (int64_t image = share(s.batch, t, threads); image < end; image += chunk) {
      const int64_t images = std::min(chunk, end - image);
      for (int64_t n = 0; n < images; ++n)
        copy_channels_last(s, l, x + (image + n) * in_image, planes + n * l.floats());
      add_images(s, l, images, planes, dy + image * out_image, sums);
    }
  });
  // dw[o][c][i][j] += the threads' sums[o][i][j][c], in thread order.
  const int64_t taps = s.kernel_h * s.kernel_w;
  run_threads(st, [&](int t, int threads) {
    for (int64_t e = share(weights, t, threads); e < share(weights, t + 1, threads); ++e) {
      const int64_t o = e / (s.in_channels * taps), c = e / taps % s.in_channels, k = e % taps;
      const int64_t from = (o * taps + k) * s.in_channels + c;
      double sum = 0;
      for (int u = 0; u < used_threads; ++u) sum += sums_of(u)[from];
      dw[e] = static_cast<float>(dw[e] + sum);
    }
  });
}

int64_t backward_weight_scratch_floats(const Conv2dShape& s, int threads) {
  return scratch_floats(0, thread_floats(s), threads);
}

}  // namespace petra::kernels::cpu::conv2d::direct::channels
#endif  // PETRA_CONV_DIRECT
