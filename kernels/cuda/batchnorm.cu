// kernels/cuda/batchnorm.cu: the cuda:: 2-d batch normalisation of kernels/batchnorm.hpp
// (training forward, evaluation forward, backward).
//
// The training forward and the backward each need two sums per channel over its N*H*W values
// before any output can be written ((x - K, (x - K)^2) for the statistics; dy and dy * (x - mean)
// for the gradients). They must be deterministic, so no floating-point atomics: a two-level
// reduction with a fixed shape.
//   1. channel_partials: the channel's n = N*H*W values are split into S slices (S depends only
//      on n, at most 32: fast_divide.cuh's channel_slices), one block of 256 threads per
//      (channel, slice). Each thread adds its values (a grid-stride walk of the slice, in a fixed
//      order, four loads ahead; float4s where the plane allows) in double; the block adds its
//      threads' pairs with a fixed binary tree in shared memory (block_tree_sum,
//      kernels/cuda/block_reduce.cuh) and writes one pair.
//   2. one warp per channel adds its S pairs (lane l the slices l, l + 32, ... in order, then a
//      fixed shuffle tree), in double, and its lane 0 derives the per-channel results (mean,
//      invstd, running statistics; or dgamma +=, dbeta +=, and the three coefficients of dx).
//   3. an element-wise grid-stride pass writes y or dx from those per-channel values, on tensors
//      of 16 MiB and more walking from the end (what step 1 read last is likeliest to be still in
//      the L2 cache; SecondWalk).
// Double accumulation matches ref:: (which sums in double): the variance is E[(x-K)^2] - E[x-K]^2
// with K the channel's first value, so the usual cancellation of sum/sum-of-squares is limited
// to |mean - K| relative to the spread, and it happens in double. The slices and the tree do not
// depend on the grid or the scheduling, so every run gives the same bits (the float4 walk shares the
// values among threads otherwise than the float one: an aligned tensor and a misaligned view of it
// may differ in the last bit of their sums).
//
// Index arithmetic: the channel of a value, (k / plane) % channels, by FastDivide's multiply and
// shift (kernels/cuda/fast_divide.cuh) instead of two 64-bit divisions per value, which made these
// passes bound by integer work (24-36% of the copy bandwidth on an H200, docs/results-gpu.md). The
// element-wise passes work on groups of 4 values (one float4 per array, one channel index per
// group) when the plane is a multiple of 4 and the pointers 16-byte aligned, else of 1: the same
// arithmetic per value, so the same bits.
//
// Memory: each of the three passes is coalesced (consecutive threads read consecutive values of
// a row of the plane); the sums read x (and dy) once and the element-wise pass once more, as
// cpu::'s two passes do (L2 eviction hints on the two reads, evict_last then evict_first, were
// tried and measured no gain on an H100 in run 12, so they were taken out: docs/gpu-kernels.md).
// The partial pairs and the per-channel maps (y's, dx's) live in s.scratch() (the stream's
// workspace). The evaluation forward is one element-wise pass.
//
// Batch norm fused with the ReLU that follows it (kernels/batchnorm.hpp, batchnorm_relu_*): the
// same kernels with a compile-time `relu` flag. The forward's element-wise pass writes
// relu_of(BN(x)) (the unfused pair writes BN(x), then reads it back and writes relu of it: 8 bytes
// per value saved, and one tensor); the backward's sums pass and its dx pass read y beside dy and
// use relu_masked(y, dy) where they read dy (the unfused pair reads y and dy and writes the masked
// dy, which both passes then read: 8 bytes per value saved net, and one tensor). The mask comes
// from the stored y, never from recomputed statistics, so FMA contraction cannot flip a sign.
//
// Batch norm + ReLU fused into the coupling (batchnorm_relu_coupling_*): the training forward's
// two reductions as above, then the element-wise pass with another destination (CouplingOutput):
// the thread of value k of z computes f there and writes both streams of the coupling's output at
// k's position (one read of z and of each stream of a, one write of each stream of out; f is
// never stored). Consecutive threads still touch consecutive addresses of every array.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <tuple>

#include "petra/kernels/batchnorm.hpp"
#include "petra/kernels/conv2d.hpp"
#include "petra/kernels/cuda/block_reduce.cuh"
#include "petra/kernels/cuda/check.cuh"
#include "petra/kernels/cuda/cluster.cuh"
#include "petra/kernels/cuda/fast_divide.cuh"
#include "petra/kernels/cuda/lanes.cuh"
#include "petra/kernels/cuda/launch.cuh"

namespace petra::kernels::cuda {
namespace {

using cuda_detail::block_tree_sum;
using cuda_detail::cluster_barrier;
using cuda_detail::cluster_peer;
using cuda_detail::cluster_rank;
using cuda_detail::lane;
using cuda_detail::grid_threads;
using cuda_detail::kBlockThreads;
using cuda_detail::kWidth;
using cuda_detail::lanes;
using cuda_detail::launch_grid_stride;
using cuda_detail::thread_index;
using cuda_detail::grid_warps;
using cuda_detail::warp_index;
using cuda_detail::warp_strided_sum;

// Slices of a channel (fast_divide.cuh's channel_slices): about 8192 values each, at most 32.
inline std::int64_t slices_of(const BatchNormShape& shape) { return channel_slices(shape.values_per_channel()); }

enum class Sums {
  kStatistics,  // (x - K, (x - K)^2), K = the channel's first value
  kGradients,   // (dy, dy * (x - mean))
};

// Block (c, slice) = blockIdx.x / slices, blockIdx.x % slices: partials[2 * blockIdx.x + {0, 1}]
// are the slice's two sums. `relu` masks dy with y (kGradients only). The walk is in units of V
// (float, or float4 where the plane is a multiple of 4 and the pointers 16-byte aligned): `plane`
// and `count` are the plane and the channel's size in V units, and a thread adds the lanes of each
// V it reads in order, reading kLoadBatch Vs ahead (fast_divide.cuh's walk_channel). With one float
// per load and 2048-value slices the training passes ran at 37-41% of the copy bandwidth on an
// H200 (docs/gpu-kernels.md, "Bytes in flight").
inline constexpr int kLoadBatch = 4;

template <class V>
struct GradientItem {  // what the gradient sums read at one offset
  V x, y, dy;
};

template <Sums sums, bool relu, class V>
__global__ void __launch_bounds__(kBlockThreads)
    channel_partials(std::int64_t channels, FastDivide plane, std::int64_t count,
                     std::int64_t slices, const float* x, const float* y, const float* dy,
                     const float* saved_mean, double* partials) {
  const std::int64_t c = blockIdx.x / slices, slice = blockIdx.x % slices;
  const double pivot =
      sums == Sums::kStatistics ? double(x[c * plane.divisor() * kWidth<V>]) : double(saved_mean[c]);
  double s1 = 0, s2 = 0;
  const std::int64_t start = slice * kBlockThreads + threadIdx.x, step = slices * kBlockThreads;
  const ChannelWalk walk(plane, channels, c, start, step);  // fast_divide.cuh
  const auto* xv = reinterpret_cast<const V*>(x);
  if constexpr (sums == Sums::kStatistics) {
    walk_channel<kLoadBatch>(
        walk, start, step, count, [=](std::int64_t k) { return xv[k]; },
        [&](const V& v) {
          for (int i = 0; i < kWidth<V>; ++i) {
            const double d = double(lane(v, i)) - pivot;
            s1 += d;
            s2 += d * d;
          }
        });
  } else {
    const auto* yv = reinterpret_cast<const V*>(y);
    const auto* gv = reinterpret_cast<const V*>(dy);
    walk_channel<kLoadBatch>(
        walk, start, step, count,
        [=](std::int64_t k) {
          return GradientItem<V>{xv[k], relu ? yv[k] : V{}, gv[k]};
        },
        [&](const GradientItem<V>& item) {
          for (int i = 0; i < kWidth<V>; ++i) {
            const double g = relu ? relu_masked(lane(item.y, i), lane(item.dy, i)) : lane(item.dy, i);
            s1 += g;
            s2 += g * (double(lane(item.x, i)) - pivot);
          }
        });
  }
  __shared__ double first[kBlockThreads];
  __shared__ double second[kBlockThreads];
  first[threadIdx.x] = s1;
  second[threadIdx.x] = s2;
  block_tree_sum(first, second);  // kernels/cuda/block_reduce.cuh: a fixed tree
  if (threadIdx.x == 0) {
    partials[2 * blockIdx.x] = first[0];
    partials[2 * blockIdx.x + 1] = second[0];
  }
}

// The channel's two sums, valid in lane 0 of the calling warp (every lane must call it): its
// slices' pairs added by warp_strided_sum. A warp rather than a thread per channel: one thread's
// 16-64 dependent loads of the partials cost microseconds.
__device__ inline void channel_sums(const double* partials, std::int64_t c, std::int64_t slices,
                                    double& s1, double& s2) {
  s1 = warp_strided_sum(partials + 2 * c * slices, slices, 2);
  s2 = warp_strided_sum(partials + 2 * c * slices + 1, slices, 2);
}

// ---- A channel's results from its two sums, as ref:: computes them (the two-pass kernels and the
// one-pass kernels below share them).

struct ChannelStatistics {
  double mean, var, invstd;
};
// From s1 = sum(x - pivot) and s2 = sum((x - pivot)^2) over the channel's n values.
__device__ inline ChannelStatistics statistics_of(double n, double pivot, double s1, double s2, double eps) {
  const double shifted_mean = s1 / n;
  const double var = fmax(s2 / n - shifted_mean * shifted_mean, 0.0);
  return {pivot + shifted_mean, var, 1.0 / sqrt(var + eps)};
}

// The saved statistics and the running ones (unbiased variance) of channel c.
__device__ inline void record_statistics(std::int64_t c, double n, double momentum, const ChannelStatistics& st,
                                         float* saved_mean, float* saved_invstd, float* running_mean,
                                         float* running_var) {
  saved_mean[c] = float(st.mean);
  saved_invstd[c] = float(st.invstd);
  const double unbiased_var = n > 1 ? st.var * n / (n - 1) : st.var;
  if (running_mean) running_mean[c] = float((1 - momentum) * double(running_mean[c]) + momentum * st.mean);
  if (running_var) running_var[c] = float((1 - momentum) * double(running_var[c]) + momentum * unbiased_var);
}

// The channel's map y = (x - mean_f) * scale + bias. When |mean| >> std, float(mean) alone would
// lose digits of x - mean: the map subtracts mean_f = float(mean) (nearly exactly) and folds
// mean - mean_f into the bias, as cpu:: does.
struct ChannelMap {
  float mean, scale, bias;
};
__device__ inline ChannelMap map_of(const ChannelStatistics& st, float gamma, float beta) {
  const float mean_f = float(st.mean);
  const double scale = double(gamma) * st.invstd;
  return {mean_f, float(scale), float(double(beta) - (st.mean - double(mean_f)) * scale)};
}

// dx = gamma * invstd * (dy - sum(dy)/n - xhat * sum(dy * xhat)/n), xhat = (x - mean) * invstd,
// that is dx = a * dy + b * (x - mean) + k per channel; sum(dy * xhat) = sum(dy * (x - mean)) * invstd.
struct GradientCoefficients {
  float a, b, k;
};
__device__ inline GradientCoefficients coefficients_of(double n, double sum_dy, double sum_dy_xhat, float gamma,
                                                       double invstd) {
  const double scale = double(gamma) * invstd;
  return {float(scale), float(-scale * invstd * sum_dy_xhat / n), float(-scale * sum_dy / n)};
}

// dgamma += sum(dy * xhat), dbeta += sum(dy), in double and rounded once.
__device__ inline void accumulate_parameter_gradients(std::int64_t c, double sum_dy, double sum_dy_xhat,
                                                      float* dgamma, float* dbeta) {
  dgamma[c] = float(double(dgamma[c]) + sum_dy_xhat);
  dbeta[c] = float(double(dbeta[c]) + sum_dy);
}

// One warp per channel: the statistics from the slices' partials (the pivot is the channel's first
// value), and the channel's map in maps[3c..3c+2].
__global__ void statistics(std::int64_t channels, std::int64_t plane, std::int64_t count,
                           std::int64_t slices, double eps, double momentum, const float* x,
                           const float* gamma, const float* beta, const double* partials,
                           float* saved_mean, float* saved_invstd, float* running_mean,
                           float* running_var, float* maps) {
  for (std::int64_t c = warp_index(); c < channels; c += grid_warps()) {
    double s1, s2;
    channel_sums(partials, c, slices, s1, s2);
    if (threadIdx.x % 32 != 0) continue;
    const double n = double(count);
    const ChannelStatistics st = statistics_of(n, double(x[c * plane]), s1, s2, eps);
    record_statistics(c, n, momentum, st, saved_mean, saved_invstd, running_mean, running_var);
    const ChannelMap map = map_of(st, gamma[c], beta[c]);
    maps[3 * c] = map.mean;
    maps[3 * c + 1] = map.scale;
    maps[3 * c + 2] = map.bias;
  }
}

// The element-wise passes read and write V: float, or float4 where the plane is a multiple of 4
// and every pointer 16-byte aligned (kernels/cuda/lanes.cuh). A float4 never crosses a plane, so
// its four values share a channel; the arithmetic per value is the same either way.
// Where a forward's element-wise pass puts BN(x) for the V at index g of x (in V units).
// TensorOutput: y[g], with the fused ReLU when relu.
template <bool relu>
struct TensorOutput {
  float* y;
  template <class V>
  __device__ void store(std::int64_t g, V value) const {
    if constexpr (relu) value = lanes([](float v) { return relu_of(v); }, value);
    reinterpret_cast<V*>(y)[g] = value;
  }
  bool aligned() const { return cuda_detail::aligned_16(y); }
};

// The coupling fused with F's last batch norm + ReLU (batchnorm_relu_coupling_*): the V at index g
// of f = relu(BN(z)) is added into stream 1 of out (forward) or subtracted into its stream 2
// (inverse), and the same thread moves the other stream's V. stream = C * plane, in floats.
struct CouplingOutput {
  CouplingDirection direction;
  FastDivide stream;
  const float* a;
  float* out;
  template <class V>
  __device__ void store(std::int64_t g, V f) const {
    const std::int64_t k = g * kWidth<V>, n = stream.quotient(k);
    // (n, 1, i) and (n, 2, i), in V units (a float4 stays inside a stream: stream % 4 == 0 then)
    const std::int64_t first = (k + n * stream.divisor()) / kWidth<V>, second = first + stream.divisor() / kWidth<V>;
    const auto* av = reinterpret_cast<const V*>(a);
    auto* outv = reinterpret_cast<V*>(out);
    const V a1 = av[first], a2 = av[second];
    if (direction == CouplingDirection::forward) {  // out1 = a2 + f, out2 = a1
      outv[first] = lanes([](float x, float y) { return x + relu_of(y); }, a2, f);
      outv[second] = a1;
    } else {  // out1 = a2, out2 = a1 - f
      outv[first] = a2;
      outv[second] = lanes([](float x, float y) { return x - relu_of(y); }, a1, f);
    }
  }
  bool aligned() const { return cuda_detail::aligned_16(a) && cuda_detail::aligned_16(out); }
};

// The order of the training passes' second walk over x (and dy). On a large tensor it goes from
// the end to the start: the first pass's blocks all advance through their channels' samples
// together, so the lines it read last, the ones most likely still in the L2 cache (50 MB on an
// H200), are the last samples'. Run 7 (docs/results-gpu.md): at (128, 64, 32, 32), 33.5 MB, the
// training forward 37.4 -> 35.5 us, the backward 52.2 -> 49.7, the forward fused into the coupling
// 71.7 -> 61.3; but at (128, 256, 8, 8), 8.4 MB, which stays in the L2 whichever the order, 14.4 ->
// 18.5 us (cause not known). So from the end only from kFromEndBytes up. Consecutive threads touch
// consecutive addresses either way, and the values are the same. (Under the emulation the threshold
// is 4 KiB, so that the kernel tests' small tensors take both orders.)
#ifdef PETRA_CUDA_EMULATION
inline constexpr std::int64_t kFromEndBytes = std::int64_t(4) << 10;
#else
inline constexpr std::int64_t kFromEndBytes = std::int64_t(16) << 20;
#endif
struct SecondWalk {
  bool from_end;
  __device__ std::int64_t operator()(std::int64_t i, std::int64_t count) const { return from_end ? count - 1 - i : i; }
};
inline SecondWalk second_walk(const BatchNormShape& shape) {
  return {shape.size() * std::int64_t(sizeof(float)) >= kFromEndBytes};
}

// BN(x) = gamma * (x - mean) * invstd + beta = (x - mean_f) * scale + bias, per value, to `output`,
// in the order of `walk` (above).
template <class Output, class V>
__global__ void normalise(std::int64_t vectors, ChannelOf channel_of, SecondWalk walk, const float* x,
                          const float* maps, Output output) {
  for (std::int64_t i = thread_index(); i < vectors; i += grid_threads()) {
    const std::int64_t g = walk(i, vectors);
    const std::int64_t c = channel_of(g * kWidth<V>);
    const float mean = maps[3 * c], scale = maps[3 * c + 1], bias = maps[3 * c + 2];
    output.store(g, lanes([=](float v) { return (v - mean) * scale + bias; },
                          reinterpret_cast<const V*>(x)[g]));
  }
}

// Evaluation: the same with the running statistics, invstd = 1 / sqrt(running_var + eps).
template <class Output, class V>
__global__ void normalise_eval(std::int64_t vectors, ChannelOf channel_of, float eps, const float* x,
                               const float* gamma, const float* beta, const float* running_mean,
                               const float* running_var, Output output) {
  for (std::int64_t g = thread_index(); g < vectors; g += grid_threads()) {
    const std::int64_t c = channel_of(g * kWidth<V>);
    const float mean = running_mean[c], scale = gamma[c] * (1.0f / sqrtf(running_var[c] + eps)), bias = beta[c];
    output.store(g, lanes([=](float v) { return (v - mean) * scale + bias; }, reinterpret_cast<const V*>(x)[g]));
  }
}

// One warp per channel: dx's coefficients[3c..3c+2] = (a, b, k) from the slices' partials, and
// dgamma, dbeta accumulated.
__global__ void gradient_coefficients(std::int64_t channels, std::int64_t count,
                                      std::int64_t slices, const double* partials,
                                      const float* gamma, const float* saved_invstd,
                                      float* coefficients, float* dgamma, float* dbeta) {
  for (std::int64_t c = warp_index(); c < channels; c += grid_warps()) {
    double sum_dy, sum_dy_centred;
    channel_sums(partials, c, slices, sum_dy, sum_dy_centred);
    if (threadIdx.x % 32 != 0) continue;
    const double invstd = saved_invstd[c];
    const double sum_dy_xhat = sum_dy_centred * invstd;
    const GradientCoefficients g = coefficients_of(double(count), sum_dy, sum_dy_xhat, gamma[c], invstd);
    coefficients[3 * c] = g.a;
    coefficients[3 * c + 1] = g.b;
    coefficients[3 * c + 2] = g.k;
    accumulate_parameter_gradients(c, sum_dy, sum_dy_xhat, dgamma, dbeta);
  }
}

// In the order of `walk`, as normalise.
template <bool relu, class V>
__global__ void input_gradient(std::int64_t vectors, ChannelOf channel_of, SecondWalk walk, const float* x,
                               const float* y, const float* dy, const float* saved_mean, const float* coefficients,
                               float* dx) {
  for (std::int64_t i = thread_index(); i < vectors; i += grid_threads()) {
    const std::int64_t g = walk(i, vectors);
    const std::int64_t c = channel_of(g * kWidth<V>);
    const float a = coefficients[3 * c], b = coefficients[3 * c + 1], k = coefficients[3 * c + 2],
                mean = saved_mean[c];
    V gradient = reinterpret_cast<const V*>(dy)[g];
    if constexpr (relu)
      gradient = lanes([](float yv, float d) { return relu_masked(yv, d); },
                       reinterpret_cast<const V*>(y)[g], gradient);
    reinterpret_cast<V*>(dx)[g] = lanes([=](float d, float xv) { return a * d + b * (xv - mean) + k; }, gradient,
                                        reinterpret_cast<const V*>(x)[g]);
  }
}

// ---- One pass: the channel's values stay on chip between the sums and the element-wise pass.
//
// The two-pass kernels above read x (and dy) twice, a ceiling of 67% (forward) and 60% (backward)
// of the copy bandwidth by the strict measure; run 12 measured 57% and 61%. Here a cluster of
// blocks owns one channel (kernels/cuda/cluster.cuh; one block where a channel fits in one block's
// shared memory, and on GPUs without clusters): each block reads its share of the channel once,
// into its shared memory, adding the two sums as the values land; the blocks' pairs meet through
// the cluster's shared memory; then each block writes its share of y (or dx) from shared memory.
// One read and one write per value, like a copy, and one launch instead of three.
// A block's share: the channel's values j in [begin, end), in V units, j = n * plane + i at
// tensor offset (n * channels + c) * plane + i.
struct ChannelShare {
  FastDivide plane;
  std::int64_t channels, c, begin, end;
  __device__ std::int64_t size() const { return end > begin ? end - begin : 0; }
  // The tensor offset (in V units) of the share's value i.
  __device__ std::int64_t offset(std::int64_t i) const {
    const std::int64_t j = begin + i, n = plane.quotient(j);
    return (n * channels + c) * plane.divisor() + (j - n * plane.divisor());
  }
};

// Shared memory of a one-pass block: the two sums' trees (kBlockThreads doubles each), the
// block's pair as its cluster reads it, then its share of the channel (one array of V in the
// forward: x; two in the backward: x and the masked dy).
inline constexpr std::size_t kResidentHeaderBytes = (2 * kBlockThreads + 2) * sizeof(double);

// The channel's two sums, in every thread of the cluster: the block's threads' (s1, s2) by the
// fixed tree, then the cluster's blocks' pairs added in rank order (the same order in every block,
// so every block gets the same bits). Every thread of the cluster must call it.
__device__ inline void cluster_sums(double* first, double* second, double* published, unsigned cluster, double& s1,
                                    double& s2) {
  first[threadIdx.x] = s1;
  second[threadIdx.x] = s2;
  block_tree_sum(first, second);
  if (threadIdx.x == 0) {
    published[0] = first[0];
    published[1] = second[0];
  }
  cluster_barrier();  // every block's pair is written
  s1 = 0;
  s2 = 0;
  for (unsigned rank = 0; rank < cluster; ++rank) {
    const double* pair = cluster_peer(published, rank);
    s1 += pair[0];
    s2 += pair[1];
  }
  cluster_barrier();  // and read: a block may now leave without pulling shared memory from under a peer
}

// The training forward of channel blockIdx.x / cluster, in one read of x and one write of the output.
template <class Output, class V>
__global__ void __launch_bounds__(kBlockThreads)
    resident_forward(std::int64_t channels, FastDivide plane, std::int64_t count, unsigned cluster, std::int64_t share,
                     double eps, double momentum, const float* x, const float* gamma, const float* beta,
                     float* saved_mean, float* saved_invstd, float* running_mean, float* running_var, Output output) {
  PETRA_DYNAMIC_SHARED(unsigned char, shared);
  auto* const first = reinterpret_cast<double*>(shared);
  auto* const second = first + kBlockThreads;
  auto* const published = second + kBlockThreads;
  auto* const values = reinterpret_cast<V*>(shared + kResidentHeaderBytes);
  const std::int64_t c = blockIdx.x / cluster;
  const unsigned rank = cluster_rank();
  const ChannelShare mine{plane, channels, c, rank * share, min(count, (rank + 1) * share)};
  const std::int64_t size = mine.size();
  const double pivot = double(x[c * plane.divisor() * kWidth<V>]);  // the channel's first value, as the two passes
  const auto* xv = reinterpret_cast<const V*>(x);
  double s1 = 0, s2 = 0;
  // kLoadBatch loads in flight per thread, then their values into shared memory and the sums.
  for (std::int64_t i0 = threadIdx.x; i0 < size; i0 += kLoadBatch * kBlockThreads) {
    V loaded[kLoadBatch];
    for (int b = 0; b < kLoadBatch; ++b)
      if (const std::int64_t i = i0 + b * kBlockThreads; i < size) loaded[b] = xv[mine.offset(i)];
    for (int b = 0; b < kLoadBatch; ++b) {
      const std::int64_t i = i0 + b * kBlockThreads;
      if (i >= size) break;
      values[i] = loaded[b];
      for (int l = 0; l < kWidth<V>; ++l) {
        const double d = double(lane(loaded[b], l)) - pivot;
        s1 += d;
        s2 += d * d;
      }
    }
  }
  cluster_sums(first, second, published, cluster, s1, s2);
  const double n = double(count * kWidth<V>);
  const ChannelStatistics st = statistics_of(n, pivot, s1, s2, eps);
  if (rank == 0 && threadIdx.x == 0)
    record_statistics(c, n, momentum, st, saved_mean, saved_invstd, running_mean, running_var);
  const ChannelMap map = map_of(st, gamma[c], beta[c]);
  for (std::int64_t i = threadIdx.x; i < size; i += kBlockThreads)
    output.store(mine.offset(i), lanes([=](float v) { return (v - map.mean) * map.scale + map.bias; }, values[i]));
}

// The backward of channel blockIdx.x / cluster: x, dy (and y, for the mask) read once; x and the
// masked dy kept in shared memory; dx written once.
template <bool relu, class V>
__global__ void __launch_bounds__(kBlockThreads)
    resident_backward(std::int64_t channels, FastDivide plane, std::int64_t count, unsigned cluster,
                      std::int64_t share, const float* x, const float* y, const float* dy, const float* gamma,
                      const float* saved_mean, const float* saved_invstd, float* dx, float* dgamma, float* dbeta) {
  PETRA_DYNAMIC_SHARED(unsigned char, shared);
  auto* const first = reinterpret_cast<double*>(shared);
  auto* const second = first + kBlockThreads;
  auto* const published = second + kBlockThreads;
  auto* const xs = reinterpret_cast<V*>(shared + kResidentHeaderBytes);
  auto* const gs = xs + share;
  const std::int64_t c = blockIdx.x / cluster;
  const unsigned rank = cluster_rank();
  const ChannelShare mine{plane, channels, c, rank * share, min(count, (rank + 1) * share)};
  const std::int64_t size = mine.size();
  const float mean = saved_mean[c];
  const double pivot = mean;
  const auto *xv = reinterpret_cast<const V*>(x), *yv = reinterpret_cast<const V*>(y),
             *gv = reinterpret_cast<const V*>(dy);
  double s1 = 0, s2 = 0;
  for (std::int64_t i0 = threadIdx.x; i0 < size; i0 += kLoadBatch * kBlockThreads) {
    GradientItem<V> loaded[kLoadBatch];
    for (int b = 0; b < kLoadBatch; ++b)
      if (const std::int64_t i = i0 + b * kBlockThreads; i < size) {
        const std::int64_t at = mine.offset(i);
        loaded[b] = GradientItem<V>{xv[at], relu ? yv[at] : V{}, gv[at]};
      }
    for (int b = 0; b < kLoadBatch; ++b) {
      const std::int64_t i = i0 + b * kBlockThreads;
      if (i >= size) break;
      const V g = relu ? lanes([](float yl, float d) { return relu_masked(yl, d); }, loaded[b].y, loaded[b].dy)
                       : loaded[b].dy;
      xs[i] = loaded[b].x;
      gs[i] = g;
      for (int l = 0; l < kWidth<V>; ++l) {
        s1 += lane(g, l);
        s2 += lane(g, l) * (double(lane(loaded[b].x, l)) - pivot);
      }
    }
  }
  cluster_sums(first, second, published, cluster, s1, s2);
  const double invstd = saved_invstd[c], sum_dy_xhat = s2 * invstd;
  if (rank == 0 && threadIdx.x == 0) accumulate_parameter_gradients(c, s1, sum_dy_xhat, dgamma, dbeta);
  const GradientCoefficients k = coefficients_of(double(count * kWidth<V>), s1, sum_dy_xhat, gamma[c], invstd);
  for (std::int64_t i = threadIdx.x; i < size; i += kBlockThreads)
    reinterpret_cast<V*>(dx)[mine.offset(i)] =
        lanes([=](float d, float xl) { return k.a * d + k.b * (xl - mean) + k.k; }, gs[i], xs[i]);
}

// Whether the element-wise passes of `shape` may move float4s: groups of 4 inside a plane, and
// every pointer they touch 16-byte aligned (null pointers, unused, pass).
inline bool vector_path(const BatchNormShape& shape, std::initializer_list<const void*> pointers) {
  if (shape.plane() % 4 != 0) return false;
  for (const void* p : pointers)
    if (p != nullptr && !cuda_detail::aligned_16(p)) return false;
  return true;
}

// ---- Which path: the one pass where a channel fits in a cluster's shared memory.
//
// The one pass is off by default until a GPU has timed it against the two passes
// (set_batchnorm_one_pass; bench-cuda times both). A channel takes the smallest cluster whose
// blocks each hold at most kResidentTargetBytes (three blocks per multiprocessor then fit in an
// H100's 228 KB, so one block's reading overlaps another's sums), else the largest cluster if its
// blocks hold at most kResidentMaxBytes (one block per multiprocessor; an A100 opts in to 163 KB)
// and the device's opt-in allows, else the two passes. Then, while the grid has fewer blocks than
// the device has multiprocessors, the cluster doubles as long as each block keeps kMinShare values
// (a few channels of many values would otherwise leave most of the GPU idle). Clusters of more
// than one block need a device with clusters (cudaDevAttrClusterLaunch) running the kernel's sm_90
// code (a build without it runs the sm_80 PTX, whose cluster helpers are one block's); at most 8,
// the portable size; and the runtime must say that such a cluster fits
// (cudaOccupancyMaxActiveClusters: a MIG slice or a smaller GPU may not hold 8 multiprocessors'
// worth), else the two passes. Under the emulation the bounds are small and the device has 4
// multiprocessors, so that the tests' small shapes take every branch.
#ifdef PETRA_CUDA_EMULATION
inline constexpr std::size_t kResidentTargetBytes = kResidentHeaderBytes + 256;
inline constexpr std::size_t kResidentMaxBytes = kResidentHeaderBytes + 2048;
inline constexpr std::int64_t kMinShare = 8;
#else
inline constexpr std::size_t kResidentTargetBytes = 72 << 10;
inline constexpr std::size_t kResidentMaxBytes = 160 << 10;
inline constexpr std::int64_t kMinShare = 4 * kBlockThreads;
#endif
inline constexpr unsigned kMaxCluster = 8;
std::atomic<bool> one_pass_on{false};

// What a device allows the one pass, asked once per device.
struct OnePassLimits {
  unsigned widest_cluster = 1;  // kMaxCluster with clusters (sm_90 and later), else 1
  std::size_t max_shared = 0;   // dynamic shared memory per block, with the opt-in
  std::int64_t multiprocessors = 1;
};
OnePassLimits one_pass_limits(int device) {
#ifdef PETRA_CUDA_EMULATION
  (void)device;
  return {kMaxCluster, kResidentMaxBytes, 4};
#else
  static std::mutex mutex;
  static std::map<int, OnePassLimits> known;
  const std::lock_guard lock(mutex);
  if (auto it = known.find(device); it != known.end()) return it->second;
  int clusters = 0, optin = 0, multiprocessors = 0;
  PETRA_CUDA_CHECK(cudaDeviceGetAttribute(&clusters, cudaDevAttrClusterLaunch, device));
  PETRA_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  PETRA_CUDA_CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
  const OnePassLimits limits{clusters != 0 ? kMaxCluster : 1, std::size_t(optin), std::max(multiprocessors, 1)};
  known.emplace(device, limits);
  return limits;
#endif
}

struct OnePassPlan {
  unsigned cluster = 0;  // 0: the two passes
  std::int64_t share = 0;  // V per block
  std::size_t shared_bytes = 0;
};

// The cluster by the rule above, from the shape alone; `count`: the channel's values in V units,
// `arrays`: the arrays of V a block keeps.
OnePassPlan size_one_pass(const OnePassLimits& limits, std::int64_t channels, std::int64_t count,
                          std::size_t vector_bytes, int arrays) {
  const auto plan_of = [&](unsigned cluster) {
    const std::int64_t share = (count + cluster - 1) / cluster;
    return OnePassPlan{cluster, share, kResidentHeaderBytes + std::size_t(arrays) * std::size_t(share) * vector_bytes};
  };
  const std::size_t most = std::min(kResidentMaxBytes, limits.max_shared);
  OnePassPlan plan;
  for (unsigned cluster = 1; cluster <= limits.widest_cluster && plan.cluster == 0; cluster *= 2) {
    const OnePassPlan candidate = plan_of(cluster);
    if (candidate.shared_bytes <= std::min(kResidentTargetBytes, most) ||
        (cluster == limits.widest_cluster && candidate.shared_bytes <= most))
      plan = candidate;
  }
  while (plan.cluster > 0 && plan.cluster < limits.widest_cluster &&
         channels * plan.cluster < limits.multiprocessors && plan_of(2 * plan.cluster).share >= kMinShare)
    plan = plan_of(2 * plan.cluster);
  return plan;
}

// Whether `kernel` can run `plan` on `device`: its sm_90 code (not the sm_80 PTX compiled for a
// newer GPU) where the cluster has more than one block, and room for at least one such cluster.
// Asked once per kernel, device, cluster and size.
bool one_pass_fits(const void* kernel, int device, unsigned blocks, const OnePassPlan& plan) {
#ifdef PETRA_CUDA_EMULATION
  (void)kernel, (void)device, (void)blocks, (void)plan;
  return true;
#else
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, unsigned, std::size_t>, bool> known;
  {
    const std::lock_guard lock(mutex);
    if (auto it = known.find({kernel, device, plan.cluster, plan.shared_bytes}); it != known.end()) return it->second;
  }
  cuda_detail::DeviceGuard guard(device);
  cudaFuncAttributes attributes{};
  PETRA_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  // ptxVersion, the virtual architecture the code was compiled from (its __CUDA_ARCH__), not
  // binaryVersion: sm_80 PTX compiled by the driver for an sm_90 GPU reports binaryVersion 90, yet
  // runs cluster.cuh's one-block code (a peer rank there traps, and the context is lost).
  bool fits = plan.cluster == 1 || attributes.ptxVersion >= 90;
  if (fits && plan.shared_bytes > 0) cuda_detail::allow_dynamic_shared(kernel, device, plan.shared_bytes);
  if (fits && plan.cluster > 1) {
    cudaLaunchAttribute attribute;
    const cudaLaunchConfig_t config =
        cuda_detail::cluster_launch_config(blocks, kBlockThreads, plan.cluster, plan.shared_bytes, nullptr, attribute);
    int clusters = 0;
    const cudaError_t status = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
    if (status == cudaSuccess) {
      fits = clusters > 0;
    } else if (status == cudaErrorInvalidClusterSize || status == cudaErrorInvalidValue ||
               status == cudaErrorNotSupported) {
      (void)cudaGetLastError();  // a refusal of this cluster or size: an answer (the two passes), not
      fits = false;              // an error for the next launch's check
    } else {
      // anything else (the query "may also return error codes from previous, asynchronous
      // launches"): thrown (and cleared), not remembered as the answer
      cuda_detail::throw_cuda_error(status, "cudaOccupancyMaxActiveClusters", __FILE__, __LINE__);
    }
  }
  const std::lock_guard lock(mutex);
  known.emplace(std::tuple{kernel, device, plan.cluster, plan.shared_bytes}, fits);
  return fits;
#endif
}

// The one pass's plan for `kernel` on s's device, or {} (the two passes).
template <class Kernel>
OnePassPlan one_pass_plan(const StreamHandle& s, Kernel* kernel, std::int64_t channels, std::int64_t count,
                          std::size_t vector_bytes, int arrays) {
  if (!one_pass_on.load(std::memory_order_relaxed) || count <= 0) return {};
  const OnePassPlan plan = size_one_pass(one_pass_limits(s.device_index), channels, count, vector_bytes, arrays);
  if (plan.cluster == 0 ||
      !one_pass_fits(reinterpret_cast<const void*>(kernel), s.device_index, unsigned(channels) * plan.cluster, plan))
    return {};
  return plan;
}

// The first pass: one block per (channel, slice), on float4s where vector_path allows.
template <Sums sums, bool relu>
void launch_partials(const char* name, const StreamHandle& s, const BatchNormShape& shape,
                     std::int64_t slices, const float* x, const float* y, const float* dy,
                     const float* saved_mean, double* partials) {
  const unsigned blocks = unsigned(shape.channels * slices);
  if (vector_path(shape, {x, y, dy}))
    cuda_detail::launch_blocks(name, s, blocks, kBlockThreads, channel_partials<sums, relu, float4>, shape.channels,
                               FastDivide(shape.plane() / 4), shape.values_per_channel() / 4, slices, x, y, dy,
                               saved_mean, partials);
  else
    cuda_detail::launch_blocks(name, s, blocks, kBlockThreads, channel_partials<sums, relu, float>, shape.channels,
                               FastDivide(shape.plane()), shape.values_per_channel(), slices, x, y, dy, saved_mean,
                               partials);
}

// The launch names (what the emulation's last_launch() and a profiler show) of the variants.
struct LaunchNames {
  const char* statistics;
  const char* forward_train;
  const char* forward_eval;
  const char* gradient_sums;
  const char* backward;
  const char* forward_one_pass;
  const char* backward_one_pass;
};
constexpr LaunchNames kPlainNames{"batchnorm_statistics",        "batchnorm_forward_train",
                                  "batchnorm_forward_eval",      "batchnorm_gradient_sums",
                                  "batchnorm_backward",          "batchnorm_forward_train_one_pass",
                                  "batchnorm_backward_one_pass"};
constexpr LaunchNames kReluNames{"batchnorm_relu_statistics",   "batchnorm_relu_forward_train",
                                 "batchnorm_relu_forward_eval", "batchnorm_relu_gradient_sums",
                                 "batchnorm_relu_backward",     "batchnorm_relu_forward_train_one_pass",
                                 "batchnorm_relu_backward_one_pass"};
constexpr LaunchNames kCouplingNames{"batchnorm_relu_coupling_statistics",
                                     "batchnorm_relu_coupling_train",
                                     "batchnorm_relu_coupling_eval",
                                     nullptr,
                                     nullptr,
                                     "batchnorm_relu_coupling_train_one_pass",
                                     nullptr};
template <bool relu>
constexpr const LaunchNames& names() {
  return relu ? kReluNames : kPlainNames;
}

template <class Output>
void forward_train(const LaunchNames& names, const StreamHandle& s, const BatchNormShape& shape,
                   double eps, double momentum, const float* x, const float* gamma,
                   const float* beta, const Output& output, float* saved_mean,
                   float* saved_invstd, float* running_mean, float* running_var) {
  if (shape.size() <= 0) return;
  const bool vector = vector_path(shape, {x}) && output.aligned();
  const std::int64_t width = vector ? 4 : 1, count = shape.values_per_channel() / width;
  const auto one_pass = vector ? resident_forward<Output, float4> : resident_forward<Output, float>;
  if (const OnePassPlan plan = one_pass_plan(s, one_pass, shape.channels, count, std::size_t(width) * sizeof(float), 1);
      plan.cluster > 0) {
    cuda_detail::launch_clusters(names.forward_one_pass, s, unsigned(shape.channels) * plan.cluster, kBlockThreads,
                                 plan.cluster, plan.shared_bytes, one_pass, shape.channels,
                                 FastDivide(shape.plane() / width), count, plan.cluster, plan.share, eps, momentum, x,
                                 gamma, beta, saved_mean, saved_invstd, running_mean, running_var, output);
    return;
  }
  const std::int64_t slices = slices_of(shape);
  // Scratch: the partial pairs, then three floats per channel (the maps).
  const std::size_t partial_bytes = 2 * std::size_t(shape.channels * slices) * sizeof(double);
  auto* scratch = static_cast<unsigned char*>(
      s.scratch(partial_bytes + 3 * std::size_t(shape.channels) * sizeof(float)));
  auto* partials = reinterpret_cast<double*>(scratch);
  auto* maps = reinterpret_cast<float*>(scratch + partial_bytes);
  launch_partials<Sums::kStatistics, false>(names.statistics, s, shape, slices, x, nullptr,
                                            nullptr, nullptr, partials);
  launch_grid_stride(names.statistics, s, shape.channels * 32, statistics, shape.channels,
                     shape.plane(), shape.values_per_channel(), slices, eps, momentum, x,
                     gamma, beta, partials, saved_mean, saved_invstd, running_mean, running_var,
                     maps);
  const ChannelOf channel_of(shape.plane(), shape.channels);
  if (vector)
    launch_grid_stride(names.forward_train, s, shape.size() / 4, normalise<Output, float4>, shape.size() / 4, channel_of,
                       second_walk(shape), x, maps, output);
  else
    launch_grid_stride(names.forward_train, s, shape.size(), normalise<Output, float>, shape.size(), channel_of,
                       second_walk(shape), x, maps, output);
}

template <class Output>
void forward_eval(const LaunchNames& names, const StreamHandle& s, const BatchNormShape& shape,
                  double eps, const float* x, const float* gamma, const float* beta,
                  const float* running_mean, const float* running_var, const Output& output) {
  const ChannelOf channel_of(shape.plane(), shape.channels);
  if (vector_path(shape, {x}) && output.aligned())
    launch_grid_stride(names.forward_eval, s, shape.size() / 4, normalise_eval<Output, float4>, shape.size() / 4,
                       channel_of, float(eps), x, gamma, beta, running_mean, running_var, output);
  else
    launch_grid_stride(names.forward_eval, s, shape.size(), normalise_eval<Output, float>, shape.size(), channel_of,
                       float(eps), x, gamma, beta, running_mean, running_var, output);
}

// y: the fused forward's output when relu (the mask), else unused.
template <bool relu>
void backward(const StreamHandle& s, const BatchNormShape& shape, const float* x, const float* y,
              const float* dy, const float* gamma, const float* saved_mean,
              const float* saved_invstd, float* dx, float* dgamma, float* dbeta) {
  if (shape.size() <= 0) return;
  const bool vector = vector_path(shape, {x, y, dy, dx});
  const std::int64_t width = vector ? 4 : 1, count = shape.values_per_channel() / width;
  const auto one_pass = vector ? resident_backward<relu, float4> : resident_backward<relu, float>;
  if (const OnePassPlan plan = one_pass_plan(s, one_pass, shape.channels, count, std::size_t(width) * sizeof(float), 2);
      plan.cluster > 0) {
    cuda_detail::launch_clusters(names<relu>().backward_one_pass, s, unsigned(shape.channels) * plan.cluster,
                                 kBlockThreads, plan.cluster, plan.shared_bytes, one_pass, shape.channels,
                                 FastDivide(shape.plane() / width), count, plan.cluster, plan.share, x, y, dy, gamma,
                                 saved_mean, saved_invstd, dx, dgamma, dbeta);
    return;
  }
  const std::int64_t slices = slices_of(shape);
  // Scratch: the partial pairs, then three floats per channel.
  const std::size_t partial_bytes = 2 * std::size_t(shape.channels * slices) * sizeof(double);
  auto* scratch = static_cast<unsigned char*>(
      s.scratch(partial_bytes + 3 * std::size_t(shape.channels) * sizeof(float)));
  auto* partials = reinterpret_cast<double*>(scratch);
  auto* coefficients = reinterpret_cast<float*>(scratch + partial_bytes);
  launch_partials<Sums::kGradients, relu>(names<relu>().gradient_sums, s, shape, slices, x, y, dy,
                                          saved_mean, partials);
  launch_grid_stride(names<relu>().gradient_sums, s, shape.channels * 32, gradient_coefficients,
                     shape.channels, shape.values_per_channel(), slices, partials, gamma,
                     saved_invstd, coefficients, dgamma, dbeta);
  const ChannelOf channel_of(shape.plane(), shape.channels);
  if (vector)
    launch_grid_stride(names<relu>().backward, s, shape.size() / 4, input_gradient<relu, float4>, shape.size() / 4,
                       channel_of, second_walk(shape), x, y, dy, saved_mean, coefficients, dx);
  else
    launch_grid_stride(names<relu>().backward, s, shape.size(), input_gradient<relu, float>, shape.size(), channel_of,
                       second_walk(shape), x, y, dy, saved_mean, coefficients, dx);
}

}  // namespace

void set_batchnorm_one_pass(bool on) { one_pass_on.store(on, std::memory_order_relaxed); }
bool batchnorm_one_pass() { return one_pass_on.load(std::memory_order_relaxed); }

void batchnorm_forward_train(const StreamHandle& s, const BatchNormShape& shape, double eps,
                             double momentum, const float* x, const float* gamma,
                             const float* beta, float* y, float* saved_mean, float* saved_invstd,
                             float* running_mean, float* running_var) {
  forward_train(kPlainNames, s, shape, eps, momentum, x, gamma, beta, TensorOutput<false>{y},
                saved_mean, saved_invstd, running_mean, running_var);
}

int batchnorm_one_pass_cluster(const StreamHandle& s, const BatchNormShape& shape, bool backward) {
  const bool vector = shape.plane() % 4 == 0;  // (vector_path, for aligned tensors)
  const std::int64_t width = vector ? 4 : 1, count = shape.values_per_channel() / width;
  const std::size_t bytes = std::size_t(width) * sizeof(float);
  const OnePassPlan plan =
      backward ? one_pass_plan(s, vector ? resident_backward<false, float4> : resident_backward<false, float>,
                               shape.channels, count, bytes, 2)
               : one_pass_plan(s, vector ? resident_forward<TensorOutput<false>, float4>
                                         : resident_forward<TensorOutput<false>, float>,
                               shape.channels, count, bytes, 1);
  return int(plan.cluster);
}

void batchnorm_forward_eval(const StreamHandle& s, const BatchNormShape& shape, double eps,
                            const float* x, const float* gamma, const float* beta,
                            const float* running_mean, const float* running_var, float* y) {
  forward_eval(kPlainNames, s, shape, eps, x, gamma, beta, running_mean, running_var,
               TensorOutput<false>{y});
}

void batchnorm_backward(const StreamHandle& s, const BatchNormShape& shape, const float* x,
                        const float* dy, const float* gamma, const float* saved_mean,
                        const float* saved_invstd, float* dx, float* dgamma, float* dbeta) {
  backward<false>(s, shape, x, nullptr, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta);
}

void batchnorm_relu_forward_train(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                  double momentum, const float* x, const float* gamma,
                                  const float* beta, float* y, float* saved_mean,
                                  float* saved_invstd, float* running_mean, float* running_var) {
  forward_train(kReluNames, s, shape, eps, momentum, x, gamma, beta, TensorOutput<true>{y},
                saved_mean, saved_invstd, running_mean, running_var);
}

void batchnorm_relu_forward_eval(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                 const float* x, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, float* y) {
  forward_eval(kReluNames, s, shape, eps, x, gamma, beta, running_mean, running_var,
               TensorOutput<true>{y});
}

void batchnorm_relu_backward(const StreamHandle& s, const BatchNormShape& shape, const float* x,
                             const float* y, const float* dy, const float* gamma,
                             const float* saved_mean, const float* saved_invstd, float* dx,
                             float* dgamma, float* dbeta) {
  backward<true>(s, shape, x, y, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta);
}

namespace {
// dx_sum += dx summed per channel, by the convolution's bias reduction (kernels/cuda/conv2d.cu).
void add_channel_sums(const StreamHandle& s, const BatchNormShape& shape, const float* dx, float* dx_sum) {
  Conv2dShape k;
  k.batch = shape.batch;
  k.in_channels = 1;
  k.in_h = shape.height;
  k.in_w = shape.width;
  k.out_channels = shape.channels;
  k.kernel_h = k.kernel_w = 1;
  conv2d_backward_bias(s, k, dx, dx_sum);
}
}  // namespace

void batchnorm_backward_summed(const StreamHandle& s, const BatchNormShape& shape, const float* x,
                               const float* dy, const float* gamma, const float* saved_mean,
                               const float* saved_invstd, float* dx, float* dgamma, float* dbeta,
                               float* dx_sum) {
  batchnorm_backward(s, shape, x, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta);
  add_channel_sums(s, shape, dx, dx_sum);
}

void batchnorm_relu_backward_summed(const StreamHandle& s, const BatchNormShape& shape,
                                    const float* x, const float* y, const float* dy,
                                    const float* gamma, const float* saved_mean,
                                    const float* saved_invstd, float* dx, float* dgamma,
                                    float* dbeta, float* dx_sum) {
  batchnorm_relu_backward(s, shape, x, y, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta);
  add_channel_sums(s, shape, dx, dx_sum);
}

void batchnorm_relu_coupling_train(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                   double momentum, CouplingDirection direction, const float* z,
                                   const float* gamma, const float* beta, const float* a,
                                   float* out, float* saved_mean, float* saved_invstd,
                                   float* running_mean, float* running_var) {
  forward_train(kCouplingNames, s, shape, eps, momentum, z, gamma, beta,
                CouplingOutput{direction, FastDivide(shape.channels * shape.plane()), a, out}, saved_mean,
                saved_invstd, running_mean, running_var);
}

void batchnorm_relu_coupling_eval(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                  CouplingDirection direction, const float* z, const float* gamma,
                                  const float* beta, const float* running_mean,
                                  const float* running_var, const float* a, float* out) {
  forward_eval(kCouplingNames, s, shape, eps, z, gamma, beta, running_mean, running_var,
               CouplingOutput{direction, FastDivide(shape.channels * shape.plane()), a, out});
}

}  // namespace petra::kernels::cuda
