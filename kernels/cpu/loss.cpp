// kernels/cpu/loss.cpp: the fast softmax cross-entropy, argmax and accuracy. Each row is one
// Eigen array expression (vectorised max, exp, sum); rows are split across threads only for
// large heads, and the per-row losses are added in row order whatever the thread count.
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <vector>

#include "petra/kernels/loss.hpp"
#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu {
namespace {

template <class T>
using Row = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <class T>
using ConstRow = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

std::int64_t first_bad_label(const CrossEntropyShape& shape, const std::int64_t* labels) {
  for (std::int64_t b = 0; b < shape.batch; ++b)
    if (labels[b] < 0 || labels[b] >= shape.classes) return b;
  return -1;
}

}  // namespace

template <class T>
void cross_entropy_forward(const StreamHandle& s, const CrossEntropyShape& shape, const T* logits,
                           const std::int64_t* labels, T* loss, T* probs, std::int64_t* first_bad) {
  first_bad[0] = first_bad_label(shape, labels);
  if (first_bad[0] >= 0) return;
  const std::int64_t classes = shape.classes;
  std::vector<double> row_loss(static_cast<std::size_t>(shape.batch));
  parallel_for(threads_above(s, shape.batch * shape.classes), shape.batch, [&](std::int64_t b) {
    const ConstRow<T> logit(logits + b * classes, classes);
    Row<T> prob(probs + b * classes, classes);
    const T max = logit.maxCoeff();
    prob = (logit - max).exp();
    const T sum_exp = prob.sum();
    prob *= T(1) / sum_exp;
    row_loss[std::size_t(b)] = std::log(double(sum_exp)) - (double(logit[labels[b]]) - double(max));
  });
  double total = 0;
  for (double l : row_loss) total += l;
  loss[0] = static_cast<T>(total / double(shape.batch));
}

template <class T>
void cross_entropy_backward(const StreamHandle& s, const CrossEntropyShape& shape, const T* probs,
                            const std::int64_t* labels, const T* dloss, T* dlogits) {
  const T factor = static_cast<T>(double(dloss[0]) / double(shape.batch));
  const std::int64_t classes = shape.classes;
  parallel_for(threads_above(s, shape.batch * shape.classes), shape.batch, [&](std::int64_t b) {
    Row<T>(dlogits + b * classes, classes) = ConstRow<T>(probs + b * classes, classes) * factor;
    if (labels[b] >= 0 && labels[b] < classes) dlogits[b * classes + labels[b]] -= factor;
  });
}

// argmax and accuracy are one comparison per logit: the reference loop is already as fast as it
// gets, so the cpu versions are the ref ones.
template <class T>
void argmax(const StreamHandle& s, const CrossEntropyShape& shape, const T* logits, std::int64_t* predicted) {
  ref::argmax<T>(s, shape, logits, predicted);
}

template <class T>
void count_correct(const StreamHandle& s, const CrossEntropyShape& shape, const T* logits, const std::int64_t* labels,
                   std::int64_t* correct) {
  ref::count_correct<T>(s, shape, logits, labels, correct);
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

}  // namespace petra::kernels::cpu
