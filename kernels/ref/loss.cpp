// kernels/ref/loss.cpp: the reference softmax cross-entropy, argmax and accuracy (plain loops,
// double math).
#include <algorithm>
#include <cmath>

#include "petra/kernels/loss.hpp"

namespace petra::kernels::ref {
namespace {

std::int64_t first_bad_label(const CrossEntropyShape& shape, const std::int64_t* labels) {
  for (std::int64_t b = 0; b < shape.batch; ++b)
    if (labels[b] < 0 || labels[b] >= shape.classes) return b;
  return -1;
}

// True when a should replace the current best b in an argmax: larger, or the first NaN.
template <class T>
bool beats(T a, T b) {
  return a > b || (std::isnan(a) && !std::isnan(b));
}

template <class T>
std::int64_t argmax_of_row(const T* row, std::int64_t classes) {
  std::int64_t best = 0;
  for (std::int64_t c = 1; c < classes; ++c)
    if (beats(row[c], row[best])) best = c;
  return best;
}

}  // namespace

template <class T>
void cross_entropy_forward(const StreamHandle&, const CrossEntropyShape& shape, const T* logits,
                           const std::int64_t* labels, T* loss, T* probs, std::int64_t* first_bad) {
  first_bad[0] = first_bad_label(shape, labels);
  if (first_bad[0] >= 0) return;
  const std::int64_t classes = shape.classes;
  double total = 0;  // sum over rows of -log softmax[label]
  for (std::int64_t b = 0; b < shape.batch; ++b) {
    const T* row = logits + b * classes;
    double max = double(row[0]);
    for (std::int64_t c = 1; c < classes; ++c) max = std::max(max, double(row[c]));
    double sum_exp = 0;
    for (std::int64_t c = 0; c < classes; ++c) sum_exp += std::exp(double(row[c]) - max);
    for (std::int64_t c = 0; c < classes; ++c) probs[b * classes + c] = static_cast<T>(std::exp(double(row[c]) - max) / sum_exp);
    // -log softmax[label] = log(sum_exp) - (logit[label] - max)
    total += std::log(sum_exp) - (double(row[labels[b]]) - max);
  }
  loss[0] = static_cast<T>(total / double(shape.batch));
}

template <class T>
void cross_entropy_backward(const StreamHandle&, const CrossEntropyShape& shape, const T* probs,
                            const std::int64_t* labels, const T* dloss, T* dlogits) {
  const double factor = double(dloss[0]) / double(shape.batch);
  for (std::int64_t b = 0; b < shape.batch; ++b) {
    for (std::int64_t c = 0; c < shape.classes; ++c) {
      const double onehot = c == labels[b] ? 1.0 : 0.0;
      dlogits[b * shape.classes + c] = static_cast<T>(factor * (double(probs[b * shape.classes + c]) - onehot));
    }
  }
}

template <class T>
void argmax(const StreamHandle&, const CrossEntropyShape& shape, const T* logits, std::int64_t* predicted) {
  for (std::int64_t b = 0; b < shape.batch; ++b) predicted[b] = argmax_of_row(logits + b * shape.classes, shape.classes);
}

template <class T>
void count_correct(const StreamHandle&, const CrossEntropyShape& shape, const T* logits, const std::int64_t* labels,
                   std::int64_t* correct) {
  std::int64_t count = 0;
  for (std::int64_t b = 0; b < shape.batch; ++b)
    if (argmax_of_row(logits + b * shape.classes, shape.classes) == labels[b]) ++count;
  correct[0] = count;
}

#define PETRA_INSTANTIATE(T)                                                                                       \
  template void cross_entropy_forward<T>(const StreamHandle&, const CrossEntropyShape&, const T*,                  \
                                         const std::int64_t*, T*, T*, std::int64_t*);                              \
  template void cross_entropy_backward<T>(const StreamHandle&, const CrossEntropyShape&, const T*,                 \
                                          const std::int64_t*, const T*, T*);                                      \
  template void argmax<T>(const StreamHandle&, const CrossEntropyShape&, const T*, std::int64_t*);                 \
  template void count_correct<T>(const StreamHandle&, const CrossEntropyShape&, const T*, const std::int64_t*,     \
                                 std::int64_t*);
PETRA_INSTANTIATE(float)
PETRA_INSTANTIATE(double)
#undef PETRA_INSTANTIATE

}  // namespace petra::kernels::ref
