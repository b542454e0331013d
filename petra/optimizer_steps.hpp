// petra/optimizer_steps.hpp: one optimizer step on one parameter tensor, in place, dispatched to
// the kernels of kernels/optim.hpp for the tensor's device (PyTorch semantics: see that header).
// nn/optimizer.hpp builds the optimizers of petra-train on these.
#pragma once

#include <cstdint>

#include "petra/kernels/optim.hpp"
#include "petra/tensor.hpp"

namespace petra {

using kernels::AdamOptions;
using kernels::LarsOptions;
using kernels::SgdOptions;

namespace ops {

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, const SgdOptions& o,
              bool first_step);
void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
               const AdamOptions& o, std::int64_t step);
void lars_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, const LarsOptions& o);

}  // namespace ops
}  // namespace petra
