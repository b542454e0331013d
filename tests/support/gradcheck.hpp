// tests/support/gradcheck.hpp: finite-difference gradient checks, built on testing::check_gradient
// (tests/support/testing.hpp: central differences of a scalar function of one flat vector). Each
// checker reports through doctest, one CHECK per input (or per sampled element), naming what
// failed and its worst element.
//
// Kernels (flat std::vector<double> arrays, ref:: in double):
//   check_vjp(f, inputs, g, analytic, names)
//       y = f(inputs): analytic[k] must be the vector-Jacobian product of f with g for inputs[k],
//       i.e. the gradient of L = <g, f(inputs)> in inputs[k] with the other inputs fixed.
//
// Tensors and Variables (float64 on the CPU, which dispatches to ref::):
//   dot(a, b)                        <a, b> over all elements, in double
//   vjp_loss(f, inputs, k, g)        a Variable op as the scalar function L(v) = <g, f(inputs)>
//                                    of the flat values v of inputs[k], evaluated without a graph
//   check_op_gradients(f, inputs)    autograd's vjp of f for every input against central
//                                    differences of vjp_loss, with a random g
//   check_sampled_gradient(loss, t, analytic, what)
//                                    central differences of loss() in a few elements of t (a
//                                    parameter, perturbed in place and restored) against
//                                    analytic, one CHECK per element
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "petra/autograd.hpp"
#include "petra/ops.hpp"
#include "tests/support/fixtures.hpp"
#include "tests/support/testing.hpp"

namespace petra::testing {

// ---------------------------------------------------------------- kernels

using VectorFn = std::function<std::vector<double>(const std::vector<std::vector<double>>&)>;

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

inline void check_vjp(const VectorFn& f, const std::vector<std::vector<double>>& inputs, const std::vector<double>& g,
                      const std::vector<std::vector<double>>& analytic, const std::vector<std::string>& names) {
  REQUIRE(analytic.size() == inputs.size());
  REQUIRE(names.size() == inputs.size());
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    auto loss = [&](const std::vector<double>& v) {
      std::vector<std::vector<double>> probe = inputs;
      probe[k] = v;
      return dot(g, f(probe));
    };
    const auto r = check_gradient(loss, inputs[k], analytic[k]);
    CHECK_MESSAGE(r.ok, names[k], ": ", r.worst);
  }
}

// ---------------------------------------------------------------- tensors and Variables

using OpFn = std::function<Variable(const std::vector<Variable>&)>;

inline double dot(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double s = 0;
  for (std::size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}

inline std::function<double(const std::vector<double>&)> vjp_loss(OpFn f, std::vector<Tensor> inputs, std::size_t k,
                                                                   Tensor g) {
  return [f = std::move(f), inputs = std::move(inputs), k, g = std::move(g)](const std::vector<double>& values) {
    NoGradGuard no_grad;
    std::vector<Variable> probe;
    for (std::size_t j = 0; j < inputs.size(); ++j)
      probe.emplace_back(j == k ? Tensor::from_vector<double>(inputs[j].shape(), values) : inputs[j]);
    return dot(f(probe).data(), g);
  };
}

// For every input k, compares the autograd gradient of L = <g, f(inputs)> (g random from `seed`)
// with central differences, in float64.
inline void check_op_gradients(const OpFn& f, const std::vector<Tensor>& inputs, std::uint64_t seed = 99,
                               double rtol = 1e-5) {
  std::vector<Variable> vars;
  for (const Tensor& t : inputs) vars.emplace_back(t.clone(), true);
  const Variable y = f(vars);
  const Tensor g = random_tensor(y.shape(), seed);
  const Variable outputs[] = {y};
  const Tensor seeds[] = {g};
  const auto grads = vjp(outputs, seeds, vars);
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    CAPTURE(k);
    REQUIRE(grads[k].defined());
    const auto r = check_gradient(vjp_loss(f, inputs, k, g), inputs[k].to_vector<double>(),
                                  grads[k].to_vector<double>(), 1e-6, 1e-7, rtol);
    CHECK_MESSAGE(r.ok, r.worst);
  }
}

// Elements 0, s, 2s, ... of t (s = max(1, numel / samples)), each perturbed by +-h in place, must
// give |analytic[i] - numeric| <= atol + rtol |numeric| (testing::check_gradient's criterion).
inline void check_sampled_gradient(const std::function<double()>& loss, const Tensor& t,
                                   const std::vector<double>& analytic, const std::string& what,
                                   std::int64_t samples = 5, double h = 1e-6, double atol = 1e-7, double rtol = 1e-5) {
  const std::vector<double> original = t.to_vector<double>();
  const auto loss_with = [&](std::size_t i, double value) {
    std::vector<double> values = original;
    values[i] = value;
    t.copy_from(Tensor::from_vector<double>(t.shape(), values));
    return loss();
  };
  const std::int64_t n = t.numel();
  for (std::int64_t i = 0; i < n; i += std::max<std::int64_t>(1, n / samples)) {
    const auto at = static_cast<std::size_t>(i);
    const double up = loss_with(at, original[at] + h);
    const double down = loss_with(at, original[at] - h);
    t.copy_from(Tensor::from_vector<double>(t.shape(), original));
    const double numeric = (up - down) / (2 * h);
    CHECK_MESSAGE(std::abs(analytic[at] - numeric) <= atol + rtol * std::abs(numeric), what, "[", i, "] analytic ",
                  analytic[at], " numeric ", numeric);
  }
}

}  // namespace petra::testing
