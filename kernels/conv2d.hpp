// kernels/conv2d.hpp: 2-d convolution over NCHW tensors (cross-correlation, as PyTorch's Conv2d).
//
//   y[b, o, oh, ow] = bias[o] + sum_{c, i, j} w[o, c, i, j] * x[b, c, oh*stride_h - pad_h + i,
//                                                               ow*stride_w - pad_w + j]
// where x reads as zero outside the image (symmetric zero padding). Dilation 1, one group.
//
// Layout (all contiguous): x, dx (batch, in_channels, in_h, in_w); y, dy (batch, out_channels,
// out_h, out_w); w, dw (out_channels, in_channels, kernel_h, kernel_w) as PyTorch; bias, db
// (out_channels). bias may be nullptr (no bias). One exception: on the CPU (ref:: and cpu::) the
// images of x may lie further apart than in_channels * in_h * in_w (Conv2dShape::in_image_stride),
// so that a channel slice of a larger tensor, such as one stream of a reversible block, is read in
// place instead of being copied out first.
//
// Backward, for L = <dy, y>:
//   dx[b, c, h, w]  = sum over the (o, i, j, oh, ow) that read x[b, c, h, w] of w[o, c, i, j] * dy
//   dw[o, c, i, j] += sum_{b, oh, ow} dy[b, o, oh, ow] * x[b, c, oh*stride_h - pad_h + i, ...]
//   db[o]          += sum_{b, oh, ow} dy[b, o, oh, ow]
//
// cpu:: lowers the convolution to matrix products (im2col + Eigen GEMM) or, for the narrow 3x3
// layers where that measured slower and AVX-512 is compiled in, runs direct register-blocked
// kernels on zero-padded planes (kernels/cpu/conv2d.cpp says which runs where; each algorithm's
// file, kernels/cpu/conv2d_im2col.cpp and conv2d_direct_*.cpp, explains it). It needs scratch
// memory from the stream's workspace: at most cpu::conv2d_workspace_bytes(shape, s.num_threads)
// bytes. ref:: needs none.
#pragma once

#include <cstddef>
#include <cstdint>

#include "petra/config.hpp"
#include "petra/kernels/common.hpp"

namespace petra::kernels {

struct Conv2dShape {
  std::int64_t batch = 0, in_channels = 0, in_h = 0, in_w = 0;
  std::int64_t out_channels = 0, kernel_h = 0, kernel_w = 0;
  std::int64_t stride_h = 1, stride_w = 1;
  std::int64_t pad_h = 0, pad_w = 0;
  // Floats from one image of x to the next, 0 for packed images. The forward and backward-weight
  // passes of ref:: and cpu:: honour it (dx, y and dy are always packed); the CUDA kernels
  // require 0.
  std::int64_t in_image_stride = 0;

  std::int64_t x_image_stride() const { return in_image_stride ? in_image_stride : in_channels * in_h * in_w; }
  std::int64_t out_h() const { return (in_h + 2 * pad_h - kernel_h) / stride_h + 1; }
  std::int64_t out_w() const { return (in_w + 2 * pad_w - kernel_w) / stride_w + 1; }
  std::int64_t input_size() const { return batch * in_channels * in_h * in_w; }
  std::int64_t output_size() const { return batch * out_channels * out_h() * out_w(); }
  std::int64_t weight_size() const { return out_channels * in_channels * kernel_h * kernel_w; }
  // Multiply-adds times 2 of the forward pass; each backward pass (data, weight) costs the same.
  std::int64_t flops() const { return 2 * output_size() * in_channels * kernel_h * kernel_w; }
};

// A square kernel with the same stride and padding in both dimensions (the common case).
inline Conv2dShape conv2d_shape(std::int64_t batch, std::int64_t in_channels, std::int64_t in_h,
                                std::int64_t in_w, std::int64_t out_channels, std::int64_t kernel,
                                std::int64_t stride, std::int64_t padding) {
  return {batch, in_channels, in_h, in_w, out_channels, kernel, kernel,
          stride, stride, padding, padding};
}

namespace ref {

// y = conv(x, w) + bias.
template <class T>
void conv2d_forward(const StreamHandle& s, const Conv2dShape& shape, const T* x, const T* w,
                    const T* bias, T* y);

// dx = (gradient with respect to the input).
template <class T>
void conv2d_backward_data(const StreamHandle& s, const Conv2dShape& shape, const T* dy,
                          const T* w, T* dx);

// dw += (gradient with respect to the weight).
template <class T>
void conv2d_backward_weight(const StreamHandle& s, const Conv2dShape& shape, const T* x,
                            const T* dy, T* dw);

// db += (gradient with respect to the bias).
template <class T>
void conv2d_backward_bias(const StreamHandle& s, const Conv2dShape& shape, const T* dy, T* db);

}  // namespace ref

namespace cpu {

// Same contracts as ref::, for float and double.
void conv2d_forward(const StreamHandle& s, const Conv2dShape& shape, const float* x,
                    const float* w, const float* bias, float* y);
void conv2d_backward_data(const StreamHandle& s, const Conv2dShape& shape, const float* dy,
                          const float* w, float* dx);
void conv2d_backward_weight(const StreamHandle& s, const Conv2dShape& shape, const float* x,
                            const float* dy, float* dw);
void conv2d_backward_bias(const StreamHandle& s, const Conv2dShape& shape, const float* dy,
                          float* db);

void conv2d_forward(const StreamHandle& s, const Conv2dShape& shape, const double* x,
                    const double* w, const double* bias, double* y);
void conv2d_backward_data(const StreamHandle& s, const Conv2dShape& shape, const double* dy,
                          const double* w, double* dx);
void conv2d_backward_weight(const StreamHandle& s, const Conv2dShape& shape, const double* x,
                            const double* dy, double* dw);
void conv2d_backward_bias(const StreamHandle& s, const Conv2dShape& shape, const double* dy,
                          double* db);

// The most scratch bytes any of the float kernels above asks from the workspace for this shape
// with num_threads threads (double needs twice as much).
std::size_t conv2d_workspace_bytes(const Conv2dShape& shape, int num_threads);

}  // namespace cpu

#if PETRA_HAVE_CUDA
// Same contracts as ref::, float, launched on s.cuda_stream; pointers are device memory
// (kernels/cuda/conv2d.cu, docs/gpu-kernels.md). Forward, backward data and backward weight are
// one shared-memory tiled implicit GEMM (64 x 64 to 128 x 128 tiles of the output, 4 x 4 to 8 x 8
// per thread, the operands gathered from x, w and dy on the fly, no im2col matrix); backward data
// is the gather form (each dx written by one thread); backward weight splits its long sum into
// fixed slices whose partials a second kernel adds in order. The bias gradient adds fixed slices
// of each channel in blocks, then each channel's partials in order. Deterministic: no
// floating-point atomics, every addition order fixed by the shape (and, for the bias gradient,
// by whether dy is 16-byte aligned: its float4 path shares the values among threads otherwise).
// conv2d_backward_weight needs scratch from s.workspace when it splits: at most 64 MiB
// (kernels/cuda/conv2d_tiling.cuh, weight_split_slices), and in TF32 up to 64 MiB more for its
// channels-last copy of x (set_conv2d_channels_last); the bias gradient 512 bytes per channel. Checked under the CUDA emulation (tests/emulation/test_emulated_conv2d.cpp) and on an
// H200 (docs/results-gpu.md). cuDNN's convolution is the run-time alternative
// (petra::set_conv_impl, kernels/cuda_libraries.hpp).
namespace cuda {

void conv2d_forward(const StreamHandle& s, const Conv2dShape& shape, const float* x,
                    const float* w, const float* bias, float* y);
void conv2d_backward_data(const StreamHandle& s, const Conv2dShape& shape, const float* dy,
                          const float* w, float* dx);
void conv2d_backward_weight(const StreamHandle& s, const Conv2dShape& shape, const float* x,
                            const float* dy, float* dw);
void conv2d_backward_bias(const StreamHandle& s, const Conv2dShape& shape, const float* dy,
                          float* db);

// The arithmetic of the cuda:: convolution's three passes (forward, backward data, backward
// weight), for the whole process (as PyTorch's allow_tf32):
//   fp32 (the default): FP32 multiply-adds, the results above;
//   tf32: the same tiles multiplied on the tensor cores (mma.m16n8k8, inputs rounded to TF32's
//         10-bit mantissa, FP32 accumulation): relative error about 2^-11 per product instead of
//         2^-24, still deterministic. sm_80 and newer; below, an FP32 emulation of the same math.
// cuDNN's convolutions (--conv-impl cudnn) follow it too. Set it before launching work; kernels
// read it at launch. petra-train: --conv-math.
enum class Conv2dMath { fp32, tf32 };
void set_conv2d_math(Conv2dMath math);
Conv2dMath conv2d_math();

// The block tile, for the whole process: -1 (the default) lets each product pick its tile by its
// shape (conv2d_tiling::choose_tile, from measurements on an H200); 0, 1, 2, 3
// force 64x64, 64x128, 128x64, 128x128 on both paths (benchmarks time each so); 4, the TF32
// 128x128 compiled for two blocks per multiprocessor (128 registers) where that kernel fits without
// spilling (the channels-last forward and weight gradient, Winograd's GEMM), 128x128 elsewhere; 5,
// the TF32 128x128 with a K step of 32 (three stages in 99.4 KiB of dynamic shared memory; 128x128
// on a GPU whose blocks hold less, and in FP32): options to time, never picked by the rule. The results are the same bits whatever the tile.
void set_conv2d_tile(int tile);

// The algorithm of the weight gradient (conv2d_backward_weight) of 3x3 convolutions at stride 1 and
// padding 1, for the whole process: direct, the implicit GEMM of the other passes; winograd,
// Winograd's F(2x2, 3x3) (2.25x fewer multiply-adds, the transformed operands in the stream's
// workspace, at most 128 MiB a batch part and 64 MiB of partial sums; results a few roundings from
// direct's, still deterministic); or automatic (the default), winograd where run 12 timed it
// faster (docs/results-gpu.md): 64 or more channels in and out, and in TF32 planes of at most
// 16 x 16. Other shapes, and a layer whose one image or whose out x in channels (over 2^20) need
// more workspace, stay direct.
enum class Conv2dWeightAlgorithm { automatic, direct, winograd };
void set_conv2d_weight_algorithm(Conv2dWeightAlgorithm algorithm);
Conv2dWeightAlgorithm conv2d_weight_algorithm();

// The algorithm of the forward (conv2d_forward) and backward data (conv2d_backward_data) of 3x3
// convolutions at stride 1 and padding 1, for the whole process: direct (the default), the implicit
// GEMMs above; or winograd, Winograd's F(2x2, 3x3) (2.25x fewer multiply-adds, the same 16 products
// as the Winograd weight gradient's, the transformed weights and operands in the stream's
// workspace, at most 64 + 128 MiB; backward data as the forward of dy with the kernel turned by 180
// degrees; results a few roundings from direct's, still deterministic); or automatic, winograd
// where run 12's numbers estimate it faster (64 or more channels in and out, output planes of at
// most 16 x 16, in TF32 8 x 8: docs/gpu-kernels.md). Options bench-cuda and gpu-check time beside direct, not
// yet a default: no GPU has timed them (docs/results-gpu.md). Other shapes, a stream without a
// workspace, and a layer whose one image or whose out x in channels (over 2^20) need more
// workspace, stay direct. petra-train: --conv-forward.
enum class Conv2dForwardAlgorithm { direct, winograd, automatic };
void set_conv2d_forward_algorithm(Conv2dForwardAlgorithm algorithm);
Conv2dForwardAlgorithm conv2d_forward_algorithm();

// Whether the forward, and backward data at stride 1, cut their K into slices where the 128 x 128
// tile would leave fewer than 128 blocks (conv2d_tiling::output_split; at batch 128 the 512-channel
// 4 x 4 layers: 64 tiles for 132 multiprocessors): a block per tile and slice sums into partials in
// the stream's workspace (at most 64 MiB), and a second launch adds the slices in order. Off by
// default, an option to time (bench-cuda's petra_split_k_ms); the results differ from the unsplit
// product's in the last places, each deterministic. A forced tile (set_conv2d_tile) turns it off;
// TF32 backward data without channels-last copies (out_channels % 4 != 0) never splits.
// For the whole process.
void set_conv2d_split_k(bool on);
bool conv2d_split_k();

// Whether the TF32 passes read channels-last copies (the default, true; docs/gpu-kernels.md steps
// 16 and 17): the forward at stride 1 with in_channels % 4 == 0 (copies of x and the weights),
// backward data with out_channels % 4 == 0 (dy and the weights), the weight gradient with
// in_channels % 32 == 0 (x): their gathered operands in 16-byte copies, one or two more launches
// per call and up to 64 MiB of the stream's workspace (128 MiB with the weight gradient's
// partials); or x and dy themselves, as FP32 does. The forward's and backward data's results
// differ in the last places (another order of the sum), each deterministic; the weight
// gradient's are the same bits. For the whole process; benchmarks time both.
void set_conv2d_channels_last(bool enabled);
bool conv2d_channels_last();

// The most elements (default and at most 2^31 - 1) an input or output of one launch may have: the
// kernels index in 32 bits, and a larger batch runs in launches of fewer samples (forward and
// backward data: the same results; backward weight: the parts added into dw in batch order). A
// sample or the weights over the limit are a ShapeError. Tests lower it to check the split; <= 0
// restores the default.
void set_conv2d_launch_elements(std::int64_t limit);

}  // namespace cuda
#endif

}  // namespace petra::kernels
