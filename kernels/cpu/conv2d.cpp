// kernels/cpu/conv2d.cpp: the fast CPU 2-d convolution: direct AVX-512 kernels for 3x3-like
// convolutions, im2col lowering + Eigen GEMM for the rest, OpenMP over images.
//
// How a convolution becomes a matrix product (im2col). Number the output pixels of the whole
// batch as columns n = (image, oh, ow), and the taps of the kernel as rows k = (c, i, j), with
// K = in_channels * kernel_h * kernel_w rows. Build the "column matrix" col[k][n] = the input
// value that tap k of output pixel n reads (x[image, c, oh*stride_h - pad_h + i, ow*stride_w -
// pad_w + j], or 0 in the padding). Then every output is a dot product of a weight row with a
// column: y[o][n] = sum_k w[o][k] * col[k][n], that is Y = W * col, with W the weight seen as an
// (out_channels x K) matrix, exactly its PyTorch memory layout. The two backward passes are
// products with the same matrices: dW += dY * col^T, and dcol = W^T * dY, whose entries are then
// added back to the input pixels they came from (col2im). Building col costs memory traffic
// (each input value is copied kernel_h * kernel_w times), but the product then runs at GEMM
// speed. To keep col small and in cache, the columns are processed in tiles of a few hundred
// (whole output rows, or whole images when an image has few pixels so that the GEMM is still
// wide), each thread taking its own range of output rows with single-threaded GEMMs.
//
// Shortcuts: a 1x1, stride-1, unpadded convolution needs no col (the input already is that
// matrix), and backward-data of a stride-1 convolution is itself a forward convolution of dy
// with the flipped, transposed kernel and padding kernel - 1 - pad, which replaces the
// scatter-add of col2im by a gather and gives a GEMM as deep as the forward one. Building col
// is the main cost besides the GEMM, so it has three forms: a block copy per tap for "same"
// stride-1 convs, a table-driven gather for small images, and a row-by-row copy otherwise.
//
// The direct path (float, AVX-512; namespace `direct`, below). For narrow layers (16 to 64
// channels, as in RevNet18 on 28x28 images) the GEMM above is shallow and im2col plus Eigen's
// packing cost about as much as the multiply-adds. The direct kernels skip both: they keep a
// 4 x 6 block of 16-lane accumulators in registers and add, for every tap, 4 broadcast weights
// times 6 vectors of input loaded at the tap's shift. 1.3-1.8x faster than im2col + GEMM on
// those layers; `direct::applies` and `direct::small::applies` say where they are used.
#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/conv2d.hpp"
#include "kernels/cpu/parallel.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#define PETRA_CONV_DIRECT 1
#else
#define PETRA_CONV_DIRECT 0
#endif

namespace petra::kernels::cpu {
namespace {

using std::int64_t;

// GEMM columns (output pixels) per tile. Measured on the ResNet-18 CIFAR layers (Zen 5, 1 and 2
// threads): 256 to 512 are equally fast; 128 and 1024+ lose 5-10%. 256 keeps the col tile of a
// 64-channel 3x3 conv (576 x 256 floats) in L2.
constexpr int64_t kTileColumns = 256;

// Backward-data of a stride-1 conv runs as a forward conv with in_channels outputs: worth it
// unless in_channels is tiny (the network's first layer), where col2im's GEMM is better shaped.
bool backward_data_as_forward(const Conv2dShape& s) {
  return s.stride_h == 1 && s.stride_w == 1 && s.in_channels >= 16;
}

template <class T>
using RowMajorMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using MatrixView = Eigen::Map<RowMajorMatrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using ConstMatrixView = Eigen::Map<const RowMajorMatrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

// A matrix in memory: row r starts at data + r * stride.
template <class T>
struct Panel {
  T* data;
  int64_t stride;
};

template <class T>
MatrixView<T> view(Panel<T> p, int64_t rows, int64_t cols) {
  return MatrixView<T>(p.data, rows, cols, Eigen::OuterStride<>(p.stride));
}
template <class T>
ConstMatrixView<T> view(Panel<const T> p, int64_t rows, int64_t cols) {
  return ConstMatrixView<T>(p.data, rows, cols, Eigen::OuterStride<>(p.stride));
}

constexpr int64_t round_up(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

// The im2col geometry of one convolution, and how its output rows are cut into tiles.
struct Lowering {
  Conv2dShape shape;
  int64_t out_h, out_w;
  int64_t pixels;      // out_h * out_w: columns per image
  int64_t taps;        // K = in_channels * kernel_h * kernel_w: rows of col
  int64_t total_rows;  // output rows of the batch; global row r = image * out_h + oh
  int64_t tile_rows;   // output rows per tile (whole images when an image is small)
  bool input_is_col;   // 1x1, stride 1, no padding: x itself is the column matrix
  bool same_size;      // stride 1 and out_w == in_w: a tap's col row is a shifted copy of x
  // For small images (a tile holds several): tap_sources[(i * kernel_w + j) * pixels + p] is
  // the offset in an input channel that tap (i, j) of output pixel p reads, or -1 (padding).
  std::vector<std::int32_t> tap_sources;

  explicit Lowering(const Conv2dShape& s)
      : shape(s),
        out_h(s.out_h()),
        out_w(s.out_w()),
        pixels(out_h * out_w),
        taps(s.in_channels * s.kernel_h * s.kernel_w),
        total_rows(s.batch * out_h),
        input_is_col(s.kernel_h == 1 && s.kernel_w == 1 && s.stride_h == 1 && s.stride_w == 1 &&
                     s.pad_h == 0 && s.pad_w == 0),
        same_size(s.stride_h == 1 && s.stride_w == 1 && out_w == s.in_w) {
    // Without a col buffer to keep small, a tile can be a whole image.
    const int64_t target = input_is_col ? std::max(kTileColumns, pixels) : kTileColumns;
    if (pixels <= 0) {
      tile_rows = 1;  // an empty output: no tiles
    } else if (pixels >= target) {
      tile_rows = std::max<int64_t>(1, target / out_w);
    } else {
      tile_rows = std::max<int64_t>(1, target / pixels) * out_h;
      if (!input_is_col && s.in_h * s.in_w <= INT32_MAX) tap_sources = make_tap_sources();
    }
  }
  int64_t max_tile_columns() const { return std::min(tile_rows, total_rows) * out_w; }

 private:
  std::vector<std::int32_t> make_tap_sources() const {
    std::vector<std::int32_t> sources;
    sources.reserve(static_cast<std::size_t>(shape.kernel_h * shape.kernel_w * pixels));
    for (int64_t i = 0; i < shape.kernel_h; ++i)
      for (int64_t j = 0; j < shape.kernel_w; ++j)
        for (int64_t oh = 0; oh < out_h; ++oh)
          for (int64_t ow = 0; ow < out_w; ++ow) {
            const int64_t ih = oh * shape.stride_h - shape.pad_h + i;
            const int64_t iw = ow * shape.stride_w - shape.pad_w + j;
            const bool inside = ih >= 0 && ih < shape.in_h && iw >= 0 && iw < shape.in_w;
            sources.push_back(inside ? static_cast<std::int32_t>(ih * shape.in_w + iw) : -1);
          }
    return sources;
  }
};

// A tile: the output rows [row0, row1) of the batch; its columns are their pixels.
struct Tile {
  int64_t row0, row1;
};

// Calls fn(tile) for consecutive tiles covering rows [begin, end). A tile that fits in one
// image never crosses into the next one, so that it can be read and written in place.
template <class Fn>
void for_each_tile(const Lowering& low, int64_t begin, int64_t end, Fn&& fn) {
  for (int64_t r = begin; r < end;) {
    int64_t r1 = std::min(end, r + low.tile_rows);
    if (low.tile_rows <= low.out_h) r1 = std::min(r1, (r / low.out_h + 1) * low.out_h);
    fn(Tile{r, r1});
    r = r1;
  }
}

// The part of a tile that lies in one image: `count` pixels from `pixel0` of image `image`,
// which are the tile's columns from `column0`.
struct ImagePiece {
  int64_t image, pixel0, column0, count;
};

template <class Fn>
void for_each_image_piece(const Lowering& low, Tile tile, Fn&& fn) {
  for (int64_t r = tile.row0; r < tile.row1;) {
    const int64_t image = r / low.out_h;
    const int64_t r1 = std::min(tile.row1, (image + 1) * low.out_h);
    fn(ImagePiece{image, (r - image * low.out_h) * low.out_w, (r - tile.row0) * low.out_w,
                  (r1 - r) * low.out_w});
    r = r1;
  }
}

bool in_one_image(const Lowering& low, Tile tile) {
  return tile.row0 / low.out_h == (tile.row1 - 1) / low.out_h;
}

// The tile's columns of an NCHW tensor with `channels` channels and low.pixels pixels per
// channel, seen in place (valid only for a tile inside one image).
template <class T>
Panel<T> columns_in_place(const Lowering& low, T* tensor, int64_t channels, Tile tile) {
  const int64_t image = tile.row0 / low.out_h;
  const int64_t pixel0 = (tile.row0 - image * low.out_h) * low.out_w;
  return {tensor + image * channels * low.pixels + pixel0, low.pixels};
}

// tile_matrix[ch][column] = tensor[image, ch, pixel] over the tile (an NCHW tensor of the
// output's geometry), and the reverse.
template <class T>
void gather_columns(const Lowering& low, const T* tensor, int64_t channels, Tile tile, T* out,
                    int64_t out_stride) {
  for_each_image_piece(low, tile, [&](const ImagePiece& p) {
    for (int64_t ch = 0; ch < channels; ++ch) {
      const T* src = tensor + (p.image * channels + ch) * low.pixels + p.pixel0;
      std::copy(src, src + p.count, out + ch * out_stride + p.column0);
    }
  });
}
template <class T>
void scatter_columns(const Lowering& low, const T* in, int64_t in_stride, int64_t channels,
                     Tile tile, T* tensor) {
  for_each_image_piece(low, tile, [&](const ImagePiece& p) {
    for (int64_t ch = 0; ch < channels; ++ch) {
      const T* src = in + ch * in_stride + p.column0;
      std::copy(src, src + p.count, tensor + (p.image * channels + ch) * low.pixels + p.pixel0);
    }
  });
}

// For kernel column j: the output columns ow in [first, last) read an input column inside the
// image, iw = ow * stride_w + offset with offset = j - pad_w; the others read padding.
struct ValidColumns {
  int64_t first, last, offset;
};
ValidColumns valid_columns(const Lowering& low, int64_t j) {
  const auto& s = low.shape;
  const int64_t offset = j - s.pad_w;
  int64_t first = offset >= 0 ? 0 : (-offset + s.stride_w - 1) / s.stride_w;
  int64_t last = s.in_w - 1 - offset < 0 ? 0 : (s.in_w - 1 - offset) / s.stride_w + 1;
  first = std::min(first, low.out_w);
  last = std::clamp(last, first, low.out_w);
  return {first, last, offset};
}

// Calls fn(k, row, valid, column) for every tap k = (c, i, j) and every output row of the tile:
// `row` is the input row (image, c, ih) that this tap reads for that output row, or nullptr when
// ih falls into the padding; `valid` says which output columns read inside it; the output row's
// pixels are the tile's columns from `column`. The loop nest shared by im2col and col2im.
template <class T, class Fn>
void for_each_tap_row(const Lowering& low, T* x, Tile tile, Fn&& fn) {
  const auto& s = low.shape;
  for (int64_t c = 0; c < s.in_channels; ++c)
    for (int64_t i = 0; i < s.kernel_h; ++i)
      for (int64_t j = 0; j < s.kernel_w; ++j) {
        const int64_t k = (c * s.kernel_h + i) * s.kernel_w + j;
        const ValidColumns valid = valid_columns(low, j);
        int64_t image = tile.row0 / low.out_h, oh = tile.row0 % low.out_h;
        for (int64_t column = 0; column < (tile.row1 - tile.row0) * low.out_w; column += low.out_w) {
          const int64_t ih = oh * s.stride_h - s.pad_h + i;
          T* row = nullptr;
          if (ih >= 0 && ih < s.in_h) row = x + ((image * s.in_channels + c) * s.in_h + ih) * s.in_w;
          fn(k, row, valid, column);
          if (++oh == low.out_h) oh = 0, ++image;
        }
      }
}

// im2col of a stride-1 conv whose output rows are as wide as the input rows ("same" padding in
// width). Then, over the rows of one image, the col row of tap (c, i, j) is x's channel c
// shifted by (i - pad_h) rows and (j - pad_w) columns: one block copy, after which the pixels
// that wrapped around a row edge, and the rows above or below the image, are set to zero.
// (The general path below copies row by row, which costs more than the copy for small rows.)
template <class T>
void fill_columns_shifted(const Lowering& low, const T* x, Tile tile, T* col, int64_t n) {
  const auto& s = low.shape;
  const int64_t width = low.out_w, plane = s.in_h * s.in_w;
  for_each_image_piece(low, tile, [&](const ImagePiece& p) {
    const int64_t oh0 = p.pixel0 / width, oh1 = oh0 + p.count / width;
    for (int64_t c = 0; c < s.in_channels; ++c) {
      const T* channel = x + (p.image * s.in_channels + c) * plane;
      for (int64_t i = 0; i < s.kernel_h; ++i) {
        // output rows [inside0, inside1) read input rows inside the image
        const int64_t inside0 = std::clamp(s.pad_h - i, oh0, oh1);
        const int64_t inside1 = std::clamp(s.in_h + s.pad_h - i, inside0, oh1);
        for (int64_t j = 0; j < s.kernel_w; ++j) {
          const ValidColumns valid = valid_columns(low, j);
          // out[(oh - oh0) * width + ow] is this tap's value for output pixel (oh, ow)
          T* out = col + ((c * s.kernel_h + i) * s.kernel_w + j) * n + p.column0;
          const int64_t copy1 = valid.first < valid.last ? inside1 : inside0;  // else all padding
          std::fill(out, out + (inside0 - oh0) * width, T(0));
          std::fill(out + (copy1 - oh0) * width, out + (oh1 - oh0) * width, T(0));
          if (inside0 == copy1) continue;
          // Output pixels [begin, end) (counted from row oh0) read x's pixel at the same index
          // plus `shift`, which is inside the channel for every pixel that is not zeroed below.
          const int64_t begin = (inside0 - oh0) * width + valid.first;
          const int64_t end = (copy1 - 1 - oh0) * width + valid.last;
          const int64_t shift = (oh0 + i - s.pad_h) * width + valid.offset;
          std::copy(channel + (begin + shift), channel + (end + shift), out + begin);
          for (int64_t r = inside0 - oh0; r < copy1 - oh0; ++r) {
            for (int64_t ow = 0; ow < valid.first; ++ow) out[r * width + ow] = T(0);
            for (int64_t ow = valid.last; ow < width; ++ow) out[r * width + ow] = T(0);
          }
        }
      }
    }
  });
}

// im2col for small images, through the table of the pixel each tap reads: a gather per tap and
// image, with no per-row bookkeeping (which would cost more than the copy for 4x4 images).
template <class T>
void fill_columns_gathered(const Lowering& low, const T* x, Tile tile, T* col, int64_t n) {
  const auto& s = low.shape;
  const int64_t kernel_taps = s.kernel_h * s.kernel_w, plane = s.in_h * s.in_w;
  for_each_image_piece(low, tile, [&](const ImagePiece& p) {
    for (int64_t c = 0; c < s.in_channels; ++c) {
      const T* channel = x + (p.image * s.in_channels + c) * plane;
      for (int64_t tap = 0; tap < kernel_taps; ++tap) {
        const std::int32_t* source = low.tap_sources.data() + tap * low.pixels + p.pixel0;
        T* out = col + (c * kernel_taps + tap) * n + p.column0;
        // Two passes so that the first vectorises as a gather: read every pixel (pixel 0 for
        // padding), then zero the padding.
        for (int64_t d = 0; d < p.count; ++d) out[d] = channel[std::max(source[d], std::int32_t{0})];
        for (int64_t d = 0; d < p.count; ++d)
          if (source[d] < 0) out[d] = T(0);
      }
    }
  });
}

// im2col: col[k][column] for the tile's columns, col being taps x columns with row stride n.
template <class T>
void fill_columns(const Lowering& low, const T* x, Tile tile, T* col, int64_t n) {
  if (!low.tap_sources.empty()) {
    fill_columns_gathered(low, x, tile, col, n);
    return;
  }
  if (low.same_size) {
    fill_columns_shifted(low, x, tile, col, n);
    return;
  }
  const int64_t stride = low.shape.stride_w, out_w = low.out_w;
  for_each_tap_row(low, x, tile, [&](int64_t k, const T* row, const ValidColumns& valid, int64_t column) {
    T* out = col + k * n + column;
    if (row == nullptr) {
      std::fill(out, out + out_w, T(0));
      return;
    }
    std::fill(out, out + valid.first, T(0));
    std::fill(out + valid.last, out + out_w, T(0));
    const int64_t count = valid.last - valid.first;
    if (count == 0) return;
    const T* src = row + valid.first * stride + valid.offset;  // read by output column first
    if (stride == 1) {
      std::copy(src, src + count, out + valid.first);
    } else if (stride == 2) {  // the downsampling convs: a compile-time stride vectorises
      for (int64_t m = 0; m < count; ++m) out[valid.first + m] = src[2 * m];
    } else {
      for (int64_t m = 0; m < count; ++m) out[valid.first + m] = src[m * stride];
    }
  });
}

// col2im: adds col[k][column] into the input pixel it was read from (padding reads are dropped).
template <class T>
void add_columns(const Lowering& low, const T* col, int64_t n, Tile tile, T* dx) {
  const int64_t stride = low.shape.stride_w;
  for_each_tap_row(low, dx, tile, [&](int64_t k, T* row, const ValidColumns& valid, int64_t column) {
    const int64_t count = valid.last - valid.first;
    if (row == nullptr || count == 0) return;
    const T* in = col + k * n + column + valid.first;
    T* dst = row + valid.first * stride + valid.offset;
    if (stride == 2) {  // the downsampling convs: a compile-time stride vectorises
      for (int64_t m = 0; m < count; ++m) dst[2 * m] += in[m];
    } else {
      for (int64_t m = 0; m < count; ++m) dst[m * stride] += in[m];
    }
  });
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

// The shape whose forward pass is backward-data of a stride-1 convolution: dy is its input, dx
// its output, and its weight is w flipped in both spatial dimensions with in/out swapped.
Conv2dShape transposed_stride1(const Conv2dShape& s) {
  return {s.batch, s.out_channels, s.out_h(), s.out_w(), s.in_channels, s.kernel_h, s.kernel_w,
          1, 1, s.kernel_h - 1 - s.pad_h, s.kernel_w - 1 - s.pad_w};
}

#if PETRA_CONV_DIRECT
// ---- Direct convolution for AVX-512 (float), without im2col ----
//
// The input of a few images is copied once into zero-padded planes laid out as a "grid" (see
// Grid): grid position q holds output pixel (oh, ow) of one image at q = oh * width + image *
// span + ow, and tap (i, j) of every grid position reads the padded plane at q plus a constant
// shift. So 16 consecutive grid positions are one vector load per tap, and the convolution is a
// sum over the K = in_channels * kernel_h * kernel_w taps of shifted input vectors times
// broadcast weights (forward_block). Grid columns ow >= out_w are not output pixels (they read
// across a row edge): they are computed and dropped when storing, a compress + masked store per
// run of pixels. Backward-data of a stride-1 convolution is the forward pass of
// transposed_stride1(s). Backward-weight is the same walk with the roles swapped: dw[o, k] is the
// dot product over grid positions of dy (expanded onto the grid, zero where no pixel) with the
// input at tap k's shift; the 16-lane partial sums stay in registers over a batch of grids, then
// are reduced and added to double sums, which keeps the sum over batch * pixels accurate.
// Images of exactly 16 pixels (4x4) have their own kernels (namespace small): one vector per
// channel, no grid at all.
namespace direct {

constexpr int64_t kLanes = 16;
constexpr int kChannelBlock = 4;  // output channels per micro-kernel (rows of broadcast weights)
constexpr int kVectorBlock = 6;   // grid vectors per forward micro-kernel (4 x 6 accumulators)
constexpr int kTapBlock = 6;      // taps per backward-weight micro-kernel (4 x 6 accumulators)

// The grid: `images` images side by side, each in `span` columns; grid position q = oh * width
// + image * span + ow is output pixel (oh, ow) of that image, or no pixel when ow >= out_w. A
// stride-s convolution reads the padded input in s_h x s_w phases: phase (a, b) holds the
// padded pixels (r * s_h + a, t * s_w + b) at (r, image * span + t), so that tap (i, j) of every
// grid position reads phase (i % s_h, j % s_w) at the constant shift (i / s_h) * width + j / s_w.
struct Grid {
  int64_t images;   // images per grid
  int64_t span;     // grid columns per image
  int64_t width;    // images * span
  int64_t rows;     // rows of a phase plane
  int64_t cells;    // out_h * width
  int64_t vectors;  // ceil(cells / 16)
  int64_t plane;    // floats per phase plane (all reads of all vectors stay inside)
  int64_t channel;  // floats per channel: stride_h * stride_w planes
  int64_t pixels;   // out_h * out_w: pixels of one output channel of one image
  std::vector<int64_t> tap_offsets;  // per tap k = (c, i, j): its shift
  // The lanes of vector v that are output pixels of one image form a run of consecutive pixels:
  // runs [first_run[v], first_run[v + 1]) of `runs`.
  struct Run {
    std::uint16_t mask;  // its lanes
    std::int32_t image;  // in the grid
    std::int32_t pixel;  // oh * out_w + ow of its first lane
  };
  std::vector<Run> runs;
  std::vector<std::int32_t> first_run;
  // Stride 1: the same for the input side, vector u of a padded plane: runs [first_input_run[u],
  // first_input_run[u + 1]) of `input_runs`, whose `pixel` is ih * in_w + iw of the first lane.
  std::vector<Run> input_runs;
  std::vector<std::int32_t> first_input_run;

  Grid(const Conv2dShape& s, int64_t images_per_grid)
      : images(images_per_grid), pixels(s.out_h() * s.out_w()) {
    const int64_t out_h = s.out_h(), out_w = s.out_w(), sh = s.stride_h, sw = s.stride_w;
    span = columns_per_image(s);
    width = images * span;
    rows = (s.in_h + 2 * s.pad_h + sh - 1) / sh;
    cells = out_h * width;
    vectors = (cells + kLanes - 1) / kLanes;
    const int64_t last_read =
        vectors * kLanes - 1 + (s.kernel_h - 1) / sh * width + (s.kernel_w - 1) / sw;
    plane = round_up(std::max(rows * width, last_read + 1), kLanes);
    channel = sh * sw * plane;
    for (int64_t c = 0; c < s.in_channels; ++c)
      for (int64_t i = 0; i < s.kernel_h; ++i)
        for (int64_t j = 0; j < s.kernel_w; ++j)
          tap_offsets.push_back(c * channel + (i % sh * sw + j % sw) * plane + i / sh * width +
                                j / sw);
    for (int64_t v = 0; v < vectors; ++v) {
      first_run.push_back(static_cast<std::int32_t>(runs.size()));
      for (int64_t image = 0; image < images; ++image) {
        Run run{0, static_cast<std::int32_t>(image), -1};
        for (int64_t lane = 0; lane < kLanes; ++lane) {
          const int64_t q = v * kLanes + lane, oh = q / width, ow = q % width - image * span;
          if (q >= cells || ow < 0 || ow >= out_w) continue;
          run.mask = static_cast<std::uint16_t>(run.mask | (1u << lane));
          if (run.pixel < 0) run.pixel = static_cast<std::int32_t>(oh * out_w + ow);
        }
        if (run.mask != 0) runs.push_back(run);
      }
    }
    first_run.push_back(static_cast<std::int32_t>(runs.size()));
    if (sh == 1 && sw == 1) find_input_runs(s);
  }
  int64_t taps() const { return static_cast<int64_t>(tap_offsets.size()); }

  // Plane position p = r * width + image * span + t holds input pixel (r - pad_h, t - pad_w).
  void find_input_runs(const Conv2dShape& s) {
    for (int64_t u = 0; u < plane / kLanes; ++u) {
      first_input_run.push_back(static_cast<std::int32_t>(input_runs.size()));
      for (int64_t image = 0; image < images; ++image) {
        Run run{0, static_cast<std::int32_t>(image), -1};
        for (int64_t lane = 0; lane < kLanes; ++lane) {
          const int64_t p = u * kLanes + lane, ih = p / width - s.pad_h,
                        iw = p % width - image * span - s.pad_w;
          if (p >= rows * width || ih < 0 || ih >= s.in_h || iw < 0 || iw >= s.in_w) continue;
          run.mask = static_cast<std::uint16_t>(run.mask | (1u << lane));
          if (run.pixel < 0) run.pixel = static_cast<std::int32_t>(ih * s.in_w + iw);
        }
        if (run.mask != 0) input_runs.push_back(run);
      }
    }
    first_input_run.push_back(static_cast<std::int32_t>(input_runs.size()));
  }

  // Stride 1 with pad_w < kernel_w: an image needs in_w + pad_w columns, its right padding being
  // the left padding of the next image (or of the next row, after wrapping around).
  static int64_t columns_per_image(const Conv2dShape& s) {
    const bool wrap = s.stride_h == 1 && s.stride_w == 1 && s.pad_w < s.kernel_w;
    return wrap ? s.in_w + s.pad_w : (s.in_w + 2 * s.pad_w + s.stride_w - 1) / s.stride_w;
  }
  // Images per grid: 1, 2, 4, 8 or 16, the fewest that leave little of the last vector unused.
  static int64_t images_for(const Conv2dShape& s) {
    const int64_t span = columns_per_image(s), pixels = s.out_h() * s.out_w();
    const double best = double(s.out_w()) / double(span);  // the fraction with no rounding up
    auto used = [&](int64_t images) {  // the fraction of the grid's lanes that are pixels
      const int64_t vectors = (s.out_h() * images * span + kLanes - 1) / kLanes;
      return double(images * pixels) / double(vectors * kLanes);
    };
    int64_t images = 1;
    while (images < 16 && 2 * images <= s.batch && used(images) < 0.97 * best) images *= 2;
    return images;
  }
};

// Where the grid kernels beat im2col + GEMM. Measured on Zen 5 (1 thread, the 3x3 layers of
// RevNet18 on 28x28 images, batch 64), all three passes: 1.6-1.8x faster with 28x28 and 14x14
// outputs (16 and 32 channels), 1.3x on stride-2 28x28 -> 14x14; with 7x7 outputs 1.3x (forward)
// and 1.1x (backward-weight) at stride 1, even at stride 2 (forward) and slower for its
// backward-weight, whose 16-lane sums are reduced after too few vectors. Below 7 columns the grid
// is too much padding (4x4: one lane in five), and 1x1 convolutions have no col to build anyway.
// Backward-weight keeps double sums of the whole weight per thread, written all over for every
// batch of grids: beyond about 40K weights (the 64-channel 3x3 convs: 37K) they no longer stay in
// L2 and the GEMM wins (bench-kernels, ResNet-18 layers of 128 and 256 channels: up to 2x).
enum class Pass { forward, weight };
bool applies(const Conv2dShape& s, Pass pass) {
  const bool stride1 = s.stride_h == 1 && s.stride_w == 1;
  const int64_t min_width = pass == Pass::weight && !stride1 ? 8 : 7;
  return s.stride_h <= 2 && s.stride_w <= 2 && s.pad_h >= 0 && s.pad_w >= 0 && s.out_h() > 0 &&
         s.out_w() >= min_width && s.kernel_h * s.kernel_w > 1 &&
         (pass == Pass::weight ? s.weight_size() <= 40000
                               : s.out_channels >= kChannelBlock);  // else mostly padding rows
}

// to[0, n) = from[0, n) and to[0, n) = 0, inline: the rows are short, and a call to memmove or
// memset costs more than them.
inline void copy_row(const float* from, int64_t n, float* to) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) _mm512_storeu_ps(to + i, _mm512_loadu_ps(from + i));
  if (i < n) {
    const auto tail = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(to + i, tail, _mm512_maskz_loadu_ps(tail, from + i));
  }
}
inline void zero_row(int64_t n, float* to) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) _mm512_storeu_ps(to + i, _mm512_setzero_ps());
  if (i < n)
    _mm512_mask_storeu_ps(to + i, static_cast<__mmask16>((1u << (n - i)) - 1), _mm512_setzero_ps());
}

// The output pixels among the 16 lanes of `values` selected by `mask` go to consecutive floats.
inline void store_pixels(float* to, std::uint16_t mask, __m512 values) {
  if (mask == 0xFFFF) {
    _mm512_storeu_ps(to, values);
  } else {
    const auto count = static_cast<unsigned>(__builtin_popcount(mask));
    _mm512_mask_storeu_ps(to, static_cast<__mmask16>((1u << count) - 1),
                          _mm512_maskz_compress_ps(mask, values));
  }
}
// The reverse: the lanes of `mask` of `into` from consecutive floats, the others unchanged.
inline __m512 load_pixels(__m512 into, const float* from, std::uint16_t mask) {
  if (mask == 0xFFFF) return _mm512_loadu_ps(from);
  const auto count = static_cast<unsigned>(__builtin_popcount(mask));
  return _mm512_mask_expand_ps(
      into, mask, _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << count) - 1), from));
}

// Writes the phase planes of `count` images of `channels` channels each, from `x` (NCHW, an image
// every `image_size` floats); the grid's other images read zeros. Every float is written.
void pad_images(const Conv2dShape& s, const Grid& g, const float* x, int64_t count, float* padded) {
  const int64_t image_size = s.in_channels * s.in_h * s.in_w;
  if (!g.first_input_run.empty()) {  // stride 1: whole aligned vectors, from the table
    for (int64_t c = 0; c < s.in_channels; ++c) {
      const float* channel = x + c * s.in_h * s.in_w;
      for (int64_t u = 0; u < g.plane / kLanes; ++u) {
        __m512 v = _mm512_setzero_ps();
        for (int32_t r = g.first_input_run[u]; r < g.first_input_run[u + 1]; ++r) {
          const Grid::Run& run = g.input_runs[r];
          if (run.image < count)
            v = load_pixels(v, channel + run.image * image_size + run.pixel, run.mask);
        }
        _mm512_store_ps(padded + c * g.channel + u * kLanes, v);
      }
    }
    return;
  }
  for (int64_t c = 0; c < s.in_channels; ++c)
    for (int64_t a = 0; a < s.stride_h; ++a)
      for (int64_t b = 0; b < s.stride_w; ++b) {
        float* plane = padded + c * g.channel + (a * s.stride_w + b) * g.plane;
        // columns t in [first, last) of an image read its input column t * stride_w + b - pad_w
        const int64_t first =
            std::min(g.span, (std::max<int64_t>(0, s.pad_w - b) + s.stride_w - 1) / s.stride_w);
        const int64_t last =
            std::clamp((s.in_w + s.pad_w - b + s.stride_w - 1) / s.stride_w, first, g.span);
        for (int64_t r = 0; r < g.rows; ++r) {
          const int64_t ih = r * s.stride_h + a - s.pad_h;
          float* row = plane + r * g.width;
          if (ih < 0 || ih >= s.in_h) {
            zero_row(g.width, row);
            continue;
          }
          for (int64_t image = 0; image < g.images; ++image) {
            float* to = row + image * g.span;
            if (image >= count) {
              zero_row(g.span, to);
              continue;
            }
            zero_row(first, to);
            zero_row(g.span - last, to + last);
            if (first == last) continue;
            const float* from = x + image * image_size + (c * s.in_h + ih) * s.in_w +
                                first * s.stride_w + b - s.pad_w;
            if (s.stride_w == 1) {
              copy_row(from, last - first, to + first);
            } else if (s.stride_w == 2) {  // a compile-time stride vectorises
              for (int64_t t = 0; t < last - first; ++t) to[first + t] = from[2 * t];
            } else {
              for (int64_t t = 0; t < last - first; ++t) to[first + t] = from[t * s.stride_w];
            }
          }
        }
        zero_row(g.plane - g.rows * g.width, plane + g.rows * g.width);
      }
}

// Lane i of the result = the sum of the 16 lanes of v[i] (a transposing tree: 45 instructions for
// 16 sums, where one horizontal sum at a time takes 8 each). (The zero-masking forms with every
// lane set are the plain instructions; GCC 12 warns about the undefined source of the others.)
inline __m512 sum_lanes_16(const __m512 (&v)[16]) {
  constexpr __mmask16 all = 0xFFFF;
  __m512 pairs[8], quads[4], halves[2];
  // pairs[i], per 128-bit block: (a0 + a2, b0 + b2, a1 + a3, b1 + b3) of a = v[2i], b = v[2i + 1]
  for (int i = 0; i < 8; ++i)
    pairs[i] = _mm512_add_ps(_mm512_maskz_unpacklo_ps(all, v[2 * i], v[2 * i + 1]),
                             _mm512_maskz_unpackhi_ps(all, v[2 * i], v[2 * i + 1]));
  // quads[i], per 128-bit block: a partial sum of each of v[4i .. 4i + 3]
  for (int i = 0; i < 4; ++i)
    quads[i] = _mm512_add_ps(_mm512_maskz_shuffle_ps(all, pairs[2 * i], pairs[2 * i + 1], 0x44),
                             _mm512_maskz_shuffle_ps(all, pairs[2 * i], pairs[2 * i + 1], 0xEE));
  // halves[i]: blocks 0 + 2 and 1 + 3 of quads[2i], then the same of quads[2i + 1]
  for (int i = 0; i < 2; ++i)
    halves[i] =
        _mm512_add_ps(_mm512_maskz_shuffle_f32x4(all, quads[2 * i], quads[2 * i + 1], 0x44),
                      _mm512_maskz_shuffle_f32x4(all, quads[2 * i], quads[2 * i + 1], 0xEE));
  return _mm512_add_ps(_mm512_maskz_shuffle_f32x4(all, halves[0], halves[1], 0x88),
                       _mm512_maskz_shuffle_f32x4(all, halves[0], halves[1], 0xDD));
}

// sums[b * stride + t] += the sum of the lanes of acc[b][t], for b < rows.
// (acc is read once, with constant indices: any other access would keep the accumulators of the
// caller's loop in memory instead of registers.)
template <int Count, class Sum>
void add_lane_sums(const __m512 (&acc)[kChannelBlock][Count], int64_t rows, Sum* sums,
                   int64_t stride) {
  constexpr int n = kChannelBlock * Count;
  __m512 flat[round_up(n, 16)];
  for (int b = 0; b < kChannelBlock; ++b)
    for (int t = 0; t < Count; ++t) flat[b * Count + t] = acc[b][t];
  for (int i = n; i < round_up(n, 16); ++i) flat[i] = _mm512_setzero_ps();
  for (int first = 0; first < n; first += 16) {
    __m512 group[16];
    for (int i = 0; i < 16; ++i) group[i] = flat[first + i];
    alignas(64) float total[16];
    _mm512_store_ps(total, sum_lanes_16(group));
    for (int i = 0; i < 16 && first + i < n; ++i)
      if ((first + i) / Count < rows)
        sums[(first + i) / Count * stride + (first + i) % Count] += Sum(total[i]);
  }
}

// dw[e] += the sum over threads of sums_of(thread)[e], in thread order.
template <class SumsOf>
void add_thread_sums(const StreamHandle& st, int64_t size, int used_threads, SumsOf&& sums_of,
                     float* dw) {
  run_threads(st, [&](int t, int threads) {
    for (int64_t e = share(size, t, threads); e < share(size, t + 1, threads); ++e) {
      double sum = 0;
      for (int u = 0; u < used_threads; ++u) sum += sums_of(u)[e];
      dw[e] = static_cast<float>(dw[e] + sum);
    }
  });
}

// acc[b][v] += sum_k panel[k][b] * grid[tap_offsets[k] + 16 v .. + 15].
template <int Vectors>
inline void accumulate_outputs(const float* grid, const int64_t* tap_offsets, int64_t taps,
                               const float* panel, __m512 (&acc)[kChannelBlock][Vectors]) {
  for (int64_t k = 0; k < taps; ++k) {
    const float* x = grid + tap_offsets[k];
    const float* w = panel + k * kChannelBlock;
    __m512 wb[kChannelBlock];
    for (int b = 0; b < kChannelBlock; ++b) wb[b] = _mm512_set1_ps(w[b]);
    for (int v = 0; v < Vectors; ++v) {
      const __m512 xv = _mm512_loadu_ps(x + v * kLanes);
      for (int b = 0; b < kChannelBlock; ++b) acc[b][v] = _mm512_fmadd_ps(wb[b], xv, acc[b][v]);
    }
  }
}

// Where one grid's forward pass reads and writes.
struct ForwardTask {
  const Conv2dShape& s;
  const Grid& g;
  const float* padded;  // the grid's phase planes
  const float* panels;  // the weight packed by pack_weight
  const float* bias;    // or nullptr
  float* y;             // the grid's first image
  int64_t count;        // images of the grid that exist
};

// Output channels [o0, o0 + 4) of grid vectors [v0, v0 + Vectors).
template <int Vectors>
void forward_block(const ForwardTask& task, int64_t o0, int64_t v0) {
  const Conv2dShape& s = task.s;
  const Grid& g = task.g;
  __m512 acc[kChannelBlock][Vectors];
  for (int b = 0; b < kChannelBlock; ++b) {
    const float start = task.bias != nullptr && o0 + b < s.out_channels ? task.bias[o0 + b] : 0.0f;
    for (int v = 0; v < Vectors; ++v) acc[b][v] = _mm512_set1_ps(start);
  }
  accumulate_outputs<Vectors>(task.padded + v0 * kLanes, g.tap_offsets.data(), g.taps(),
                              task.panels + o0 * g.taps(), acc);
  const int64_t out_image = s.out_channels * g.pixels;
  for (int v = 0; v < Vectors; ++v)
    for (int32_t r = g.first_run[v0 + v]; r < g.first_run[v0 + v + 1]; ++r) {
      const Grid::Run& run = g.runs[r];
      if (run.image >= task.count) continue;
      float* to = task.y + run.image * out_image + o0 * g.pixels + run.pixel;
      for (int b = 0; b < kChannelBlock && o0 + b < s.out_channels; ++b)
        store_pixels(to + b * g.pixels, run.mask, acc[b][v]);
    }
}

template <int Vectors = kVectorBlock>
void forward_blocks(int vectors, const ForwardTask& task, int64_t o0, int64_t v0) {
  if constexpr (Vectors > 1) {
    if (vectors < Vectors) {
      forward_blocks<Vectors - 1>(vectors, task, o0, v0);
      return;
    }
  }
  forward_block<Vectors>(task, o0, v0);
}

// Output channels rounded up to the micro-kernels' blocks of 4 (the extra ones read zero weights).
int64_t rounded_channels(const Conv2dShape& s) { return round_up(s.out_channels, kChannelBlock); }

// The weight in panels of 4 output channels: panels[o / 4][k][o % 4] = w[o][k] for the taps k =
// (c, i, j), zero for o >= out_channels, so that a micro-kernel reads its 4 weights of a tap from
// one place and its panel as one stream.
void pack_weight(const StreamHandle& st, const Conv2dShape& s, const float* w, float* panels) {
  const int64_t taps = s.in_channels * s.kernel_h * s.kernel_w,
                blocks = rounded_channels(s) / kChannelBlock;
  run_threads(st, [&](int t, int threads) {
    for (int64_t block = share(blocks, t, threads); block < share(blocks, t + 1, threads);
         ++block) {
      float* to = panels + block * taps * kChannelBlock;
      for (int64_t k = 0; k < taps; ++k)
        for (int64_t b = 0; b < kChannelBlock; ++b) {
          const int64_t o = block * kChannelBlock + b;
          *to++ = o < s.out_channels ? w[o * taps + k] : 0.0f;
        }
    }
  });
}
// The same for the stride-1 backward-data conv (transposed_stride1(s)), straight from s's weight:
// its output channel c and tap k = (o, i, j) read w[o, c, kh - 1 - i, kw - 1 - j].
void pack_flipped_weight(const StreamHandle& st, const Conv2dShape& s, const float* w,
                         float* panels) {
  const int64_t kh = s.kernel_h, kw = s.kernel_w, taps = s.out_channels * kh * kw;
  const int64_t blocks = round_up(s.in_channels, kChannelBlock) / kChannelBlock;
  run_threads(st, [&](int t, int threads) {
    for (int64_t block = share(blocks, t, threads); block < share(blocks, t + 1, threads);
         ++block) {
      float* to = panels + block * taps * kChannelBlock;
      for (int64_t o = 0; o < s.out_channels; ++o)
        for (int64_t i = 0; i < kh; ++i)
          for (int64_t j = 0; j < kw; ++j)
            for (int64_t b = 0; b < kChannelBlock; ++b) {
              const int64_t c = block * kChannelBlock + b;
              *to++ = c < s.in_channels
                          ? w[((o * s.in_channels + c) * kh + kh - 1 - i) * kw + kw - 1 - j]
                          : 0.0f;
            }
    }
  });
}

// Scratch of the forward passes, in floats: the packed weight (shared), the phase planes of a
// grid (per thread).
int64_t forward_shared(const Conv2dShape& s) {
  return s.in_channels * s.kernel_h * s.kernel_w * rounded_channels(s);
}
int64_t forward_scratch(const Conv2dShape& s, const Grid& g) { return s.in_channels * g.channel; }

// Brings [begin, end) into L2 a few cache lines per step(), spread over the `steps` calls: the next
// grid's input, read by pad_images while the current grid is computed, so that it does not wait
// on memory (the activations of a layer rarely stay in L2 until the next one).
class Prefetcher {
 public:
  Prefetcher(const void* begin, const void* end, int64_t steps)
      : next_(static_cast<const char*>(begin)),
        end_(static_cast<const char*>(end)),
        lines_per_step_(((end_ - next_) / 64 + steps) / std::max<int64_t>(steps, 1)) {}
  void step() {
    for (int64_t n = 0; n < lines_per_step_ && next_ < end_; ++n, next_ += 64)
      _mm_prefetch(next_, _MM_HINT_T1);
  }

 private:
  const char* next_;
  const char* end_;
  int64_t lines_per_step_;
};

// y = conv(x, w) + bias, pack(panels) writing the weight packed by pack_weight (or
// pack_flipped_weight). Each thread takes whole grids of images.
template <class Pack>
void forward(const StreamHandle& st, const Conv2dShape& s, const float* x, Pack&& pack,
             const float* bias, float* y) {
  const Grid g(s, Grid::images_for(s));
  const Scratch<float> scratch =
      reserve_scratch<float>(st, forward_shared(s), forward_scratch(s, g));
  pack(scratch.shared);
  const float* panels = scratch.shared;
  const int64_t in_image = s.in_channels * s.in_h * s.in_w, out_image = s.out_channels * g.pixels;
  const int64_t grids = (s.batch + g.images - 1) / g.images;
  run_threads(st, [&](int t, int threads) {
    float* padded = scratch.of_thread(t);
    const int64_t end = share(grids, t + 1, threads);
    const int64_t steps = (g.vectors + kVectorBlock - 1) / kVectorBlock *
                          ((s.out_channels + kChannelBlock - 1) / kChannelBlock);
    for (int64_t grid = share(grids, t, threads); grid < end; ++grid) {
      const int64_t image = grid * g.images, count = std::min(g.images, s.batch - image);
      pad_images(s, g, x + image * in_image, count, padded);
      const int64_t next_end = std::min(s.batch, std::min(grid + 2, end) * g.images);
      Prefetcher next_input(x + (image + count) * in_image,
                            x + std::max(next_end, image + count) * in_image, steps);
      const ForwardTask task{s, g, padded, panels, bias, y + image * out_image, count};
      for (int64_t v0 = 0; v0 < g.vectors; v0 += kVectorBlock)
        for (int64_t o0 = 0; o0 < s.out_channels; o0 += kChannelBlock) {
          next_input.step();
          forward_blocks(static_cast<int>(std::min<int64_t>(kVectorBlock, g.vectors - v0)), task,
                         o0, v0);
        }
    }
  });
}

// sums[b][k0 + t] += sum over the grid positions of `grids` grids of dy_grid row b times the
// input at tap k0 + t's shift.
template <int Taps>
void weight_block(const Grid& g, const float* padded, int64_t padded_stride, const float* dy_grid,
                  int64_t grid_stride, int64_t grids, int64_t k0, double* sums, int64_t sums_stride,
                  int64_t rows) {
  const int64_t row = g.vectors * kLanes;  // floats per dy_grid row
  __m512 acc[kChannelBlock][Taps];
  for (auto& a : acc)
    for (auto& v : a) v = _mm512_setzero_ps();
  for (int64_t grid = 0; grid < grids; ++grid) {
    const float* dy = dy_grid + grid * grid_stride;
    const float* x[Taps];
    for (int t = 0; t < Taps; ++t) x[t] = padded + grid * padded_stride + g.tap_offsets[k0 + t];
    for (int64_t q = 0; q < row; q += kLanes) {
      __m512 d[kChannelBlock];
      for (int b = 0; b < kChannelBlock; ++b) d[b] = _mm512_load_ps(dy + b * row + q);
      for (int t = 0; t < Taps; ++t) {
        const __m512 xv = _mm512_loadu_ps(x[t] + q);
        for (int b = 0; b < kChannelBlock; ++b) acc[b][t] = _mm512_fmadd_ps(d[b], xv, acc[b][t]);
      }
    }
  }
  add_lane_sums(acc, rows, sums + k0, sums_stride);
}

template <int Taps = kTapBlock>
void weight_blocks(int taps, const Grid& g, const float* padded, int64_t padded_stride,
                   const float* dy_grid, int64_t grid_stride, int64_t grids, int64_t k0,
                   double* sums, int64_t sums_stride, int64_t rows) {
  if constexpr (Taps > 1) {
    if (taps < Taps) {
      weight_blocks<Taps - 1>(taps, g, padded, padded_stride, dy_grid, grid_stride, grids, k0, sums,
                              sums_stride, rows);
      return;
    }
  }
  weight_block<Taps>(g, padded, padded_stride, dy_grid, grid_stride, grids, k0, sums, sums_stride,
                     rows);
}

// dy_grid[o][q] = dy of grid position q of output channel o (o < rounded_channels(s)), zero where
// q is no output pixel, no image or o >= out_channels.
void fill_dy_grid(const Conv2dShape& s, const Grid& g, const float* dy, int64_t count,
                  float* dy_grid) {
  const int64_t row = g.vectors * kLanes, out_image = s.out_channels * g.pixels;
  for (int64_t o = 0; o < rounded_channels(s); ++o)
    for (int64_t v = 0; v < g.vectors; ++v) {
      __m512 d = _mm512_setzero_ps();
      if (o < s.out_channels)
        for (int32_t r = g.first_run[v]; r < g.first_run[v + 1]; ++r) {
          const Grid::Run& run = g.runs[r];
          if (run.image < count)
            d = load_pixels(d, dy + run.image * out_image + o * g.pixels + run.pixel, run.mask);
        }
      _mm512_store_ps(dy_grid + o * row + v * kLanes, d);
    }
}

// Grids processed together by backward-weight: their phase planes and dy grids fill about three
// quarters of L2, and the 16-lane partial sums are reduced once per batch of grids.
int64_t grids_per_batch(const Conv2dShape& s, const Grid& g) {
  const int64_t bytes = (s.in_channels * g.channel + rounded_channels(s) * g.vectors * kLanes) * 4;
  return std::clamp<int64_t>((768 << 10) / std::max<int64_t>(bytes, 1), 1, 32);
}
int64_t weight_scratch(const Conv2dShape& s, const Grid& g) {  // per thread, in floats
  return grids_per_batch(s, g) *
             (s.in_channels * g.channel + rounded_channels(s) * g.vectors * kLanes) +
         2 * s.weight_size();  // + the double sums
}

// dw += dy (x) x over the batch. Each thread sums its grids into its own double sums; they are
// added to dw in thread order (the result depends on the thread count only).
void backward_weight(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* dy,
                     float* dw) {
  const Grid g(s, Grid::images_for(s));
  const Scratch<float> scratch = reserve_scratch<float>(st, 0, weight_scratch(s, g));
  const int64_t batch = grids_per_batch(s, g), taps = g.taps();
  const int64_t padded_stride = s.in_channels * g.channel, row = g.vectors * kLanes;
  const int64_t grid_stride = rounded_channels(s) * row;
  const int64_t in_image = s.in_channels * s.in_h * s.in_w, out_image = s.out_channels * g.pixels;
  const int64_t grids = (s.batch + g.images - 1) / g.images;
  auto sums_of = [&](int t) {
    return reinterpret_cast<double*>(scratch.of_thread(t) + batch * (padded_stride + grid_stride));
  };
  int used_threads = 1;
  run_threads(st, [&](int t, int threads) {
    if (t == 0) used_threads = threads;
    float* padded = scratch.of_thread(t);
    float* dy_grid = padded + batch * padded_stride;
    double* sums = sums_of(t);
    std::fill(sums, sums + s.weight_size(), 0.0);
    const int64_t end = share(grids, t + 1, threads);
    for (int64_t first = share(grids, t, threads); first < end; first += batch) {
      const int64_t count = std::min(batch, end - first);
      for (int64_t n = 0; n < count; ++n) {
        const int64_t image = (first + n) * g.images, images = std::min(g.images, s.batch - image);
        pad_images(s, g, x + image * in_image, images, padded + n * padded_stride);
        fill_dy_grid(s, g, dy + image * out_image, images, dy_grid + n * grid_stride);
      }
      // the next batch's images, while this one is computed
      const int64_t next = std::min(s.batch, (first + count) * g.images);
      const int64_t next_end = std::min(s.batch, std::min(end, first + 2 * count) * g.images);
      const int64_t steps = (s.out_channels + kChannelBlock - 1) / kChannelBlock *
                            ((taps + kTapBlock - 1) / kTapBlock);
      Prefetcher next_input(x + next * in_image, x + next_end * in_image, steps);
      Prefetcher next_grad(dy + next * out_image, dy + next_end * out_image, steps);
      for (int64_t o0 = 0; o0 < s.out_channels; o0 += kChannelBlock)
        for (int64_t k0 = 0; k0 < taps; k0 += kTapBlock) {
          next_input.step();
          next_grad.step();
          weight_blocks(static_cast<int>(std::min<int64_t>(kTapBlock, taps - k0)), g, padded,
                        padded_stride, dy_grid + o0 * row, grid_stride, count, k0, sums + o0 * taps,
                        taps, std::min<int64_t>(kChannelBlock, s.out_channels - o0));
        }
    }
  });
  add_thread_sums(st, s.weight_size(), used_threads, sums_of, dw);
}

// ---- Images of 16 pixels (4x4), stride 1, output as large as the input ----
//
// One channel of an image is then one vector, and tap (i, j) of all its output pixels is that
// vector shifted by (i - pad_h) * in_w + j - pad_w: one load, with the lanes that would read
// outside the image (or across a row edge) masked to zero. So there is neither im2col nor a grid,
// and every lane is an output pixel. Forward: acc[4 channels][6 images] += w (x) x;
// backward-weight: acc[4 channels][6 taps] += dy (x) x over the whole batch, reduced once. The
// input is copied with a margin of zeros before and after, so that the shifted loads stay inside
// one buffer.
namespace small {

constexpr int kImageBlock = 6;  // images per forward micro-kernel (4 x 6 accumulators)

// Measured (Zen 5, 128 channels, 4x4, 3x3, batch 64, against im2col + GEMM): forward and
// backward-data 1.15x faster on 1 thread and 1.1x on 2, backward-weight 1.05x on both. Every
// block of backward-weight reads the copy of the whole batch's input: beyond L2 (512 channels at
// batch 64: 2 MB) it waits on memory, and the GEMM is faster.
bool applies(const Conv2dShape& s, Pass pass) {
  return s.stride_h == 1 && s.stride_w == 1 && s.pad_h >= 0 && s.pad_w >= 0 &&
         s.out_h() == s.in_h && s.out_w() == s.in_w && s.in_h * s.in_w == kLanes &&
         (pass == Pass::weight ? s.batch * s.in_channels * kLanes <= (128 << 10)  // 512 KB
                               : s.out_channels >= kChannelBlock);
}

struct Taps {
  int64_t image;                 // in_channels * 16: floats per input image
  int64_t margin;                // zeros before and after the copied images (a multiple of 16)
  std::vector<int64_t> offsets;  // per tap k = (c, i, j): c * 16 + the shift
  std::vector<__mmask16> masks;  // per tap: the output pixels whose read is inside the image

  explicit Taps(const Conv2dShape& s)
      : image(s.in_channels * kLanes),
        margin(round_up(std::max(s.pad_h * s.in_w + s.pad_w,
                                 (s.kernel_h - 1 - s.pad_h) * s.in_w + s.kernel_w - 1 - s.pad_w),
                        kLanes)) {
    for (int64_t c = 0; c < s.in_channels; ++c)
      for (int64_t i = 0; i < s.kernel_h; ++i)
        for (int64_t j = 0; j < s.kernel_w; ++j) {
          offsets.push_back(c * kLanes + (i - s.pad_h) * s.in_w + j - s.pad_w);
          unsigned mask = 0;
          for (int64_t p = 0; p < kLanes; ++p) {
            const int64_t ih = p / s.in_w + i - s.pad_h, iw = p % s.in_w + j - s.pad_w;
            if (ih >= 0 && ih < s.in_h && iw >= 0 && iw < s.in_w) mask |= 1u << p;
          }
          masks.push_back(static_cast<__mmask16>(mask));
        }
  }
  int64_t count() const { return static_cast<int64_t>(offsets.size()); }
  // floats of a copy of `images` images with its margins
  int64_t copy_size(int64_t images) const {
    return margin + round_up(images * image, kLanes) + margin;
  }
};

// Copies `images` images from x into `to` after the margin, zeros in the margins; returns where
// the first image starts.
float* copy_images(const Taps& taps, const float* x, int64_t images, float* to) {
  zero_row(taps.margin, to);
  copy_row(x, images * taps.image, to + taps.margin);
  float* end = to + taps.margin + images * taps.image;
  zero_row(to + taps.copy_size(images) - end, end);
  return to + taps.margin;
}

// The 16 pixels' values of a tap, zero where the tap reads outside the image. (A full load and a
// zeroing move rather than a masked load: GCC 12 treats the masked load as writing memory, which
// keeps the accumulators of the loops around it in memory; the margins make the load safe.)
inline __m512 load_tap(__mmask16 mask, const float* from) {
  return _mm512_maskz_mov_ps(mask, _mm512_loadu_ps(from));
}

// acc[b][v] += sum_k panel[k][b] * (tap k of image v); x: image 0's copy.
// (Plain pointers and counts, not the Taps: __m512 may alias anything, so with the accumulators
// spilled the vectors' internals would have to be reloaded, and GCC then keeps acc in memory.)
template <int Images>
inline void accumulate_outputs(const int64_t* offsets, const __mmask16* masks, int64_t taps,
                               int64_t image, const float* x, const float* panel,
                               __m512 (&acc)[kChannelBlock][Images]) {
  for (int64_t k = 0; k < taps; ++k) {
    const float* from = x + offsets[k];
    const __mmask16 mask = masks[k];
    const float* w = panel + k * kChannelBlock;
    __m512 wb[kChannelBlock];
    for (int b = 0; b < kChannelBlock; ++b) wb[b] = _mm512_set1_ps(w[b]);
    for (int v = 0; v < Images; ++v) {
      const __m512 xv = load_tap(mask, from + v * image);
      for (int b = 0; b < kChannelBlock; ++b) acc[b][v] = _mm512_fmadd_ps(wb[b], xv, acc[b][v]);
    }
  }
}

// y of output channels [o0, o0 + 4) of `Images` consecutive images (x: the first one's copy).
template <int Images>
void forward_block(const Conv2dShape& s, const Taps& taps, const float* x, const float* panels,
                   const float* bias, int64_t o0, float* y) {
  // (Loops over acc with constant trip counts only, so that GCC keeps it in registers.)
  const int64_t rows = std::min<int64_t>(kChannelBlock, s.out_channels - o0);
  __m512 acc[kChannelBlock][Images];
  for (int b = 0; b < kChannelBlock; ++b)
    for (int v = 0; v < Images; ++v)
      acc[b][v] = _mm512_set1_ps(bias != nullptr && b < rows ? bias[o0 + b] : 0.0f);
  accumulate_outputs(taps.offsets.data(), taps.masks.data(), taps.count(), taps.image, x,
                     panels + o0 * taps.count(), acc);
  const int64_t out_image = s.out_channels * kLanes;
  for (int b = 0; b < kChannelBlock; ++b)
    for (int v = 0; v < Images; ++v)
      if (b < rows) _mm512_storeu_ps(y + v * out_image + (o0 + b) * kLanes, acc[b][v]);
}

template <int Images = kImageBlock>
void forward_blocks(int images, const Conv2dShape& s, const Taps& taps, const float* x,
                    const float* panels, const float* bias, int64_t o0, float* y) {
  if constexpr (Images > 1) {
    if (images < Images) {
      forward_blocks<Images - 1>(images, s, taps, x, panels, bias, o0, y);
      return;
    }
  }
  forward_block<Images>(s, taps, x, panels, bias, o0, y);
}

// Per thread, in floats: a copy of kImageBlock images.
int64_t forward_scratch(const Conv2dShape& s) { return Taps(s).copy_size(kImageBlock); }

// y = conv(x, w) + bias, pack(panels) writing the packed weight as for direct::forward.
template <class Pack>
void forward(const StreamHandle& st, const Conv2dShape& s, const float* x, Pack&& pack,
             const float* bias, float* y) {
  const Taps taps(s);
  const Scratch<float> scratch =
      reserve_scratch<float>(st, forward_shared(s), taps.copy_size(kImageBlock));
  pack(scratch.shared);
  const float* panels = scratch.shared;
  const int64_t out_image = s.out_channels * kLanes;
  run_threads(st, [&](int t, int threads) {
    const int64_t end = share(s.batch, t + 1, threads);
    for (int64_t image = share(s.batch, t, threads); image < end; image += kImageBlock) {
      const int64_t images = std::min<int64_t>(kImageBlock, end - image);
      const float* copy = copy_images(taps, x + image * taps.image, images, scratch.of_thread(t));
      for (int64_t o0 = 0; o0 < s.out_channels; o0 += kChannelBlock)
        forward_blocks(static_cast<int>(images), s, taps, copy, panels, bias, o0,
                       y + image * out_image);
    }
  });
}

// dw[o0 + b][k0 + t] += sum over the images of dy channel o0 + b times x at tap k0 + t.
template <int Count>
void weight_block(const Conv2dShape& s, const Taps& taps, const float* x, const float* dy,
                  int64_t o0, int64_t k0, float* dw) {
  const int64_t rows = std::min<int64_t>(kChannelBlock, s.out_channels - o0),
                out_image = s.out_channels * kLanes;
  const float* from[Count];
  __mmask16 mask[Count];
  for (int t = 0; t < Count; ++t) {
    from[t] = x + taps.offsets[k0 + t];
    mask[t] = taps.masks[k0 + t];
  }
  const float* grad = dy + o0 * kLanes;
  __m512 acc[kChannelBlock][Count];
  for (int b = 0; b < kChannelBlock; ++b)
    for (int t = 0; t < Count; ++t) acc[b][t] = _mm512_setzero_ps();
  for (int64_t image = 0; image < s.batch; ++image) {
    __m512 d[kChannelBlock];
    for (int b = 0; b < kChannelBlock; ++b)
      d[b] =
          b < rows ? _mm512_loadu_ps(grad + image * out_image + b * kLanes) : _mm512_setzero_ps();
    for (int t = 0; t < Count; ++t) {
      const __m512 xv = load_tap(mask[t], from[t] + image * taps.image);
      for (int b = 0; b < kChannelBlock; ++b) acc[b][t] = _mm512_fmadd_ps(d[b], xv, acc[b][t]);
    }
  }
  add_lane_sums(acc, rows, dw + o0 * taps.count() + k0, taps.count());
}

template <int Count = kTapBlock>
void weight_blocks(int count, const Conv2dShape& s, const Taps& taps, const float* x,
                   const float* dy, int64_t o0, int64_t k0, float* dw) {
  if constexpr (Count > 1) {
    if (count < Count) {
      weight_blocks<Count - 1>(count, s, taps, x, dy, o0, k0, dw);
      return;
    }
  }
  weight_block<Count>(s, taps, x, dy, o0, k0, dw);
}

// Shared, in floats: a copy of the whole batch.
int64_t weight_shared(const Conv2dShape& s) { return Taps(s).copy_size(s.batch); }

// dw += dy (x) x over the batch. The threads share the copy of the input and split the output
// channels, so that each sum over the batch is made whole by one thread and added to dw once.
void backward_weight(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* dy,
                     float* dw) {
  const Taps taps(s);
  const Scratch<float> scratch = reserve_scratch<float>(st, taps.copy_size(s.batch), 0);
  float* copy = scratch.shared + taps.margin;
  run_threads(st, [&](int t, int threads) {
    const int64_t first = share(s.batch, t, threads), end = share(s.batch, t + 1, threads);
    copy_row(x + first * taps.image, (end - first) * taps.image, copy + first * taps.image);
    if (t == 0) {
      zero_row(taps.margin, scratch.shared);
      float* after = copy + s.batch * taps.image;
      zero_row(scratch.shared + taps.copy_size(s.batch) - after, after);
    }
  });
  const int64_t blocks = (s.out_channels + kChannelBlock - 1) / kChannelBlock;
  run_threads(st, [&](int t, int threads) {
    for (int64_t block = share(blocks, t, threads); block < share(blocks, t + 1, threads); ++block)
      for (int64_t k0 = 0; k0 < taps.count(); k0 += kTapBlock)
        weight_blocks(static_cast<int>(std::min<int64_t>(kTapBlock, taps.count() - k0)), s, taps,
                      copy, dy, block * kChannelBlock, k0, dw);
  });
}

}  // namespace small

// ---- Entry points: each runs its pass with the direct kernels and returns true, or returns
// false where they do not apply.

template <class Pack>
bool forward_with(const StreamHandle& st, const Conv2dShape& s, const float* x, Pack&& pack,
                  const float* bias, float* y) {
  if (small::applies(s, Pass::forward)) {
    small::forward(st, s, x, pack, bias, y);
    return true;
  }
  if (applies(s, Pass::forward)) {
    forward(st, s, x, pack, bias, y);
    return true;
  }
  return false;
}

bool try_forward(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* w,
                 const float* bias, float* y) {
  return forward_with(
      st, s, x, [&](float* panels) { pack_weight(st, s, w, panels); }, bias, y);
}

bool try_backward_data(const StreamHandle& st, const Conv2dShape& s, const float* dy,
                       const float* w, float* dx) {
  if (s.stride_h != 1 || s.stride_w != 1) return false;
  return forward_with(
      st, transposed_stride1(s), dy, [&](float* panels) { pack_flipped_weight(st, s, w, panels); },
      nullptr, dx);
}

bool try_backward_weight(const StreamHandle& st, const Conv2dShape& s, const float* x,
                         const float* dy, float* dw) {
  if (small::applies(s, Pass::weight)) {
    small::backward_weight(st, s, x, dy, dw);
    return true;
  }
  if (applies(s, Pass::weight)) {
    backward_weight(st, s, x, dy, dw);
    return true;
  }
  return false;
}

// The most scratch floats the passes above ask for with `threads` threads (0 where none applies),
// rounded as reserve_scratch does.
int64_t workspace_floats(const Conv2dShape& s, int threads) {
  const int64_t line = 64 / sizeof(float);
  auto total = [&](int64_t shared, int64_t per_thread) {
    return round_up(shared, line) + threads * round_up(per_thread, line);
  };
  auto forward_floats = [&](const Conv2dShape& f) -> int64_t {
    if (small::applies(f, Pass::forward))
      return total(forward_shared(f), small::forward_scratch(f));
    if (applies(f, Pass::forward))
      return total(forward_shared(f), forward_scratch(f, Grid(f, Grid::images_for(f))));
    return 0;
  };
  int64_t floats = forward_floats(s);
  if (s.stride_h == 1 && s.stride_w == 1)
    floats = std::max(floats, forward_floats(transposed_stride1(s)));
  if (small::applies(s, Pass::weight))
    floats = std::max(floats, total(small::weight_shared(s), 0));
  else if (applies(s, Pass::weight))
    floats = std::max(floats, total(0, weight_scratch(s, Grid(s, Grid::images_for(s)))));
  return floats;
}

}  // namespace direct
#endif  // PETRA_CONV_DIRECT

// Per-thread scratch of the tiled passes: a col tile and an output-side tile.
int64_t col_tile_elements(const Lowering& low) {
  return low.input_is_col ? (low.tile_rows <= low.out_h ? 0 : low.taps * low.max_tile_columns())
                          : low.taps * low.max_tile_columns();
}
int64_t out_tile_elements(const Lowering& low) {
  return low.tile_rows <= low.out_h ? 0 : low.shape.out_channels * low.max_tile_columns();
}

// The col panel of a tile: x in place for a 1x1 stride-1 convolution, else filled into `buffer`.
template <class T>
Panel<const T> input_columns(const Lowering& low, const T* x, Tile tile, T* buffer) {
  if (low.input_is_col && in_one_image(low, tile))
    return columns_in_place(low, x, low.shape.in_channels, tile);
  const int64_t n = (tile.row1 - tile.row0) * low.out_w;
  if (low.input_is_col) {
    gather_columns(low, x, low.shape.in_channels, tile, buffer, n);
  } else {
    fill_columns(low, x, tile, buffer, n);
  }
  return {buffer, n};
}

// The dY panel of a tile (out_channels x its columns): dy in place when the tile lies in one
// image, else gathered into `buffer`.
template <class T>
Panel<const T> output_columns(const Lowering& low, const T* dy, Tile tile, T* buffer) {
  if (in_one_image(low, tile)) return columns_in_place(low, dy, low.shape.out_channels, tile);
  const int64_t n = (tile.row1 - tile.row0) * low.out_w;
  gather_columns(low, dy, low.shape.out_channels, tile, buffer, n);
  return {buffer, n};
}

int64_t forward_thread_elements(const Lowering& low) {
  return col_tile_elements(low) + out_tile_elements(low);
}

// The forward pass on an explicit lowering (also used by backward-data of stride-1 convs), with
// forward_thread_elements(low) per thread of scratch reserved by the caller.
template <class T>
void forward(const StreamHandle& s, const Lowering& low, const T* x, const T* w, const T* bias,
             T* y, const Scratch<T>& scratch) {
  const int64_t out_channels = low.shape.out_channels;
  const ConstMatrixView<T> weight = view(Panel<const T>{w, low.taps}, out_channels, low.taps);
  run_threads(s, [&](int t, int threads) {
    T* col_buffer = scratch.of_thread(t);
    T* out_buffer = col_buffer + col_tile_elements(low);
    for_each_tile(low, share(low.total_rows, t, threads), share(low.total_rows, t + 1, threads),
                  [&](Tile tile) {
      const int64_t n = (tile.row1 - tile.row0) * low.out_w;
      const Panel<const T> in = input_columns(low, x, tile, col_buffer);
      const bool in_place = in_one_image(low, tile);
      const Panel<T> out = in_place ? columns_in_place(low, y, out_channels, tile) : Panel<T>{out_buffer, n};
      auto result = view(out, out_channels, n);
      // (Eigen zeroes the destination of "= product" before accumulating into it: starting
      // from the bias instead saves that pass.)
      if (bias != nullptr) {
        result.colwise() = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 1>>(bias, out_channels);
        result.noalias() += weight * view(in, low.taps, n);
      } else {
        result.noalias() = weight * view(in, low.taps, n);
      }
      if (!in_place) scatter_columns(low, out.data, n, out_channels, tile, y);
    });
  });
}

template <class T>
void forward_pass(const StreamHandle& s, const Conv2dShape& shape, const T* x, const T* w,
                  const T* bias, T* y) {
#if PETRA_CONV_DIRECT
  if constexpr (std::is_same_v<T, float>) {
    if (direct::try_forward(s, shape, x, w, bias, y)) return;
  }
#endif
  const Lowering low(shape);
  forward(s, low, x, w, bias, y, reserve_scratch<T>(s, 0, forward_thread_elements(low)));
}

// flipped[c, o, kh-1-i, kw-1-j] = w[o, c, i, j]: the weight of the transposed_stride1 shape.
template <class T>
void flip_transpose_weight(const StreamHandle& s, const Conv2dShape& shape, const T* w,
                           T* flipped) {
  const int64_t kh = shape.kernel_h, kw = shape.kernel_w, taps = kh * kw;
  run_threads(s, [&](int t, int threads) {
    for (int64_t c = share(shape.in_channels, t, threads); c < share(shape.in_channels, t + 1, threads); ++c)
      for (int64_t o = 0; o < shape.out_channels; ++o) {
        const T* from = w + (o * shape.in_channels + c) * taps;
        std::reverse_copy(from, from + taps, flipped + (c * shape.out_channels + o) * taps);
      }
  });
}

template <class T>
void backward_data_stride1(const StreamHandle& s, const Conv2dShape& shape, const T* dy,
                           const T* w, T* dx) {
  const Lowering low(transposed_stride1(shape));
  const Scratch<T> scratch = reserve_scratch<T>(s, shape.weight_size(), forward_thread_elements(low));
  flip_transpose_weight(s, shape, w, scratch.shared);
  forward(s, low, dy, static_cast<const T*>(scratch.shared), static_cast<const T*>(nullptr), dx, scratch);
}

// Backward-data of a strided convolution: dcol = W^T * dY per tile, then col2im into dx. Each
// thread owns whole images, so that the scatter-adds of two threads never meet.
template <class T>
void backward_data_col2im(const StreamHandle& s, const Conv2dShape& shape, const T* dy,
                          const T* w, T* dx) {
  const Lowering low(shape);
  const int64_t out_channels = shape.out_channels;
  const int64_t col_elements = low.taps * low.max_tile_columns();
  const Scratch<T> scratch = reserve_scratch<T>(s, 0, col_elements + out_tile_elements(low));
  const ConstMatrixView<T> weight = view(Panel<const T>{w, low.taps}, out_channels, low.taps);
  const int64_t image_size = shape.in_channels * shape.in_h * shape.in_w;
  run_threads(s, [&](int t, int threads) {
    T* col_buffer = scratch.of_thread(t);
    T* dy_buffer = col_buffer + col_elements;
    const int64_t image0 = share(shape.batch, t, threads), image1 = share(shape.batch, t + 1, threads);
    int64_t zeroed = image0;  // dx images [image0, zeroed) are zero or hold their first terms
    for_each_tile(low, image0 * low.out_h, image1 * low.out_h, [&](Tile tile) {
      const int64_t n = (tile.row1 - tile.row0) * low.out_w;
      // Zero each dx image just before its first scatter-add, while it then stays in cache.
      const int64_t last_image = (tile.row1 - 1) / low.out_h;
      std::fill(dx + zeroed * image_size, dx + (last_image + 1) * image_size, T(0));
      zeroed = std::max(zeroed, last_image + 1);
      const Panel<const T> grad = output_columns(low, dy, tile, dy_buffer);
      view(Panel<T>{col_buffer, n}, low.taps, n).noalias() =
          weight.transpose() * view(grad, out_channels, n);
      add_columns(low, col_buffer, n, tile, dx);
    });
  });
}

template <class T>
void backward_data(const StreamHandle& s, const Conv2dShape& shape, const T* dy, const T* w,
                   T* dx) {
#if PETRA_CONV_DIRECT
  if constexpr (std::is_same_v<T, float>) {
    if (direct::try_backward_data(s, shape, dy, w, dx)) return;
  }
#endif
  if (backward_data_as_forward(shape)) {
    backward_data_stride1(s, shape, dy, w, dx);
  } else {
    backward_data_col2im(s, shape, dy, w, dx);
  }
}

// dW += dY * col^T over all tiles. Thread 0 accumulates straight into dw, the others into
// partial sums in scratch, which are added to dw at the end (in a fixed order: the result
// depends on the thread count only).
template <class T>
void backward_weight(const StreamHandle& s, const Conv2dShape& shape, const T* x, const T* dy,
                     T* dw) {
#if PETRA_CONV_DIRECT
  if constexpr (std::is_same_v<T, float>) {
    if (direct::try_backward_weight(s, shape, x, dy, dw)) return;
  }
#endif
  const Lowering low(shape);
  const int64_t out_channels = shape.out_channels, weight_size = shape.weight_size();
  const int partial_sums = std::max(1, s.num_threads) - 1;
  const Scratch<T> scratch = reserve_scratch<T>(s, partial_sums * weight_size,
                                                col_tile_elements(low) + out_tile_elements(low));
  auto partial_of = [&](int thread) { return scratch.shared + (thread - 1) * weight_size; };
  int used_threads = 1;
  run_threads(s, [&](int t, int threads) {
    if (t == 0) used_threads = threads;
    T* col_buffer = scratch.of_thread(t);
    T* dy_buffer = col_buffer + col_tile_elements(low);
    T* partial = t == 0 ? dw : partial_of(t);
    auto dweight = view(Panel<T>{partial, low.taps}, out_channels, low.taps);
    bool assign = t != 0;  // the first product initialises a partial sum
    for_each_tile(low, share(low.total_rows, t, threads), share(low.total_rows, t + 1, threads),
                  [&](Tile tile) {
      const int64_t n = (tile.row1 - tile.row0) * low.out_w;
      const Panel<const T> in = input_columns(low, x, tile, col_buffer);
      const Panel<const T> grad = output_columns(low, dy, tile, dy_buffer);
      const ConstMatrixView<T> dy_tile = view(grad, out_channels, n), col = view(in, low.taps, n);
      if (assign) {
        dweight.noalias() = dy_tile * col.transpose();
      } else {
        dweight.noalias() += dy_tile * col.transpose();
      }
      assign = false;
    });
    if (assign) dweight.setZero();  // this thread had no rows
  });
  if (used_threads == 1) return;
  run_threads(s, [&](int t, int threads) {
    const int64_t begin = share(weight_size, t, threads), end = share(weight_size, t + 1, threads);
    for (int u = 1; u < used_threads; ++u) {
      const T* partial = partial_of(u);
      for (int64_t e = begin; e < end; ++e) dw[e] += partial[e];
    }
  });
}

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
  const int threads = std::max(1, num_threads);
  const Lowering low(shape);
  const int64_t line = 16;
  auto per_thread = [&](int64_t elements) { return threads * round_up(elements, line); };
  const int64_t forward_elements = per_thread(forward_thread_elements(low));
  const int64_t weight_elements =
      round_up((threads - 1) * shape.weight_size(), line) + per_thread(forward_thread_elements(low));
  const int64_t data_elements =
      backward_data_as_forward(shape)
          ? round_up(shape.weight_size(), line) +
                per_thread(forward_thread_elements(Lowering(transposed_stride1(shape))))
          : per_thread(low.taps * low.max_tile_columns() + out_tile_elements(low));
  int64_t direct_elements = 0;
#if PETRA_CONV_DIRECT
  direct_elements = direct::workspace_floats(shape, threads);
#endif
  return static_cast<std::size_t>(
             std::max({forward_elements, weight_elements, data_elements, direct_elements})) *
         sizeof(float);
}

}  // namespace petra::kernels::cpu
