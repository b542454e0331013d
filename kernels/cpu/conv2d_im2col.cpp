// kernels/cpu/conv2d_im2col.cpp: the CPU convolution as matrix products (im2col + Eigen GEMM),
// for float and double, any shape. kernels/cpu/conv2d.cpp chooses it for every pass that the
// direct AVX-512 kernels (conv2d_direct_small.cpp, conv2d_direct_grid.cpp) do not take: all of
// double and of builds without AVX-512, and for float the shapes their `applies` turns down,
// among them 1x1 kernels, strides above 2, outputs narrower than 7 columns other than 4x4 images,
// and the backward-weight of wide layers.
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
#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "petra/kernels/cpu/conv2d_algorithms.hpp"
#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu::conv2d::im2col {
namespace {

using std::int64_t;

// GEMM columns (output pixels) per tile. Measured on the ResNet-18 CIFAR layers (Zen 5, 1 and 2
// threads): 256 to 512 are equally fast; 128 and 1024+ lose 5-10%. 256 keeps the col tile of a
// 64-channel 3x3 conv (576 x 256 floats) in L2.
constexpr int64_t kTileColumns = 256;

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

// The tile's columns of an NCHW tensor of low.pixels pixels per channel and an image every
// `image_stride` elements, seen in place (valid only for a tile inside one image).
template <class T>
Panel<T> columns_in_place(const Lowering& low, T* tensor, int64_t image_stride, Tile tile) {
  const int64_t image = tile.row0 / low.out_h;
  const int64_t pixel0 = (tile.row0 - image * low.out_h) * low.out_w;
  return {tensor + image * image_stride + pixel0, low.pixels};
}

// tile_matrix[ch][column] = tensor[image, ch, pixel] over the tile (an NCHW tensor of the
// output's geometry, an image every `image_stride` elements), and the reverse (packed images).
template <class T>
void gather_columns(const Lowering& low, const T* tensor, int64_t channels, int64_t image_stride, Tile tile,
                    T* out, int64_t out_stride) {
  for_each_image_piece(low, tile, [&](const ImagePiece& p) {
    for (int64_t ch = 0; ch < channels; ++ch) {
      const T* src = tensor + p.image * image_stride + ch * low.pixels + p.pixel0;
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
// pixels are the tile's columns from `column`; x's images lie `image_stride` elements apart. The
// loop nest shared by im2col and col2im.
template <class T, class Fn>
void for_each_tap_row(const Lowering& low, T* x, int64_t image_stride, Tile tile, Fn&& fn) {
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
          if (ih >= 0 && ih < s.in_h) row = x + image * image_stride + (c * s.in_h + ih) * s.in_w;
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
      const T* channel = x + p.image * s.x_image_stride() + c * plane;
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
      const T* channel = x + p.image * s.x_image_stride() + c * plane;
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
  const int64_t x_image = low.shape.x_image_stride();
  for_each_tap_row(low, x, x_image, tile, [&](int64_t k, const T* row, const ValidColumns& valid, int64_t column) {
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
  const int64_t dx_image = low.shape.in_channels * low.shape.in_h * low.shape.in_w;  // dx is packed
  for_each_tap_row(low, dx, dx_image, tile, [&](int64_t k, T* row, const ValidColumns& valid, int64_t column) {
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
    return columns_in_place(low, x, low.shape.x_image_stride(), tile);
  const int64_t n = (tile.row1 - tile.row0) * low.out_w;
  if (low.input_is_col) {
    gather_columns(low, x, low.shape.in_channels, low.shape.x_image_stride(), tile, buffer, n);
  } else {
    fill_columns(low, x, tile, buffer, n);
  }
  return {buffer, n};
}

// The dY panel of a tile (out_channels x its columns): dy in place when the tile lies in one
// image, else gathered into `buffer`.
template <class T>
Panel<const T> output_columns(const Lowering& low, const T* dy, Tile tile, T* buffer) {
  const int64_t dy_image = low.shape.out_channels * low.pixels;
  if (in_one_image(low, tile)) return columns_in_place(low, dy, dy_image, tile);
  const int64_t n = (tile.row1 - tile.row0) * low.out_w;
  gather_columns(low, dy, low.shape.out_channels, dy_image, tile, buffer, n);
  return {buffer, n};
}

int64_t forward_thread_elements(const Lowering& low) {
  return col_tile_elements(low) + out_tile_elements(low);
}

// The forward pass on an explicit lowering (also used by backward-data of stride-1 convs), with
// forward_thread_elements(low) per thread of scratch reserved by the caller.
template <class T>
void forward_lowered(const StreamHandle& s, const Lowering& low, const T* x, const T* w,
                     const T* bias, T* y, const Scratch<T>& scratch) {
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
      const Panel<T> out =
          in_place ? columns_in_place(low, y, out_channels * low.pixels, tile) : Panel<T>{out_buffer, n};
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

}  // namespace

template <class T>
void forward(const StreamHandle& s, const Conv2dShape& shape, const T* x, const T* w,
             const T* bias, T* y) {
  const Lowering low(shape);
  forward_lowered(s, low, x, w, bias, y, reserve_scratch<T>(s, 0, forward_thread_elements(low)));
}

template <class T>
void backward_data_transposed(const StreamHandle& s, const Conv2dShape& shape, const T* dy,
                              const T* w, T* dx) {
  const Lowering low(transposed_stride1(shape));
  const Scratch<T> scratch = reserve_scratch<T>(s, shape.weight_size(), forward_thread_elements(low));
  flip_transpose_weight(s, shape, w, scratch.shared);
  forward_lowered(s, low, dy, static_cast<const T*>(scratch.shared), static_cast<const T*>(nullptr), dx, scratch);
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

// dW += dY * col^T over all tiles. Thread 0 accumulates straight into dw, the others into
// partial sums in scratch, which are added to dw at the end (in a fixed order: the result
// depends on the thread count only).
template <class T>
void backward_weight(const StreamHandle& s, const Conv2dShape& shape, const T* x, const T* dy,
                     T* dw) {
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

int64_t forward_scratch_floats(const Conv2dShape& shape, int threads) {
  return scratch_floats(0, forward_thread_elements(Lowering(shape)), threads);
}

int64_t backward_data_transposed_scratch_floats(const Conv2dShape& shape, int threads) {
  return scratch_floats(shape.weight_size(),
                        forward_thread_elements(Lowering(transposed_stride1(shape))), threads);
}

int64_t backward_data_col2im_scratch_floats(const Conv2dShape& shape, int threads) {
  const Lowering low(shape);
  return scratch_floats(0, low.taps * low.max_tile_columns() + out_tile_elements(low), threads);
}

int64_t backward_weight_scratch_floats(const Conv2dShape& shape, int threads) {
  return scratch_floats((threads - 1) * shape.weight_size(),
                        forward_thread_elements(Lowering(shape)), threads);
}

#define PETRA_INSTANTIATE(T)                                                                       \
  template void forward<T>(const StreamHandle&, const Conv2dShape&, const T*, const T*, const T*,  \
                           T*);                                                                    \
  template void backward_data_transposed<T>(const StreamHandle&, const Conv2dShape&, const T*,     \
                                            const T*, T*);                                         \
  template void backward_data_col2im<T>(const StreamHandle&, const Conv2dShape&, const T*,         \
                                        const T*, T*);                                             \
  template void backward_weight<T>(const StreamHandle&, const Conv2dShape&, const T*, const T*, T*);
PETRA_INSTANTIATE(float)
PETRA_INSTANTIATE(double)
#undef PETRA_INSTANTIATE

}  // namespace petra::kernels::cpu::conv2d::im2col
