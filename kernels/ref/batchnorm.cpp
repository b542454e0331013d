// kernels/ref/batchnorm.cpp: the oracle for kernels/batchnorm.hpp, plain loops in double.
#include "petra/kernels/batchnorm.hpp"

#include <cmath>
#include <vector>

namespace petra::kernels::ref {

namespace {

// Index of value (n, c, i) of an NCHW tensor, i = h * width + w.
std::int64_t at(const BatchNormShape& shape, std::int64_t n, std::int64_t c, std::int64_t i) {
  return (n * shape.channels + c) * shape.plane() + i;
}
// The same value's index in dy (BatchNormShape::dy_image_stride).
std::int64_t at_dy(const BatchNormShape& shape, std::int64_t n, std::int64_t c, std::int64_t i) {
  return n * shape.dy_sample_stride() + c * shape.plane() + i;
}

}  // namespace

template <class T>
void batchnorm_forward_train(const StreamHandle&, const BatchNormShape& shape, double eps,
                             double momentum, const T* x, const T* gamma, const T* beta, T* y,
                             T* saved_mean, T* saved_invstd, T* running_mean, T* running_var) {
  const double count = double(shape.values_per_channel());
  for (std::int64_t c = 0; c < shape.channels; ++c) {
    double sum = 0;
    for (std::int64_t n = 0; n < shape.batch; ++n)
      for (std::int64_t i = 0; i < shape.plane(); ++i) sum += x[at(shape, n, c, i)];
    const double mean = sum / count;
    double squares = 0;
    for (std::int64_t n = 0; n < shape.batch; ++n)
      for (std::int64_t i = 0; i < shape.plane(); ++i) {
        const double d = x[at(shape, n, c, i)] - mean;
        squares += d * d;
      }
    const double var = squares / count;
    const double invstd = 1.0 / std::sqrt(var + eps);
    for (std::int64_t n = 0; n < shape.batch; ++n)
      for (std::int64_t i = 0; i < shape.plane(); ++i) {
        const std::int64_t k = at(shape, n, c, i);
        y[k] = T(double(gamma[c]) * (x[k] - mean) * invstd + double(beta[c]));
      }
    saved_mean[c] = T(mean);
    saved_invstd[c] = T(invstd);
    const double unbiased_var = count > 1 ? var * count / (count - 1) : var;
    if (running_mean) running_mean[c] = T((1 - momentum) * running_mean[c] + momentum * mean);
    if (running_var) running_var[c] = T((1 - momentum) * running_var[c] + momentum * unbiased_var);
  }
}

template <class T>
void batchnorm_forward_eval(const StreamHandle&, const BatchNormShape& shape, double eps,
                            const T* x, const T* gamma, const T* beta, const T* running_mean,
                            const T* running_var, T* y) {
  for (std::int64_t c = 0; c < shape.channels; ++c) {
    const double invstd = 1.0 / std::sqrt(double(running_var[c]) + eps);
    for (std::int64_t n = 0; n < shape.batch; ++n)
      for (std::int64_t i = 0; i < shape.plane(); ++i) {
        const std::int64_t k = at(shape, n, c, i);
        y[k] = T(double(gamma[c]) * (x[k] - double(running_mean[c])) * invstd + double(beta[c]));
      }
  }
}

template <class T>
void batchnorm_backward(const StreamHandle&, const BatchNormShape& shape, const T* x,
                        const T* dy, const T* gamma, const T* saved_mean, const T* saved_invstd,
                        T* dx, T* dgamma, T* dbeta) {
  const double count = double(shape.values_per_channel());
  for (std::int64_t c = 0; c < shape.channels; ++c) {
    const double mean = saved_mean[c], invstd = saved_invstd[c];
    double sum_dy = 0, sum_dy_xhat = 0;
    for (std::int64_t n = 0; n < shape.batch; ++n)
      for (std::int64_t i = 0; i < shape.plane(); ++i) {
        const std::int64_t k = at(shape, n, c, i), kd = at_dy(shape, n, c, i);
        sum_dy += dy[kd];
        sum_dy_xhat += dy[kd] * (x[k] - mean) * invstd;
      }
    for (std::int64_t n = 0; n < shape.batch; ++n)
      for (std::int64_t i = 0; i < shape.plane(); ++i) {
        const std::int64_t k = at(shape, n, c, i);
        const double xhat = (x[k] - mean) * invstd;
        dx[k] = T(double(gamma[c]) * invstd * (dy[at_dy(shape, n, c, i)] - sum_dy / count - xhat * sum_dy_xhat / count));
      }
    dgamma[c] = T(dgamma[c] + sum_dy_xhat);
    dbeta[c] = T(dbeta[c] + sum_dy);
  }
}


// The fused op as its definition: batch norm, then the ReLU on its output; the backward masks dy
// with y > 0 and runs batch norm's backward. Plain and slow on purpose: it is the oracle.
template <class T>
void batchnorm_relu_forward_train(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                  double momentum, const T* x, const T* gamma, const T* beta,
                                  T* y, T* saved_mean, T* saved_invstd, T* running_mean,
                                  T* running_var) {
  batchnorm_forward_train(s, shape, eps, momentum, x, gamma, beta, y, saved_mean, saved_invstd,
                          running_mean, running_var);
  for (std::int64_t k = 0; k < shape.size(); ++k) y[k] = relu_of(y[k]);
}

template <class T>
void batchnorm_relu_forward_eval(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                 const T* x, const T* gamma, const T* beta, const T* running_mean,
                                 const T* running_var, T* y) {
  batchnorm_forward_eval(s, shape, eps, x, gamma, beta, running_mean, running_var, y);
  for (std::int64_t k = 0; k < shape.size(); ++k) y[k] = relu_of(y[k]);
}

template <class T>
void batchnorm_relu_backward(const StreamHandle& s, const BatchNormShape& shape, const T* x,
                             const T* y, const T* dy, const T* gamma, const T* saved_mean,
                             const T* saved_invstd, T* dx, T* dgamma, T* dbeta) {
  std::vector<T> dy_masked(static_cast<std::size_t>(shape.size()));
  for (std::int64_t n = 0; n < shape.batch; ++n)
    for (std::int64_t c = 0; c < shape.channels; ++c)
      for (std::int64_t i = 0; i < shape.plane(); ++i) {
        const std::int64_t k = at(shape, n, c, i);
        dy_masked[std::size_t(k)] = relu_masked(y[k], dy[at_dy(shape, n, c, i)]);
      }
  BatchNormShape packed = shape;
  packed.dy_image_stride = 0;
  batchnorm_backward(s, packed, x, dy_masked.data(), gamma, saved_mean, saved_invstd, dx, dgamma,
                     dbeta);
}

namespace {
// dx_sum[c] += the sum of dx over channel c's values, in double.
template <class T>
void add_channel_sums(const BatchNormShape& shape, const T* dx, T* dx_sum) {
  for (std::int64_t c = 0; c < shape.channels; ++c) {
    double total = 0;
    for (std::int64_t n = 0; n < shape.batch; ++n)
      for (std::int64_t i = 0; i < shape.plane(); ++i) total += dx[at(shape, n, c, i)];
    dx_sum[c] = T(dx_sum[c] + total);
  }
}
}  // namespace

template <class T>
void batchnorm_backward_summed(const StreamHandle& s, const BatchNormShape& shape, const T* x,
                               const T* dy, const T* gamma, const T* saved_mean,
                               const T* saved_invstd, T* dx, T* dgamma, T* dbeta, T* dx_sum) {
  batchnorm_backward(s, shape, x, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta);
  add_channel_sums(shape, dx, dx_sum);
}

template <class T>
void batchnorm_relu_backward_summed(const StreamHandle& s, const BatchNormShape& shape, const T* x,
                                    const T* y, const T* dy, const T* gamma, const T* saved_mean,
                                    const T* saved_invstd, T* dx, T* dgamma, T* dbeta, T* dx_sum) {
  batchnorm_relu_backward(s, shape, x, y, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta);
  add_channel_sums(shape, dx, dx_sum);
}

namespace {
// out = the coupling of `a` with f in `direction` (kernels/coupling.hpp's oracle).
template <class T>
void couple(const StreamHandle& s, const BatchNormShape& shape, CouplingDirection direction, const T* a,
            const std::vector<T>& f, T* out) {
  const CouplingShape coupling{shape.batch, shape.channels, shape.height, shape.width};
  if (direction == CouplingDirection::forward) coupling_forward(s, coupling, a, f.data(), out);
  else coupling_inverse(s, coupling, a, f.data(), out);
}
}  // namespace

// The oracle of the fused op is its definition: f = relu(BN(z)) stored, then the coupling.
template <class T>
void batchnorm_relu_coupling_train(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                   double momentum, CouplingDirection direction, const T* z,
                                   const T* gamma, const T* beta, const T* a, T* out,
                                   T* saved_mean, T* saved_invstd, T* running_mean,
                                   T* running_var) {
  std::vector<T> f(static_cast<std::size_t>(shape.size()));
  batchnorm_relu_forward_train(s, shape, eps, momentum, z, gamma, beta, f.data(), saved_mean,
                               saved_invstd, running_mean, running_var);
  couple(s, shape, direction, a, f, out);
}

template <class T>
void batchnorm_relu_coupling_eval(const StreamHandle& s, const BatchNormShape& shape, double eps,
                                  CouplingDirection direction, const T* z, const T* gamma,
                                  const T* beta, const T* running_mean, const T* running_var,
                                  const T* a, T* out) {
  std::vector<T> f(static_cast<std::size_t>(shape.size()));
  batchnorm_relu_forward_eval(s, shape, eps, z, gamma, beta, running_mean, running_var, f.data());
  couple(s, shape, direction, a, f, out);
}

#define PETRA_INSTANTIATE(T)                                                                   \
  template void batchnorm_forward_train<T>(const StreamHandle&, const BatchNormShape&, double, \
                                           double, const T*, const T*, const T*, T*, T*, T*,   \
                                           T*, T*);                                            \
  template void batchnorm_forward_eval<T>(const StreamHandle&, const BatchNormShape&, double,  \
                                          const T*, const T*, const T*, const T*, const T*,    \
                                          T*);                                                 \
  template void batchnorm_backward<T>(const StreamHandle&, const BatchNormShape&, const T*,    \
                                      const T*, const T*, const T*, const T*, T*, T*, T*);       \
  template void batchnorm_relu_forward_train<T>(const StreamHandle&, const BatchNormShape&,    \
                                                double, double, const T*, const T*, const T*,  \
                                                T*, T*, T*, T*, T*);                           \
  template void batchnorm_relu_forward_eval<T>(const StreamHandle&, const BatchNormShape&,     \
                                               double, const T*, const T*, const T*, const T*, \
                                               const T*, T*);                                  \
  template void batchnorm_relu_backward<T>(const StreamHandle&, const BatchNormShape&,         \
                                           const T*, const T*, const T*, const T*, const T*,   \
                                           const T*, T*, T*, T*);                           \
  template void batchnorm_backward_summed<T>(const StreamHandle&, const BatchNormShape&,       \
                                             const T*, const T*, const T*, const T*, const T*, \
                                             T*, T*, T*, T*);                                  \
  template void batchnorm_relu_backward_summed<T>(const StreamHandle&, const BatchNormShape&,  \
                                                  const T*, const T*, const T*, const T*,      \
                                                  const T*, const T*, T*, T*, T*, T*);         \
  template void batchnorm_relu_coupling_train<T>(const StreamHandle&, const BatchNormShape&,   \
                                                 double, double, CouplingDirection, const T*,  \
                                                 const T*, const T*, const T*, T*, T*, T*, T*, \
                                                 T*);                                          \
  template void batchnorm_relu_coupling_eval<T>(const StreamHandle&, const BatchNormShape&,    \
                                                double, CouplingDirection, const T*, const T*, \
                                                const T*, const T*, const T*, const T*, T*);
PETRA_INSTANTIATE(float)
PETRA_INSTANTIATE(double)
#undef PETRA_INSTANTIATE

}  // namespace petra::kernels::ref
