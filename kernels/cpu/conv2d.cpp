// kernels/cpu/conv2d.cpp: the cpu:: entry points of kernels/conv2d.hpp, and which algorithm runs
// each pass (kernels/cpu/conv2d_algorithms.hpp lists them):
//   - float, AVX-512 compiled in: first Winograd's F(4x4, 3x3) for the forward and backward-data
//     of 3x3 stride-1 padding-1 layers of 16 channels or more on rows of up to 28
//     (conv2d_winograd_f4.cpp, `applies`), then F(2x2, 3x3) for those of 16 to 64 channels on rows
//     of 7 to 30 (conv2d_winograd.cpp: rows of 29 and 30, outputs not a multiple of 4) and on 4x4 images (conv2d_winograd_small.cpp); then the
//     direct kernels where they measured faster than
//     im2col + GEMM, first direct::small (images of 16 pixels, conv2d_direct_small.cpp), then for the
//     forward direct::lanes (stride 2, channels on the lanes: conv2d_direct_lanes.cpp), then
//     direct::pointwise (1x1 at stride 2, conv2d_direct_pointwise.cpp), then direct::grid (narrow
//     3x3-like layers, conv2d_direct_grid.cpp); each one's `applies` says where;
//     backward-data runs them as the forward pass of transposed_stride1(shape), at stride 1 only,
//     and direct::lanes' own backward-data at stride 2 where `applies_backward_data` says so, and
//     direct::pointwise's for 1x1 at stride 2;
//   - float backward-weight, AVX-512: first F(4x4, 3x3) where its forward applies (f4_weight: but
//     4x4 images on several threads go to conv2d_winograd_small.cpp's), then F(2x2, 3x3) where
//     `applies_weight` (rows of 7 to 16: those F(4x4) does not take), then direct::channels (16 input channels per vector,
//     3-column kernels, outputs at least 7 wide: conv2d_direct_channels.cpp), then
//     direct::pointwise (1x1 at stride 2), then as above;
//   - otherwise (all of double, the other shapes) im2col + Eigen GEMM (conv2d_im2col.cpp), whose
//     backward-data is itself a forward convolution at stride 1 with at least 16 input channels
//     and col2im otherwise;
//   - the bias gradient, here: per-channel sums of dy, the same for every shape.
// conv2d_workspace_bytes is the most scratch any of them asks for.
#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "petra/kernels/conv2d.hpp"
#include "petra/kernels/cpu/conv2d_algorithms.hpp"
#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu {
namespace {

using std::int64_t;

// Backward-data of a stride-1 conv runs as a forward conv with in_channels outputs: worth it
// unless in_channels is tiny (the network's first layer), where col2im's GEMM is better shaped.
bool backward_data_as_forward(const Conv2dShape& s) {
  return s.stride_h == 1 && s.stride_w == 1 && s.in_channels >= 16;
}

template <class T>
void forward_pass(const StreamHandle& s, const Conv2dShape& shape, const T* x, const T* w,
                  const T* bias, T* y) {
#if PETRA_CONV_DIRECT
  if constexpr (std::is_same_v<T, float>) {
    if (conv2d::winograd_f4::applies(shape)) {
      conv2d::winograd_f4::forward(s, shape, x, w, bias, y);
      return;
    }
    if (conv2d::winograd::applies(shape)) {
      conv2d::winograd::forward(s, shape, x, w, bias, y);
      return;
    }
    if (conv2d::winograd_small::applies(shape)) {
      conv2d::winograd_small::forward(s, shape, x, w, bias, y);
      return;
    }
    if (conv2d::direct::small::applies(shape, conv2d::Pass::forward)) {
      conv2d::direct::small::forward(s, shape, x, w, bias, y);
      return;
    }
    if (conv2d::direct::pointwise::applies(shape)) {
      conv2d::direct::pointwise::forward(s, shape, x, w, bias, y);
      return;
    }
    if (conv2d::direct::lanes::applies(shape, conv2d::Pass::forward)) {
      conv2d::direct::lanes::forward(s, shape, x, w, bias, y);
      return;
    }
    if (conv2d::direct::grid::applies(shape, conv2d::Pass::forward)) {
      conv2d::direct::grid::forward(s, shape, x, w, bias, y);
      return;
    }
  }
#endif
  conv2d::im2col::forward(s, shape, x, w, bias, y);
}

template <class T>
void backward_data(const StreamHandle& s, const Conv2dShape& shape, const T* dy, const T* w,
                   T* dx) {
#if PETRA_CONV_DIRECT
  if constexpr (std::is_same_v<T, float>) {
    if (shape.stride_h == 1 && shape.stride_w == 1) {
      const Conv2dShape transposed = conv2d::transposed_stride1(shape);
      if (conv2d::winograd_f4::applies(transposed)) {
        conv2d::winograd_f4::backward_data(s, shape, dy, w, dx);
        return;
      }
      if (conv2d::winograd::applies(transposed)) {
        conv2d::winograd::backward_data(s, shape, dy, w, dx);
        return;
      }
      if (conv2d::winograd_small::applies(transposed)) {
        conv2d::winograd_small::backward_data(s, shape, dy, w, dx);
        return;
      }
      if (conv2d::direct::small::applies(transposed, conv2d::Pass::forward)) {
        conv2d::direct::small::backward_data(s, shape, dy, w, dx);
        return;
      }
      if (conv2d::direct::grid::applies(transposed, conv2d::Pass::forward)) {
        conv2d::direct::grid::backward_data(s, shape, dy, w, dx);
        return;
      }
    }
    if (conv2d::direct::lanes::applies_backward_data(shape)) {
      conv2d::direct::lanes::backward_data(s, shape, dy, w, dx);
      return;
    }
    if (conv2d::direct::pointwise::applies(shape)) {
      conv2d::direct::pointwise::backward_data(s, shape, dy, w, dx);
      return;
    }
  }
#endif
  if (backward_data_as_forward(shape)) {
    conv2d::im2col::backward_data_transposed(s, shape, dy, w, dx);
  } else {
    conv2d::im2col::backward_data_col2im(s, shape, dy, w, dx);
  }
}

#if PETRA_CONV_DIRECT
// Whether F(4x4)'s weight gradient takes the pass. It gives each thread whole units (tile rows of
// 16 images) and adds the threads' sums at the end; on 4x4 images with several threads
// winograd_small's (whole chunks of output channels per thread, nothing to add) is faster:
// 128->128 @4 at 2 threads 0.70 against 0.91 ms, at 1 thread 1.28 against 1.08 (`bench-conv-shapes
// --cold`, medians of 4 interleaved rounds; docs/results-cpu.md §1).
bool f4_weight(const Conv2dShape& shape, int threads) {
  return conv2d::winograd_f4::applies_weight(shape) && !(threads > 1 && conv2d::winograd_small::applies_weight(shape));
}
#endif

template <class T>
void backward_weight(const StreamHandle& s, const Conv2dShape& shape, const T* x, const T* dy,
                     T* dw) {
#if PETRA_CONV_DIRECT
  if constexpr (std::is_same_v<T, float>) {
    if (f4_weight(shape, s.num_threads)) {
      conv2d::winograd_f4::backward_weight(s, shape, x, dy, dw);
      return;
    }
    if (conv2d::winograd::applies_weight(shape)) {
      conv2d::winograd::backward_weight(s, shape, x, dy, dw);
      return;
    }
    if (conv2d::winograd_small::applies_weight(shape)) {
      conv2d::winograd_small::backward_weight(s, shape, x, dy, dw);
      return;
    }
    if (conv2d::direct::channels::applies(shape, conv2d::Pass::weight)) {
      conv2d::direct::channels::backward_weight(s, shape, x, dy, dw);
      return;
    }
    if (conv2d::direct::pointwise::applies(shape)) {
      conv2d::direct::pointwise::backward_weight(s, shape, x, dy, dw);
      return;
    }
    if (conv2d::direct::small::applies(shape, conv2d::Pass::weight)) {
      conv2d::direct::small::backward_weight(s, shape, x, dy, dw);
      return;
    }
    if (conv2d::direct::grid::applies(shape, conv2d::Pass::weight)) {
      conv2d::direct::grid::backward_weight(s, shape, x, dy, dw);
      return;
    }
  }
#endif
  conv2d::im2col::backward_weight(s, shape, x, dy, dw);
}

// db += the sum of dy over the batch and the pixels, per output channel: each thread sums whole
// channels, so the result does not depend on the thread count.
template <class T>
void backward_bias(const StreamHandle& s, const Conv2dShape& shape, const T* dy, T* db) {
  const int64_t pixels = shape.out_h() * shape.out_w(), channels = shape.out_channels;
  run_threads(s, [&](int t, int threads) {
    for (int64_t o = share(channels, t, threads); o < share(channels, t + 1, threads); ++o) {
      double sum = 0;
      for (int64_t b = 0; b < shape.batch; ++b)
        sum += Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 1>>(dy + (b * channels + o) * pixels, pixels).sum();
      db[o] = static_cast<T>(db[o] + sum);
    }
  });
}

#if PETRA_CONV_DIRECT
// The most scratch floats the direct kernels ask for with `threads` threads (0 where none
// applies), with the choices of the passes above.
int64_t direct_workspace_floats(const Conv2dShape& s, int threads) {
  namespace direct = conv2d::direct;
  using conv2d::Pass;
  auto forward_floats = [&](const Conv2dShape& f) -> int64_t {
    if (conv2d::winograd_f4::applies(f)) return conv2d::winograd_f4::scratch_floats(f, threads);
    if (conv2d::winograd::applies(f)) return conv2d::winograd::scratch_floats(f, threads);
    if (conv2d::winograd_small::applies(f)) return conv2d::winograd_small::scratch_floats(f, threads);
    if (direct::small::applies(f, Pass::forward)) return direct::small::forward_scratch_floats(f, threads);
    if (direct::pointwise::applies(f)) return direct::pointwise::forward_scratch_floats(f, threads);
    if (direct::lanes::applies(f, Pass::forward)) return direct::lanes::forward_scratch_floats(f, threads);
    if (direct::grid::applies(f, Pass::forward)) return direct::grid::forward_scratch_floats(f, threads);
    return 0;
  };
  int64_t floats = forward_floats(s);
  if (s.stride_h == 1 && s.stride_w == 1)
    floats = std::max(floats, forward_floats(conv2d::transposed_stride1(s)));
  if (direct::lanes::applies_backward_data(s))
    floats = std::max(floats, direct::lanes::backward_data_scratch_floats(s, threads));
  else if (direct::pointwise::applies(s))
    floats = std::max(floats, direct::pointwise::backward_data_scratch_floats(s, threads));
  if (f4_weight(s, threads))
    floats = std::max(floats, conv2d::winograd_f4::backward_weight_scratch_floats(s, threads));
  else if (conv2d::winograd::applies_weight(s))
    floats = std::max(floats, conv2d::winograd::backward_weight_scratch_floats(s, threads));
  else if (conv2d::winograd_small::applies_weight(s))
    floats = std::max(floats, conv2d::winograd_small::backward_weight_scratch_floats(s, threads));
  else if (direct::channels::applies(s, Pass::weight))
    floats = std::max(floats, direct::channels::backward_weight_scratch_floats(s, threads));
  else if (direct::pointwise::applies(s))
    floats = std::max(floats, direct::pointwise::backward_weight_scratch_floats(s, threads));
  else if (direct::small::applies(s, Pass::weight))
    floats = std::max(floats, direct::small::backward_weight_scratch_floats(s, threads));
  else if (direct::grid::applies(s, Pass::weight))
    floats = std::max(floats, direct::grid::backward_weight_scratch_floats(s, threads));
  return floats;
}
#endif

}  // namespace

void conv2d_forward(const StreamHandle& s, const Conv2dShape& shape, const float* x,
                    const float* w, const float* bias, float* y) {
  forward_pass(s, shape, x, w, bias, y);
}
void conv2d_backward_data(const StreamHandle& s, const Conv2dShape& shape, const float* dy,
                          const float* w, float* dx) {
  backward_data(s, shape, dy, w, dx);
}
void conv2d_backward_weight(const StreamHandle& s, const Conv2dShape& shape, const float* x,
                            const float* dy, float* dw) {
  backward_weight(s, shape, x, dy, dw);
}
void conv2d_backward_bias(const StreamHandle& s, const Conv2dShape& shape, const float* dy,
                          float* db) {
  backward_bias(s, shape, dy, db);
}

void conv2d_forward(const StreamHandle& s, const Conv2dShape& shape, const double* x,
                    const double* w, const double* bias, double* y) {
  forward_pass(s, shape, x, w, bias, y);
}
void conv2d_backward_data(const StreamHandle& s, const Conv2dShape& shape, const double* dy,
                          const double* w, double* dx) {
  backward_data(s, shape, dy, w, dx);
}
void conv2d_backward_weight(const StreamHandle& s, const Conv2dShape& shape, const double* x,
                            const double* dy, double* dw) {
  backward_weight(s, shape, x, dy, dw);
}
void conv2d_backward_bias(const StreamHandle& s, const Conv2dShape& shape, const double* dy,
                          double* db) {
  backward_bias(s, shape, dy, db);
}

std::size_t conv2d_workspace_bytes(const Conv2dShape& shape, int num_threads) {
  namespace im2col = conv2d::im2col;
  const int threads = std::max(1, num_threads);
  const int64_t data_floats = backward_data_as_forward(shape)
                                  ? im2col::backward_data_transposed_scratch_floats(shape, threads)
                                  : im2col::backward_data_col2im_scratch_floats(shape, threads);
  int64_t direct_floats = 0;
#if PETRA_CONV_DIRECT
  direct_floats = direct_workspace_floats(shape, threads);
#endif
  return static_cast<std::size_t>(std::max({im2col::forward_scratch_floats(shape, threads),
                                            im2col::backward_weight_scratch_floats(shape, threads),
                                            data_floats, direct_floats})) *
         sizeof(float);
}

}  // namespace petra::kernels::cpu
