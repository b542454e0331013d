// kernels/cuda/elementwise.cu: the cuda:: element-wise kernels of kernels/elementwise.hpp.
//
// Every op is one grid-stride loop (launch_grid_stride, kernels/cuda/launch.cuh) over n floats,
// applying a small functor. These kernels are memory-bound: consecutive threads touch consecutive
// floats, so each warp's loads and stores are coalesced. When every pointer is 16-byte aligned
// (always, for tensors from petra's allocator) each thread moves float4s: one 16-byte load or store
// instead of four. On an H200 (bench-cuda, docs/results-gpu.md) that took scale and relu from 74%
// to 96% of a device-to-device copy's bandwidth and add from 87% to 102%: with one float per access
// the threads could not keep enough bytes in flight.
//
// No __restrict__ on the pointers: the header allows an output to be the same array as an input
// (z = x + z, relu in place). Each element is still read before it is written, by one thread.
#include <cstdint>

#include "petra/kernels/cuda/lanes.cuh"
#include "petra/kernels/cuda/launch.cuh"
#include "petra/kernels/elementwise.hpp"

namespace petra::kernels::cuda {
namespace {

using cuda_detail::aligned_16;
using cuda_detail::launch_grid_stride;

using cuda_detail::kWidth;
using cuda_detail::lanes;

// The kernels below read and write n floats as V: float, or float4 when every pointer is 16-byte
// aligned (kernels/cuda/lanes.cuh). The grid-stride loop covers the n / width whole vectors; then
// the grid's first threads do the n % width floats left over, one each (none when V is float).
__device__ inline std::int64_t thread_index() {
  return std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::int64_t grid_threads() { return std::int64_t(gridDim.x) * blockDim.x; }

// y[i] = op(x[i])
template <class V, class Op>
__global__ void map_unary(std::int64_t n, const float* x, float* y, Op op) {
  const std::int64_t vectors = n / kWidth<V>;
  const auto* xv = reinterpret_cast<const V*>(x);
  auto* yv = reinterpret_cast<V*>(y);
  for (std::int64_t i = thread_index(); i < vectors; i += grid_threads()) yv[i] = lanes(op, xv[i]);
  const std::int64_t rest = vectors * kWidth<V> + thread_index();
  if (rest < n) y[rest] = op(x[rest]);
}

// z[i] = op(x[i], y[i])
template <class V, class Op>
__global__ void map_binary(std::int64_t n, const float* x, const float* y, float* z, Op op) {
  const std::int64_t vectors = n / kWidth<V>;
  const auto* xv = reinterpret_cast<const V*>(x);
  const auto* yv = reinterpret_cast<const V*>(y);
  auto* zv = reinterpret_cast<V*>(z);
  for (std::int64_t i = thread_index(); i < vectors; i += grid_threads())
    zv[i] = lanes(op, xv[i], yv[i]);
  const std::int64_t rest = vectors * kWidth<V> + thread_index();
  if (rest < n) z[rest] = op(x[rest], y[rest]);
}

// y[i] = value
template <class V>
__global__ void fill_kernel(std::int64_t n, float value, float* y) {
  const std::int64_t vectors = n / kWidth<V>;
  V v;
  if constexpr (kWidth<V> == 4) v = make_float4(value, value, value, value);
  else v = value;
  auto* yv = reinterpret_cast<V*>(y);
  for (std::int64_t i = thread_index(); i < vectors; i += grid_threads()) yv[i] = v;
  const std::int64_t rest = vectors * kWidth<V> + thread_index();
  if (rest < n) y[rest] = value;
}

// Launches the float4 version of a kernel when every pointer allows it, else the float one; the
// grid is sized by the number of vectors.
template <class Op>
void launch_unary(const char* name, const StreamHandle& s, std::int64_t n, const float* x,
                  float* y, Op op) {
  if (aligned_16(x) && aligned_16(y))
    launch_grid_stride(name, s, (n + 3) / 4, map_unary<float4, Op>, n, x, y, op);
  else
    launch_grid_stride(name, s, n, map_unary<float, Op>, n, x, y, op);
}

template <class Op>
void launch_binary(const char* name, const StreamHandle& s, std::int64_t n, const float* x,
                   const float* y, float* z, Op op) {
  if (aligned_16(x) && aligned_16(y) && aligned_16(z))
    launch_grid_stride(name, s, (n + 3) / 4, map_binary<float4, Op>, n, x, y, z, op);
  else
    launch_grid_stride(name, s, n, map_binary<float, Op>, n, x, y, z, op);
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
  launch_binary("elementwise add", s, n, x, y, z, Add{});
}

void sub(const StreamHandle& s, std::int64_t n, const float* x, const float* y, float* z) {
  launch_binary("elementwise sub", s, n, x, y, z, Sub{});
}

void mul(const StreamHandle& s, std::int64_t n, const float* x, const float* y, float* z) {
  launch_binary("elementwise mul", s, n, x, y, z, Mul{});
}

void scale(const StreamHandle& s, std::int64_t n, double a, const float* x, float* y) {
  launch_unary("elementwise scale", s, n, x, y, Scale{float(a)});
}

// y += a * x: x is the first operand of the binary map, y both the second operand and the output.
void axpy(const StreamHandle& s, std::int64_t n, double a, const float* x, float* y) {
  launch_binary("elementwise axpy", s, n, x, y, y, Axpy{float(a)});
}

void add_inplace(const StreamHandle& s, std::int64_t n, const float* x, float* y) {
  launch_binary("elementwise add_inplace", s, n, x, y, y, Add{});
}

void relu(const StreamHandle& s, std::int64_t n, const float* x, float* y) {
  launch_unary("elementwise relu", s, n, x, y, Relu{});
}

void relu_backward(const StreamHandle& s, std::int64_t n, const float* y, const float* dy,
                   float* dx) {
  launch_binary("elementwise relu_backward", s, n, y, dy, dx, ReluBackward{});
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
  if (aligned_16(y))
    launch_grid_stride("elementwise fill", s, (n + 3) / 4, fill_kernel<float4>, n, float(value), y);
  else
    launch_grid_stride("elementwise fill", s, n, fill_kernel<float>, n, float(value), y);
}

}  // namespace petra::kernels::cuda
