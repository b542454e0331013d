// kernels/cpu/optim.cpp: the fast optimizer updates: one fused pass over the arrays (PyTorch
// makes several), in T, in PyTorch's order of operations; threads (one contiguous range each)
// only for large arrays. LARS first computes its two norms in double with deterministic_sum
// (kernels/cpu/parallel.hpp): pieces whose size does not depend on the thread count, so the
// result does not either.
#include <algorithm>
#include <array>
#include <cmath>

#include "petra/kernels/optim.hpp"
#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu {
namespace {

// Sum of squares of n contiguous values in double; 32 independent accumulators keep the loop
// at memory speed.
template <class T>
double sum_of_squares_contiguous(const T* x, std::int64_t n) {
  constexpr int kLanes = 32;
  double total = 0;
  std::int64_t i = 0;
  if (n >= kLanes) {
    std::array<double, kLanes> lanes{};
    for (; i + kLanes <= n; i += kLanes)
      for (int j = 0; j < kLanes; ++j) lanes[j] += double(x[i + j]) * double(x[i + j]);
    for (double lane : lanes) total += lane;
  }
  for (; i < n; ++i) total += double(x[i]) * double(x[i]);
  return total;
}

// ||x||, from fixed pieces summed in parallel and then added in order.
template <class T>
double norm(const StreamHandle& s, std::int64_t n, const T* x) {
  return std::sqrt(deterministic_sum(threads_above(s, n), n, [&](std::int64_t begin, std::int64_t count) {
    return sum_of_squares_contiguous(x + begin, count);
  }));
}

}  // namespace

template <class T>
void sgd_step(const StreamHandle& s, std::int64_t n, const SgdOptions& o, bool first_step, T* param, const T* grad,
              T* momentum_buffer) {
  const T lr = T(o.lr), weight_decay = T(o.weight_decay), momentum = T(o.momentum);
  const T one_minus_dampening = T(1 - o.dampening);
  const bool nesterov = o.nesterov;
  if (o.momentum == 0) {
    for_each_range(threads_above(s, n), n, [=](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) param[i] -= lr * (grad[i] + weight_decay * param[i]);
    });
    return;
  }
  if (o.delay > 0) {  // spike compensation (kernels/optim.hpp)
    const CompensatedMomentum spike = compensated_momentum(o);
    const T velocity_weight = T(spike.velocity_weight), gradient_weight = T(spike.gradient_weight);
    for_each_range(threads_above(s, n), n, [=](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) {
        const T g = grad[i] + weight_decay * param[i];
        const T buf = first_step ? g : momentum * momentum_buffer[i] + g;
        momentum_buffer[i] = buf;
        param[i] -= lr * (velocity_weight * buf + gradient_weight * g);
      }
    });
    return;
  }
  for_each_range(threads_above(s, n), n, [=](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const T g = grad[i] + weight_decay * param[i];
      const T buf = first_step ? g : momentum * momentum_buffer[i] + one_minus_dampening * g;
      momentum_buffer[i] = buf;
      param[i] -= lr * (nesterov ? g + momentum * buf : buf);
    }
  });
}

template <class T>
void adam_step(const StreamHandle& s, std::int64_t n, const AdamOptions& o, std::int64_t step, T* param, const T* grad,
               T* exp_avg, T* exp_avg_sq) {
  const double bias_correction1 = 1 - std::pow(o.beta1, double(step));
  const double bias_correction2 = 1 - std::pow(o.beta2, double(step));
  const T step_size = T(o.lr / bias_correction1);
  const T inv_bias_correction2_sqrt = T(1 / std::sqrt(bias_correction2));
  const T weight_decay = T(o.weight_decay), one_minus_beta1 = T(1 - o.beta1), beta2 = T(o.beta2);
  const T one_minus_beta2 = T(1 - o.beta2), eps = T(o.eps);
  for_each_range(threads_above(s, n), n, [=](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const T g = grad[i] + weight_decay * param[i];
      const T m = exp_avg[i] + one_minus_beta1 * (g - exp_avg[i]);
      const T v = beta2 * exp_avg_sq[i] + one_minus_beta2 * g * g;
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      param[i] -= step_size * m / (std::sqrt(v) * inv_bias_correction2_sqrt + eps);
    }
  });
}

template <class T>
void lars_step(const StreamHandle& s, std::int64_t n, const LarsOptions& o, T* param, const T* grad, T* momentum_buffer) {
  const double param_norm = norm(s, n, param), grad_norm = norm(s, n, grad);
  const double trust = param_norm > 0 && grad_norm > 0 ? o.eta * param_norm / (grad_norm + o.weight_decay * param_norm) : 1.0;
  const T scaled_lr = T(o.lr * trust), weight_decay = T(o.weight_decay), momentum = T(o.momentum);
  for_each_range(threads_above(s, n), n, [=](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const T buf = momentum * momentum_buffer[i] + scaled_lr * (grad[i] + weight_decay * param[i]);
      momentum_buffer[i] = buf;
      param[i] -= buf;
    }
  });
}

#define PETRA_INSTANTIATE(T)                                                                                   \
  template void sgd_step<T>(const StreamHandle&, std::int64_t, const SgdOptions&, bool, T*, const T*, T*);     \
  template void adam_step<T>(const StreamHandle&, std::int64_t, const AdamOptions&, std::int64_t, T*, const T*, \
                             T*, T*);                                                                          \
  template void lars_step<T>(const StreamHandle&, std::int64_t, const LarsOptions&, T*, const T*, T*);
PETRA_INSTANTIATE(float)
PETRA_INSTANTIATE(double)
#undef PETRA_INSTANTIATE

}  // namespace petra::kernels::cpu
