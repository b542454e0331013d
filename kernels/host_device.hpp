// kernels/host_device.hpp: PETRA_HOST_DEVICE, for small functions that run both on the host and in
// CUDA kernels (petra/rng.hpp's Philox, kernels/reduce_plan.hpp, kernels/cuda/conv2d_tiling.cuh): `__host__ __device__` under nvcc,
// nothing for the host compiler (which also compiles the .cu files against the CUDA emulation of
// tests/emulation/). Element-wise math shared this way, and nothing more clever.
#pragma once

#ifndef PETRA_HOST_DEVICE
#if defined(__CUDACC__)
#define PETRA_HOST_DEVICE __host__ __device__
#else
#define PETRA_HOST_DEVICE
#endif
#endif
