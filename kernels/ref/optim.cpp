// kernels/ref/optim.cpp: the reference optimizer updates, one element at a time in double,
// written as the formulas of kernels/optim.hpp.
#include <cmath>

#include "petra/kernels/optim.hpp"

namespace petra::kernels::ref {

template <class T>
void sgd_step(const StreamHandle&, std::int64_t n, const SgdOptions& o, bool first_step, T* param, const T* grad,
              T* momentum_buffer) {
  const CompensatedMomentum spike = o.delay > 0 ? compensated_momentum(o) : CompensatedMomentum{1, 0};
  for (std::int64_t i = 0; i < n; ++i) {
    double g = double(grad[i]) + o.weight_decay * double(param[i]);
    if (o.momentum != 0) {
      const double buf = first_step ? g : o.momentum * double(momentum_buffer[i]) + (1 - o.dampening) * g;
      momentum_buffer[i] = static_cast<T>(buf);
      if (o.delay > 0)
        g = spike.velocity_weight * buf + spike.gradient_weight * g;
      else
        g = o.nesterov ? g + o.momentum * buf : buf;
    }
    param[i] = static_cast<T>(double(param[i]) - o.lr * g);
  }
}

template <class T>
void adam_step(const StreamHandle&, std::int64_t n, const AdamOptions& o, std::int64_t step, T* param, const T* grad,
               T* exp_avg, T* exp_avg_sq) {
  const double bias_correction1 = 1 - std::pow(o.beta1, double(step));
  const double bias_correction2 = 1 - std::pow(o.beta2, double(step));
  for (std::int64_t i = 0; i < n; ++i) {
    const double g = double(grad[i]) + o.weight_decay * double(param[i]);
    const double m = o.beta1 * double(exp_avg[i]) + (1 - o.beta1) * g;
    const double v = o.beta2 * double(exp_avg_sq[i]) + (1 - o.beta2) * g * g;
    exp_avg[i] = static_cast<T>(m);
    exp_avg_sq[i] = static_cast<T>(v);
    const double m_hat = m / bias_correction1, v_hat = v / bias_correction2;
    param[i] = static_cast<T>(double(param[i]) - o.lr * m_hat / (std::sqrt(v_hat) + o.eps));
  }
}

template <class T>
void lars_step(const StreamHandle&, std::int64_t n, const LarsOptions& o, T* param, const T* grad, T* momentum_buffer) {
  double param_sq = 0, grad_sq = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    param_sq += double(param[i]) * double(param[i]);
    grad_sq += double(grad[i]) * double(grad[i]);
  }
  const double param_norm = std::sqrt(param_sq), grad_norm = std::sqrt(grad_sq);
  const double trust = param_norm > 0 && grad_norm > 0 ? o.eta * param_norm / (grad_norm + o.weight_decay * param_norm) : 1.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double update = o.lr * trust * (double(grad[i]) + o.weight_decay * double(param[i]));
    const double buf = o.momentum * double(momentum_buffer[i]) + update;
    momentum_buffer[i] = static_cast<T>(buf);
    param[i] = static_cast<T>(double(param[i]) - buf);
  }
}

#define PETRA_INSTANTIATE(T)                                                                                   \
  template void sgd_step<T>(const StreamHandle&, std::int64_t, const SgdOptions&, bool, T*, const T*, T*);     \
  template void adam_step<T>(const StreamHandle&, std::int64_t, const AdamOptions&, std::int64_t, T*, const T*, \
                             T*, T*);                                                                          \
  template void lars_step<T>(const StreamHandle&, std::int64_t, const LarsOptions&, T*, const T*, T*);
PETRA_INSTANTIATE(float)
PETRA_INSTANTIATE(double)
#undef PETRA_INSTANTIATE

}  // namespace petra::kernels::ref
