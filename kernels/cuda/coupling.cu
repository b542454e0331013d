// kernels/cuda/coupling.cu: the cuda:: additive coupling of kernels/coupling.hpp, one hand-written
// kernel for forward, inverse and backward.
//
// Why one fused pass: the coupling does no arithmetic to speak of (one add per element), so its
// time is the bytes it moves. Per call it must read the input's two streams and f, and write the
// output's two streams: 3 reads + 2 writes of N*C*H*W floats, which is what this kernel does, in
// one launch. Composing it from framework ops (y = cat(x2 + f, x1)) writes x2 + f to a temporary
// and reads it back: 4 reads + 3 writes, 40% more traffic, two launches and a temporary buffer.
//
// Each thread handles one position i of one sample's stream and does both of its outputs (the
// added one and the moved one), reading both of its inputs first; consecutive threads take
// consecutive positions, so all accesses are coalesced. When the stream size and the pointers
// allow, a thread moves a float4 (16 bytes) per access instead of a float: a quarter of the load
// and store instructions and of the index arithmetic, for the same bytes.
#include <cstdint>

#include "petra/kernels/coupling.hpp"
#include "petra/kernels/cuda/lanes.cuh"
#include "petra/kernels/cuda/launch.cuh"

namespace petra::kernels::cuda {
namespace {

enum class Direction { kForward, kInverse, kSwap };

using cuda_detail::lanes;

__device__ inline float add(float a, float b) { return a + b; }
__device__ inline float sub(float a, float b) { return a - b; }

// For every sample n and position i < size of a stream (size and all indices counted in V, which
// is float or float4), with in1/in2 and out1/out2 the two streams of sample n:
//   kForward:  out1 = in2 + h,  out2 = in1     (coupling_forward; coupling_backward with h = g)
//   kInverse:  out1 = in2,      out2 = in1 - h (coupling_inverse)
//   kSwap:     out1 = in2,      out2 = in1     (coupling_backward with g null: h is not read)
// The first stream of the forward's input always travels as a plain copy, never through
// arithmetic, which is why inverse(forward(x)) gives x1 back bit for bit.
template <Direction direction, class V>
__global__ void coupling_kernel(std::int64_t batch, std::int64_t size, const V* in, const V* h,
                                V* out) {
  const std::int64_t items = batch * size;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t k = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < items;
       k += stride) {
    const std::int64_t n = k / size;
    const std::int64_t first = k + n * size;  // = 2 * n * size + i, with i = k - n * size
    const std::int64_t second = first + size;
    const V in1 = in[first], in2 = in[second];
    if constexpr (direction == Direction::kForward) {
      out[first] = lanes(add, in2, h[k]);
      out[second] = in1;
    } else if constexpr (direction == Direction::kInverse) {
      out[first] = in2;
      out[second] = lanes(sub, in1, h[k]);
    } else {
      out[first] = in2;
      out[second] = in1;
    }
  }
}

using cuda_detail::aligned_16;

template <Direction direction>
void launch_coupling(const char* name, const StreamHandle& s, const CouplingShape& shape,
                     const float* in, const float* h, float* out) {
  const std::int64_t size = shape.stream_size();
  // float4 needs every float4 access 16-byte aligned: the base pointers, and every stream's
  // start, which is a multiple of `size` floats from them.
  if (size % 4 == 0 && aligned_16(in) && aligned_16(h) && aligned_16(out)) {
    cuda_detail::launch_grid_stride(name, s, shape.batch * (size / 4),
                                    coupling_kernel<direction, float4>, shape.batch, size / 4,
                                    reinterpret_cast<const float4*>(in),
                                    reinterpret_cast<const float4*>(h),
                                    reinterpret_cast<float4*>(out));
  } else {
    cuda_detail::launch_grid_stride(name, s, shape.batch * size, coupling_kernel<direction, float>,
                                    shape.batch, size, in, h, out);
  }
}

}  // namespace

void coupling_forward(const StreamHandle& s, const CouplingShape& shape, const float* x,
                      const float* f, float* y) {
  launch_coupling<Direction::kForward>("coupling_forward", s, shape, x, f, y);
}

void coupling_inverse(const StreamHandle& s, const CouplingShape& shape, const float* y,
                      const float* f, float* x) {
  launch_coupling<Direction::kInverse>("coupling_inverse", s, shape, y, f, x);
}

// dx1 = dy2 + g, dx2 = dy1: the forward's map applied to (dy, g); a swap where g is null.
void coupling_backward(const StreamHandle& s, const CouplingShape& shape, const float* dy,
                       const float* g, float* dx) {
  if (g == nullptr) launch_coupling<Direction::kSwap>("coupling_backward", s, shape, dy, g, dx);
  else launch_coupling<Direction::kForward>("coupling_backward", s, shape, dy, g, dx);
}

}  // namespace petra::kernels::cuda
