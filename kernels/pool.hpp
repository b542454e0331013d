// kernels/pool.hpp: 2-d max and average pooling, and global average pooling, over NCHW tensors.
//
// Windows are square (kernel x kernel), move by `stride`, and the input is padded by `padding` on
// every side; the output size is PyTorch's with ceil_mode=False:
//   out = (in + 2*padding - kernel) / stride + 1     (integer division)
// PyTorch requires padding <= kernel/2, so every window holds at least one real input value.
//
// Max pool: padding never wins (it counts as -infinity). As in PyTorch, ties go to the first
// maximum in the window's row-major order, and NaN wins (it propagates). The forward can record
// the winner of each window as an int32 index h*width + w into its input plane (PyTorch's
// convention); the backward needs these indices (it does not recompute them), so pass a non-null
// `indices` to the forward whenever a backward will follow.
// Average pool: count_include_pad=True (PyTorch's default): every window divides by kernel^2,
// padding counting as zeros.
// Global average pool: (batch, channels, height, width) -> (batch, channels), the mean of each plane.
#pragma once

#include <cstdint>

#include "petra/kernels/common.hpp"

namespace petra::kernels {

struct Pool2dShape {
  std::int64_t batch = 0, channels = 0, height = 0, width = 0;  // the input
  std::int64_t kernel = 1, stride = 1, padding = 0;

  std::int64_t out_height() const { return (height + 2 * padding - kernel) / stride + 1; }
  std::int64_t out_width() const { return (width + 2 * padding - kernel) / stride + 1; }
  std::int64_t input_size() const { return batch * channels * height * width; }
  std::int64_t output_size() const { return batch * channels * out_height() * out_width(); }
};

struct GlobalPoolShape {
  std::int64_t batch = 0, channels = 0, height = 0, width = 0;  // the input; the output is batch x channels

  std::int64_t input_size() const { return batch * channels * height * width; }
  std::int64_t output_size() const { return batch * channels; }
};

namespace ref {

// y =; indices = (when not nullptr).
template <class T>
void max_pool2d_forward(const StreamHandle& s, const Pool2dShape& shape, const T* x, T* y,
                        std::int32_t* indices);

// dx = (dy routed to the recorded winners; overlapping windows add up).
template <class T>
void max_pool2d_backward(const StreamHandle& s, const Pool2dShape& shape, const T* dy,
                         const std::int32_t* indices, T* dx);

// y =.
template <class T>
void avg_pool2d_forward(const StreamHandle& s, const Pool2dShape& shape, const T* x, T* y);

// dx =.
template <class T>
void avg_pool2d_backward(const StreamHandle& s, const Pool2dShape& shape, const T* dy, T* dx);

// y =.
template <class T>
void global_avg_pool_forward(const StreamHandle& s, const GlobalPoolShape& shape, const T* x, T* y);

// dx =.
template <class T>
void global_avg_pool_backward(const StreamHandle& s, const GlobalPoolShape& shape, const T* dy, T* dx);

}  // namespace ref

namespace cpu {

void max_pool2d_forward(const StreamHandle& s, const Pool2dShape& shape, const float* x, float* y,
                        std::int32_t* indices);
void max_pool2d_backward(const StreamHandle& s, const Pool2dShape& shape, const float* dy,
                         const std::int32_t* indices, float* dx);
void avg_pool2d_forward(const StreamHandle& s, const Pool2dShape& shape, const float* x, float* y);
void avg_pool2d_backward(const StreamHandle& s, const Pool2dShape& shape, const float* dy, float* dx);
void global_avg_pool_forward(const StreamHandle& s, const GlobalPoolShape& shape, const float* x,
                             float* y);
void global_avg_pool_backward(const StreamHandle& s, const GlobalPoolShape& shape, const float* dy,
                              float* dx);

}  // namespace cpu

// Same contracts, float, on the GPU (kernels/cuda/pool.cu): a thread per output element for the
// window forwards, a thread per input element gathering the windows that cover it for their
// backwards (no atomics: every dx element is written once, and all of these are ref::'s bits), a
// warp per plane for the global forward. max_pool2d_backward reads an index only in a window that
// covers it, so the indices must come from max_pool2d_forward on the same shape.
namespace cuda {

void max_pool2d_forward(const StreamHandle& s, const Pool2dShape& shape, const float* x, float* y,
                        std::int32_t* indices);
void max_pool2d_backward(const StreamHandle& s, const Pool2dShape& shape, const float* dy,
                         const std::int32_t* indices, float* dx);
void avg_pool2d_forward(const StreamHandle& s, const Pool2dShape& shape, const float* x, float* y);
void avg_pool2d_backward(const StreamHandle& s, const Pool2dShape& shape, const float* dy, float* dx);
void global_avg_pool_forward(const StreamHandle& s, const GlobalPoolShape& shape, const float* x,
                             float* y);
void global_avg_pool_backward(const StreamHandle& s, const GlobalPoolShape& shape, const float* dy,
                              float* dx);

}  // namespace cuda

}  // namespace petra::kernels
