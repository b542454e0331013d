// kernels/cuda/loss.cu: the cuda:: softmax cross-entropy, argmax and accuracy of
// kernels/loss.hpp, float logits, int64 labels, every pointer in device memory.
//
// A row of logits is one sample's `classes` values, and a block owns one row at a time (the
// blocks stride over the rows). The block has T threads, the power of two from 32 to 256 just
// above `classes` (10 classes: one warp; 1000: 256 threads, about 4 values each), so that small
// heads do not leave most of a block idle; T depends on the shape only. Thread t takes the row's
// values t, t + T, ... (consecutive threads read consecutive floats: coalesced).
//
// Forward (two launches on the stream, which orders them):
//   1. softmax_rows, a block per row: the row's max (each thread over its values, then a fixed
//      tree over the threads in shared memory, kernels/cuda/block_reduce.cuh), then
//      sum_exp = sum of exp(x - max) in double (the same: per thread, then the tree), then
//      probs = float(exp(x - max) / sum_exp) in double, and thread 0 writes the row's loss,
//      log(sum_exp) - (x[label] - max), in double to scratch. ref:: does the same arithmetic in
//      double; only the order of the sum differs, so probs and loss agree with ref:: to a
//      rounding of the double sum (nvcc's exp and log are within an ulp of the host's).
//   2. finish_loss, one block: adds the per-row losses (each thread a fixed strided subset in
//      order, then the tree) and writes loss[0] = float(total / batch); the same block finds the
//      first label outside [0, classes) (the smallest such row, by the same tree with min).
//      That index stays on the device beside the loss: nothing here waits for the GPU, so a
//      training step never stalls the host (the trainer reads both when it reports, a chunk of
//      steps later). Rows with a bad label read no logit at their label.
// Backward: one element-wise grid-stride pass, dlogits = float(dloss / batch * (probs -
// onehot)) in double, as ref:: computes it: ref::'s bits, and safe in place (dlogits == probs).
// argmax: a block per row; each thread keeps the first best of its values (NaN beats every
// number; ties keep the earlier), and the tree keeps, of two candidates, the better one or, on a
// tie, the smaller index: exactly ref::'s first maximum. count_correct: argmax into scratch,
// then one block counts the rows where it equals the label (an integer sum).
// Determinism: every sum and comparison happens in an order fixed by the shape (the tree, the
// strides), never by the grid or the scheduling, and nothing uses atomics: the same input gives
// the same bits on every run.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "petra/kernels/cuda/block_reduce.cuh"
#include "petra/kernels/cuda/launch.cuh"
#include "petra/kernels/loss.hpp"

namespace petra::kernels::cuda {
namespace {

using cuda_detail::block_stride_blocks;
using cuda_detail::block_tree;
using cuda_detail::block_tree_sum;
using cuda_detail::grid_threads;
using cuda_detail::kBlockThreads;
using cuda_detail::launch_blocks;
using cuda_detail::launch_grid_stride;
using cuda_detail::thread_index;

// Threads of a block that walks `count` values: the power of two from 32 to kBlockThreads just
// at or above count.
unsigned threads_for(std::int64_t count) {
  unsigned threads = 32;
  while (threads < unsigned(kBlockThreads) && threads < count) threads *= 2;
  return threads;
}

// True when a should replace b as the best so far: larger, or a NaN replacing a number.
__device__ inline bool beats(float a, float b) { return a > b || (a != a && b == b); }

__global__ void __launch_bounds__(kBlockThreads)
    softmax_rows(std::int64_t batch, std::int64_t classes, const float* logits,
                 const std::int64_t* labels, float* probs, double* row_loss) {
  __shared__ double maxima[kBlockThreads];
  __shared__ double sums[kBlockThreads];
  for (std::int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    const float* row = logits + b * classes;
    double max = -INFINITY;
    for (std::int64_t c = threadIdx.x; c < classes; c += blockDim.x)
      max = max < double(row[c]) ? double(row[c]) : max;
    maxima[threadIdx.x] = max;
    block_tree([&](unsigned into, unsigned from) {
      if (maxima[into] < maxima[from]) maxima[into] = maxima[from];
    });
    max = maxima[0];
    double sum = 0;
    for (std::int64_t c = threadIdx.x; c < classes; c += blockDim.x) sum += exp(double(row[c]) - max);
    sums[threadIdx.x] = sum;
    block_tree_sum(sums);
    const double sum_exp = sums[0];
    for (std::int64_t c = threadIdx.x; c < classes; c += blockDim.x)
      probs[b * classes + c] = float(exp(double(row[c]) - max) / sum_exp);
    if (threadIdx.x == 0) {
      const std::int64_t label = labels[b];
      row_loss[b] = label >= 0 && label < classes ? log(sum_exp) - (double(row[label]) - max) : 0.0;
    }
  }
}

// One block: loss[0] = float(sum of row_loss / batch); first_bad[0] = the first row whose label
// is outside [0, classes), or -1.
__global__ void __launch_bounds__(kBlockThreads)
    finish_loss(std::int64_t batch, std::int64_t classes, const std::int64_t* labels,
                const double* row_loss, float* loss, std::int64_t* first_bad) {
  __shared__ double totals[kBlockThreads];
  __shared__ std::int64_t firsts[kBlockThreads];
  double total = 0;
  std::int64_t first = batch;  // none
  for (std::int64_t b = threadIdx.x; b < batch; b += blockDim.x) {
    total += row_loss[b];
    if (first == batch && (labels[b] < 0 || labels[b] >= classes)) first = b;
  }
  totals[threadIdx.x] = total;
  firsts[threadIdx.x] = first;
  block_tree([&](unsigned into, unsigned from) {
    totals[into] += totals[from];
    if (firsts[from] < firsts[into]) firsts[into] = firsts[from];
  });
  if (threadIdx.x == 0) {
    loss[0] = float(totals[0] / double(batch));  // batch 0: NaN, as ref::
    first_bad[0] = firsts[0] < batch ? firsts[0] : -1;
  }
}

__global__ void cross_entropy_gradient(std::int64_t batch, std::int64_t classes, const float* probs,
                                       const std::int64_t* labels, const float* dloss,
                                       float* dlogits) {
  const double factor = double(dloss[0]) / double(batch);
  const std::int64_t n = batch * classes;
  for (std::int64_t k = thread_index(); k < n; k += grid_threads()) {
    const std::int64_t b = k / classes, c = k - b * classes;
    const double onehot = c == labels[b] ? 1.0 : 0.0;
    dlogits[k] = float(factor * (double(probs[k]) - onehot));
  }
}

// predicted[b] = the first index of row b's largest value (NaN the largest); 0 for no classes.
__global__ void __launch_bounds__(kBlockThreads)
    argmax_rows(std::int64_t batch, std::int64_t classes, const float* logits,
                std::int64_t* predicted) {
  __shared__ float values[kBlockThreads];
  __shared__ std::int64_t at[kBlockThreads];
  for (std::int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    const float* row = logits + b * classes;
    float best = 0;
    std::int64_t best_at = classes;  // none yet
    for (std::int64_t c = threadIdx.x; c < classes; c += blockDim.x)
      if (best_at == classes || beats(row[c], best)) {
        best = row[c];
        best_at = c;
      }
    values[threadIdx.x] = best;
    at[threadIdx.x] = best_at;
    block_tree([&](unsigned into, unsigned from) {
      if (at[from] == classes) return;
      if (at[into] == classes || beats(values[from], values[into]) ||
          (!beats(values[into], values[from]) && at[from] < at[into])) {
        values[into] = values[from];
        at[into] = at[from];
      }
    });
    if (threadIdx.x == 0) predicted[b] = at[0] < classes ? at[0] : 0;
  }
}

// One block: correct[0] = number of rows with predicted[b] == labels[b].
__global__ void __launch_bounds__(kBlockThreads)
    count_matches(std::int64_t batch, const std::int64_t* predicted, const std::int64_t* labels,
                  std::int64_t* correct) {
  __shared__ std::int64_t counts[kBlockThreads];
  std::int64_t count = 0;
  for (std::int64_t b = threadIdx.x; b < batch; b += blockDim.x) count += predicted[b] == labels[b] ? 1 : 0;
  counts[threadIdx.x] = count;
  block_tree_sum(counts);
  if (threadIdx.x == 0) correct[0] = counts[0];
}

void launch_argmax(const char* name, const StreamHandle& s, const CrossEntropyShape& shape,
                   const float* logits, std::int64_t* predicted) {
  if (shape.batch <= 0) return;
  launch_blocks(name, s, block_stride_blocks(shape.batch), threads_for(shape.classes), argmax_rows,
                shape.batch, shape.classes, logits, predicted);
}

}  // namespace

void cross_entropy_forward(const StreamHandle& s, const CrossEntropyShape& shape, const float* logits,
                           const std::int64_t* labels, float* loss, float* probs, std::int64_t* first_bad) {
  auto* row_loss = static_cast<double*>(s.scratch(std::max<std::size_t>(std::size_t(shape.batch), 1) * sizeof(double)));
  if (shape.batch > 0)
    launch_blocks("cross_entropy_forward", s, block_stride_blocks(shape.batch),
                  threads_for(shape.classes), softmax_rows, shape.batch, shape.classes, logits,
                  labels, probs, row_loss);
  launch_blocks("cross_entropy_loss", s, 1, threads_for(shape.batch), finish_loss, shape.batch,
                shape.classes, labels, row_loss, loss, first_bad);
}

void cross_entropy_backward(const StreamHandle& s, const CrossEntropyShape& shape, const float* probs,
                            const std::int64_t* labels, const float* dloss, float* dlogits) {
  launch_grid_stride("cross_entropy_backward", s, shape.batch * shape.classes, cross_entropy_gradient,
                     shape.batch, shape.classes, probs, labels, dloss, dlogits);
}

void argmax(const StreamHandle& s, const CrossEntropyShape& shape, const float* logits,
            std::int64_t* predicted) {
  launch_argmax("argmax", s, shape, logits, predicted);
}

void count_correct(const StreamHandle& s, const CrossEntropyShape& shape, const float* logits,
                   const std::int64_t* labels, std::int64_t* correct) {
  auto* predicted = static_cast<std::int64_t*>(
      s.scratch(std::max<std::size_t>(std::size_t(shape.batch), 1) * sizeof(std::int64_t)));
  launch_argmax("count_correct", s, shape, logits, predicted);
  launch_blocks("count_correct", s, 1, threads_for(shape.batch), count_matches, shape.batch,
                predicted, labels, correct);
}

}  // namespace petra::kernels::cuda
