// kernels/cuda/pool.cu: the cuda:: pooling of kernels/pool.hpp (max and average pooling, forward
// and backward, and the global average pool), float, NCHW.
//
// Window pooling, forward: one thread per output element (a grid-stride loop over
// batch * channels * out_height * out_width), which walks its window clipped to the input in
// row-major order, as ref:: does. Max pool compares floats (exactly what ref::'s compare of the
// same values widened to double decides: the first maximum wins, NaN wins) and records the
// winner's index h * width + w when asked; average pool adds in double and divides by kernel^2
// in double (count_include_pad), rounding once. Same operations in the same order: the outputs
// are ref::'s bit for bit.
//
// Window pooling, backward, in gather form: one thread per *input* element, which finds the
// output windows that cover it (at most ceil(kernel / stride)^2 of them: rows i with
// i * stride - padding <= h < i * stride - padding + kernel, the same for columns) and adds, in
// double and in row-major order of the windows, the dy of those that chose it (max pool: the
// recorded index is this element) or dy / kernel^2 (average pool). Each dx element is written
// once, by one thread: no zero-fill pass, no atomics, so the result is the same bits on every
// run, and since ref:: adds each dx element's terms in that same order (it walks the outputs in
// order), bit for bit ref::'s. (A scatter with float atomicAdd would depend on the arrival order.)
// Max pool's backward trusts the indices to come from max_pool2d_forward on the same shape: an
// index outside its own window is not seen.
//
// Global average pool, forward: one warp per (sample, channel) plane (a warp-stride loop over
// the planes). The 32 lanes read the plane's consecutive floats (coalesced), each adding its
// elements lane, lane + 32, ... in double; a fixed shuffle tree (offsets 16, 8, 4, 2, 1) adds the
// 32 partial sums and lane 0 writes float(sum / (height * width)). The addition order is fixed by
// the plane's size alone, so every run gives the same bits; it differs from ref::'s sequential
// double sum, so the float result can differ from ref::'s by a rounding of the double sum
// (within 1 ulp). The backward is a grid-stride broadcast, dx = float(dy / (height * width)) in
// double: ref::'s bits.
//
// Shapes arrive as the few int64 numbers a kernel needs (PoolGeometry), computed on the host.
#include <cstdint>

#include "petra/kernels/cuda/block_reduce.cuh"
#include "petra/kernels/cuda/launch.cuh"
#include "petra/kernels/pool.hpp"

namespace petra::kernels::cuda {
namespace {

using cuda_detail::grid_threads;
using cuda_detail::kBlockThreads;
using cuda_detail::launch_grid_stride;
using cuda_detail::thread_index;

// What the window kernels need of a Pool2dShape (whose member functions are host code).
struct PoolGeometry {
  std::int64_t planes, height, width, out_height, out_width, kernel, stride, padding;
  __host__ __device__ std::int64_t outputs() const { return planes * out_height * out_width; }
  __host__ __device__ std::int64_t inputs() const { return planes * height * width; }
};

PoolGeometry geometry_of(const Pool2dShape& shape) {
  return {shape.batch * shape.channels, shape.height, shape.width, shape.out_height(),
          shape.out_width(), shape.kernel, shape.stride, shape.padding};
}

__device__ inline std::int64_t max64(std::int64_t a, std::int64_t b) { return a > b ? a : b; }
__device__ inline std::int64_t min64(std::int64_t a, std::int64_t b) { return a < b ? a : b; }

// Output element o = (plane, i, j) and its window clipped to the input: rows [h0, h1), columns
// [w0, w1).
struct Window {
  std::int64_t plane, i, j, h0, h1, w0, w1;
};

__device__ inline Window window_of(const PoolGeometry& g, std::int64_t o) {
  Window win;
  win.j = o % g.out_width;
  const std::int64_t rest = o / g.out_width;
  win.i = rest % g.out_height;
  win.plane = rest / g.out_height;
  const std::int64_t top = win.i * g.stride - g.padding, left = win.j * g.stride - g.padding;
  win.h0 = max64(top, 0);
  win.h1 = min64(top + g.kernel, g.height);
  win.w0 = max64(left, 0);
  win.w1 = min64(left + g.kernel, g.width);
  return win;
}

// The output windows covering one input coordinate x (a row h or a column w): those with
// index t in [first, last], t * stride - padding <= x < t * stride - padding + kernel, and
// t < outputs. first > last when there is none.
struct Cover {
  std::int64_t first, last;
};

__device__ inline Cover cover_of(std::int64_t x, std::int64_t kernel, std::int64_t stride,
                                 std::int64_t padding, std::int64_t outputs) {
  const std::int64_t low = x + padding - kernel + 1;  // t * stride >= low
  const std::int64_t first = low <= 0 ? 0 : (low + stride - 1) / stride;
  const std::int64_t last = min64((x + padding) / stride, outputs - 1);
  return {first, last};
}

// Input element k = (plane, h, w) of the grid-stride loop over the inputs.
struct InputAt {
  std::int64_t plane, h, w;
};

__device__ inline InputAt input_of(const PoolGeometry& g, std::int64_t k) {
  const std::int64_t w = k % g.width, rest = k / g.width;
  return {rest / g.height, rest % g.height, w};
}

__global__ void max_pool_forward(PoolGeometry g, const float* x, float* y, std::int32_t* indices) {
  const std::int64_t n = g.outputs();
  for (std::int64_t o = thread_index(); o < n; o += grid_threads()) {
    const Window win = window_of(g, o);
    const float* in = x + win.plane * g.height * g.width;
    float best = -INFINITY;
    std::int64_t best_at = win.h0 * g.width + win.w0;
    for (std::int64_t h = win.h0; h < win.h1; ++h)
      for (std::int64_t w = win.w0; w < win.w1; ++w) {
        const float v = in[h * g.width + w];
        if (v > best || v != v) {  // larger, or NaN (which then stays: nothing beats it)
          best = v;
          best_at = h * g.width + w;
        }
      }
    y[o] = best;
    if (indices) indices[o] = std::int32_t(best_at);
  }
}

// dx[k] = sum of dy over the windows covering k whose recorded winner is k.
__global__ void max_pool_backward(PoolGeometry g, const float* dy, const std::int32_t* indices,
                                  float* dx) {
  const std::int64_t n = g.inputs(), out_plane = g.out_height * g.out_width;
  for (std::int64_t k = thread_index(); k < n; k += grid_threads()) {
    const InputAt at = input_of(g, k);
    const std::int32_t me = std::int32_t(at.h * g.width + at.w);
    const Cover rows = cover_of(at.h, g.kernel, g.stride, g.padding, g.out_height);
    const Cover columns = cover_of(at.w, g.kernel, g.stride, g.padding, g.out_width);
    const std::int64_t base = at.plane * out_plane;
    double sum = 0;
    for (std::int64_t i = rows.first; i <= rows.last; ++i)
      for (std::int64_t j = columns.first; j <= columns.last; ++j) {
        const std::int64_t o = base + i * g.out_width + j;
        if (indices[o] == me) sum += double(dy[o]);
      }
    dx[k] = float(sum);
  }
}

__global__ void avg_pool_forward(PoolGeometry g, double area, const float* x, float* y) {
  const std::int64_t n = g.outputs();
  for (std::int64_t o = thread_index(); o < n; o += grid_threads()) {
    const Window win = window_of(g, o);
    const float* in = x + win.plane * g.height * g.width;
    double sum = 0;
    for (std::int64_t h = win.h0; h < win.h1; ++h)
      for (std::int64_t w = win.w0; w < win.w1; ++w) sum += double(in[h * g.width + w]);
    y[o] = float(sum / area);
  }
}

// dx[k] = sum over the windows covering k of dy / area.
__global__ void avg_pool_backward(PoolGeometry g, double area, const float* dy, float* dx) {
  const std::int64_t n = g.inputs(), out_plane = g.out_height * g.out_width;
  for (std::int64_t k = thread_index(); k < n; k += grid_threads()) {
    const InputAt at = input_of(g, k);
    const Cover rows = cover_of(at.h, g.kernel, g.stride, g.padding, g.out_height);
    const Cover columns = cover_of(at.w, g.kernel, g.stride, g.padding, g.out_width);
    const std::int64_t base = at.plane * out_plane;
    double sum = 0;
    for (std::int64_t i = rows.first; i <= rows.last; ++i)
      for (std::int64_t j = columns.first; j <= columns.last; ++j)
        sum += double(dy[base + i * g.out_width + j]) / area;
    dx[k] = float(sum);
  }
}

// One warp per plane: y[p] = (sum of the plane's `plane` floats) / plane.
__global__ void __launch_bounds__(kBlockThreads)
    global_pool_forward(std::int64_t planes, std::int64_t plane, const float* x, float* y) {
  for (std::int64_t p = cuda_detail::warp_index(); p < planes; p += cuda_detail::grid_warps()) {
    const double sum = cuda_detail::warp_strided_sum(x + p * plane, plane, 1);
    if (threadIdx.x % 32 == 0) y[p] = float(sum / double(plane));
  }
}

__global__ void global_pool_backward(std::int64_t n, std::int64_t plane, const float* dy, float* dx) {
  for (std::int64_t k = thread_index(); k < n; k += grid_threads())
    dx[k] = float(double(dy[k / plane]) / double(plane));
}

}  // namespace

void max_pool2d_forward(const StreamHandle& s, const Pool2dShape& shape, const float* x, float* y,
                        std::int32_t* indices) {
  const PoolGeometry g = geometry_of(shape);
  launch_grid_stride("max_pool2d_forward", s, g.outputs(), max_pool_forward, g, x, y, indices);
}

void max_pool2d_backward(const StreamHandle& s, const Pool2dShape& shape, const float* dy,
                         const std::int32_t* indices, float* dx) {
  const PoolGeometry g = geometry_of(shape);
  launch_grid_stride("max_pool2d_backward", s, g.inputs(), max_pool_backward, g, dy, indices, dx);
}

void avg_pool2d_forward(const StreamHandle& s, const Pool2dShape& shape, const float* x, float* y) {
  const PoolGeometry g = geometry_of(shape);
  launch_grid_stride("avg_pool2d_forward", s, g.outputs(), avg_pool_forward, g,
                     double(shape.kernel * shape.kernel), x, y);
}

void avg_pool2d_backward(const StreamHandle& s, const Pool2dShape& shape, const float* dy, float* dx) {
  const PoolGeometry g = geometry_of(shape);
  launch_grid_stride("avg_pool2d_backward", s, g.inputs(), avg_pool_backward, g,
                     double(shape.kernel * shape.kernel), dy, dx);
}

void global_avg_pool_forward(const StreamHandle& s, const GlobalPoolShape& shape, const float* x,
                             float* y) {
  const std::int64_t planes = shape.output_size(), plane = shape.height * shape.width;
  // 32 threads (a warp) per plane: as many "items" for the grid-stride launch size.
  launch_grid_stride("global_avg_pool_forward", s, planes * 32, global_pool_forward, planes, plane,
                     x, y);
}

void global_avg_pool_backward(const StreamHandle& s, const GlobalPoolShape& shape, const float* dy,
                              float* dx) {
  launch_grid_stride("global_avg_pool_backward", s, shape.input_size(), global_pool_backward,
                     shape.input_size(), shape.height * shape.width, dy, dx);
}

}  // namespace petra::kernels::cuda
