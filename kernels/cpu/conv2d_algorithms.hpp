// kernels/cpu/conv2d_algorithms.hpp: the CPU convolution algorithms that kernels/cpu/conv2d.cpp
// chooses between, and the scratch layout they share (internal, not installed).
//
//   im2col           kernels/cpu/conv2d_im2col.cpp        im2col + Eigen GEMM: any shape, float
//                                                          and double
//   direct::grid     kernels/cpu/conv2d_direct_grid.cpp   AVX-512, float: narrow 3x3-like layers
//   direct::small    kernels/cpu/conv2d_direct_small.cpp  AVX-512, float: images of 16 pixels
//   direct::lanes    kernels/cpu/conv2d_direct_lanes.cpp  AVX-512, float: forward at stride 2,
//                                                          output channels on the lanes
//   direct::channels kernels/cpu/conv2d_direct_channels.cpp AVX-512, float: backward-weight of
//                                                          3-column kernels, 16k input channels
//   direct::pointwise kernels/cpu/conv2d_direct_pointwise.cpp AVX-512, float: 1x1 stride 2 (the
//                                                          downsampling shortcuts), all passes
//   winograd         kernels/cpu/conv2d_winograd.cpp      AVX-512, float: 3x3 stride 1 pad 1,
//                                                          F(2x2, 3x3): forward, backward-data,
//                                                          backward-weight (rows up to 16)
//   winograd_small   kernels/cpu/conv2d_winograd_small.cpp AVX-512, float: the same on 4x4 images,
//                                                          one image channel per vector (all three
//                                                          passes)
//   winograd_f4      kernels/cpu/conv2d_winograd_f4.cpp   AVX-512, float: F(4x4, 3x3) on rows of up
//                                                          to 16, 16 images on the lanes: forward
//                                                          and backward-data
//
// Each algorithm's passes have the contracts of kernels/conv2d.hpp (y =, dx =, dw +=) and take
// their scratch from the stream's workspace through reserve_scratch; *_scratch_floats(shape,
// threads) is how many floats a pass asks for, which conv2d_workspace_bytes adds up.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "petra/kernels/common.hpp"
#include "petra/kernels/conv2d.hpp"

// The direct kernels exist where AVX-512 is compiled in.
#if defined(__AVX512F__)
#define PETRA_CONV_DIRECT 1
#else
#define PETRA_CONV_DIRECT 0
#endif

namespace petra::kernels::cpu::conv2d {

using std::int64_t;

// The helpers shared by the algorithms have internal linkage, as when all lived in one file: each
// includer gets its own copy, inlined as it was there.
namespace {

constexpr int64_t round_up(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

// Scratch of one call: a shared block, then one block per thread.
template <class T>
struct Scratch {
  T* shared;
  T* per_thread;
  int64_t thread_elements;
  T* of_thread(int t) const { return per_thread + t * thread_elements; }
};

template <class T>
Scratch<T> reserve_scratch(const StreamHandle& s, int64_t shared_elements, int64_t thread_elements) {
  const int64_t line = 64 / sizeof(T);  // keep each thread's block on its own cache lines
  shared_elements = round_up(shared_elements, line);
  thread_elements = round_up(thread_elements, line);
  const int threads = std::max(1, s.num_threads);
  const int64_t total = shared_elements + threads * thread_elements;
  if (total == 0) return {nullptr, nullptr, 0};
  T* base = static_cast<T*>(s.scratch(static_cast<std::size_t>(total) * sizeof(T)));
  return {base, base + shared_elements, thread_elements};
}

// The floats reserve_scratch<float> takes for `shared` floats and `per_thread` floats per thread
// with `threads` threads.
constexpr int64_t scratch_floats(int64_t shared, int64_t per_thread, int threads) {
  constexpr int64_t line = 64 / sizeof(float);
  return round_up(shared, line) + threads * round_up(per_thread, line);
}

// Floats (a multiple of 16) rounded up to an odd number of 64-byte lines: the distance between
// the positions of a Winograd tile in V and M. A transform reads or writes a tile's positions
// (16 for F(2x2), 36 for F(4x4)) at once, one position apart; at a multiple of 4 KB apart (64
// channels x 64 tiles, or 128 channels x 4 columns) they all fall in one set of the 12-way L1 and
// evict each other (F(2x2) 64 -> 64 @7: 1.95 ms per forward, 1.10 ms with odd lines; F(4x4)
// 32 -> 32 @14: docs/results-cpu.md §1, "Two layouts of F(4x4) ..."). An odd number of lines puts
// consecutive positions in different sets.
constexpr int64_t odd_lines(int64_t floats) {
  constexpr int64_t line = 64 / sizeof(float);
  return floats / line % 2 == 1 ? floats : floats + line;
}

// The shape whose forward pass is backward-data of a stride-1 convolution: dy is its input, dx
// its output, and its weight is w flipped in both spatial dimensions with in/out swapped.
inline Conv2dShape transposed_stride1(const Conv2dShape& s) {
  return {s.batch, s.out_channels, s.out_h(), s.out_w(), s.in_channels, s.kernel_h, s.kernel_w,
          1, 1, s.kernel_h - 1 - s.pad_h, s.kernel_w - 1 - s.pad_w};
}

// Tap (i, j) from input channel c to output channel o of a 3x3 weight w[out][in][3][3]; and of the
// transposed_stride1 convolution's weight (output channel c, input channel o: w[o][c] flipped).
// Both are affine in their arguments: tap (i, j) of (first, second) is w[first * first_stride() +
// second * second_stride() + offset(i, j)], which the vector transforms gather by.
struct Taps3x3 {
  const float* w;
  int64_t in;
  float operator()(int64_t o, int64_t c, int64_t i, int64_t j) const { return w[((o * in + c) * 3 + i) * 3 + j]; }
  int64_t first_stride() const { return in * 9; }
  int64_t second_stride() const { return 9; }
  static int64_t offset(int i, int j) { return i * 3 + j; }
};
struct FlippedTaps3x3 {
  const float* w;
  int64_t in;  // of the original convolution
  float operator()(int64_t c, int64_t o, int64_t i, int64_t j) const {
    return w[((o * in + c) * 3 + 2 - i) * 3 + 2 - j];
  }
  int64_t first_stride() const { return 9; }
  int64_t second_stride() const { return in * 9; }
  static int64_t offset(int i, int j) { return (2 - i) * 3 + 2 - j; }
};

// Winograd F(2x2, 3x3)'s transformed kernel u = G g G^T of one 3x3 kernel, g(i, j) its taps,
// G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1] (conv2d_winograd.cpp): halves and sums only.
template <class Taps>
inline void winograd_transform_kernel(Taps&& g, float (&u)[4][4]) {
  float gg[4][3];  // G g
  for (int j = 0; j < 3; ++j) {
    const float a = g(0, j), b = g(1, j), e = g(2, j);
    gg[0][j] = a;
    gg[1][j] = 0.5f * (a + b + e);
    gg[2][j] = 0.5f * (a - b + e);
    gg[3][j] = e;
  }
  for (int i = 0; i < 4; ++i) {  // (G g) G^T
    const float a = gg[i][0], b = gg[i][1], e = gg[i][2];
    u[i][0] = a;
    u[i][1] = 0.5f * (a + b + e);
    u[i][2] = 0.5f * (a - b + e);
    u[i][3] = e;
  }
}

// Winograd F(2x2, 3x3)'s weight gradient from the gradient of one transformed kernel (its 4x4
// positions dU): to[0..9) += G^T dU G, G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1] (conv2d_winograd.cpp).
inline void add_winograd_weight_gradient(const double (&du)[4][4], float* to) {
  double right[4][3];  // dU G
  for (int r = 0; r < 4; ++r) {
    right[r][0] = du[r][0] + 0.5 * (du[r][1] + du[r][2]);
    right[r][1] = 0.5 * (du[r][1] - du[r][2]);
    right[r][2] = 0.5 * (du[r][1] + du[r][2]) + du[r][3];
  }
  for (int j = 0; j < 3; ++j) {  // G^T (dU G)
    to[j] = static_cast<float>(to[j] + right[0][j] + 0.5 * (right[1][j] + right[2][j]));
    to[3 + j] = static_cast<float>(to[3 + j] + 0.5 * (right[1][j] - right[2][j]));
    to[6 + j] = static_cast<float>(to[6 + j] + 0.5 * (right[1][j] + right[2][j]) + right[3][j]);
  }
}

}  // namespace

// ---- im2col + GEMM (kernels/cpu/conv2d_im2col.cpp), T = float or double.
namespace im2col {

template <class T>
void forward(const StreamHandle& s, const Conv2dShape& shape, const T* x, const T* w,
             const T* bias, T* y);
// Stride 1 only: backward-data as the forward convolution of dy with the flipped, transposed
// weight (transposed_stride1).
template <class T>
void backward_data_transposed(const StreamHandle& s, const Conv2dShape& shape, const T* dy,
                              const T* w, T* dx);
// Any stride: dcol = W^T dY, scatter-added into dx (col2im).
template <class T>
void backward_data_col2im(const StreamHandle& s, const Conv2dShape& shape, const T* dy,
                          const T* w, T* dx);
template <class T>
void backward_weight(const StreamHandle& s, const Conv2dShape& shape, const T* x, const T* dy,
                     T* dw);

// Scratch of each pass in floats (double takes twice the bytes).
int64_t forward_scratch_floats(const Conv2dShape& shape, int threads);
int64_t backward_data_transposed_scratch_floats(const Conv2dShape& shape, int threads);
int64_t backward_data_col2im_scratch_floats(const Conv2dShape& shape, int threads);
int64_t backward_weight_scratch_floats(const Conv2dShape& shape, int threads);

}  // namespace im2col

#if PETRA_CONV_DIRECT
// ---- The direct AVX-512 kernels, float. applies(shape, pass) says where each is used; a
// backward-data pass is the forward pass of transposed_stride1(shape), so it applies where
// stride is 1 and applies(transposed_stride1(shape), Pass::forward).
enum class Pass { forward, weight };

namespace direct::grid {  // kernels/cpu/conv2d_direct_grid.cpp
bool applies(const Conv2dShape& s, Pass pass);
void forward(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* w,
             const float* bias, float* y);
void backward_data(const StreamHandle& st, const Conv2dShape& s, const float* dy, const float* w,
                   float* dx);
void backward_weight(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* dy,
                     float* dw);
// Scratch floats of forward(s) (and backward_data(s): of transposed_stride1(s)) and of
// backward_weight(s).
int64_t forward_scratch_floats(const Conv2dShape& s, int threads);
int64_t backward_weight_scratch_floats(const Conv2dShape& s, int threads);
}  // namespace direct::grid

namespace direct::small {  // kernels/cpu/conv2d_direct_small.cpp
bool applies(const Conv2dShape& s, Pass pass);
void forward(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* w,
             const float* bias, float* y);
void backward_data(const StreamHandle& st, const Conv2dShape& s, const float* dy, const float* w,
                   float* dx);
void backward_weight(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* dy,
                     float* dw);
// Scratch floats of forward(s) (and backward_data(s): of transposed_stride1(s)) and of
// backward_weight(s).
int64_t forward_scratch_floats(const Conv2dShape& s, int threads);
int64_t backward_weight_scratch_floats(const Conv2dShape& s, int threads);
}  // namespace direct::small

namespace direct::lanes {  // kernels/cpu/conv2d_direct_lanes.cpp: forward and backward-data at stride 2
bool applies(const Conv2dShape& s, Pass pass);
void forward(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* w,
             const float* bias, float* y);
int64_t forward_scratch_floats(const Conv2dShape& s, int threads);
// Backward-data at stride 2 (input channels on the lanes), where applies_backward_data(s).
bool applies_backward_data(const Conv2dShape& s);
void backward_data(const StreamHandle& st, const Conv2dShape& s, const float* dy, const float* w,
                   float* dx);
int64_t backward_data_scratch_floats(const Conv2dShape& s, int threads);
}  // namespace direct::lanes

namespace direct::channels {  // kernels/cpu/conv2d_direct_channels.cpp: backward-weight only
bool applies(const Conv2dShape& s, Pass pass);
void backward_weight(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* dy,
                     float* dw);
int64_t backward_weight_scratch_floats(const Conv2dShape& s, int threads);
}  // namespace direct::channels

namespace direct::pointwise {  // kernels/cpu/conv2d_direct_pointwise.cpp: 1x1 at stride 2, all passes
bool applies(const Conv2dShape& s);
void forward(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* w,
             const float* bias, float* y);
void backward_data(const StreamHandle& st, const Conv2dShape& s, const float* dy, const float* w,
                   float* dx);
void backward_weight(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* dy,
                     float* dw);
int64_t forward_scratch_floats(const Conv2dShape& s, int threads);
int64_t backward_data_scratch_floats(const Conv2dShape& s, int threads);
int64_t backward_weight_scratch_floats(const Conv2dShape& s, int threads);
}  // namespace direct::pointwise

namespace winograd {  // kernels/cpu/conv2d_winograd.cpp: 3x3, stride 1, padding 1: F(2x2, 3x3)
bool applies(const Conv2dShape& s);  // of the forward pass; backward-data: of transposed_stride1(s)
void forward(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* w,
             const float* bias, float* y);
void backward_data(const StreamHandle& st, const Conv2dShape& s, const float* dy, const float* w,
                   float* dx);
// Scratch floats of forward(s) (and backward_data(s): of transposed_stride1(s)).
int64_t scratch_floats(const Conv2dShape& s, int threads);
// Backward-weight, where applies_weight(s).
bool applies_weight(const Conv2dShape& s);
void backward_weight(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* dy,
                     float* dw);
int64_t backward_weight_scratch_floats(const Conv2dShape& s, int threads);
}  // namespace winograd

namespace winograd_small {  // kernels/cpu/conv2d_winograd_small.cpp: F(2x2, 3x3) on 4x4 images
bool applies(const Conv2dShape& s);  // of the forward pass; backward-data: of transposed_stride1(s)
void forward(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* w,
             const float* bias, float* y);
void backward_data(const StreamHandle& st, const Conv2dShape& s, const float* dy, const float* w,
                   float* dx);
// Scratch floats of forward(s) (and backward_data(s): of transposed_stride1(s)).
int64_t scratch_floats(const Conv2dShape& s, int threads);
// Backward-weight, where applies_weight(s).
bool applies_weight(const Conv2dShape& s);
void backward_weight(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* dy,
                     float* dw);
int64_t backward_weight_scratch_floats(const Conv2dShape& s, int threads);
}  // namespace winograd_small

namespace winograd_f4 {  // kernels/cpu/conv2d_winograd_f4.cpp: F(4x4, 3x3) on rows of up to 28
bool applies(const Conv2dShape& s);  // of the forward pass; backward-data: of transposed_stride1(s)
void forward(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* w,
             const float* bias, float* y);
void backward_data(const StreamHandle& st, const Conv2dShape& s, const float* dy, const float* w,
                   float* dx);
// Scratch floats of forward(s) (and backward_data(s): of transposed_stride1(s)).
int64_t scratch_floats(const Conv2dShape& s, int threads);
bool applies_weight(const Conv2dShape& s);
void backward_weight(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* dy, float* dw);
int64_t backward_weight_scratch_floats(const Conv2dShape& s, int threads);
}  // namespace winograd_f4
#endif  // PETRA_CONV_DIRECT

}  // namespace petra::kernels::cpu::conv2d
