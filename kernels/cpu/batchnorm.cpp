// kernels/cpu/batchnorm.cpp: fast batch normalisation (see kernels/batchnorm.hpp).
//
// Batch norm is memory-bound: a few flops per value, so what matters is how memory is walked.
// Each thread takes a contiguous run of whole samples (a "part"): its reads and, above all, its
// writes stay in one block of memory. (Splitting by channels instead, each thread writing its
// channels' run of every sample, ran no faster on 2 threads than on 1 here, slower on the small
// planes: two cores writing interleaved blocks of one tensor contend, even 64 KB blocks apart;
// contiguous halves run at twice the speed. docs/results-cpu.md §1.) Three phases:
//   pass 1 walks the part's samples in order and adds each one, position by position, into
//          accumulators the size of one sample. No horizontal sums per height*width run (a 4x4
//          plane is one 16-float vector), and 4 samples are added per accumulator update, so the
//          accumulators cost little next to the input stream. Each accumulator sums its part's
//          values in float;
//   totals per channel, in double: the parts' accumulators summed in part order, the channels
//          shared out over the threads (a barrier before and after);
//   pass 2 applies the per-channel formula to the part's samples (y in the forward, dx in the
//          backward).
// One part (one thread) gives the bits of the plain sequential sum; with more parts the float
// sums, and so the last bits, depend on the thread count (as the convolutions' weight gradients).
// Visiting a channel's runs one after another would be simpler, but the runs are only
// height*width floats long and lie channels*height*width apart; jumping between pages that way
// defeats the hardware prefetcher (a few GB/s instead of 25-35 GB/s per core here).
// Pass 1 reads the inputs, pass 2 reads them again (often from L3) and writes the output.
// The fused batch norm + ReLU (kernels/batchnorm.hpp) is the same code with a compile-time flag:
// its forward applies the ReLU in pass 2 as it writes y; its backward reads y beside dy and masks
// dy (y > 0) where passes 1 and 2 load it. No pass is added, and the unfused ReLU's passes (one
// over the output forward, one over dy and y backward, each with a tensor of its own) are gone.
// The mapped pair (batchnorm_relu_*_mapped, what ops uses on the CPU) goes one step further: the
// forward also saves the per-channel map it applied (float mean, scale, bias), and the backward
// applies it to x again instead of reading y: the same fma on the same floats, so the same mask
// bit for bit, and two tensors read per value in each pass instead of three (in a training step,
// where every input comes from DRAM, 12-24% of the backward: docs/results-cpu.md §1).
// The coupling fused with F's last batch norm + ReLU (batchnorm_relu_coupling_*) is the forward
// with another destination for pass 2 (CouplingOutput): the run of f it computes is added into,
// or subtracted from, the run of the other stream, and the moved stream is copied beside it.
// Training forward and backward take 3 (the mapped backward 5) arrays of channels*height*width
// floats (+ padding) of scratch per thread from s.workspace, which must be set.
#include "petra/kernels/batchnorm.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "petra/kernels/cpu/batchnorm_maps.hpp"
#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu {

namespace {

// Samples added per accumulator update in pass 1.
constexpr int kGroup = 4;

// Threads for `shape`, one part of the samples each: as many as get kMinValuesPerThread values
// (threads_with_share, kernels/cpu/parallel.hpp), at most one per sample.
int sample_parts(const StreamHandle& s, const BatchNormShape& shape) {
  return int(std::max<std::int64_t>(1, std::min<std::int64_t>(threads_with_share(s, shape.size()), shape.batch)));
}

// `count` per-position arrays of one sample for each of `parts` parts, in scratch: at(part, k).
// They are offset from one another by 1 KB beyond the sample size: arrays whose addresses agree
// modulo 4 KB make the CPU stall loads behind unrelated stores ("4K aliasing"), and sample sizes
// are often multiples of 4 KB.
class PartArrays {
 public:
  PartArrays(const StreamHandle& s, const BatchNormShape& shape, int count, int parts)
      : pitch_(shape.channels * shape.plane() + 256),
        count_(count),
        base_(static_cast<float*>(s.scratch(sizeof(float) * std::size_t(count) * std::size_t(parts) * pitch_))) {}
  float* at(int part, int k) const { return base_ + (std::int64_t(part) * count_ + k) * pitch_; }

 private:
  std::int64_t pitch_;
  int count_;
  float* base_;
};

// The first float of sample n, channel c.
std::int64_t run_start(const BatchNormShape& shape, std::int64_t n, std::int64_t c) {
  return (n * shape.channels + c) * shape.plane();
}

// Sets a[i] = value_of_channel(c) for every position i of channels [c0, c1).
template <class Value>
void fill_per_channel(const BatchNormShape& shape, std::int64_t c0, std::int64_t c1, float* a,
                      Value&& value_of_channel) {
  for (std::int64_t c = c0; c < c1; ++c)
    std::fill(a + c * shape.plane(), a + (c + 1) * shape.plane(), value_of_channel(c));
}

// Sum over the positions of channel c of a per-position array, in double: eight running sums (one
// vector of doubles) added in a fixed order, so that the bits do not depend on whether, or how, the
// compiler vectorises the loop where it is inlined (a plain reduction left scalar is a chain of
// dependent additions: 4 cycles a value).
double channel_total(const BatchNormShape& shape, const float* a, std::int64_t c) {
  const std::int64_t plane = shape.plane();
  const float* run = a + c * plane;
  double lane[8] = {};
  std::int64_t i = 0;
  for (; i + 8 <= plane; i += 8)
    for (int j = 0; j < 8; ++j) lane[j] += run[i + j];
  double total = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; i < plane; ++i) total += run[i];
  return total;
}

// Channel c's total of array k over all parts, the parts summed in order (so the bits depend
// only on the number of parts).
double parts_total(const BatchNormShape& shape, const PartArrays& arrays, int parts, int k, std::int64_t c) {
  double total = 0;
  for (int part = 0; part < parts; ++part) total += channel_total(shape, arrays.at(part, k), c);
  return total;
}

// Calls add(n, group) for samples [n0, n1) in groups of kGroup, then one by one: n is the first
// of `group` consecutive samples.
template <class Add>
[[gnu::always_inline]] inline void for_sample_groups(std::int64_t n0, std::int64_t n1, Add&& add) {
  std::int64_t n = n0;
  for (; n + kGroup <= n1; n += kGroup) add(n, std::integral_constant<int, kGroup>{});
  for (; n < n1; ++n) add(n, std::integral_constant<int, 1>{});
}

// sum[i] += d and square[i] += d^2 over G samples, with d = x_g[i] - shift[i]; x_g = x + g*pitch.
template <int G>
void add_moments(const float* x, std::int64_t pitch, const float* shift, float* sum,
                 float* square, std::int64_t length) {
#pragma omp simd
  for (std::int64_t i = 0; i < length; ++i) {
    float s = 0, q = 0;
    for (int g = 0; g < G; ++g) {
      const float d = x[g * pitch + i] - shift[i];
      s += d;
      q += d * d;
    }
    sum[i] += s;
    square[i] += q;
  }
}

// Where a backward's ReLU mask comes from: none (plain batch norm); y > 0, the fused forward's
// output; or the forward's map applied to x again (the mapped backward): the same fma on the same
// floats, so the same bits and the same mask as y > 0, without reading y.
enum class Mask { none, from_y, from_x };

// The gradient that reaches batch norm at one value: dy, or with the fused ReLU dy where it passed.
// y is read only from_y; x, mean, scale and bias (the forward's map) only from_x.
template <Mask M>
inline float incoming_gradient(float dy, float y, float x, float mean, float scale, float bias) {
  if constexpr (M == Mask::from_y) return relu_masked(y, dy);
  else if constexpr (M == Mask::from_x) return std::fma(x - mean, scale, bias) > 0.0f ? dy : 0.0f;
  else return dy;
}

// Per-position arrays of one sample (block part) for pass 1: the mean, and from_x the forward's
// scale and bias (its mean is `mean`: both are float(mean)).
struct PositionMaps {
  const float* mean;
  const float* scale;
  const float* bias;
};

// sum[i] += dy and centered[i] += dy * (x - mean[i]) over G samples, dy masked as M says (y is
// unused unless from_y). x and y step `pitch` floats from sample to sample, dy `dy_pitch`.
template <int G, Mask M>
void add_gradient_sums(const float* x, const float* y, const float* dy, std::int64_t pitch, std::int64_t dy_pitch,
                       PositionMaps maps, float* sum, float* centered, std::int64_t length) {
  const float* mean = maps.mean;
  const float* scale = maps.scale;
  const float* bias = maps.bias;
#pragma omp simd
  for (std::int64_t i = 0; i < length; ++i) {
    float s = 0, c = 0;
    for (int g = 0; g < G; ++g) {
      const float xv = x[g * pitch + i];
      const float d = incoming_gradient<M>(dy[g * dy_pitch + i], M == Mask::from_y ? y[g * pitch + i] : 0.0f, xv,
                                           mean[i], M == Mask::from_x ? scale[i] : 0.0f,
                                           M == Mask::from_x ? bias[i] : 0.0f);
      s += d;
      c += d * (xv - mean[i]);
    }
    sum[i] += s;
    centered[i] += c;
  }
}

using bn::AffineMap;
using bn::normalised;

// Where a forward's pass 2 writes sample n's channels [c0, c1) (`x`: the input, `maps`: per channel).
// TensorOutput: y itself, BN(x) or with the fused ReLU relu(BN(x)).
template <bool Relu>
struct TensorOutput {
  float* y;
  void write(const BatchNormShape& shape, std::int64_t n, std::int64_t c0, std::int64_t c1, const float* x,
             const AffineMap* maps) const {
    for (std::int64_t c = c0; c < c1; ++c) {
      const AffineMap m = maps[c];
      const float* in = x + run_start(shape, n, c);
      float* out = y + run_start(shape, n, c);
#pragma omp simd
      for (std::int64_t i = 0; i < shape.plane(); ++i) {
        const float v = normalised(in[i], m);
        out[i] = Relu ? relu_of(v) : v;
      }
    }
  }
};

// The coupling's output (batchnorm_relu_coupling_*, kernels/batchnorm.hpp): f = relu(BN(z)) goes
// straight into the stream it is added to (forward) or subtracted from (inverse), channel by
// channel, and the other stream's channels [c0, c1) of the sample, contiguous in both a and out,
// are moved with one copy.
struct CouplingOutput {
  CouplingDirection direction;
  const float* a;
  float* out;
  void write(const BatchNormShape& shape, std::int64_t n, std::int64_t c0, std::int64_t c1, const float* z,
             const AffineMap* maps) const {
    const std::int64_t plane = shape.plane(), stream = shape.channels * plane;
    const std::int64_t first = 2 * n * stream, second = first + stream;  // streams 1 and 2 of sample n
    const bool forward = direction == CouplingDirection::forward;
    // forward: out1 = a2 + f, out2 = a1;  inverse: out1 = a2, out2 = a1 - f
    const float* from = a + (forward ? second : first);
    float* to = out + (forward ? first : second);
    for (std::int64_t c = c0; c < c1; ++c) {
      const AffineMap m = maps[c];
      const float* in = z + run_start(shape, n, c);
      const float* other = from + c * plane;
      float* dst = to + c * plane;
      if (forward) {
#pragma omp simd
        for (std::int64_t i = 0; i < plane; ++i) dst[i] = other[i] + relu_of(normalised(in[i], m));
      } else {
#pragma omp simd
        for (std::int64_t i = 0; i < plane; ++i) dst[i] = other[i] - relu_of(normalised(in[i], m));
      }
    }
    const std::int64_t moved_from = forward ? first : second, moved_to = forward ? second : first;
    std::memcpy(out + moved_to + c0 * plane, a + moved_from + c0 * plane, sizeof(float) * (c1 - c0) * plane);
  }
};

// Pass 2 of the forwards for samples [n0, n1), every channel. The samples go last to first: after
// pass 1 the last samples are the ones still in cache.
template <class Output>
void apply_affine(const BatchNormShape& shape, std::int64_t n0, std::int64_t n1, const float* x,
                  const AffineMap* maps, const Output& output) {
  for (std::int64_t n = n1 - 1; n >= n0; --n) output.write(shape, n, 0, shape.channels, x, maps);
}

// Part `part` of `parts`: its samples [n0, n1) and its share [c0, c1) of the channels.
struct PartRange {
  std::int64_t n0, n1, c0, c1;
};
PartRange part_range(const BatchNormShape& shape, int part, int parts) {
  return {share(shape.batch, part, parts), share(shape.batch, part + 1, parts), share(shape.channels, part, parts),
          share(shape.channels, part + 1, parts)};
}

template <class Output>
void forward_train(const StreamHandle& s, const BatchNormShape& shape, double eps,
                   double momentum, const float* x, const float* gamma, const float* beta,
                   const Output& output, float* saved_mean, float* saved_invstd,
                   float* running_mean, float* running_var, float* saved_affine = nullptr) {
  use_threads(s);
  const int threads = sample_parts(s, shape);
  enum { kShift, kSum, kSquare };
  const PartArrays arrays(s, shape, 3, threads);
  std::vector<AffineMap> maps(shape.channels);
  const std::int64_t plane = shape.plane(), pitch = shape.channels * plane;
  const double count = double(shape.values_per_channel());

  run_parts(threads, [&](int part, int parts) {
    const PartRange r = part_range(shape, part, parts);
    float* const shift = arrays.at(part, kShift);
    float* const sum = arrays.at(part, kSum);
    float* const square = arrays.at(part, kSquare);

    // Pass 1: sums of d = x - shift and d^2, where shift is the channel's first value, so that
    // sum(d^2)/n - (sum(d)/n)^2 does not cancel when |mean| >> std.
    fill_per_channel(shape, 0, shape.channels, shift, [&](std::int64_t c) { return x[c * plane]; });
    std::fill(sum, sum + pitch, 0.f);
    std::fill(square, square + pitch, 0.f);
    for_sample_groups(r.n0, r.n1, [&](std::int64_t n, auto group) {
      add_moments<decltype(group)::value>(x + n * pitch, pitch, shift, sum, square, pitch);
    });
    sync_parts();

    const bn::StatisticsOut out{saved_mean, saved_invstd, running_mean, running_var, saved_affine};
    for (std::int64_t c = r.c0; c < r.c1; ++c)
      maps[c] = bn::finish_statistics(c, parts_total(shape, arrays, parts, kSum, c),
                                      parts_total(shape, arrays, parts, kSquare, c), x[c * plane], count, eps,
                                      momentum, gamma, beta, out);
    sync_parts();

    apply_affine(shape, r.n0, r.n1, x, maps.data(), output);
  });
}

template <class Output>
void forward_eval(const StreamHandle& s, const BatchNormShape& shape, double eps, const float* x,
                  const float* gamma, const float* beta, const float* running_mean,
                  const float* running_var, const Output& output) {
  use_threads(s);
  std::vector<AffineMap> maps(shape.channels);
  for (std::int64_t c = 0; c < shape.channels; ++c)
    maps[c] = bn::affine_map(running_mean[c],
                             double(gamma[c]) / std::sqrt(double(running_var[c]) + eps), beta[c]);
  run_parts(sample_parts(s, shape), [&](int part, int parts) {
    const PartRange r = part_range(shape, part, parts);
    apply_affine(shape, r.n0, r.n1, x, maps.data(), output);
  });
}

// y is the fused forward's output when from_y (the mask), unused otherwise. dx_sum, when not null,
// gets += the per-channel sum of dx, taken in pass 2 as dx is written (float sums over the part's
// samples per position, then a double total per channel over the parts, as pass 1's sums).
//
// M says where the ReLU's mask comes from: y (from_y), or from_x the forward's maps in `affine`
// (3 floats per channel, batchnorm_relu_forward_train_mapped); y is then not read.
template <Mask M>
void backward(const StreamHandle& s, const BatchNormShape& shape, const float* x, const float* y,
              const float* dy, const float* gamma, const float* saved_mean,
              const float* saved_invstd, float* dx, float* dgamma, float* dbeta,
              float* dx_sum = nullptr, const float* affine = nullptr) {
  use_threads(s);
  const int threads = sample_parts(s, shape);
  enum { kMean, kDySum, kDyCentered, kForwardScale, kForwardBias };
  const PartArrays arrays(s, shape, M == Mask::from_x ? 5 : 3, threads);
  struct GradientMap {
    float a, b, k, mean, forward_scale, forward_bias;
  };
  std::vector<GradientMap> maps(shape.channels);
  const std::int64_t plane = shape.plane(), pitch = shape.channels * plane, dy_pitch = shape.dy_sample_stride();
  const double count = double(shape.values_per_channel());

  run_parts(threads, [&](int part, int parts) {
    const PartRange r = part_range(shape, part, parts);
    float* const mean = arrays.at(part, kMean);
    float* const dy_sum = arrays.at(part, kDySum);
    float* const dy_centered_sum = arrays.at(part, kDyCentered);

    // Pass 1: sum(dy) and sum(dy * (x - mean)), dy masked as M says.
    fill_per_channel(shape, 0, shape.channels, mean, [&](std::int64_t c) { return saved_mean[c]; });
    PositionMaps position_maps{mean, nullptr, nullptr};
    if constexpr (M == Mask::from_x) {
      float* const forward_scale = arrays.at(part, kForwardScale);
      float* const forward_bias = arrays.at(part, kForwardBias);
      fill_per_channel(shape, 0, shape.channels, forward_scale, [&](std::int64_t c) { return affine[3 * c + 1]; });
      fill_per_channel(shape, 0, shape.channels, forward_bias, [&](std::int64_t c) { return affine[3 * c + 2]; });
      position_maps = {mean, forward_scale, forward_bias};
    }
    std::fill(dy_sum, dy_sum + pitch, 0.f);
    std::fill(dy_centered_sum, dy_centered_sum + pitch, 0.f);
    for_sample_groups(r.n0, r.n1, [&](std::int64_t n, auto group) {
      add_gradient_sums<decltype(group)::value, M>(x + n * pitch, M == Mask::from_y ? y + n * pitch : nullptr,
                                                   dy + n * dy_pitch, pitch, dy_pitch, position_maps, dy_sum,
                                                   dy_centered_sum, pitch);
    });
    sync_parts();

    for (std::int64_t c = r.c0; c < r.c1; ++c) {
      const bn::GradientCoefficients g =
          bn::gradient_coefficients(c, parts_total(shape, arrays, parts, kDySum, c),
                                    parts_total(shape, arrays, parts, kDyCentered, c), saved_invstd, gamma, count,
                                    dgamma, dbeta);
      maps[c] = {g.a, g.b, g.k, saved_mean[c], M == Mask::from_x ? affine[3 * c + 1] : 0.0f,
                 M == Mask::from_x ? affine[3 * c + 2] : 0.0f};
    }
    sync_parts();  // every part has read every part's sums: dy_sum's array is free again

    // Pass 2, last sample first (those are still in cache). With dx_sum, each dx value is also
    // added into a per-position accumulator (dy_sum's array), as pass 1 sums: no sum across lanes
    // per run, which on 4x4 planes would cost more than the run.
    float* const dx_acc = dy_sum;
    if (dx_sum) std::fill(dx_acc, dx_acc + pitch, 0.f);
    for (std::int64_t n = r.n1 - 1; n >= r.n0; --n)
      for (std::int64_t c = 0; c < shape.channels; ++c) {
        const GradientMap m = maps[c];
        const float* xs = x + run_start(shape, n, c);
        const float* ys = M == Mask::from_y ? y + run_start(shape, n, c) : nullptr;
        const float* dys = dy + n * dy_pitch + c * plane;
        float* dxs = dx + run_start(shape, n, c);
        if (!dx_sum) {
#pragma omp simd
          for (std::int64_t i = 0; i < plane; ++i)
            dxs[i] = m.a * incoming_gradient<M>(dys[i], M == Mask::from_y ? ys[i] : 0.0f, xs[i], m.mean,
                                                m.forward_scale, m.forward_bias) +
                     m.b * (xs[i] - m.mean) + m.k;
          continue;
        }
        float* acc = dx_acc + c * plane;
#pragma omp simd
        for (std::int64_t i = 0; i < plane; ++i) {
          const float d = m.a * incoming_gradient<M>(dys[i], M == Mask::from_y ? ys[i] : 0.0f, xs[i], m.mean,
                                                     m.forward_scale, m.forward_bias) +
                          m.b * (xs[i] - m.mean) + m.k;
          dxs[i] = d;
          acc[i] += d;
        }
      }
    if (dx_sum) {
      sync_parts();
      for (std::int64_t c = r.c0; c < r.c1; ++c)
        dx_sum[c] = float(dx_sum[c] + parts_total(shape, arrays, parts, kDySum, c));
    }
  });
}

}  // namespace

void batchnorm_forward_train(const StreamHandle& s, const BatchNormShape& shape, double eps,
                             double momentum, const float* x, const float* gamma,
                             const float* beta, float* y, float* saved_mean, float* saved_invstd,
                             float* running_mean, float* running_var) {
  forward_train(s, shape, eps, momentum, x, gamma, beta, TensorOutput<false>{y}, saved_mean,
                saved_invstd, running_mean, running_var);
}

void batchnorm_forward_eval(const StreamHandle& s, const BatchNormShape& shape, double eps,
                            const float* x, const float* gamma, const float* beta,
                            const float* running_mean, const float* running_var, float* y) {
  forward_eval(s, shape, eps, x, gamma, beta, running_mean, running_var, TensorOutput<false>{y});
}

void batchnorm_backward(const StreamHandle& s, const BatchNormShape& shape, const float* x,
                        const float* dy, const float* gamma, const float* saved_mean,
                        const float* saved_invstd, float* dx, float* dgamma, float* dbeta) {
  backward<Mask::none>(s, shape, x, nullptr, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta);
}

void batchnorm_relu_forward_train(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                  double momentum, const float* x, const float* gamma,
                                  const float* beta, float* y, float* saved_mean,
                                  float* saved_invstd, float* running_mean, float* running_var) {
  forward_train(s, shape, eps, momentum, x, gamma, beta, TensorOutput<true>{y}, saved_mean,
                saved_invstd, running_mean, running_var);
}

void batchnorm_relu_forward_eval(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                 const float* x, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, float* y) {
  forward_eval(s, shape, eps, x, gamma, beta, running_mean, running_var, TensorOutput<true>{y});
}

void batchnorm_relu_backward(const StreamHandle& s, const BatchNormShape& shape, const float* x,
                             const float* y, const float* dy, const float* gamma,
                             const float* saved_mean, const float* saved_invstd, float* dx,
                             float* dgamma, float* dbeta) {
  backward<Mask::from_y>(s, shape, x, y, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta);
}

void batchnorm_backward_summed(const StreamHandle& s, const BatchNormShape& shape, const float* x,
                               const float* dy, const float* gamma, const float* saved_mean,
                               const float* saved_invstd, float* dx, float* dgamma, float* dbeta,
                               float* dx_sum) {
  backward<Mask::none>(s, shape, x, nullptr, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta, dx_sum);
}

void batchnorm_relu_backward_summed(const StreamHandle& s, const BatchNormShape& shape,
                                    const float* x, const float* y, const float* dy,
                                    const float* gamma, const float* saved_mean,
                                    const float* saved_invstd, float* dx, float* dgamma,
                                    float* dbeta, float* dx_sum) {
  backward<Mask::from_y>(s, shape, x, y, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta, dx_sum);
}

void batchnorm_relu_forward_train_mapped(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                         double momentum, const float* x, const float* gamma, const float* beta,
                                         float* y, float* saved_mean, float* saved_invstd, float* running_mean,
                                         float* running_var, float* affine) {
  forward_train(s, shape, eps, momentum, x, gamma, beta, TensorOutput<true>{y}, saved_mean, saved_invstd,
                running_mean, running_var, affine);
}

void batchnorm_relu_backward_mapped(const StreamHandle& s, const BatchNormShape& shape, const float* x,
                                    const float* affine, const float* dy, const float* gamma,
                                    const float* saved_mean, const float* saved_invstd, float* dx, float* dgamma,
                                    float* dbeta, float* dx_sum) {
  backward<Mask::from_x>(s, shape, x, nullptr, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta, dx_sum,
                         affine);
}

void batchnorm_relu_coupling_train(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                   double momentum, CouplingDirection direction, const float* z,
                                   const float* gamma, const float* beta, const float* a,
                                   float* out, float* saved_mean, float* saved_invstd,
                                   float* running_mean, float* running_var) {
  forward_train(s, shape, eps, momentum, z, gamma, beta, CouplingOutput{direction, a, out},
                saved_mean, saved_invstd, running_mean, running_var);
}

void batchnorm_relu_coupling_train_mapped(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                          double momentum, CouplingDirection direction, const float* z,
                                          const float* gamma, const float* beta, const float* a, float* out,
                                          float* saved_mean, float* saved_invstd, float* running_mean,
                                          float* running_var, float* affine) {
  forward_train(s, shape, eps, momentum, z, gamma, beta, CouplingOutput{direction, a, out}, saved_mean,
                saved_invstd, running_mean, running_var, affine);
}

void batchnorm_relu_coupling_eval(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                  CouplingDirection direction, const float* z, const float* gamma,
                                  const float* beta, const float* running_mean,
                                  const float* running_var, const float* a, float* out) {
  forward_eval(s, shape, eps, z, gamma, beta, running_mean, running_var,
               CouplingOutput{direction, a, out});
}

}  // namespace petra::kernels::cpu
