// kernels/cuda/elementwise.cu: the cuda:: element-wise kernels of kernels/elementwise.hpp.
//
// Every op is one grid-stride loop (kernels/cuda/check.cuh) over n floats, applying a small
// functor. These kernels are memory-bound: consecutive threads touch consecutive floats, so each
// warp's loads and stores are fully coalesced, and that is all the speed there is to get.
//
// No __restrict__ on the pointers: the header allows an output to be the same array as an input
// (z = x + z, relu in place). Each element is still read before it is written, by one thread.
#include <cstdint>

#include "kernels/cuda/check.cuh"
#include "kernels/elementwise.hpp"

namespace petra::kernels::cuda {
namespace {

using cuda_detail::launch_grid_stride;

// y[i] = op(x[i])
template <class Op>
__global__ void map_unary(std::int64_t n, const float* x, float* y, Op op) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = op(x[i]);
}

// z[i] = op(x[i], y[i])
template <class Op>
__global__ void map_binary(std::int64_t n, const float* x, const float* y, float* z, Op op) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    z[i] = op(x[i], y[i]);
}

// y[i] = value
__global__ void fill_kernel(std::int64_t n, float value, float* y) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = value;
}

struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Sub {
  __device__ float operator()(float a, float b) const { return a - b; }
};
struct Mul {
  __device__ float operator()(float a, float b) const { return a * b; }
};
struct Scale {
  float a;
  __device__ float operator()(float x) const { return a * x; }
};
// (x, y) -> y + a * x with one rounding (fma), as close to ref's double arithmetic as float gets.
struct Axpy {
  float a;
  __device__ float operator()(float x, float y) const { return fmaf(a, x, y); }
};
// "x < 0 ? 0 : x" so that NaN stays NaN, as in ref:: and PyTorch.
struct Relu {
  __device__ float operator()(float x) const { return x < 0.0f ? 0.0f : x; }
};
// (y, dy) -> dy * (y > 0)
struct ReluBackward {
  __device__ float operator()(float y, float dy) const { return y > 0.0f ? dy : 0.0f; }
};

}  // namespace

void add(const StreamHandle& s, std::int64_t n, const float* x, const float* y, float* z) {
  launch_grid_stride("elementwise add", s, n, map_binary<Add>, n, x, y, z, Add{});
}

void sub(const StreamHandle& s, std::int64_t n, const float* x, const float* y, float* z) {
  launch_grid_stride("elementwise sub", s, n, map_binary<Sub>, n, x, y, z, Sub{});
}

void mul(const StreamHandle& s, std::int64_t n, const float* x, const float* y, float* z) {
  launch_grid_stride("elementwise mul", s, n, map_binary<Mul>, n, x, y, z, Mul{});
}

void scale(const StreamHandle& s, std::int64_t n, double a, const float* x, float* y) {
  launch_grid_stride("elementwise scale", s, n, map_unary<Scale>, n, x, y, Scale{float(a)});
}

// y += a * x: x is the first operand of the binary map, y both the second operand and the output.
void axpy(const StreamHandle& s, std::int64_t n, double a, const float* x, float* y) {
  launch_grid_stride("elementwise axpy", s, n, map_binary<Axpy>, n, x, y, y, Axpy{float(a)});
}

void add_inplace(const StreamHandle& s, std::int64_t n, const float* x, float* y) {
  launch_grid_stride("elementwise add_inplace", s, n, map_binary<Add>, n, x, y, y, Add{});
}

void relu(const StreamHandle& s, std::int64_t n, const float* x, float* y) {
  launch_grid_stride("elementwise relu", s, n, map_unary<Relu>, n, x, y, Relu{});
}

void relu_backward(const StreamHandle& s, std::int64_t n, const float* y, const float* dy,
                   float* dx) {
  launch_grid_stride("elementwise relu_backward", s, n, map_binary<ReluBackward>, n, y, dy, dx,
                     ReluBackward{});
}

// A device-to-device copy is what the runtime's copy path is for (it picks the copy engine or its
// own tuned kernel); an in-place copy is nothing to do.
void copy(const StreamHandle& s, std::int64_t n, const float* x, float* y) {
  if (n <= 0 || x == y) return;
  cuda_detail::DeviceGuard guard(s.device_index);
  PETRA_CUDA_CHECK(cudaMemcpyAsync(y, x, std::size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice,
                                   cuda_detail::stream_of(s)));
}

void fill(const StreamHandle& s, std::int64_t n, double value, float* y) {
  launch_grid_stride("elementwise fill", s, n, fill_kernel, n, float(value), y);
}

}  // namespace petra::kernels::cuda
