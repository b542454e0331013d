// tests/emulation/emulated_loss.cpp: kernels/cuda/loss.cu compiled by the host compiler against the
// CUDA emulation, so that its kernels::cuda:: functions run on the CPU (test_emulated_loss.cpp).
// This executable does not link petra-core, whose kernels::cuda:: are the real ones.
#include "tests/emulation/cuda_emulation.hpp"

#include "petra/kernels/cuda/loss.cu"
