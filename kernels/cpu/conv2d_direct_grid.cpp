// kernels/cpu/conv2d_direct_grid.cpp: the direct AVX-512 convolution (float) on grids of
// zero-padded planes, without im2col. It was written for narrow layers (16 to 64 channels, as in
// RevNet18 on 28x28 images), where the GEMM of conv2d_im2col.cpp is shallow and im2col plus
// Eigen's packing cost about as much as the multiply-adds: these kernels skip both, keeping a
// 4 x 6 block of 16-lane accumulators in registers and adding, for every tap, 4 broadcast weights
// times 6 vectors of input loaded at the tap's shift, 1.3-1.8x faster on those layers (the forward
// takes 6 x 4 where there are 64 output channels or more: Tile, below).
// kernels/cpu/conv2d.cpp chooses it for float wherever `applies` (below, with the measurements)
// says so and conv2d_direct_small.cpp's kernels do not apply: kernels larger than 1x1, strides 1
// and 2, outputs at least 7 columns wide (8 for a strided backward-weight), at least 4 output
// channels (forward, backward-data), at most 40K weights (backward-weight). Compiled only with
// AVX-512 (PETRA_CONV_DIRECT).
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
#include "petra/kernels/cpu/conv2d_algorithms.hpp"

#if PETRA_CONV_DIRECT
#include <algorithm>
#include <cstdint>
#include <vector>

#include "petra/kernels/cpu/conv2d_direct.hpp"
#include "petra/kernels/cpu/parallel.hpp"

namespace petra::kernels::cpu::conv2d::direct::grid {
namespace {

// The forward micro-kernel's register tile: Channels output channels x Vectors grid vectors, fed
// per tap by Channels broadcast weights and Vectors unaligned loads. 4 x 6 measured best on 16 and
// 32 output channels, 6 x 4 on 64 and more, where rounding the channels up to 6 wastes little
// (docs/results-cpu.md §1, "Forward kernels tried": 1.06-1.10x on those layers' forward and
// backward-data). Each output is summed over the taps in the same order by both: the same bits.
template <int C, int V>
struct Tile {
  static constexpr int channels = C, vectors = V;
};
using NarrowTile = Tile<4, 6>;
using WideTile = Tile<6, 4>;
bool wide_tile(const Conv2dShape& s) { return s.out_channels >= 64; }

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
  }
  int64_t taps() const { return static_cast<int64_t>(tap_offsets.size()); }

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
// every s.x_image_stride() floats); the grid's other images read zeros. Every float is written, except
// at stride 1 when `padding_written`: there each image's input row ih lies whole at plane position
// (ih + pad_h) * width + image * span + pad_w (Grid), every other position is padding, the same for
// every grid, and a caller that reuses the planes writes the padding once and then only the rows.
void pad_images(const Conv2dShape& s, const Grid& g, const float* x, int64_t count, float* padded,
                bool padding_written) {
  const int64_t image_stride = s.x_image_stride();
  if (s.stride_h == 1 && s.stride_w == 1) {
    if (!padding_written) zero_row(s.in_channels * g.channel, padded);
    for (int64_t c = 0; c < s.in_channels; ++c)
      for (int64_t image = 0; image < g.images; ++image) {
        float* to = padded + c * g.channel + s.pad_h * g.width + image * g.span + s.pad_w;
        const float* from = x + image * image_stride + c * s.in_h * s.in_w;
        for (int64_t ih = 0; ih < s.in_h; ++ih, to += g.width, from += s.in_w) {
          if (image < count)
            copy_row(from, s.in_w, to);
          else
            zero_row(s.in_w, to);
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
            const float* from = x + image * image_stride + (c * s.in_h + ih) * s.in_w +
                                first * s.stride_w + b - s.pad_w;
            if (s.stride_w == 1) {
              copy_row(from, last - first, to + first);
            } else if (s.stride_w == 2) {
              copy_even(from, last - first, to + first);
            } else {
              for (int64_t t = 0; t < last - first; ++t) to[first + t] = from[t * s.stride_w];
            }
          }
        }
        zero_row(g.plane - g.rows * g.width, plane + g.rows * g.width);
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
template <int Channels, int Vectors>
inline void accumulate_outputs(const float* grid, const int64_t* tap_offsets, int64_t taps,
                               const float* panel, __m512 (&acc)[Channels][Vectors]) {
  for (int64_t k = 0; k < taps; ++k) {
    const float* x = grid + tap_offsets[k];
    const float* w = panel + k * Channels;
    __m512 wb[Channels];
    for (int b = 0; b < Channels; ++b) wb[b] = _mm512_set1_ps(w[b]);
    for (int v = 0; v < Vectors; ++v) {
      const __m512 xv = _mm512_loadu_ps(x + v * kLanes);
      for (int b = 0; b < Channels; ++b) acc[b][v] = _mm512_fmadd_ps(wb[b], xv, acc[b][v]);
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

// Output channels [o0, o0 + Channels) of grid vectors [v0, v0 + Vectors).
template <int Channels, int Vectors>
void forward_block(const ForwardTask& task, int64_t o0, int64_t v0) {
  const Conv2dShape& s = task.s;
  const Grid& g = task.g;
  __m512 acc[Channels][Vectors];
  for (int b = 0; b < Channels; ++b) {
    const float start = task.bias != nullptr && o0 + b < s.out_channels ? task.bias[o0 + b] : 0.0f;
    for (int v = 0; v < Vectors; ++v) acc[b][v] = _mm512_set1_ps(start);
  }
  accumulate_outputs<Channels, Vectors>(task.padded + v0 * kLanes, g.tap_offsets.data(), g.taps(),
                              task.panels + o0 * g.taps(), acc);
  const int64_t out_image = s.out_channels * g.pixels;
  for (int v = 0; v < Vectors; ++v)
    for (int32_t r = g.first_run[v0 + v]; r < g.first_run[v0 + v + 1]; ++r) {
      const Grid::Run& run = g.runs[r];
      if (run.image >= task.count) continue;
      float* to = task.y + run.image * out_image + o0 * g.pixels + run.pixel;
      for (int b = 0; b < Channels && o0 + b < s.out_channels; ++b)
        store_pixels(to + b * g.pixels, run.mask, acc[b][v]);
    }
}

template <int Channels, int Vectors>
void forward_blocks(int vectors, const ForwardTask& task, int64_t o0, int64_t v0) {
  if constexpr (Vectors > 1) {
    if (vectors < Vectors) {
      forward_blocks<Channels, Vectors - 1>(vectors, task, o0, v0);
      return;
    }
  }
  forward_block<Channels, Vectors>(task, o0, v0);
}

// Per-thread scratch of the forward passes, in floats: the phase planes of a grid.
int64_t forward_scratch(const Conv2dShape& s, const Grid& g) { return s.in_channels * g.channel; }

// Brings `images` images of `image_floats` floats, `image_stride` floats apart from `first`, into
// L2 a few cache lines per step(), spread over the `steps` calls: the next grid's input, read by
// pad_images while the current grid is computed, so that it does not wait on memory (the
// activations of a layer rarely stay in L2 until the next one). Image by image, so that a channel
// slice (images further apart than their size) brings in only its own channels.
class Prefetcher {
 public:
  Prefetcher(const float* first, int64_t images, int64_t image_stride, int64_t image_floats, int64_t steps)
      : image_(reinterpret_cast<const char*>(first)),
        next_(image_),
        image_bytes_(int64_t(sizeof(float)) * image_floats),
        stride_bytes_(int64_t(sizeof(float)) * image_stride),
        images_left_(std::max<int64_t>(images, 0)),
        lines_per_step_((images_left_ * image_bytes_ / 64 + steps) / std::max<int64_t>(steps, 1)) {}
  void step() {
    for (int64_t n = 0; n < lines_per_step_ && images_left_ > 0; ++n) {
      _mm_prefetch(next_, _MM_HINT_T1);
      next_ += 64;
      if (next_ >= image_ + image_bytes_) {
        image_ += stride_bytes_;
        next_ = image_;
        --images_left_;
      }
    }
  }

 private:
  const char* image_;  // the image being brought in
  const char* next_;   // its next line
  int64_t image_bytes_, stride_bytes_, images_left_, lines_per_step_;
};

// y = conv(x, w) + bias, pack(panels) writing the weight packed by pack_weight<Tile::channels> (or
// pack_flipped_weight). Each thread takes whole grids of images.
template <class Tile, class Pack>
void forward_packed(const StreamHandle& st, const Conv2dShape& s, const float* x, Pack&& pack,
                    const float* bias, float* y) {
  const Grid g(s, Grid::images_for(s));
  const Scratch<float> scratch =
      reserve_scratch<float>(st, forward_shared<Tile::channels>(s), forward_scratch(s, g));
  pack(scratch.shared);
  const float* panels = scratch.shared;
  const int64_t in_image = s.x_image_stride(), image_floats = s.in_channels * s.in_h * s.in_w;
  const int64_t out_image = s.out_channels * g.pixels;
  const int64_t grids = (s.batch + g.images - 1) / g.images;
  run_threads(st, [&](int t, int threads) {
    float* padded = scratch.of_thread(t);
    const int64_t end = share(grids, t + 1, threads);
    constexpr int64_t channels = Tile::channels, vectors = Tile::vectors;
    const int64_t steps = (g.vectors + vectors - 1) / vectors * ((s.out_channels + channels - 1) / channels);
    for (int64_t grid = share(grids, t, threads); grid < end; ++grid) {
      const int64_t image = grid * g.images, count = std::min(g.images, s.batch - image);
      pad_images(s, g, x + image * in_image, count, padded, /*padding_written=*/grid > share(grids, t, threads));
      const int64_t next_end = std::min(s.batch, std::min(grid + 2, end) * g.images);
      Prefetcher next_input(x + (image + count) * in_image, next_end - (image + count), in_image, image_floats, steps);
      const ForwardTask task{s, g, padded, panels, bias, y + image * out_image, count};
      for (int64_t v0 = 0; v0 < g.vectors; v0 += vectors)
        for (int64_t o0 = 0; o0 < s.out_channels; o0 += channels) {
          next_input.step();
          forward_blocks<Tile::channels, Tile::vectors>(static_cast<int>(std::min(vectors, g.vectors - v0)), task,
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

}  // namespace

// Where the grid kernels beat im2col + GEMM. Measured on Zen 5 (1 thread, the 3x3 layers of
// RevNet18 on 28x28 images, batch 64), all three passes: 1.6-1.8x faster with 28x28 and 14x14
// outputs (16 and 32 channels), 1.3x on stride-2 28x28 -> 14x14; with 7x7 outputs 1.3x (forward)
// and 1.1x (backward-weight) at stride 1, even at stride 2 (forward) and slower for its
// backward-weight, whose 16-lane sums are reduced after too few vectors. Below 7 columns the grid
// is too much padding (4x4: one lane in five), and 1x1 convolutions have no col to build anyway.
// Backward-weight keeps double sums of the whole weight per thread, written all over for every
// batch of grids: beyond about 40K weights (the 64-channel 3x3 convs: 37K) they no longer stay in
// L2 and the GEMM wins (bench-kernels, ResNet-18 layers of 128 and 256 channels: up to 2x).
bool applies(const Conv2dShape& s, Pass pass) {
  const bool stride1 = s.stride_h == 1 && s.stride_w == 1;
  const int64_t min_width = pass == Pass::weight && !stride1 ? 8 : 7;
  return s.stride_h <= 2 && s.stride_w <= 2 && s.pad_h >= 0 && s.pad_w >= 0 && s.out_h() > 0 &&
         s.out_w() >= min_width && s.kernel_h * s.kernel_w > 1 &&
         (pass == Pass::weight ? s.weight_size() <= 40000
                               : s.out_channels >= kChannelBlock);  // else mostly padding rows
}

template <class Tile>
void forward_with(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* w,
                  const float* bias, float* y) {
  forward_packed<Tile>(st, s, x, [&](float* panels) { pack_weight<Tile::channels>(st, s, w, panels); }, bias, y);
}

template <class Tile>
void backward_data_with(const StreamHandle& st, const Conv2dShape& s, const float* dy, const float* w,
                        float* dx) {
  forward_packed<Tile>(
      st, transposed_stride1(s), dy,
      [&](float* panels) { pack_flipped_weight<Tile::channels>(st, s, w, panels); }, nullptr, dx);
}

void forward(const StreamHandle& st, const Conv2dShape& s, const float* x, const float* w,
             const float* bias, float* y) {
  if (wide_tile(s))
    forward_with<WideTile>(st, s, x, w, bias, y);
  else
    forward_with<NarrowTile>(st, s, x, w, bias, y);
}

void backward_data(const StreamHandle& st, const Conv2dShape& s, const float* dy, const float* w,
                   float* dx) {
  if (wide_tile(transposed_stride1(s)))
    backward_data_with<WideTile>(st, s, dy, w, dx);
  else
    backward_data_with<NarrowTile>(st, s, dy, w, dx);
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
  const int64_t in_image = s.x_image_stride(), image_floats = s.in_channels * s.in_h * s.in_w;
  const int64_t out_image = s.out_channels * g.pixels;
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
        pad_images(s, g, x + image * in_image, images, padded + n * padded_stride,
                   /*padding_written=*/first > share(grids, t, threads));
        fill_dy_grid(s, g, dy + image * out_image, images, dy_grid + n * grid_stride);
      }
      // the next batch's images, while this one is computed
      const int64_t next = std::min(s.batch, (first + count) * g.images);
      const int64_t next_end = std::min(s.batch, std::min(end, first + 2 * count) * g.images);
      const int64_t steps = (s.out_channels + kChannelBlock - 1) / kChannelBlock *
                            ((taps + kTapBlock - 1) / kTapBlock);
      Prefetcher next_input(x + next * in_image, next_end - next, in_image, image_floats, steps);
      Prefetcher next_grad(dy + next * out_image, next_end - next, out_image, out_image, steps);
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

int64_t forward_scratch_floats(const Conv2dShape& s, int threads) {
  const int64_t packed = wide_tile(s) ? forward_shared<WideTile::channels>(s) : forward_shared<NarrowTile::channels>(s);
  return scratch_floats(packed, forward_scratch(s, Grid(s, Grid::images_for(s))), threads);
}

int64_t backward_weight_scratch_floats(const Conv2dShape& s, int threads) {
  return scratch_floats(0, weight_scratch(s, Grid(s, Grid::images_for(s))), threads);
}

}  // namespace petra::kernels::cpu::conv2d::direct::grid
#endif  // PETRA_CONV_DIRECT
