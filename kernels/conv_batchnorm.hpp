// kernels/conv_batchnorm.hpp: a 3x3 convolution of a one-channel image, batch norm and ReLU in
// one op that never stores the convolution's output (the stem of a network on grey images).
//
// The unfused stem writes z = conv(x) + bias (batch x C x H x W floats, e.g. 6.4 MB for 64 images
// of 32 x 28 x 28), batch norm reads z twice and writes y; its backward reads z and dy and writes
// dz, which the convolution's weight gradient reads again. On one core nearly all of that comes
// from DRAM. But z costs only 9 multiply-adds a value, so this op recomputes it, 16 positions x 16
// channels at a time in registers, in every pass that needs it:
//   forward  pass 1: z -> the sums of z - shift and its square (the training statistics);
//            pass 2: z -> y = relu(fma(z - mean, scale, bias)), written once.
//   backward pass 1: z, dy -> sum(g), sum(g * (z - mean)) with g = dy where the forward's y > 0;
//            pass 2: z, dy -> dz = a*g + b*(z - mean) + k, taken at once into dw (+= dz * x
//            under each tap) and dbias (+= dz): dz is never written either.
// What goes to memory is y (forward) and dy twice (backward). The ReLU's mask comes from z and the
// forward's map (saved affine), as the mapped batch norm's (kernels/batchnorm.hpp): the same fma
// on the same floats, so exactly the forward's y > 0. The per-channel arithmetic is batch norm's
// own (kernels/cpu/batchnorm_maps.hpp); the statistics, running statistics (momentum, unbiased
// variance) and saved mean/invstd follow kernels/batchnorm.hpp's contract.
//
// Scope: cpu:: only, float, AVX-512 compiled in; 1 input channel, 3x3 kernel, stride 1, padding 1,
// out_channels a multiple of 16; x packed or strided images (Conv2dShape::in_image_stride), y and
// dy packed. The numbers are the unfused ops' up to float rounding (the sums run in another
// order), deterministic for a given thread count: tests/cpu/test_conv_batchnorm.cpp checks them
// against ref:: (conv2d, then batch norm + ReLU) and finite differences. nn's conv_batch_norm
// routes a training-mode conv -> batch norm -> ReLU here when its input needs no gradient (the op
// gives none for x) and conv_batchnorm_relu_fits says the shape fits; everything else keeps the
// unfused ops. Scratch from s.workspace: conv_batchnorm_relu_workspace_bytes.
#pragma once

#include <cstddef>

#include "petra/kernels/common.hpp"
#include "petra/kernels/conv2d.hpp"

namespace petra::kernels::cpu {

// Whether the fused op takes `conv` (see Scope above).
bool conv_batchnorm_relu_fits(const Conv2dShape& conv);

// Bytes of s.workspace the forward and the backward need for `conv` on `threads` threads.
std::size_t conv_batchnorm_relu_workspace_bytes(const Conv2dShape& conv, int threads);

// y = relu(BN(conv(x, w) + bias)) in training mode. bias, running_mean and running_var may be null.
// saved_mean, saved_invstd (C floats) and affine (3C floats: the map's mean, scale, bias) are for
// the backward.
void conv_batchnorm_relu_forward_train(const StreamHandle& s, const Conv2dShape& conv, double eps, double momentum,
                                       const float* x, const float* w, const float* bias, const float* gamma,
                                       const float* beta, float* y, float* saved_mean, float* saved_invstd,
                                       float* running_mean, float* running_var, float* affine);

// The gradients of the forward above for dy: dw, dgamma, dbeta and dbias (may be null) get +=.
// No gradient for x.
void conv_batchnorm_relu_backward(const StreamHandle& s, const Conv2dShape& conv, const float* x, const float* w,
                                  const float* bias, const float* affine, const float* dy, const float* gamma,
                                  const float* saved_mean, const float* saved_invstd, float* dw, float* dbias,
                                  float* dgamma, float* dbeta);

}  // namespace petra::kernels::cpu
