// tests/cpu/test_conv2d.cpp: the conv2d kernels: cpu:: against ref:: on many shapes, ref::'s
// backward passes against finite differences, and the "=" / "+=" contract of each output.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "petra/kernels/conv2d.hpp"
#include "tests/support/gradcheck.hpp"
#include "tests/support/testing.hpp"

namespace {

using petra::testing::AlignedVector;  // outputs compared bit for bit: equally aligned (testing.hpp)

using petra::kernels::Conv2dShape;
using petra::kernels::conv2d_shape;
using petra::kernels::HeapWorkspace;
using petra::kernels::StreamHandle;
using petra::testing::random_values;
using petra::testing::relative_error;
namespace ref = petra::kernels::ref;
namespace cpu = petra::kernels::cpu;

std::string describe(const Conv2dShape& s) {
  return "batch " + std::to_string(s.batch) + ", " + std::to_string(s.in_channels) + "->" +
         std::to_string(s.out_channels) + " channels, " + std::to_string(s.in_h) + "x" +
         std::to_string(s.in_w) + " image, " + std::to_string(s.kernel_h) + "x" +
         std::to_string(s.kernel_w) + " kernel, stride " + std::to_string(s.stride_h) + "," +
         std::to_string(s.stride_w) + ", padding " + std::to_string(s.pad_h) + "," +
         std::to_string(s.pad_w);
}

std::size_t size_of(std::int64_t n) { return static_cast<std::size_t>(n); }

// The shapes cpu:: is compared on: odd sizes, batch 1, kernels 1/3/7 and non-square, strides 1
// and 2, paddings 0/1/3 (also larger than kernel - 1), images with few pixels so that one GEMM
// tile spans many images (and a thread's share starts inside an image), and images with many
// (at least 256 output pixels: the tiles are rows of one image).
std::vector<Conv2dShape> comparison_shapes() {
  std::vector<Conv2dShape> shapes = {
      conv2d_shape(1, 3, 7, 9, 5, 3, 1, 1),      conv2d_shape(2, 4, 11, 8, 6, 1, 1, 0),
      conv2d_shape(3, 2, 9, 13, 3, 7, 2, 3),     conv2d_shape(2, 5, 10, 10, 4, 3, 2, 1),
      conv2d_shape(1, 3, 6, 7, 2, 1, 2, 0),      conv2d_shape(2, 3, 5, 6, 4, 1, 1, 1),
      conv2d_shape(2, 2, 6, 5, 3, 3, 1, 3),      conv2d_shape(37, 3, 4, 4, 4, 3, 1, 1),
      conv2d_shape(37, 6, 4, 4, 5, 1, 1, 0),     conv2d_shape(13, 3, 8, 7, 4, 3, 2, 1),
      conv2d_shape(2, 3, 23, 21, 4, 3, 1, 1),    conv2d_shape(1, 4, 29, 31, 3, 1, 1, 0),
      conv2d_shape(2, 2, 25, 27, 3, 7, 1, 3),    conv2d_shape(2, 3, 40, 36, 4, 3, 2, 1),
      conv2d_shape(1, 2, 50, 53, 3, 5, 3, 2),    conv2d_shape(1, 1, 1, 1, 1, 1, 1, 0)};
  // in_channels >= 16: backward-data of stride 1 runs as a forward conv (padding k-1-p < 0 too)
  shapes.push_back(conv2d_shape(3, 16, 7, 9, 5, 3, 1, 1));
  shapes.push_back(conv2d_shape(2, 16, 5, 6, 3, 1, 1, 1));
  shapes.push_back(conv2d_shape(2, 17, 6, 5, 3, 3, 1, 3));
  shapes.push_back({2, 16, 9, 8, 4, 3, 1, 1, 1, 1, 0});
  shapes.push_back({2, 3, 9, 8, 4, 3, 1, 1, 1, 1, 0});   // 3x1 kernel
  shapes.push_back({3, 2, 7, 12, 3, 1, 5, 1, 2, 0, 2});  // 1x5 kernel, stride (1, 2)
  shapes.push_back({2, 3, 10, 9, 2, 4, 2, 2, 1, 1, 0});  // even 4x2 kernel, stride (2, 1)
  // The direct AVX-512 paths of cpu:: (where compiled): a stride-2 grid of phase planes, several
  // 7x7 images side by side in one grid, and the 4x4 kernels (one vector per image channel).
  shapes.push_back(conv2d_shape(5, 16, 14, 14, 32, 3, 2, 1));
  shapes.push_back(conv2d_shape(5, 8, 7, 7, 12, 3, 1, 1));
  shapes.push_back(conv2d_shape(9, 64, 4, 4, 64, 3, 1, 1));
  // The 4x4 backward-weight with output channels on the lanes: a block of 32 and one of 16 with
  // 8 channels left over (40), an odd input-channel count, a batch that is not a multiple of its
  // 8-image sums.
  shapes.push_back(conv2d_shape(11, 5, 4, 4, 40, 3, 1, 1));
  // The stride-2 forward with output channels on the lanes: rows of 15 (blocks of 7, 7 and 1) and
  // 40 channels (a partial block of 32); rows of 4 with 67 channels (the 64-channel tile, 3 left
  // over); a 5x5 kernel.
  shapes.push_back(conv2d_shape(3, 5, 29, 30, 40, 3, 2, 1));
  shapes.push_back(conv2d_shape(2, 6, 7, 7, 67, 3, 2, 1));
  shapes.push_back(conv2d_shape(2, 3, 11, 12, 16, 5, 2, 2));
  // The stride-2 backward-data with input channels on the lanes (rows of 14 or more): 40 channels
  // (a partial block of 32) on odd sizes (9 and 8 pixels per column parity: blocks of 7 and the
  // rest), 67 channels (two blocks and 3 left over), a 5x5 kernel (3 and 2 taps per parity), an
  // even 4x4 one.
  shapes.push_back(conv2d_shape(2, 40, 15, 17, 8, 3, 2, 1));
  shapes.push_back(conv2d_shape(1, 67, 14, 15, 5, 3, 2, 1));
  shapes.push_back(conv2d_shape(2, 32, 14, 16, 6, 5, 2, 2));
  shapes.push_back(conv2d_shape(2, 33, 14, 14, 4, 4, 2, 1));
  // ... and with 16 to 31 input channels (one vector per block, rows of 28 or more): 16 channels on
  // rows of 29 (blocks of 14 pixels and the rest), 20 channels (a second block of 4).
  shapes.push_back(conv2d_shape(2, 16, 28, 29, 8, 3, 2, 1));
  shapes.push_back(conv2d_shape(1, 20, 29, 28, 5, 3, 2, 1));
  shapes.push_back(conv2d_shape(3, 16, 28, 28, 16, 3, 1, 1));
  // The grid's wide tile (6 output channels per micro-kernel, 64 outputs or more): forward at
  // stride 1 and 2 and a channel count that leaves a partial last block (67), backward-data with
  // 64 input channels (its forward has 64 outputs).
  shapes.push_back(conv2d_shape(2, 16, 9, 9, 64, 3, 1, 1));
  shapes.push_back(conv2d_shape(2, 5, 9, 8, 67, 3, 1, 1));
  shapes.push_back(conv2d_shape(3, 8, 15, 15, 64, 3, 2, 1));
  shapes.push_back(conv2d_shape(2, 64, 8, 7, 16, 3, 1, 1));
  // direct::channels (backward-weight with 16 input channels per vector): batch 1, stride 2,
  // padding 0, a 5x3 kernel, strides (2, 1), 32 channels (two vectors), odd image sizes.
  shapes.push_back(conv2d_shape(1, 16, 9, 7, 8, 3, 1, 1));
  shapes.push_back(conv2d_shape(3, 32, 11, 15, 16, 3, 2, 1));
  shapes.push_back(conv2d_shape(2, 16, 9, 12, 8, 3, 1, 0));
  shapes.push_back({2, 16, 10, 9, 8, 5, 3, 1, 1, 2, 1});
  shapes.push_back({3, 16, 9, 9, 24, 3, 3, 2, 1, 1, 1});
  // winograd (3x3, stride 1, padding 1, rows of 7 to 30, 16 channels or more): odd sizes (a
  // last tile half outside, rows of 15 reaching the second vector of a padded row), 17 output
  // channels (a partial panel of 4), rows of 30 (15 tiles: the last lane of every permute), 7
  // images of 20 -> 17 channels (blocks of 26 and 23 tile rows: a block ends inside an image).
  // Rows of up to 28 with outputs in multiples of 4 go to winograd_f4 (since 2026-12-04 for rows
  // of 17 to 28), so F(2x2)'s shapes here have 17 outputs or rows of 30; 7 x 20 -> 24 at 14x14 is
  // winograd_f4's.
  shapes.push_back(conv2d_shape(2, 16, 13, 15, 17, 3, 1, 1));
  shapes.push_back(conv2d_shape(1, 16, 5, 30, 16, 3, 1, 1));
  shapes.push_back(conv2d_shape(7, 20, 14, 14, 24, 3, 1, 1));
  shapes.push_back(conv2d_shape(7, 20, 14, 14, 17, 3, 1, 1));
  // Winograd's backward-weight (rows of 16 or fewer): 48 output channels (three vectors of the
  // output channels, 8 input channels per group), 80 (a group of four vectors, 24 input channels
  // in groups of 6, and one of one vector, 16 and a partial group of 8); 17 and 24 outputs above:
  // a padded vector.
  shapes.push_back(conv2d_shape(3, 16, 9, 8, 48, 3, 1, 1));
  shapes.push_back(conv2d_shape(2, 24, 7, 11, 80, 3, 1, 1));
  // winograd_small (4x4 images, 16 channels or more): 13 images of 128 channels (blocks of 12 and
  // 1 image), 18 outputs (a partial panel of 4); backward-data of the same (18 inputs: one block,
  // groups of 6, 6 and 1 image); 5 images of 16 channels. (9, 64, 4, 4, 64) above runs it too.
  // Its backward-weight (channels in multiples of 4): 14 images of 128 channels (blocks of 12 and
  // 2 images), 36 outputs (chunks of 32 and 4 output channels).
  shapes.push_back(conv2d_shape(13, 128, 4, 4, 18, 3, 1, 1));
  shapes.push_back(conv2d_shape(5, 16, 4, 4, 18, 3, 1, 1));
  shapes.push_back(conv2d_shape(14, 128, 4, 4, 36, 3, 1, 1));
  // winograd_f4 (rows of up to 28 pixels, 16 channels or more, outputs in multiples of 4; 16
  // images on the lanes): rows of 28 (7 tiles: a chunk of one unit, products in runs of 4 and 3
  // columns), 21 (6 tiles, the last a quarter inside) and 17 (5 tiles, the last holding one
  // column); 17 images (a second group of one), 33 images of 7x7 (2x2 tiles, the
  // last tile three quarters outside; groups of 16, 16 and 1), 12 outputs (a panel of 8 and 4 of
  // zeros), 40 images of 8x3 (2x1 tiles: chunks of 3 units), 1x1 images, 5x8 (a second tile row
  // of one), 13x15 with 20 outputs (4x4 tiles, the last row and column partial). 9 x 64 -> 64 at
  // 4x4, 7 x 20 -> 24 at 14x14 and the backward-weight shapes above run it too.
  shapes.push_back(conv2d_shape(17, 16, 4, 4, 16, 3, 1, 1));
  shapes.push_back(conv2d_shape(33, 20, 7, 7, 24, 3, 1, 1));
  shapes.push_back(conv2d_shape(3, 16, 6, 6, 12, 3, 1, 1));
  shapes.push_back(conv2d_shape(40, 16, 8, 3, 20, 3, 1, 1));
  shapes.push_back(conv2d_shape(2, 24, 1, 1, 16, 3, 1, 1));
  shapes.push_back(conv2d_shape(3, 16, 5, 8, 32, 3, 1, 1));
  shapes.push_back(conv2d_shape(2, 16, 13, 15, 20, 3, 1, 1));
  shapes.push_back(conv2d_shape(18, 16, 9, 28, 16, 3, 1, 1));
  shapes.push_back(conv2d_shape(3, 24, 11, 21, 20, 3, 1, 1));
  shapes.push_back(conv2d_shape(2, 16, 6, 17, 32, 3, 1, 1));
  // direct::pointwise (1x1 at stride 2, 16k channels, rows of up to 16 outputs): the network's 16
  // -> 32 at 28x28 (13 vectors of pixels: groups of 2 and 3, a tail of 4 lanes); odd sizes (15x13:
  // 8x7 outputs, a tail of 8) with 48 outputs (tiles of 8) and 32 inputs (two vectors in
  // backward-weight); 4x4 outputs (one whole vector) in 7 images (a chunk of the whole batch);
  // rows of 32 (16 outputs, the widest); 48 inputs (vectors in groups of 2 and 1); 2x2 outputs of
  // 67 images (1 image per thread share and chunks of 67).
  shapes.push_back(conv2d_shape(3, 16, 28, 28, 32, 1, 2, 0));
  shapes.push_back(conv2d_shape(5, 32, 15, 13, 48, 1, 2, 0));
  shapes.push_back(conv2d_shape(7, 64, 7, 7, 128, 1, 2, 0));
  shapes.push_back(conv2d_shape(2, 48, 32, 32, 16, 1, 2, 0));
  shapes.push_back(conv2d_shape(67, 16, 3, 4, 16, 1, 2, 0));
  return shapes;
}

// Runs the four cpu:: kernels in T on random data and compares them with ref:: in double.
template <class T>
void compare_with_reference(const Conv2dShape& shape, int threads, double tolerance) {
  CAPTURE(describe(shape));
  CAPTURE(threads);
  const auto x = random_values<double>(size_of(shape.input_size()), 1);
  const auto w = random_values<double>(size_of(shape.weight_size()), 2);
  const auto bias = random_values<double>(size_of(shape.out_channels), 3);
  const auto dy = random_values<double>(size_of(shape.output_size()), 4);
  const std::vector<T> xt(x.begin(), x.end()), wt(w.begin(), w.end()), bt(bias.begin(), bias.end()),
      dyt(dy.begin(), dy.end());

  const StreamHandle serial;
  std::vector<double> y(size_of(shape.output_size())), dx(size_of(shape.input_size())),
      dw(size_of(shape.weight_size()), 0.0), db(size_of(shape.out_channels), 0.0);
  ref::conv2d_forward(serial, shape, x.data(), w.data(), bias.data(), y.data());
  ref::conv2d_backward_data(serial, shape, dy.data(), w.data(), dx.data());
  ref::conv2d_backward_weight(serial, shape, x.data(), dy.data(), dw.data());
  ref::conv2d_backward_bias(serial, shape, dy.data(), db.data());

  HeapWorkspace workspace;
  StreamHandle s;
  s.num_threads = threads;
  s.workspace = &workspace;
  std::vector<T> yt(y.size()), dxt(dx.size()), dwt(dw.size(), T(0)), dbt(db.size(), T(0));
  cpu::conv2d_forward(s, shape, xt.data(), wt.data(), bt.data(), yt.data());
  CHECK(relative_error(yt, y) <= tolerance);
  cpu::conv2d_forward(s, shape, xt.data(), wt.data(), static_cast<const T*>(nullptr), yt.data());
  std::vector<double> y_without_bias(y.size());
  ref::conv2d_forward(serial, shape, x.data(), w.data(), static_cast<const double*>(nullptr),
                      y_without_bias.data());
  CHECK(relative_error(yt, y_without_bias) <= tolerance);
  cpu::conv2d_backward_data(s, shape, dyt.data(), wt.data(), dxt.data());
  CHECK(relative_error(dxt, dx) <= tolerance);
  cpu::conv2d_backward_weight(s, shape, xt.data(), dyt.data(), dwt.data());
  CHECK(relative_error(dwt, dw) <= tolerance);
  cpu::conv2d_backward_bias(s, shape, dyt.data(), dbt.data());
  CHECK(relative_error(dbt, db) <= tolerance);
  // The documented scratch bound holds (HeapWorkspace rounds its capacity up to 64 bytes).
  const std::size_t bound = cpu::conv2d_workspace_bytes(shape, threads) * (sizeof(T) / sizeof(float));
  CHECK(workspace.capacity() <= (bound + 63) / 64 * 64);
}

}  // namespace

TEST_CASE("conv2d: out_h/out_w and sizes follow PyTorch's formula") {
  const Conv2dShape s = conv2d_shape(2, 3, 32, 30, 8, 3, 2, 1);
  CHECK(s.out_h() == 16);
  CHECK(s.out_w() == 15);
  CHECK(s.input_size() == 2 * 3 * 32 * 30);
  CHECK(s.output_size() == 2 * 8 * 16 * 15);
  CHECK(s.weight_size() == 8 * 3 * 3 * 3);
  CHECK(s.flops() == 2 * s.output_size() * 3 * 3 * 3);
  const Conv2dShape t{1, 1, 7, 5, 1, 3, 1, 2, 1, 0, 0};
  CHECK(t.out_h() == 3);
  CHECK(t.out_w() == 5);
}

TEST_CASE("conv2d: ref forward on a hand-computed example") {
  // One 3x3 image, one 2x2 kernel, padding 1, stride 2: outputs read the corners of a 5x5 frame.
  const Conv2dShape s = conv2d_shape(1, 1, 3, 3, 1, 2, 2, 1);
  const std::vector<double> x = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w = {1, 10, 100, 1000}, bias = {0.5};
  std::vector<double> y(4);
  ref::conv2d_forward(StreamHandle{}, s, x.data(), w.data(), bias.data(), y.data());
  // y[0,0] reads x(-1..0, -1..0): only x[0][0] = 1 under w[1][1].
  CHECK(y[0] == doctest::Approx(1000 * 1 + 0.5));
  CHECK(y[1] == doctest::Approx(100 * 2 + 1000 * 3 + 0.5));
  CHECK(y[2] == doctest::Approx(10 * 4 + 1000 * 7 + 0.5));
  CHECK(y[3] == doctest::Approx(1 * 5 + 10 * 6 + 100 * 8 + 1000 * 9 + 0.5));
}

TEST_CASE("conv2d: cpu matches ref (float, 1, 2 and 3 threads)") {
  for (const auto& shape : comparison_shapes())
    for (int threads : {1, 2, 3}) compare_with_reference<float>(shape, threads, 1e-5);
}

TEST_CASE("conv2d: cpu matches ref (double)") {
  for (const auto& shape : comparison_shapes()) compare_with_reference<double>(shape, 2, 1e-12);
}

TEST_CASE("conv2d: cpu matches ref on a ResNet-like layer (64 channels, 3x3, 16x16)") {
  compare_with_reference<float>(conv2d_shape(2, 64, 16, 16, 32, 3, 1, 1), 2, 1e-5);
  compare_with_reference<float>(conv2d_shape(3, 32, 16, 16, 64, 3, 2, 1), 2, 1e-5);
}

// The kernels' sums have a fixed order for a given thread count (docs/decisions.md): running a
// pass twice gives the same bits, on the benchmark network's layer shapes.
TEST_CASE("conv2d: cpu results are bit-identical from run to run") {
  for (const Conv2dShape& shape : {conv2d_shape(5, 16, 28, 28, 16, 3, 1, 1), conv2d_shape(4, 16, 28, 28, 32, 3, 2, 1),
                                   conv2d_shape(6, 32, 14, 14, 32, 3, 1, 1)})
    for (int threads : {1, 2}) {
      CAPTURE(describe(shape));
      CAPTURE(threads);
      const auto x = random_values<float>(size_of(shape.input_size()), 1);
      const auto dy = random_values<float>(size_of(shape.output_size()), 4);
      HeapWorkspace workspace;
      StreamHandle s;
      s.num_threads = threads;
      s.workspace = &workspace;
      std::vector<float> first(size_of(shape.weight_size()), 0.0f), second = first;
      cpu::conv2d_backward_weight(s, shape, x.data(), dy.data(), first.data());
      cpu::conv2d_backward_weight(s, shape, x.data(), dy.data(), second.data());
      CHECK(first == second);
      double norm = 0;
      for (float v : first) norm += double(v) * v;
      CHECK(norm > 0);  // the pass wrote something
    }
}

// Winograd's forward and backward-data (kernels/cpu/conv2d_winograd.cpp) give each thread whole
// blocks of tile rows: the same bits at any thread count, on the benchmark network's shapes and
// odd ones (a thread's first block may start inside an image). The same for 4x4 images
// (conv2d_winograd_small.cpp: each thread an equal share of the 25 images, in blocks of up to 12),
// whose backward-weight gives each thread whole chunks of output channels: its bits too (72
// outputs: chunks of 32, 32 and 8) from 2 threads on (at 1 thread F(4x4)'s weight gradient takes
// the pass: kernels/cpu/conv2d.cpp, f4_weight). F(4x4, 3x3) on rows of up to 28 (conv2d_winograd_f4.cpp, the
// 28x28, 14x14, 4x4 with 64 and 72 channels, and 7x7 shapes here) gives each thread whole tile rows of 16
// images (37 images: 3 groups, the last of 5).
TEST_CASE("conv2d: the Winograd passes give the same bits at 1, 2 and 3 threads") {
  for (const Conv2dShape& shape : {conv2d_shape(5, 16, 28, 28, 16, 3, 1, 1), conv2d_shape(6, 32, 14, 14, 32, 3, 1, 1),
                                   conv2d_shape(7, 20, 13, 15, 17, 3, 1, 1), conv2d_shape(25, 128, 4, 4, 18, 3, 1, 1),
                                   conv2d_shape(25, 64, 4, 4, 72, 3, 1, 1), conv2d_shape(37, 16, 7, 7, 24, 3, 1, 1)}) {
    CAPTURE(describe(shape));
    const auto x = random_values<float>(size_of(shape.input_size()), 1);
    const auto w = random_values<float>(size_of(shape.weight_size()), 2);
    const auto bias = random_values<float>(size_of(shape.out_channels), 3);
    const auto dy = random_values<float>(size_of(shape.output_size()), 4);
    const bool weight_too = shape.in_h == 4 && shape.out_channels % 4 == 0;
    std::vector<float> y1, dx1, dw1;
    for (int threads : {1, 2, 3}) {
      CAPTURE(threads);
      HeapWorkspace workspace;
      StreamHandle s;
      s.num_threads = threads;
      s.workspace = &workspace;
      std::vector<float> y(size_of(shape.output_size())), dx(size_of(shape.input_size())),
          dw(size_of(shape.weight_size()), 0.0f);
      cpu::conv2d_forward(s, shape, x.data(), w.data(), bias.data(), y.data());
      cpu::conv2d_backward_data(s, shape, dy.data(), w.data(), dx.data());
      if (weight_too) cpu::conv2d_backward_weight(s, shape, x.data(), dy.data(), dw.data());
      if (threads == 1) {
        y1 = y;
        dx1 = dx;
      }
      if (threads == 2) dw1 = dw;
      CHECK(y == y1);
      CHECK(dx == dx1);
      if (threads >= 2) CHECK(dw == dw1);
    }
  }
}

// x as a channel slice of a larger tensor (Conv2dShape::in_image_stride): channels [first, first +
// in_channels) of images with `extra` more channels, the others NaN so that reading one of them
// would show. Forward and backward-weight of ref:: and of cpu:: (each algorithm: the comparison
// shapes reach all of them) must give the bits they give on the packed x.
template <class T>
void compare_channel_slice(Conv2dShape shape, int threads) {
  CAPTURE(describe(shape));
  CAPTURE(threads);
  const std::int64_t plane = shape.in_h * shape.in_w, first = 1, extra = 3;
  const std::int64_t image = (shape.in_channels + extra) * plane;
  const auto x = random_values<T>(size_of(shape.input_size()), 1);
  const auto dy = random_values<T>(size_of(shape.output_size()), 4);
  const auto w = random_values<T>(size_of(shape.weight_size()), 2);
  std::vector<T> wide(size_of(shape.batch * image), std::numeric_limits<T>::quiet_NaN());
  for (std::int64_t n = 0; n < shape.batch; ++n)
    std::copy_n(x.begin() + n * shape.in_channels * plane, shape.in_channels * plane,
                wide.begin() + n * image + first * plane);
  Conv2dShape sliced = shape;
  sliced.in_image_stride = image;
  const T* slice = wide.data() + first * plane;

  HeapWorkspace workspace;
  StreamHandle s;
  s.num_threads = threads;
  s.workspace = &workspace;
  AlignedVector<T> y(size_of(shape.output_size())), y_sliced(y.size());
  AlignedVector<T> dw(size_of(shape.weight_size()), T(0)), dw_sliced = dw;
  cpu::conv2d_forward(s, shape, x.data(), w.data(), static_cast<const T*>(nullptr), y.data());
  cpu::conv2d_forward(s, sliced, slice, w.data(), static_cast<const T*>(nullptr), y_sliced.data());
  CHECK(y_sliced == y);
  cpu::conv2d_backward_weight(s, shape, x.data(), dy.data(), dw.data());
  cpu::conv2d_backward_weight(s, sliced, slice, dy.data(), dw_sliced.data());
  CHECK(dw_sliced == dw);

  const StreamHandle serial;
  ref::conv2d_forward(serial, sliced, slice, w.data(), static_cast<const T*>(nullptr), y_sliced.data());
  ref::conv2d_forward(serial, shape, x.data(), w.data(), static_cast<const T*>(nullptr), y.data());
  CHECK(y_sliced == y);
  std::fill(dw.begin(), dw.end(), T(0));
  std::fill(dw_sliced.begin(), dw_sliced.end(), T(0));
  ref::conv2d_backward_weight(serial, sliced, slice, dy.data(), dw_sliced.data());
  ref::conv2d_backward_weight(serial, shape, x.data(), dy.data(), dw.data());
  CHECK(dw_sliced == dw);
}

TEST_CASE("conv2d: a channel slice is read in place, with the bits of the packed input") {
  for (const auto& shape : comparison_shapes())
    for (int threads : {1, 2, 3}) compare_channel_slice<float>(shape, threads);
  for (const auto& shape : comparison_shapes()) compare_channel_slice<double>(shape, 2);
  // The benchmark network's streams: 16 and 32 channels (grid forward, channels backward-weight),
  // a stride-2 transition and its 1x1 projection (im2col), 4x4 images (direct::small).
  for (const Conv2dShape& shape :
       {conv2d_shape(5, 16, 28, 28, 16, 3, 1, 1), conv2d_shape(4, 32, 14, 14, 32, 3, 1, 1),
        conv2d_shape(4, 16, 28, 28, 32, 3, 2, 1), conv2d_shape(4, 16, 28, 28, 32, 1, 2, 0),
        conv2d_shape(7, 128, 4, 4, 128, 3, 1, 1)})
    for (int threads : {1, 2}) compare_channel_slice<float>(shape, threads);
}

TEST_CASE("conv2d: ref backward passes match finite differences") {
  const std::vector<Conv2dShape> shapes = {
      conv2d_shape(2, 2, 5, 4, 3, 3, 2, 1), conv2d_shape(1, 3, 4, 5, 2, 1, 1, 0),
      Conv2dShape{2, 2, 5, 6, 2, 2, 3, 1, 2, 1, 0}};
  for (const auto& shape : shapes) {
    CAPTURE(describe(shape));
    const StreamHandle s;
    auto x = random_values<double>(size_of(shape.input_size()), 11);
    auto w = random_values<double>(size_of(shape.weight_size()), 12);
    auto bias = random_values<double>(size_of(shape.out_channels), 13);
    const auto g = random_values<double>(size_of(shape.output_size()), 14);
    std::vector<double> dx(x.size()), dw(w.size(), 0.0), db(bias.size(), 0.0);
    ref::conv2d_backward_data(s, shape, g.data(), w.data(), dx.data());
    ref::conv2d_backward_weight(s, shape, x.data(), g.data(), dw.data());
    ref::conv2d_backward_bias(s, shape, g.data(), db.data());
    // L = <g, conv(x, w) + bias>; its gradients are the backward passes applied to g.
    petra::testing::check_vjp(
        [&](const auto& in) {
          std::vector<double> y(g.size());
          ref::conv2d_forward(s, shape, in[0].data(), in[1].data(), in[2].data(), y.data());
          return y;
        },
        {x, w, bias}, g, {dx, dw, db}, {"dx", "dw", "db"});
  }
}

// y and dx are assigned (whatever they held is gone); dw and db are accumulated.
template <class Kernels>
void check_assign_accumulate_contract(const Kernels& run) {
  const std::vector<Conv2dShape> shapes = {conv2d_shape(3, 3, 6, 5, 4, 3, 1, 1),
                                           conv2d_shape(3, 3, 6, 5, 4, 3, 2, 1),
                                           conv2d_shape(2, 4, 5, 5, 3, 1, 1, 0)};
  for (const auto& shape : shapes) {
    CAPTURE(describe(shape));
    const auto x = random_values<float>(size_of(shape.input_size()), 21);
    const auto w = random_values<float>(size_of(shape.weight_size()), 22);
    const auto bias = random_values<float>(size_of(shape.out_channels), 23);
    const auto dy = random_values<float>(size_of(shape.output_size()), 24);
    std::vector<float> y_fresh(dy.size()), dx_fresh(x.size()), dw_fresh(w.size(), 0.f),
        db_fresh(bias.size(), 0.f);
    run(shape, x, w, bias, dy, y_fresh, dx_fresh, dw_fresh, db_fresh);

    std::vector<float> y(dy.size(), 7.f), dx(x.size(), -3.f), dw(w.size(), 5.f),
        db(bias.size(), -2.f);
    run(shape, x, w, bias, dy, y, dx, dw, db);
    CHECK(relative_error(y, y_fresh) <= 1e-6);
    CHECK(relative_error(dx, dx_fresh) <= 1e-6);
    for (auto& v : dw_fresh) v += 5.f;
    for (auto& v : db_fresh) v += -2.f;
    CHECK(relative_error(dw, dw_fresh) <= 1e-6);
    CHECK(relative_error(db, db_fresh) <= 1e-6);
  }
}

TEST_CASE("conv2d: forward and backward-data assign, backward-weight and -bias accumulate") {
  SUBCASE("ref") {
    check_assign_accumulate_contract([](const Conv2dShape& shape, const auto& x, const auto& w,
                                        const auto& bias, const auto& dy, auto& y, auto& dx,
                                        auto& dw, auto& db) {
      const StreamHandle s;
      ref::conv2d_forward(s, shape, x.data(), w.data(), bias.data(), y.data());
      ref::conv2d_backward_data(s, shape, dy.data(), w.data(), dx.data());
      ref::conv2d_backward_weight(s, shape, x.data(), dy.data(), dw.data());
      ref::conv2d_backward_bias(s, shape, dy.data(), db.data());
    });
  }
  SUBCASE("cpu") {
    check_assign_accumulate_contract([](const Conv2dShape& shape, const auto& x, const auto& w,
                                        const auto& bias, const auto& dy, auto& y, auto& dx,
                                        auto& dw, auto& db) {
      HeapWorkspace workspace;
      StreamHandle s;
      s.num_threads = 2;
      s.workspace = &workspace;
      cpu::conv2d_forward(s, shape, x.data(), w.data(), bias.data(), y.data());
      cpu::conv2d_backward_data(s, shape, dy.data(), w.data(), dx.data());
      cpu::conv2d_backward_weight(s, shape, x.data(), dy.data(), dw.data());
      cpu::conv2d_backward_bias(s, shape, dy.data(), db.data());
    });
  }
}
