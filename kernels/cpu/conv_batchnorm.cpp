// kernels/cpu/conv_batchnorm.cpp: the stem's 3x3 convolution of a one-channel image, batch norm
// and ReLU in one op that never stores the convolution's output (kernels/conv_batchnorm.hpp says
// why and what it computes). AVX-512 only (conv_batchnorm_relu_fits is false elsewhere).
//
// Channels on the lanes. A position's 16 output channels of one block of channels are one vector:
// z = bias + sum over the 9 taps of weight_vector[tap] * x[position + tap] (the image's value
// broadcast), so the 9 weight vectors stay in registers for a whole image and no input is ever
// loaded shifted or unaligned. 16 positions are computed at once (16 independent chains of FMAs).
// In this layout the batch norm's per-channel sums and the weight gradient's (dz times the image
// under each tap, summed over positions) are plain vector accumulators; only y (written) and dy
// (read) are planes in memory, and they cross over with a 16 x 16 transpose per block of 16
// positions (conv2d_direct.hpp's transpose16).
//
// Work is split as in kernels/cpu/batchnorm.cpp: each thread (a "part") takes a contiguous run of
// samples; per image it copies the image into a zero-padded buffer (h + 2 rows of w + 2 floats).
// Sums: float vector accumulators over one image's positions, then added per image into the part's
// double per-channel totals; after a barrier the parts' totals are added in part order. So the
// bits depend only on the number of parts (threads).
#include "petra/kernels/conv_batchnorm.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "petra/kernels/batchnorm.hpp"
#include "petra/kernels/cpu/batchnorm_maps.hpp"
#include "petra/kernels/cpu/conv2d_algorithms.hpp"
#include "petra/kernels/cpu/parallel.hpp"
#if PETRA_CONV_DIRECT
#include "petra/kernels/cpu/conv2d_direct.hpp"
#endif

namespace petra::kernels::cpu {

namespace {

constexpr std::int64_t kLanes = 16;  // channels per vector, and positions per block
constexpr int kTaps = 9;             // a 3x3 kernel on one input channel

std::int64_t round_up(std::int64_t n, std::int64_t m) { return (n + m - 1) / m * m; }

// The sizes the passes use, from the convolution's shape.
struct Geometry {
  std::int64_t batch, channels, h, w, hp, wp, plane, blocks, x_stride;
  explicit Geometry(const Conv2dShape& c)
      : batch(c.batch), channels(c.out_channels), h(c.in_h), w(c.in_w), hp(c.in_h + 2), wp(c.in_w + 2),
        plane(c.in_h * c.in_w), blocks((c.in_h * c.in_w + kLanes - 1) / kLanes), x_stride(c.x_image_stride()) {}
};

// Per-part scratch, in floats: the padded image, then `sums` double totals per channel (the
// forward's two; the backward's two, then the bias's and the 9 taps' of the weight gradient).
// Parts lie `pitch` floats apart (a multiple of 16: each part starts on a 64-byte line).
constexpr int kSums = 2 + 1 + kTaps;
struct PartLayout {
  std::int64_t padded_floats, pitch;
  explicit PartLayout(const Geometry& g)
      : padded_floats(round_up(g.hp * g.wp, kLanes)),
        pitch(padded_floats + 2 * kSums * g.channels + 256) {}
};

#if PETRA_CONV_DIRECT
using conv2d::direct::transpose16;

// z at sample 0, channel c, position (0, 0), straight from x: the forward's shift for channel c
// (any value near the channel's values keeps sum(d^2)/n - (sum(d)/n)^2 from cancelling).
double first_value(const Geometry& g, const float* x, const float* w, const float* bias, std::int64_t c) {
  double z = bias ? bias[c] : 0.0;
  for (std::int64_t ky = 0; ky < 3; ++ky)
    for (std::int64_t kx = 0; kx < 3; ++kx) {
      const std::int64_t iy = ky - 1, ix = kx - 1;
      if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) z += double(w[c * kTaps + ky * 3 + kx]) * x[iy * g.w + ix];
    }
  return z;
}

// Sample-part count, as batch norm's: threads that get at least kMinValuesPerThread outputs each.
int sample_parts(const StreamHandle& s, const Geometry& g) {
  const std::int64_t outputs = g.batch * g.channels * g.plane;
  return int(std::max<std::int64_t>(1, std::min<std::int64_t>(threads_with_share(s, outputs), g.batch)));
}

// Copies image n of x into `padded`, zeros around it (the padding of 1).
void pad_image(const Geometry& g, const float* x, std::int64_t n, float* padded, std::int64_t padded_floats) {
  std::fill(padded, padded + padded_floats, 0.0f);
  for (std::int64_t iy = 0; iy < g.h; ++iy)
    std::memcpy(padded + (iy + 1) * g.wp + 1, x + n * g.x_stride + iy * g.w, sizeof(float) * g.w);
}

// The offsets in the padded image of positions [0, blocks * 16): position p = (oy, ox) -> oy * wp + ox
// (its tap (0, 0)); positions past the plane read the first one.
std::vector<std::int32_t> position_offsets(const Geometry& g) {
  std::vector<std::int32_t> off(std::size_t(g.blocks * kLanes), 0);
  for (std::int64_t p = 0; p < g.plane; ++p) off[std::size_t(p)] = std::int32_t((p / g.w) * g.wp + p % g.w);
  return off;
}

// z at position j of the 16 at `off`, for the 16 channels whose weight vectors are wv. Every pass
// computes z with this one function: the same bits (taps added in the order ky, then kx).
[[gnu::always_inline]] inline __m512 conv_position(const float* padded, std::int64_t wp, const std::int32_t* off,
                                                   int j, const __m512 (&wv)[kTaps], __m512 bias) {
  const float* row0 = padded + off[j];
  const float* row1 = row0 + wp;
  const float* row2 = row1 + wp;
  __m512 acc = bias;
  acc = _mm512_fmadd_ps(_mm512_set1_ps(row0[0]), wv[0], acc);
  acc = _mm512_fmadd_ps(_mm512_set1_ps(row0[1]), wv[1], acc);
  acc = _mm512_fmadd_ps(_mm512_set1_ps(row0[2]), wv[2], acc);
  acc = _mm512_fmadd_ps(_mm512_set1_ps(row1[0]), wv[3], acc);
  acc = _mm512_fmadd_ps(_mm512_set1_ps(row1[1]), wv[4], acc);
  acc = _mm512_fmadd_ps(_mm512_set1_ps(row1[2]), wv[5], acc);
  acc = _mm512_fmadd_ps(_mm512_set1_ps(row2[0]), wv[6], acc);
  acc = _mm512_fmadd_ps(_mm512_set1_ps(row2[1]), wv[7], acc);
  acc = _mm512_fmadd_ps(_mm512_set1_ps(row2[2]), wv[8], acc);
  return acc;
}

// z[j] = the channels of position j, for the 16 positions at `off`. Unrolled in the forward's
// passes, whose 16 chains of 9 FMAs then interleave with z in registers (0.59 -> 0.53 ms per forward
// of 64 images at 28x28, cold); the backward's passes, which keep more accumulators live, ran 5%
// slower unrolled (docs/results-cpu.md §1).
template <bool Unrolled>
[[gnu::always_inline]] inline void conv_block(const float* padded, std::int64_t wp, const std::int32_t* off,
                                              const __m512 (&wv)[kTaps], __m512 bias, __m512 (&z)[kLanes]) {
  if constexpr (Unrolled) {
#pragma GCC unroll 16
    for (int j = 0; j < kLanes; ++j) z[j] = conv_position(padded, wp, off, j, wv, bias);
  } else {
#pragma GCC unroll 1
    for (int j = 0; j < kLanes; ++j) z[j] = conv_position(padded, wp, off, j, wv, bias);
  }
}

// The weight vectors of channels [16 cv, 16 cv + 16): wv[t] lane i = w[16 cv + i][tap t].
void load_weights(const float* w, std::int64_t cv, __m512 (&wv)[kTaps]) {
  alignas(64) float lanes[kLanes];
  for (int t = 0; t < kTaps; ++t) {
    for (int i = 0; i < kLanes; ++i) lanes[i] = w[(cv * kLanes + i) * kTaps + t];
    wv[t] = _mm512_load_ps(lanes);
  }
}

// Lanes of v added into sums[0, 16), in double.
void add_lanes(__m512 v, double* sums) {
  alignas(64) float lanes[kLanes];
  _mm512_store_ps(lanes, v);
  for (int i = 0; i < kLanes; ++i) sums[i] += lanes[i];
}

// Positions of block b that lie in the plane, and the mask of them.
std::int64_t valid_positions(const Geometry& g, std::int64_t b) { return std::min(kLanes, g.plane - b * kLanes); }
__mmask16 lane_mask(std::int64_t count) { return __mmask16(count >= kLanes ? 0xFFFFu : (1u << count) - 1u); }

// Channels [16 cv, 16 cv + 16) of a per-channel array as a vector.
__m512 channel_vector(const std::vector<float>& per_channel, std::int64_t cv) {
  return _mm512_loadu_ps(per_channel.data() + cv * kLanes);
}

// Calls image(n, cv, z_of) for the part's samples [n0, n1) and every block of 16 channels cv, where
// z_of(b, z) computes z for block b of 16 positions (z[j]: position 16 b + j's channels). The image
// is padded once per sample, the weights loaded once per (sample, channel block). Each pass keeps
// its accumulators local to `image`, where they stay in registers.
template <bool Unrolled = false, class Image>
void for_each_image(const Geometry& g, const PartLayout& l, float* padded, std::int64_t n0, std::int64_t n1,
                    const float* x, const float* w, const float* bias, const std::vector<std::int32_t>& off,
                    Image&& image) {
  for (std::int64_t n = n0; n < n1; ++n) {
    pad_image(g, x, n, padded, l.padded_floats);
    for (std::int64_t cv = 0; cv < g.channels / kLanes; ++cv) {
      __m512 wv[kTaps];
      load_weights(w, cv, wv);
      const __m512 bias_v = bias ? _mm512_loadu_ps(bias + cv * kLanes) : _mm512_setzero_ps();
      image(n, cv, [&](std::int64_t b, __m512 (&z)[kLanes]) {
        conv_block<Unrolled>(padded, g.wp, off.data() + b * kLanes, wv, bias_v, z);
      });
    }
  }
}

// The gradient that reaches batch norm: dy where the forward's y > 0, that is where its map
// fma(z - mean, scale, shift) > 0 (zc = z - mean): the forward's exact bits, so its exact mask.
[[gnu::always_inline]] inline __m512 passed_gradient(__m512 zc, __m512 scale, __m512 shift, __m512 dy) {
  const __mmask16 passed = _mm512_cmp_ps_mask(_mm512_fmadd_ps(zc, scale, shift), _mm512_setzero_ps(), _CMP_GT_OQ);
  return _mm512_maskz_mov_ps(passed, dy);
}

// How many blocks of 16 positions ahead load_gradient_block prefetches each of its 16 rows. The
// rows are 16 planes read side by side, more streams than the hardware prefetcher follows: without
// it the backward ran twice as slow on a cold dy (as a training step leaves it) as on a warm one.
constexpr std::int64_t kPrefetchBlocks = 6;

// Loads dy at (sample n, channels [16 cv, +16), positions of block b) with the channels on the
// lanes: rows[j] = position 16 b + j's gradient (positions past the plane: 0).
void load_gradient_block(const Geometry& g, const float* dy, std::int64_t n, std::int64_t cv, std::int64_t b,
                         __m512 (&rows)[kLanes]) {
  const __mmask16 mask = lane_mask(valid_positions(g, b));
  const float* const first = dy + (n * g.channels + cv * kLanes) * g.plane + b * kLanes;
  for (int i = 0; i < kLanes; ++i) {
    rows[i] = _mm512_maskz_loadu_ps(mask, first + i * g.plane);
    _mm_prefetch(reinterpret_cast<const char*>(first + i * g.plane + kPrefetchBlocks * kLanes), _MM_HINT_T0);
  }
  transpose16(rows);
}
#endif  // PETRA_CONV_DIRECT

}  // namespace

bool conv_batchnorm_relu_fits(const Conv2dShape& c) {
  return PETRA_CONV_DIRECT && c.in_channels == 1 && c.kernel_h == 3 && c.kernel_w == 3 && c.stride_h == 1 &&
         c.stride_w == 1 && c.pad_h == 1 && c.pad_w == 1 && c.batch >= 1 && c.in_h >= 1 && c.in_w >= 1 &&
         c.out_channels >= kLanes && c.out_channels % kLanes == 0 && c.in_h * c.in_w < (std::int64_t(1) << 30);
}

std::size_t conv_batchnorm_relu_workspace_bytes(const Conv2dShape& conv, int threads) {
  const Geometry g(conv);
  return sizeof(float) * std::size_t(PartLayout(g).pitch) * std::size_t(std::max(threads, 1)) + 64;
}

#if PETRA_CONV_DIRECT
namespace {
// Part `part`'s padded image and double sums, 64-byte aligned.
struct PartScratch {
  float* padded;
  double* totals;  // kSums arrays of `channels` doubles: totals + k * channels
};
PartScratch part_scratch(void* scratch, const PartLayout& l, int part) {
  const auto base = (reinterpret_cast<std::uintptr_t>(scratch) + 63) & ~std::uintptr_t(63);
  float* p = reinterpret_cast<float*>(base) + part * l.pitch;
  return {p, reinterpret_cast<double*>(p + l.padded_floats)};
}

// What both passes of both directions set up: the stream's threads, the sizes, one scratch block
// for every part, and the positions' offsets in the padded image.
struct Setup {
  Geometry g;
  PartLayout layout;
  int threads;
  void* scratch;
  std::vector<std::int32_t> offsets;
  Setup(const StreamHandle& s, const Conv2dShape& conv)
      : g(conv), layout(g), threads(sample_parts(s, g)),
        scratch(s.scratch(conv_batchnorm_relu_workspace_bytes(conv, threads))), offsets(position_offsets(g)) {
    use_threads(s);
  }
};

// Channel c's total of the parts' double array k (totals + k * channels), the parts added in order.
double parts_total(const Setup& run, int parts, int k, std::int64_t c) {
  double total = 0;
  for (int q = 0; q < parts; ++q) total += part_scratch(run.scratch, run.layout, q).totals[k * run.g.channels + c];
  return total;
}
}  // namespace
#endif

void conv_batchnorm_relu_forward_train(const StreamHandle& s, const Conv2dShape& conv, double eps, double momentum,
                                       const float* x, const float* w, const float* bias, const float* gamma,
                                       const float* beta, float* y, float* saved_mean, float* saved_invstd,
                                       float* running_mean, float* running_var, float* affine) {
#if PETRA_CONV_DIRECT
  const Setup run(s, conv);
  const Geometry& g = run.g;
  std::vector<float> shift(g.channels);
  for (std::int64_t c = 0; c < g.channels; ++c) shift[c] = float(first_value(g, x, w, bias, c));
  std::vector<float> map_mean(g.channels), map_scale(g.channels), map_bias(g.channels);  // pass 2's map
  const double count = double(g.batch) * double(g.plane);

  run_parts(run.threads, [&](int part, int parts) {
    const PartScratch p = part_scratch(run.scratch, run.layout, part);
    double* const sums = p.totals;
    double* const squares = p.totals + g.channels;
    std::fill(sums, sums + 2 * g.channels, 0.0);
    const std::int64_t n0 = share(g.batch, part, parts), n1 = share(g.batch, part + 1, parts);

    // Pass 1: per channel, the sums of d = z - shift and d^2, in float over one image (two
    // accumulators each, alternating positions), then in double.
    for_each_image<true>(g, run.layout, p.padded, n0, n1, x, w, bias, run.offsets,
                         [&](std::int64_t, std::int64_t cv, auto&& z_of) {
      const __m512 sh = _mm512_loadu_ps(shift.data() + cv * kLanes);
      __m512 sum[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()}, square[2] = {sum[0], sum[1]};
      for (std::int64_t b = 0; b < g.blocks; ++b) {
        __m512 z[kLanes];
        z_of(b, z);
        const std::int64_t valid = valid_positions(g, b);
        for (int j = 0; j < kLanes; ++j) {
          if (j >= valid) break;
          const __m512 d = _mm512_sub_ps(z[j], sh);
          sum[j & 1] = _mm512_add_ps(sum[j & 1], d);
          square[j & 1] = _mm512_fmadd_ps(d, d, square[j & 1]);
        }
      }
      add_lanes(_mm512_add_ps(sum[0], sum[1]), sums + cv * kLanes);
      add_lanes(_mm512_add_ps(square[0], square[1]), squares + cv * kLanes);
    });
    sync_parts();

    const bn::StatisticsOut out{saved_mean, saved_invstd, running_mean, running_var, affine};
    for (std::int64_t c = share(g.channels, part, parts); c < share(g.channels, part + 1, parts); ++c) {
      const bn::AffineMap m = bn::finish_statistics(c, parts_total(run,  parts, 0, c),
                                                    parts_total(run,  parts, 1, c), shift[c], count,
                                                    eps, momentum, gamma, beta, out);
      map_mean[c] = m.mean;
      map_scale[c] = m.scale;
      map_bias[c] = m.bias;
    }
    sync_parts();

    // Pass 2: y = relu(BN(z)), transposed back to planes: the op's only write.
    const __m512 zero = _mm512_setzero_ps();
    for_each_image<true>(g, run.layout, p.padded, n0, n1, x, w, bias, run.offsets,
                         [&](std::int64_t n, std::int64_t cv, auto&& z_of) {
      const __m512 mean = channel_vector(map_mean, cv);
      const __m512 scale = channel_vector(map_scale, cv);
      const __m512 shift_v = channel_vector(map_bias, cv);
      float* const out = y + (n * g.channels + cv * kLanes) * g.plane;
      for (std::int64_t b = 0; b < g.blocks; ++b) {
        __m512 rows[kLanes];
        z_of(b, rows);
        for (int j = 0; j < kLanes; ++j)  // max(0, v): v < 0 ? 0 : v, NaN kept (relu_of)
          rows[j] = _mm512_max_ps(zero, _mm512_fmadd_ps(_mm512_sub_ps(rows[j], mean), scale, shift_v));
        transpose16(rows);
        const __mmask16 mask = lane_mask(valid_positions(g, b));
        for (int i = 0; i < kLanes; ++i) {
          _mm512_mask_storeu_ps(out + i * g.plane + b * kLanes, mask, rows[i]);
          _m_prefetchw(out + i * g.plane + (b + kPrefetchBlocks) * kLanes);
        }
      }
    });
  });
#else
  (void)s, (void)conv, (void)eps, (void)momentum, (void)x, (void)w, (void)bias, (void)gamma, (void)beta, (void)y,
      (void)saved_mean, (void)saved_invstd, (void)running_mean, (void)running_var, (void)affine;
#endif
}

void conv_batchnorm_relu_backward(const StreamHandle& s, const Conv2dShape& conv, const float* x, const float* w,
                                  const float* bias, const float* affine, const float* dy, const float* gamma,
                                  const float* saved_mean, const float* saved_invstd, float* dw, float* dbias,
                                  float* dgamma, float* dbeta) {
#if PETRA_CONV_DIRECT
  const Setup run(s, conv);
  const Geometry& g = run.g;
  std::vector<float> coefficient_a(g.channels), coefficient_b(g.channels), coefficient_k(g.channels);
  const double count = double(g.batch) * double(g.plane);
  // The forward's map per channel (affine: mean, scale, bias), whose fma on z gives y's exact bits
  // and so its mask. (saved_mean is the same float as the map's mean.)
  (void)saved_mean;
  std::vector<float> map_mean(g.channels), map_scale(g.channels), map_bias(g.channels);
  for (std::int64_t c = 0; c < g.channels; ++c) {
    map_mean[c] = affine[3 * c];
    map_scale[c] = affine[3 * c + 1];
    map_bias[c] = affine[3 * c + 2];
  }
  const auto forward_vectors = [&](std::int64_t cv, __m512& mean, __m512& scale, __m512& shift) {
    mean = channel_vector(map_mean, cv);
    scale = channel_vector(map_scale, cv);
    shift = channel_vector(map_bias, cv);
  };
  const __m512 zero = _mm512_setzero_ps();

  run_parts(run.threads, [&](int part, int parts) {
    const PartScratch p = part_scratch(run.scratch, run.layout, part);
    double* const totals = p.totals;
    std::fill(totals, totals + kSums * g.channels, 0.0);
    const std::int64_t n0 = share(g.batch, part, parts), n1 = share(g.batch, part + 1, parts);
    double* const dy_sums = totals;
    double* const centered_sums = totals + g.channels;

    // Pass 1: per channel, sum(g) and sum(g * (z - mean)), g = dy where y > 0.
    for_each_image(g, run.layout, p.padded, n0, n1, x, w, bias, run.offsets,
                   [&](std::int64_t n, std::int64_t cv, auto&& z_of) {
      __m512 mean, scale, shift;
      forward_vectors(cv, mean, scale, shift);
      __m512 sum[2] = {zero, zero}, centered[2] = {zero, zero};
      for (std::int64_t b = 0; b < g.blocks; ++b) {
        __m512 z[kLanes], grad[kLanes];
        z_of(b, z);
        load_gradient_block(g, dy, n, cv, b, grad);
        const std::int64_t valid = valid_positions(g, b);
        for (int j = 0; j < kLanes; ++j) {
          if (j >= valid) break;
          const __m512 zc = _mm512_sub_ps(z[j], mean);
          const __m512 gv = passed_gradient(zc, scale, shift, grad[j]);
          sum[j & 1] = _mm512_add_ps(sum[j & 1], gv);
          centered[j & 1] = _mm512_fmadd_ps(gv, zc, centered[j & 1]);
        }
      }
      add_lanes(_mm512_add_ps(sum[0], sum[1]), dy_sums + cv * kLanes);
      add_lanes(_mm512_add_ps(centered[0], centered[1]), centered_sums + cv * kLanes);
    });
    sync_parts();

    for (std::int64_t c = share(g.channels, part, parts); c < share(g.channels, part + 1, parts); ++c) {
      const bn::GradientCoefficients k =
          bn::gradient_coefficients(c, parts_total(run,  parts, 0, c),
                                    parts_total(run,  parts, 1, c), saved_invstd, gamma, count, dgamma,
                                    dbeta);
      coefficient_a[c] = k.a;
      coefficient_b[c] = k.b;
      coefficient_k[c] = k.k;
    }
    sync_parts();

    // Pass 2: dz = a*g + b*(z - mean) + k per position, straight into the bias's sum and the 9
    // taps' sums (dz times the image under the tap): dz is never stored.
    double* const bias_sums = totals + 2 * g.channels;
    double* const tap_sums = totals + 3 * g.channels;  // [tap][channel]
    for_each_image(g, run.layout, p.padded, n0, n1, x, w, bias, run.offsets,
                   [&](std::int64_t n, std::int64_t cv, auto&& z_of) {
      __m512 mean, scale, shift;
      forward_vectors(cv, mean, scale, shift);
      const __m512 a = channel_vector(coefficient_a, cv);
      const __m512 bb = channel_vector(coefficient_b, cv);
      const __m512 k = channel_vector(coefficient_k, cv);
      __m512 bias_acc = zero, tap_acc[kTaps];
      for (int t = 0; t < kTaps; ++t) tap_acc[t] = zero;
      for (std::int64_t b = 0; b < g.blocks; ++b) {
        __m512 z[kLanes], grad[kLanes];
        z_of(b, z);
        load_gradient_block(g, dy, n, cv, b, grad);
        const std::int32_t* position = run.offsets.data() + b * kLanes;
        const std::int64_t valid = valid_positions(g, b);
        for (int j = 0; j < kLanes; ++j) {
          if (j >= valid) break;
          const __m512 zc = _mm512_sub_ps(z[j], mean);
          const __m512 gv = passed_gradient(zc, scale, shift, grad[j]);
          const __m512 dz = _mm512_fmadd_ps(a, gv, _mm512_fmadd_ps(bb, zc, k));
          bias_acc = _mm512_add_ps(bias_acc, dz);
          const float* row0 = p.padded + position[j];
          const float* row1 = row0 + g.wp;
          const float* row2 = row1 + g.wp;
          for (int t = 0; t < 3; ++t) {
            tap_acc[t] = _mm512_fmadd_ps(dz, _mm512_set1_ps(row0[t]), tap_acc[t]);
            tap_acc[3 + t] = _mm512_fmadd_ps(dz, _mm512_set1_ps(row1[t]), tap_acc[3 + t]);
            tap_acc[6 + t] = _mm512_fmadd_ps(dz, _mm512_set1_ps(row2[t]), tap_acc[6 + t]);
          }
        }
      }
      add_lanes(bias_acc, bias_sums + cv * kLanes);
      for (int t = 0; t < kTaps; ++t) add_lanes(tap_acc[t], tap_sums + t * g.channels + cv * kLanes);
    });
    sync_parts();

    for (std::int64_t c = share(g.channels, part, parts); c < share(g.channels, part + 1, parts); ++c) {
      if (dbias) dbias[c] = float(dbias[c] + parts_total(run,  parts, 2, c));
      for (int t = 0; t < kTaps; ++t)
        dw[c * kTaps + t] = float(dw[c * kTaps + t] + parts_total(run,  parts, 3 + t, c));
    }
  });
#else
  (void)s, (void)conv, (void)x, (void)w, (void)bias, (void)affine, (void)dy, (void)gamma, (void)saved_mean,
      (void)saved_invstd, (void)dw, (void)dbias, (void)dgamma, (void)dbeta;
#endif
}

}  // namespace petra::kernels::cpu
