// kernels/cpu/conv2d_direct_pointwise.cpp: the 1x1 stride-2 convolutions (float, AVX-512) of the
// downsampling shortcuts (a RevNet's or ResNet's projection: 16 -> 32 channels at 28x28, 32 -> 64
// at 14x14, 64 -> 128 at 7x7 in the benchmark network), all three passes. kernels/cpu/conv2d.cpp
// chooses them wherever `applies` (below, with the measurements) says so. Compiled only with
// AVX-512 (PETRA_CONV_DIRECT).
//
// The math: a 1x1 stride-2 convolution reads only the even pixels x[c][2 r][2 q] of each image, and
// is then a matrix product per image:
//   y[o][p]       = sum_c w[o][c] xe[c][p]            (p = r * out_w + q, the output pixels)
//   dxe[c][p]     = sum_o w[o][c] dy[o][p]            (dx = dxe on the even pixels, 0 elsewhere)
//   dw[o][c]     += sum over images and p of dy[o][p] xe[c][p]
// im2col + GEMM did this at 12-37% of the FMA peak (bench-conv-shapes, 2026-12-05): the matrices
// are small (16 x 196 by 32 x 16 per image at 28x28) and Eigen's packing costs as much as the
// products, on top of the im2col gather. Here:
//   - forward and backward-data: the image's even pixels are gathered once into planes of whole
//     vectors (xe, two loads and a permute per row: copy_even), and a register tile of 8 output
//     planes by up to 3 vectors of pixels (24 accumulators) takes per input channel 3 loads and 8
//     broadcast weights (the weight packed in panels of 8, pack_weight). The forward stores its
//     planes straight into y; backward-data reads dy's planes in place and writes dxe, which one
//     expand per 8 values spreads onto dx's even columns (odd rows and columns: zeros).
//   - backward-weight: dw's sums run over pixels, so the lanes hold 16 input channels instead (as
//     in conv2d_direct_channels.cpp): a row of 16 even pixels of 16 channels is transposed in
//     registers into 16 pixel-major vectors (xe with the channels innermost), and the tile of 8
//     output channels by 1 or 2 vectors of input channels takes per pixel 1 or 2 loads and 8
//     broadcasts of dy (Winograd's weight products, direct::weight_tile, image by image). Float
//     sums over about 1024 terms (a chunk of images) are added to double sums, as the other weight
//     gradients do.
//   - every pass prefetches the next image's (chunk's) input and output a share per tile step
//     (direct::prefetch_part): in a training step they come from DRAM, and without it the cold
//     forward was slower than im2col's (docs/results-cpu.md §1, 2026-12-05).
// Determinism: each thread takes a fixed range of images (backward-weight: its own double sums,
// added to dw in thread order), so the bits depend on the thread count only.
#include "petra/kernels/cpu/conv2d_algorithms.hpp"

#if PETRA_CONV_DIRECT
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "petra/kernels/cpu/conv2d_direct.hpp"
#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu::conv2d::direct::pointwise {
namespace {

constexpr int kBlock = 8;       // output (backward-data: input) channels of a tile: broadcast weights
constexpr int kMaxVectors = 3;  // vectors of pixels of a tile: 8 x 3 accumulators

// The output pixels of one image, as planes of whole vectors.
struct Pixels {
  int64_t count;    // out_h * out_w
  int64_t plane;    // count rounded up to whole vectors
  int64_t vectors;  // plane / 16
  __mmask16 tail;   // the lanes of the last vector inside the image
};

Pixels pixels_of(const Conv2dShape& s) {
  const int64_t count = s.out_h() * s.out_w(), plane = round_up(count, kLanes);
  return {count, plane, plane / kLanes, first_lanes(count - (plane - kLanes))};
}

// x's even pixels of one image: planes[c][r * out_w + q] = x[c][2 r][2 q], zeros from the last
// pixel to the end of each plane (`plane` floats apart).
void gather_even(const Conv2dShape& s, const Pixels& px, const float* x, float* planes) {
  const int64_t out_h = s.out_h(), out_w = s.out_w();
  for (int64_t c = 0; c < s.in_channels; ++c) {
    const float* from = x + c * s.in_h * s.in_w;
    float* to = planes + c * px.plane;
    for (int64_t r = 0; r < out_h; ++r) copy_even(from + 2 * r * s.in_w, out_w, to + r * out_w);
    zero_row(px.plane - px.count, to + px.count);
  }
}

// dx's planes of one image from the gradients of its even pixels: dx[c][2 r][2 q] =
// planes[c][r * out_w + q], zero on the odd rows and columns. One expand spreads 8 values over a
// vector's even lanes.
void scatter_even(const Conv2dShape& s, const Pixels& px, const float* planes, float* dx) {
  const int64_t out_w = s.out_w();
  for (int64_t c = 0; c < s.in_channels; ++c)
    for (int64_t h = 0; h < s.in_h; ++h) {
      float* row = dx + (c * s.in_h + h) * s.in_w;
      if (h % 2 == 1) {
        zero_row(s.in_w, row);
        continue;
      }
      const float* from = planes + c * px.plane + h / 2 * out_w;
      for (int64_t column = 0; column < s.in_w; column += kLanes) {
        const int64_t first = column / 2;  // the value of this vector's lane 0
        const __m512 values = _mm512_maskz_loadu_ps(first_lanes(std::min<int64_t>(8, out_w - first)), from + first);
        store_lanes(row + column, first_lanes(s.in_w - column), _mm512_maskz_expand_ps(0x5555, values));
      }
    }
}

// The products of forward and backward-data: out[i][16 v ..] = (bias[i] or 0) + sum over k <
// depth of panel[k][i] * in[k][16 v ..], for the kBlock planes i of `out` (`out_stride` floats
// apart) and V vectors v. `in`'s planes are `in_stride` floats apart; the last vector's loads and
// stores keep to the lanes of `last` (an image's end: in place in dy and y, nothing of the next
// plane is read or written).
template <int V>
inline void accumulate(int64_t depth, const float* panel, const float* in, int64_t in_stride, __mmask16 last,
                       __m512 (&acc)[kBlock][V]) {
  for (int64_t k = 0; k < depth; ++k, panel += kBlock, in += in_stride) {
    __m512 x[V];
    for (int v = 0; v < V; ++v)
      x[v] = v + 1 < V ? _mm512_loadu_ps(in + v * kLanes) : _mm512_maskz_loadu_ps(last, in + v * kLanes);
    for (int i = 0; i < kBlock; ++i) {
      const __m512 weight = _mm512_set1_ps(panel[i]);
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_fmadd_ps(weight, x[v], acc[i][v]);
    }
  }
}

template <int V>
void products(int64_t depth, const float* panel, const float* in, int64_t in_stride, const float* bias,
              float* out, int64_t out_stride, __mmask16 last) {
  __m512 acc[kBlock][V];
#pragma GCC unroll 32
  for (int i = 0; i < kBlock; ++i) {
    const __m512 start = bias ? _mm512_set1_ps(bias[i]) : _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[i][v] = start;
  }
  accumulate<V>(depth, panel, in, in_stride, last, acc);
  // Unrolled, so that acc is read with constant indices: otherwise GCC keeps acc in memory and
  // stores every accumulator at every step of accumulate's loop (2x slower).
#pragma GCC unroll 32
  for (int i = 0; i < kBlock; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) store_lanes(out + i * out_stride + v * kLanes, v + 1 < V ? 0xFFFF : last, acc[i][v]);
}

// kBlock planes of `out` over all `vectors` vectors of an image, in near-equal groups of at most
// kMaxVectors (13 vectors at 28x28: 2, 3, 2, 3, 3), the image's tail in the last.
void block_of_planes(int64_t depth, const float* panel, const float* in, int64_t in_stride, const float* bias,
                     float* out, int64_t out_stride, const Pixels& px) {
  const int64_t groups = ceil_div(px.vectors, kMaxVectors);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t v0 = share(px.vectors, g, groups), v1 = share(px.vectors, g + 1, groups);
    const __mmask16 last = v1 == px.vectors ? px.tail : __mmask16(0xFFFF);
    const float* from = in + v0 * kLanes;
    float* to = out + v0 * kLanes;
    switch (v1 - v0) {
      case 1: products<1>(depth, panel, from, in_stride, bias, to, out_stride, last); break;
      case 2: products<2>(depth, panel, from, in_stride, bias, to, out_stride, last); break;
      default: products<3>(depth, panel, from, in_stride, bias, to, out_stride, last); break;
    }
  }
}

// The even floats from[2 t], t < n <= 16, in the first n lanes (zeros after): copy_even's tail,
// in a register.
inline __m512 even_floats(const float* from, int64_t n) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const int64_t floats = 2 * n - 1;  // nothing beyond from[2n - 2] is read
  return _mm512_maskz_permutex2var_ps(first_lanes(n), _mm512_maskz_loadu_ps(first_lanes(floats), from), even,
                                      _mm512_maskz_loadu_ps(first_lanes(floats - kLanes), from + kLanes));
}

// x's even pixels of one image with the input channels innermost: rows[p][c] = x[c][2 r][2 q] for
// p = r * out_w + q (in_channels floats a pixel). Per output row and 16 channels: 16 gathers of 16
// even floats, one transpose.
void gather_even_channels_last(const Conv2dShape& s, const float* x, float* rows) {
  const int64_t out_h = s.out_h(), out_w = s.out_w(), plane = s.in_h * s.in_w;
  for (int64_t c0 = 0; c0 < s.in_channels; c0 += kLanes)
    for (int64_t r = 0; r < out_h; ++r) {
      __m512 v[kLanes];  // in registers: the loop that fills it is unrolled (constant indices)
#pragma GCC unroll 16
      for (int i = 0; i < kLanes; ++i) v[i] = even_floats(x + (c0 + i) * plane + 2 * r * s.in_w, out_w);
      transpose16(v);
#pragma GCC unroll 16
      for (int q = 0; q < kLanes; ++q)
        if (q < out_w) _mm512_storeu_ps(rows + (r * out_w + q) * s.in_channels + c0, v[q]);
    }
}

// Images whose terms the float sums of a chunk add up before their addition to the double sums:
// about 1024 terms (5 images at 28x28, 64 at 7x7).
int64_t images_per_chunk(const Conv2dShape& s) {
  return std::clamp<int64_t>(1024 / (s.out_h() * s.out_w()), 1, s.batch);
}

// Backward-weight's floats per thread: a chunk's pixel rows, the chunk's float sums and the double
// sums of the weight (each a multiple of 16 floats: in_channels is, so every part is aligned).
int64_t weight_thread_floats(const Conv2dShape& s) {
  return images_per_chunk(s) * s.out_h() * s.out_w() * s.in_channels + 3 * s.weight_size();
}

}  // namespace

// Where it replaced im2col + GEMM (bench-conv-shapes --cold, 1 thread, batch 64, docs/results-cpu.md
// §1 of 2026-12-05): see there for each pass. It needs a 1x1 kernel at stride 2 without padding,
// whole vectors of input and output channels, and rows of at most 16 outputs (one transpose per
// row in backward-weight).
bool applies(const Conv2dShape& s) {
  return s.kernel_h == 1 && s.kernel_w == 1 && s.stride_h == 2 && s.stride_w == 2 && s.pad_h == 0 && s.pad_w == 0 &&
         s.in_channels > 0 && s.in_channels % kLanes == 0 && s.out_channels > 0 && s.out_channels % kLanes == 0 &&
         s.batch > 0 && s.in_h > 0 && s.in_w > 0 && s.out_w() <= kLanes;
}

// y = w xe + bias, image by image: the even pixels gathered, then tiles of 8 output planes.
void forward(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* w, const float* bias,
             float* y) {
  const Pixels px = pixels_of(s);
  const int64_t ins = s.in_channels, outs = s.out_channels;
  const Scratch<float> scratch = reserve_scratch<float>(st, ins * outs, ins * px.plane);
  pack_weight<kBlock>(st, s, w, scratch.shared);  // panels[o / 8][c][o % 8]
  run_threads(st, [&](int t, int threads) {
    float* planes = scratch.of_thread(t);
    const int64_t end = share(s.batch, t + 1, threads), steps = outs / kBlock;
    for (int64_t n = share(s.batch, t, threads); n < end; ++n) {
      gather_even(s, px, x + n * s.x_image_stride(), planes);
      float* out = y + n * outs * px.count;
      for (int64_t o = 0; o < outs; o += kBlock) {
        if (n + 1 < end) {  // the next image's input and output, a share per step (prefetch_part)
          prefetch_part(x + (n + 1) * s.x_image_stride(), ins * s.in_h * s.in_w, o / kBlock, steps, false);
          prefetch_part(out + outs * px.count, outs * px.count, o / kBlock, steps, true);
        }
        block_of_planes(ins, scratch.shared + o * ins, planes, px.plane, bias ? bias + o : nullptr,
                        out + o * px.count, px.count, px);
      }
    }
  });
}

int64_t forward_scratch_floats(const Conv2dShape& s, int threads) {
  return scratch_floats(s.in_channels * s.out_channels, s.in_channels * pixels_of(s).plane, threads);
}

// dx = the even pixels' gradients w^T dy spread onto dx, image by image.
void backward_data(const StreamHandle& st, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  const Pixels px = pixels_of(s);
  const int64_t ins = s.in_channels, outs = s.out_channels;
  const Scratch<float> scratch = reserve_scratch<float>(st, ins * outs, ins * px.plane);
  pack_flipped_weight<kBlock>(st, s, w, scratch.shared);  // panels[c / 8][o][c % 8] (1x1: nothing flips)
  run_threads(st, [&](int t, int threads) {
    float* planes = scratch.of_thread(t);
    const int64_t end = share(s.batch, t + 1, threads), steps = ins / kBlock, dx_image = ins * s.in_h * s.in_w;
    for (int64_t n = share(s.batch, t, threads); n < end; ++n) {
      const float* grad = dy + n * outs * px.count;
      for (int64_t c = 0; c < ins; c += kBlock) {
        if (n + 1 < end) {  // the next image's dy and dx, a share per step (prefetch_part)
          prefetch_part(grad + outs * px.count, outs * px.count, c / kBlock, steps, false);
          prefetch_part(dx + (n + 1) * dx_image, dx_image, c / kBlock, steps, true);
        }
        block_of_planes(outs, scratch.shared + c * outs, grad, px.count, nullptr, planes + c * px.plane, px.plane, px);
      }
      scatter_even(s, px, planes, dx + n * dx_image);
    }
  });
}

int64_t backward_data_scratch_floats(const Conv2dShape& s, int threads) {
  return forward_scratch_floats(s, threads);
}

// dw += dy xe^T over the batch: each thread sums its images into its own double sums ([o][c], dw's
// layout), added to dw in thread order.
void backward_weight(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* dy, float* dw) {
  const int64_t ins = s.in_channels, outs = s.out_channels, pixels = s.out_h() * s.out_w();
  const int64_t weights = s.weight_size(), chunk = images_per_chunk(s);
  const Scratch<float> scratch = reserve_scratch<float>(st, 0, weight_thread_floats(s));
  auto chunk_sums_of = [&](int t) { return scratch.of_thread(t) + chunk * pixels * ins; };
  auto sums_of = [&](int t) { return reinterpret_cast<double*>(chunk_sums_of(t) + weights); };
  int used_threads = 1;
  run_threads(st, [&](int t, int threads) {
    if (t == 0) used_threads = threads;
    float* rows = scratch.of_thread(t);
    float* chunk_sums = chunk_sums_of(t);
    double* sums = sums_of(t);
    std::fill(sums, sums + weights, 0.0);
    const int64_t end = share(s.batch, t + 1, threads);
    for (int64_t image = share(s.batch, t, threads); image < end; image += chunk) {
      const int64_t images = std::min(chunk, end - image);
      for (int64_t n = 0; n < images; ++n) {
        if (n + 1 < images) prefetch_part(x + (image + n + 1) * s.x_image_stride(), ins * s.in_h * s.in_w, 0, 1, false);
        gather_even_channels_last(s, x + (image + n) * s.x_image_stride(), rows + n * pixels * ins);
      }
      std::fill(chunk_sums, chunk_sums + weights, 0.0f);
      const float* grad = dy + image * outs * pixels;
      const int64_t next = std::min(chunk, end - image - images), steps = outs / kBlock;
      for (int64_t o = 0; o < outs; o += kBlock) {
        for (int64_t n = 0; n < next; ++n)  // the next chunk's x and dy, a share per step (prefetch_part)
          prefetch_part(x + (image + images + n) * s.x_image_stride(), ins * s.in_h * s.in_w, o / kBlock, steps, false);
        prefetch_part(grad + images * outs * pixels, next * outs * pixels, o / kBlock, steps, false);
        if (o + kBlock < outs)  // the next block's dy planes, one short run per image
          for (int64_t n = 0; n < images; ++n) prefetch_lines(grad + n * outs * pixels + (o + kBlock) * pixels, kBlock * pixels);
        // chunk_sums[o + i][c ..] += the image's dy[o + i][p] * rows[p][c ..] over its pixels p
        // (direct::weight_tile: 8 broadcast rows of dy by 1 or 2 vectors of input channels)
        for (int64_t n = 0; n < images; ++n) {
          const float* image_grad = grad + n * outs * pixels + o * pixels;
          const float* image_rows = rows + n * pixels * ins;
          int64_t c = 0;
          for (; c + 2 * kLanes <= ins; c += 2 * kLanes)
            weight_tile<kBlock, 2>(image_grad, pixels, image_rows + c, ins, pixels, chunk_sums + o * ins + c);
          if (c < ins) weight_tile<kBlock, 1>(image_grad, pixels, image_rows + c, ins, pixels, chunk_sums + o * ins + c);
        }
      }
      for (int64_t e = 0; e < weights; e += kLanes) add_to_doubles(_mm512_load_ps(chunk_sums + e), sums + e);
    }
  });
  run_threads(st, [&](int t, int threads) {
    for (int64_t e = share(weights, t, threads); e < share(weights, t + 1, threads); ++e) {
      double sum = 0;
      for (int u = 0; u < used_threads; ++u) sum += sums_of(u)[e];
      dw[e] = static_cast<float>(dw[e] + sum);
    }
  });
}

int64_t backward_weight_scratch_floats(const Conv2dShape& s, int threads) {
  return scratch_floats(0, weight_thread_floats(s), threads);
}

}  // namespace petra::kernels::cpu::conv2d::direct::pointwise
#endif  // PETRA_CONV_DIRECT
