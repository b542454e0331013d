// kernels/coupling.hpp: the fused additive coupling (with swap) of a reversible stage.
//
// A reversible activation x has 2C channels holding two streams: x1 = channels [0, C) and
// x2 = channels [C, 2C). With f = F(x1) (C channels, computed by the caller) the coupling is
//   forward:  y1 = x2 + f,   y2 = x1          (y has 2C channels, y1 first)
//   inverse:  x1 = y2,       x2 = y1 - f      (f = F(y2), recomputed by the caller)
// The first stream is moved, never computed, so x1 comes back bit for bit; x2 = (x2 + f) - f
// comes back up to float rounding of the addition.
//   backward: given dy = (dy1, dy2) and g = the vector-Jacobian product of F at x1 with dy1,
//             dx1 = dy2 + g,   dx2 = dy1
// which is the forward's map applied to (dy, g): one pass instead of an add and a concat.
// g may be null, meaning zero (dx1 = dy2 exactly): the generic autograd coupling (petra/
// functions.cpp), whose F's vjp reaches x1 by another path, swaps the streams without building
// and reading a tensor of zeros.
//
// All tensors are NCHW, contiguous; `shape.channels` is C, the channels of ONE stream.
// Memory-bound: each call reads 3 and writes 2 tensors of N*C*H*W floats, in one pass.
// cuda:: (kernels/cuda/coupling.cu, in builds with CUDA) is one hand-written grid-stride kernel
// for all three: a thread takes position i of one sample, reads the input's two streams and f
// there and writes both output streams, consecutive threads on consecutive positions (coalesced),
// four floats at a time (float4) when the stream size is a multiple of 4 and the pointers are
// 16-byte aligned. One launch moves just the 3 + 2 tensors above; a copy plus an add would also
// write x2 + f to a temporary and read it back.
#pragma once

#include <cstdint>

#include "petra/kernels/common.hpp"
#include "petra/config.hpp"

namespace petra::kernels {

// Which map a fused coupling applies (kernels/batchnorm.hpp's batchnorm_relu_coupling_*):
// forward a = x gives y; inverse a = y gives x.
enum class CouplingDirection { forward, inverse };

struct CouplingShape {
  std::int64_t batch = 0, channels = 0, height = 0, width = 0;  // channels: per stream (C)

  std::int64_t stream_size() const { return channels * height * width; }  // one stream of one sample
  std::int64_t half_size() const { return batch * stream_size(); }        // f; x and y hold two
};

namespace ref {

// y =.
template <class T>
void coupling_forward(const StreamHandle& s, const CouplingShape& shape, const T* x, const T* f, T* y);

// x =.
template <class T>
void coupling_inverse(const StreamHandle& s, const CouplingShape& shape, const T* y, const T* f, T* x);

// dx =. g: the vjp of F at x1 with dy1 (C channels).
template <class T>
void coupling_backward(const StreamHandle& s, const CouplingShape& shape, const T* dy, const T* g,
                       T* dx);

}  // namespace ref

namespace cpu {

void coupling_forward(const StreamHandle& s, const CouplingShape& shape, const float* x,
                      const float* f, float* y);
void coupling_inverse(const StreamHandle& s, const CouplingShape& shape, const float* y,
                      const float* f, float* x);
void coupling_backward(const StreamHandle& s, const CouplingShape& shape, const float* dy,
                       const float* g, float* dx);

}  // namespace cpu

#if PETRA_HAVE_CUDA
// Same contracts as ref::, float, launched on s.cuda_stream; pointers are device memory.
namespace cuda {

void coupling_forward(const StreamHandle& s, const CouplingShape& shape, const float* x,
                      const float* f, float* y);
void coupling_inverse(const StreamHandle& s, const CouplingShape& shape, const float* y,
                      const float* f, float* x);
void coupling_backward(const StreamHandle& s, const CouplingShape& shape, const float* dy,
                       const float* g, float* dx);

}  // namespace cuda
#endif

}  // namespace petra::kernels
