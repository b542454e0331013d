// kernels/loss.hpp: softmax cross-entropy (fused with log-softmax, mean over the batch), argmax
// and accuracy on [batch, classes] logits with int64 labels.
//
//   loss = -(1/batch) * sum_b log softmax(logits[b])[labels[b]]
//   dlogits = dloss * (softmax(logits) - onehot(labels)) / batch
//
// The forward subtracts each row's max before exponentiating, so large logits cannot overflow,
// and saves the softmax probabilities [batch, classes] for the backward, which is then a
// subtraction. Labels must lie in [0, classes): the forward checks them and writes first_bad[0],
// the batch index of the first label out of range, or -1 when all are valid. When it writes an
// index, loss and probs are unspecified; the caller raises petra::Error. first_bad is memory like
// loss (device memory on a GPU), so a GPU forward never waits: the caller reads the index when it
// reads the loss.
//
// dloss (the upstream gradient of the scalar loss) and loss are pointers to one element, so that
// on a GPU they stay in device memory.
#pragma once

#include <cstdint>

#include "petra/kernels/common.hpp"

namespace petra::kernels {

struct CrossEntropyShape {
  std::int64_t batch = 0;
  std::int64_t classes = 0;
};

namespace ref {

// loss[0] =, probs = softmax(logits) (saved for the backward); first_bad[0] = -1, or the index b
// of the first labels[b] outside [0, classes).
template <class T>
void cross_entropy_forward(const StreamHandle& s, const CrossEntropyShape& shape, const T* logits,
                           const std::int64_t* labels, T* loss, T* probs, std::int64_t* first_bad);
// dlogits = dloss[0] * (probs - onehot(labels)) / batch. dlogits may be probs itself (in place).
// (A row whose label is out of range gets no onehot term; none is left after a successful forward.)
template <class T>
void cross_entropy_backward(const StreamHandle& s, const CrossEntropyShape& shape, const T* probs,
                            const std::int64_t* labels, const T* dloss, T* dlogits);
// predicted[b] = index of the largest logit of row b: the first one on ties; a NaN counts as
// larger than any number, as in PyTorch.
template <class T>
void argmax(const StreamHandle& s, const CrossEntropyShape& shape, const T* logits, std::int64_t* predicted);
// correct[0] = number of rows b with argmax(logits[b]) == labels[b]
template <class T>
void count_correct(const StreamHandle& s, const CrossEntropyShape& shape, const T* logits,
                   const std::int64_t* labels, std::int64_t* correct);

}  // namespace ref

// Same contracts as ref::, for float and double.
namespace cpu {

template <class T>
void cross_entropy_forward(const StreamHandle& s, const CrossEntropyShape& shape, const T* logits,
                           const std::int64_t* labels, T* loss, T* probs, std::int64_t* first_bad);
template <class T>
void cross_entropy_backward(const StreamHandle& s, const CrossEntropyShape& shape, const T* probs,
                            const std::int64_t* labels, const T* dloss, T* dlogits);
template <class T>
void argmax(const StreamHandle& s, const CrossEntropyShape& shape, const T* logits, std::int64_t* predicted);
template <class T>
void count_correct(const StreamHandle& s, const CrossEntropyShape& shape, const T* logits,
                   const std::int64_t* labels, std::int64_t* correct);

}  // namespace cpu

// Same contracts, float, on the GPU (kernels/cuda/loss.cu), with every pointer in device memory:
// logits, labels, probs, loss, first_bad, dloss, dlogits, predicted and correct (so the loss, the
// first bad label and count_correct's result are each one number on the device, which the caller
// copies back when it needs them). A block per row, fixed-order trees, no atomics: the same input
// gives the same bits. All four are asynchronous: none waits for the GPU. cross_entropy_forward
// needs s.workspace (a double per row), count_correct too (an int64 per row).
namespace cuda {

void cross_entropy_forward(const StreamHandle& s, const CrossEntropyShape& shape, const float* logits,
                           const std::int64_t* labels, float* loss, float* probs, std::int64_t* first_bad);
void cross_entropy_backward(const StreamHandle& s, const CrossEntropyShape& shape, const float* probs,
                            const std::int64_t* labels, const float* dloss, float* dlogits);
void argmax(const StreamHandle& s, const CrossEntropyShape& shape, const float* logits,
            std::int64_t* predicted);
void count_correct(const StreamHandle& s, const CrossEntropyShape& shape, const float* logits,
                   const std::int64_t* labels, std::int64_t* correct);

}  // namespace cuda

}  // namespace petra::kernels
