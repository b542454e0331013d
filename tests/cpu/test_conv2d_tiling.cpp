// tests/cpu/test_conv2d_tiling.cpp: the index and tile arithmetic of the CUDA convolution
// (kernels/cuda/conv2d_tiling.cuh), on the host, against brute force: every shape of a small grid
// (kernels 1..4 x 1..3, strides 1..3, paddings 0..2, inputs 1..7, channels 1..3, batch 1..2) and
// random larger ones.
//   - corner_offset(output_pixel(n)) + tap_offset(split_tap(k)), where tap_inside, is the im2col
//     matrix that ref::'s loops visit;
//   - backward data's stride classes (stride_class) reach exactly the (input pixel, tap) pairs
//     that an output pixel reads, each once and at that output pixel (found by trying every
//     output pixel), and partition the coordinates and the taps;
//   - split_tap, split_pixel, quotient against / and %; split_digits and advance (the K loop's
//     walk over a K index's digits) against splitting again;
//   - the block tiles (64 or 128 by 64 or 128): every A and B element loaded by exactly one
//     (thread, q), every C element computed by exactly one (thread, r, q); choose_tile's and
//     choose_tile_tf32's rules;
//   - offsets_fit: the 32-bit gathers' offsets within reach of the images, against the largest;
//   - split_k: slices in order, none empty, tile-aligned, covering K; weight_split_slices' bounds;
//   - the TF32 path: tf32_round against the two TF32 neighbours of a float, tf32_operand_bits
//     against tf32_round through the tensor cores' truncation, the warps' pieces and mma.m16n8k8
//     fragments covering every tile once, the products the PTX's fragment layout makes from where
//     the kernel reads them (each output's A row and B column, each k of a step once), the 16-byte
//     A copies covering the A tile once, every shared load and store bank-conflict free.
// Runs in every build (the header needs no CUDA).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "petra/kernels/conv2d.hpp"
#include "petra/kernels/cuda/conv2d_tiling.cuh"

namespace {

namespace tiling = petra::kernels::cuda::conv2d_tiling;
using petra::kernels::Conv2dShape;
using tiling::ConvGeometry;

std::string describe(const Conv2dShape& s) {
  return "batch " + std::to_string(s.batch) + " C " + std::to_string(s.in_channels) + " " +
         std::to_string(s.in_h) + "x" + std::to_string(s.in_w) + " O " + std::to_string(s.out_channels) +
         " kernel " + std::to_string(s.kernel_h) + "x" + std::to_string(s.kernel_w) + " stride " +
         std::to_string(s.stride_h) + "," + std::to_string(s.stride_w) + " pad " + std::to_string(s.pad_h) +
         "," + std::to_string(s.pad_w);
}

std::vector<Conv2dShape> small_shapes() {
  std::vector<Conv2dShape> shapes;
  for (std::int64_t kh = 1; kh <= 4; ++kh)
    for (std::int64_t kw = 1; kw <= 3; ++kw)
      for (std::int64_t sh = 1; sh <= 3; ++sh)
        for (std::int64_t pad = 0; pad <= 2; ++pad)
          for (std::int64_t h = 1; h <= 7; h += 2)
            for (std::int64_t w : {1, 4, 6}) {
              Conv2dShape s{1 + (h + w) % 2, 1 + kh % 3, h, w, 2, kh, kw, sh, 1 + (sh + kw) % 3, pad, (pad + kh) % 3};
              if (s.in_h + 2 * s.pad_h < s.kernel_h || s.in_w + 2 * s.pad_w < s.kernel_w) continue;
              shapes.push_back(s);
            }
  std::mt19937_64 gen(7);
  auto pick = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(gen); };
  while (shapes.size() < 2200) {
    Conv2dShape s{pick(1, 3), pick(1, 5), pick(1, 23), pick(1, 23), pick(1, 3), pick(1, 7), pick(1, 7),
                  pick(1, 4), pick(1, 4), pick(0, 3), pick(0, 3)};
    if (s.in_h + 2 * s.pad_h < s.kernel_h || s.in_w + 2 * s.pad_w < s.kernel_w) continue;
    shapes.push_back(s);
  }
  return shapes;
}

}  // namespace

TEST_CASE("conv2d tiling: quotient, split_tap and split_pixel agree with / and %") {
  std::mt19937_64 gen(3);
  for (int trial = 0; trial < 100000; ++trial) {
    const std::int64_t a = trial < 50000 ? std::int64_t(gen() % (std::uint64_t(1) << 33))
                                         : std::int64_t(gen() >> 1);
    const std::int64_t b = 1 + std::int64_t(gen() % (trial % 3 == 0 ? (std::uint64_t(1) << 32) : 1000));
    REQUIRE(tiling::quotient(a, b) == a / b);
  }
  for (const std::int64_t a : {0LL, 1LL, 2147483646LL, 2147483647LL, 2147483648LL, 4294967296LL})
    for (const std::int64_t b : {1LL, 3LL, 2147483647LL, 2147483648LL}) CHECK(tiling::quotient(a, b) == a / b);
  for (std::int64_t kh = 1; kh <= 5; ++kh)
    for (std::int64_t kw = 1; kw <= 5; ++kw)
      for (std::int64_t k = 0; k < 7 * kh * kw; ++k) {
        const tiling::Tap t = tiling::split_tap(k, kh, kw);
        REQUIRE(t.c == k / (kh * kw));
        REQUIRE(t.i == k % (kh * kw) / kw);
        REQUIRE(t.j == k % kw);
        REQUIRE((t.c * kh + t.i) * kw + t.j == k);
      }
  for (std::int64_t h = 1; h <= 9; ++h)
    for (std::int64_t w = 1; w <= 9; ++w)
      for (std::int64_t n = 0; n < 3 * h * w; ++n) {
        const tiling::Pixel p = tiling::split_pixel(n, h, w);
        REQUIRE(p.y >= 0);
        REQUIRE(p.y < h);
        REQUIRE(p.x >= 0);
        REQUIRE(p.x < w);
        REQUIRE((p.b * h + p.y) * w + p.x == n);
      }
}

// The K loop's table writer starts from split_digits(k_begin + t) and calls advance by the digits
// of the step once per step: the digits it reaches must be those of k_begin + t + n * step.
TEST_CASE("conv2d tiling: split_digits, and advance by a step's digits, agree with splitting again") {
  for (std::int32_t mid_n = 1; mid_n <= 9; ++mid_n)
    for (std::int32_t lo_n = 1; lo_n <= 35; ++lo_n) {
      const tiling::Radix r{mid_n, lo_n};
      for (const std::int32_t step : {1, 3, 16, 32, 81}) {
        const tiling::Digits s = tiling::split_digits(step, r);
        for (std::int64_t start = 0; start < 20; start += 7) {
          tiling::Digits d = tiling::split_digits(start, r);
          for (std::int64_t k = start; k < start + 60 * step; k += step) {
            CAPTURE(mid_n);
            CAPTURE(lo_n);
            CAPTURE(step);
            CAPTURE(k);
            REQUIRE(d.hi == k / (std::int64_t(mid_n) * lo_n));
            REQUIRE(d.mid == k / lo_n % mid_n);
            REQUIRE(d.lo == k % lo_n);
            d = tiling::advance(d, s, r);
          }
        }
      }
    }
  // split_digits is split_tap's and split_pixel's split
  const tiling::Tap t = tiling::split_tap(1234, 3, 5);
  const tiling::Digits d = tiling::split_digits(1234, {3, 5});
  CHECK(t.c == d.hi);
  CHECK(t.i == d.mid);
  CHECK(t.j == d.lo);
  // near the 32-bit limit (a launch's K stays below 2^31)
  const tiling::Radix big{32, 32};
  tiling::Digits e = tiling::split_digits(2147483647LL - 16 * 10, big);
  for (int n = 0; n < 10; ++n) e = tiling::advance(e, tiling::split_digits(16, big), big);
  CHECK(e.hi == 2147483647LL / 1024);
  CHECK(e.mid == 2147483647LL / 32 % 32);
  CHECK(e.lo == 2147483647LL % 32);
}

TEST_CASE("conv2d tiling: the gathered operands are im2col and its transpose, on every small shape") {
  std::size_t shapes = 0, gathers = 0;
  for (const Conv2dShape& s : small_shapes()) {
    ++shapes;
    const ConvGeometry g = ConvGeometry::of(s);
    INFO(describe(s));
    REQUIRE(g.out_h == s.out_h());
    REQUIRE(g.out_w == s.out_w());
    // Forward / weight operand: (tap k, output pixel n) -> x offset, as ref::'s loops.
    const std::int64_t taps = s.in_channels * s.kernel_h * s.kernel_w;
    const std::int64_t pixels = s.batch * g.out_h * g.out_w;
    // which (tap, output pixel) pairs read x element e: the transpose, for the data pass below
    std::map<std::int64_t, std::vector<std::int64_t>> readers;
    for (std::int64_t n = 0; n < pixels; ++n) {
      const std::int64_t b = n / (g.out_h * g.out_w), oh = n / g.out_w % g.out_h, ow = n % g.out_w;
      const tiling::OutputPixel op = tiling::output_pixel(g, n);
      for (std::int64_t k = 0; k < taps; ++k) {
        const std::int64_t c = k / (s.kernel_h * s.kernel_w), i = k / s.kernel_w % s.kernel_h, j = k % s.kernel_w;
        const std::int64_t h = oh * s.stride_h - s.pad_h + i, w = ow * s.stride_w - s.pad_w + j;
        const bool inside = h >= 0 && h < s.in_h && w >= 0 && w < s.in_w;
        const std::int64_t want = inside ? ((b * s.in_channels + c) * s.in_h + h) * s.in_w + w : -1;
        const tiling::Tap t = tiling::split_tap(k, s.kernel_h, s.kernel_w);
        REQUIRE(tiling::tap_inside(g, op, t) == inside);
        // the kernels' form of the check (ForwardProblem, WeightProblem): masks of a pixel's taps
        // inside against the tap's bits
        const std::uint32_t taps_h = tiling::taps_inside(std::int32_t(op.h0), std::int32_t(s.in_h)),
                            taps_w = tiling::taps_inside(std::int32_t(op.w0), std::int32_t(s.in_w));
        REQUIRE(tiling::bits_meet(taps_h, tiling::tap_bit(std::int32_t(t.i)), taps_w,
                                  tiling::tap_bit(std::int32_t(t.j))) == inside);
        if (inside) REQUIRE(tiling::corner_offset(g, op) + tiling::tap_offset(g, t) == want);
        ++gathers;
      }
    }
    // Backward data by stride classes: enumerating each class's input pixels (b, h, w) and taps
    // (i, j) and meeting them at out0 + u - v must give exactly the pairs where an output pixel
    // reads x[b, :, h, w] through tap (i, j) (found by trying every output pixel), each once, at
    // that output pixel; every input pixel must be in exactly one class.
    std::map<std::array<std::int64_t, 5>, std::int64_t> reached;  // (b, h, w, i, j) -> oh * out_w + ow
    std::vector<int> classes_of_pixel(std::size_t(s.batch * s.in_h * s.in_w), 0);
    for (std::int64_t r_h = 0; r_h < s.stride_h; ++r_h)
      for (std::int64_t r_w = 0; r_w < s.stride_w; ++r_w) {
        const tiling::StrideClass ch = tiling::stride_class(r_h, s.stride_h, s.pad_h, s.in_h, s.kernel_h);
        const tiling::StrideClass cw = tiling::stride_class(r_w, s.stride_w, s.pad_w, s.in_w, s.kernel_w);
        for (std::int64_t n = 0; n < s.batch * ch.count * cw.count; ++n) {
          const tiling::Pixel p = tiling::split_pixel(n, ch.count, cw.count);
          const std::int64_t h = ch.first + p.y * s.stride_h, w = cw.first + p.x * s.stride_w;
          REQUIRE(h < s.in_h);
          REQUIRE(w < s.in_w);
          REQUIRE((h + s.pad_h) % s.stride_h == r_h);
          REQUIRE((w + s.pad_w) % s.stride_w == r_w);
          ++classes_of_pixel[std::size_t((p.b * s.in_h + h) * s.in_w + w)];
          // DataProblem's check: the class's taps v with (oh0 - v, ow0 - v) inside dy, as masks
          const std::int64_t oh0 = ch.out0 + p.y, ow0 = cw.out0 + p.x;
          const std::uint32_t taps_h = tiling::bit_range(std::int32_t(oh0 - g.out_h + 1), std::int32_t(oh0 + 1)),
                              taps_w = tiling::bit_range(std::int32_t(ow0 - g.out_w + 1), std::int32_t(ow0 + 1));
          for (std::int64_t v_i = 0; v_i < ch.taps; ++v_i)
            for (std::int64_t v_j = 0; v_j < cw.taps; ++v_j) {
              const std::int64_t oh = ch.out0 + p.y - v_i, ow = cw.out0 + p.x - v_j;
              const bool inside = oh >= 0 && oh < g.out_h && ow >= 0 && ow < g.out_w;
              REQUIRE(tiling::bits_meet(taps_h, tiling::tap_bit(std::int32_t(v_i)), taps_w,
                                        tiling::tap_bit(std::int32_t(v_j))) == inside);
              if (!inside) continue;
              const std::array<std::int64_t, 5> key{p.b, h, w, ch.tap0 + v_i * s.stride_h, cw.tap0 + v_j * s.stride_w};
              REQUIRE(key[3] < s.kernel_h);
              REQUIRE(key[4] < s.kernel_w);
              REQUIRE(reached.count(key) == 0);
              reached[key] = oh * g.out_w + ow;
            }
        }
      }
    for (const int classes : classes_of_pixel) REQUIRE(classes == 1);
    std::size_t pairs = 0;
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t oh = 0; oh < g.out_h; ++oh)
        for (std::int64_t ow = 0; ow < g.out_w; ++ow)
          for (std::int64_t i = 0; i < s.kernel_h; ++i)
            for (std::int64_t j = 0; j < s.kernel_w; ++j) {
              const std::int64_t h = oh * s.stride_h - s.pad_h + i, w = ow * s.stride_w - s.pad_w + j;
              if (h < 0 || h >= s.in_h || w < 0 || w >= s.in_w) continue;
              const auto found = reached.find({b, h, w, i, j});
              REQUIRE(found != reached.end());
              REQUIRE(found->second == oh * g.out_w + ow);
              ++pairs;
              ++gathers;
            }
    REQUIRE(pairs == reached.size());
  }
  MESSAGE(shapes, " shapes, ", gathers, " gathers checked");
}

// The bounds check as bit tests (bit_range, taps_inside, bits_meet) against comparisons, over
// every bit of the 32 and intervals reaching past both ends; a zero mask or bit meets nothing (the
// entries past k_end and the columns past a product's end).
TEST_CASE("conv2d tiling: the bit-test bounds check agrees with comparisons") {
  for (std::int32_t lo = -40; lo <= 40; ++lo)
    for (std::int32_t hi = -40; hi <= 40; ++hi) {
      std::uint32_t want = 0;
      for (std::int32_t v = 0; v < 32; ++v)
        if (lo <= v && v < hi) want |= std::uint32_t(1) << v;
      REQUIRE(tiling::bit_range(lo, hi) == want);
    }
  for (std::int32_t first = -40; first <= 40; ++first)
    for (std::int32_t extent = 0; extent <= 40; ++extent)
      for (std::int32_t i = 0; i < 32; ++i) {
        const bool inside = first + i >= 0 && first + i < extent;
        REQUIRE(((tiling::taps_inside(first, extent) & tiling::tap_bit(i)) != 0) == inside);
      }
  CHECK(tiling::tap_bit(31) == 0x80000000u);
  CHECK_FALSE(tiling::bits_meet(0, ~0u, ~0u, ~0u));
  CHECK_FALSE(tiling::bits_meet(~0u, ~0u, ~0u, 0));
  CHECK(tiling::bits_meet(0x80000000u, tiling::tap_bit(31), 1, tiling::tap_bit(0)));
  CHECK_FALSE(tiling::bits_meet(0x7fffffffu, tiling::tap_bit(31), 1, tiling::tap_bit(0)));
}

// offsets_fit against the largest offset, and intermediate, that ((image * h + r) * w + c) *
// channels + channel takes over every row and column within reach of the images: never true
// where one is over the limit, and true once the limit is one above the largest (the bound is
// tight but for that one).
TEST_CASE("conv2d tiling: offsets_fit bounds every offset within reach of the images") {
  for (std::int64_t images = 1; images <= 3; ++images)
    for (std::int64_t h = 1; h <= 4; ++h)
      for (std::int64_t w = 1; w <= 4; ++w)
        for (std::int64_t channels = 1; channels <= 3; ++channels)
          for (std::int64_t reach_h = 1; reach_h <= 3; ++reach_h)
            for (std::int64_t reach_w = 1; reach_w <= 3; ++reach_w) {
              std::int64_t largest = 0;
              for (std::int64_t image = 0; image < images; ++image)
                for (std::int64_t r = -reach_h; r < h + reach_h; ++r)
                  for (std::int64_t c = -reach_w; c < w + reach_w; ++c)
                    for (std::int64_t channel = 0; channel < channels; ++channel) {
                      const std::int64_t row = (image * h + r) * w, corner = (row + c) * channels;
                      largest = std::max({largest, std::abs(row), std::abs(corner), std::abs(corner + channel)});
                    }
              for (std::int64_t limit = largest - 3; limit <= largest + 3; ++limit)
                if (tiling::offsets_fit(images, h, w, channels, reach_h, reach_w, limit)) REQUIRE(largest <= limit);
              REQUIRE(tiling::offsets_fit(images, h, w, channels, reach_h, reach_w, largest + 1));
            }
  // At 2^31: ResNet-18's largest CIFAR layer at batch 128 fits either way; a padding of 128
  // around 2^24 floats of one image puts a channels-last corner past -2^31, not an NCHW one.
  CHECK(tiling::offsets_fit(128, 32, 32, 64, 1 + 3, 1 + 3));
  CHECK(tiling::offsets_fit(128 * 64, 32, 32, 1, 1 + 3, 1 + 3));
  CHECK_FALSE(tiling::offsets_fit(1, 1, 4096, 4096, 128 + 1, 128 + 1));
  CHECK(tiling::offsets_fit(4096, 1, 4096, 1, 128 + 1, 128 + 1));
}

TEST_CASE("conv2d tiling: stride_class partitions coordinates and taps by residue") {
  for (std::int64_t stride = 1; stride <= 4; ++stride)
    for (std::int64_t pad = 0; pad <= 3; ++pad)
      for (std::int64_t extent = 1; extent <= 9; ++extent)
        for (std::int64_t kernel = 1; kernel <= 7; ++kernel) {
          std::int64_t coordinates = 0, taps = 0;
          for (std::int64_t r = 0; r < stride; ++r) {
            const tiling::StrideClass c = tiling::stride_class(r, stride, pad, extent, kernel);
            std::int64_t want_count = 0, want_first = -1, want_taps = 0;
            for (std::int64_t h = 0; h < extent; ++h)
              if ((h + pad) % stride == r) want_first = want_first < 0 ? h : want_first, ++want_count;
            for (std::int64_t i = 0; i < kernel; ++i) want_taps += i % stride == r;
            REQUIRE(c.count == want_count);
            if (want_count > 0) REQUIRE(c.first == want_first);
            REQUIRE(c.tap0 == r);
            REQUIRE(c.taps == want_taps);
            REQUIRE(c.out0 * stride == c.first + pad - r);
            coordinates += c.count;
            taps += c.taps;
          }
          REQUIRE(coordinates == extent);
          REQUIRE(taps == kernel);
        }
}

namespace {
// Every element of Tile's A tile (M x K), B tile (K x N) and C tile (M x N) is loaded,
// or computed, by exactly one (thread, q); a thread keeps one B column and one k of A; its
// outputs come in groups of 4 consecutive rows and columns, each group 16-byte aligned.
template <class Tile>
void check_tile_coverage() {
  constexpr int M = Tile::kM, N = Tile::kN, K = Tile::kK;
  CAPTURE(M);
  CAPTURE(N);
  CAPTURE(K);
  std::vector<int> a(M * K, 0), b(K * N, 0), c(M * N, 0);
  for (int t = 0; t < tiling::kThreads; ++t) {
    for (int q = 0; q < Tile::kLoadsA; ++q) {
      const tiling::TileCoordinate at = Tile::a_load(t, q);
      REQUIRE(at.mn >= 0);
      REQUIRE(at.mn < M);
      REQUIRE(at.k >= 0);
      REQUIRE(at.k < K);
      ++a[at.mn * K + at.k];
      CHECK(at.k == Tile::a_load(t, 0).k);
    }
    for (int q = 0; q < Tile::kLoadsB; ++q) {
      const tiling::TileCoordinate bt = Tile::b_load(t, q);
      REQUIRE(bt.mn >= 0);
      REQUIRE(bt.mn < N);
      REQUIRE(bt.k >= 0);
      REQUIRE(bt.k < K);
      ++b[bt.k * N + bt.mn];
      // the kernel keeps one B column per thread for the whole K loop
      CHECK(bt.mn == Tile::b_load(t, 0).mn);
      // and writes it at b_load_row, its k's row
      CHECK(Tile::b_load_row(t, q) == Tile::b_row(bt.k));
    }
    for (int r = 0; r < Tile::kMicroM; ++r)
      for (int q = 0; q < Tile::kMicroN; ++q) {
        const int row = Tile::micro_row(t, r), column = Tile::micro_column(t, q);
        REQUIRE(row >= 0);
        REQUIRE(row < M);
        REQUIRE(column >= 0);
        REQUIRE(column < N);
        ++c[row * N + column];
        if (r % 4 != 0) CHECK(row == Tile::micro_row(t, r - 1) + 1);
        if (q % 4 != 0) CHECK(column == Tile::micro_column(t, q - 1) + 1);
        if (r % 4 == 0) CHECK(row % 4 == 0);
        if (q % 4 == 0) CHECK(column % 4 == 0);
      }
  }
  for (const int count : a) CHECK(count == 1);
  for (const int count : b) CHECK(count == 1);
  for (const int count : c) CHECK(count == 1);
  CHECK(Tile::kLdA % 4 == 0);
  CHECK(Tile::kLdB % 4 == 0);
}
}  // namespace

TEST_CASE("conv2d tiling: each tile element is loaded once and computed once, in every tile shape") {
  check_tile_coverage<tiling::TileShape<64, 64>>();
  check_tile_coverage<tiling::TileShape<64, 128>>();
  check_tile_coverage<tiling::TileShape<128, 64>>();
  check_tile_coverage<tiling::TileShape<128, 128>>();
  // the TF32 path's: rows padded by 8 floats
  check_tile_coverage<tiling::Tf32Tile<64, 64>>();
  check_tile_coverage<tiling::Tf32Tile<64, 128>>();
  check_tile_coverage<tiling::Tf32Tile<128, 64>>();
  check_tile_coverage<tiling::Tf32Tile<128, 128>>();
  check_tile_coverage<tiling::Tf32TileK32<128, 128>>();
  // the K loop's pipeline: three stages where they fit in 40 KiB of shared memory, else two
  CHECK(tiling::TileShape<64, 64>::kStages == 3);
  CHECK(tiling::TileShape<64, 128>::kStages == 3);
  CHECK(tiling::TileShape<128, 128>::kStages == 2);
  CHECK(tiling::Tf32Tile<64, 64>::kStages == 3);
  CHECK(tiling::Tf32Tile<128, 64>::kStages == 3);
  CHECK(tiling::Tf32Tile<128, 128>::kStages == 2);
  CHECK(tiling::Tf32Tile<128, 128>::kStages * tiling::Tf32Tile<128, 128>::kStageBytes <= 40 * 1024);
  CHECK_FALSE(tiling::Tf32Tile<128, 128>::kDynamicShared);
  // the K step of 32: three stages in dynamic shared memory, within an H100's 227 KB and an A100's 163 KB
  CHECK(tiling::Tf32TileK32<128, 128>::kDynamicShared);
  CHECK(tiling::Tf32TileK32<128, 128>::kStages == 3);
  CHECK(tiling::Tf32TileK32<128, 128>::kDynamicSharedBytes == 3 * (2 * 129 * 16 + 32 * 136) * 4);
  CHECK(tiling::Tf32TileK32<128, 128>::kDynamicSharedBytes <= 160 * 1024);
}

// The rule, on the ResNet-18 CIFAR layers at batch 128 (the shapes bench-cuda times, each tile's
// time in docs/results-gpu.md run 11) and at its thresholds.
TEST_CASE("conv2d tiling: choose_tile's rule per pass, on the ResNet-18 CIFAR layers at batch 128") {
  using tiling::ConvPass;
  using tiling::TileChoice;
  using tiling::choose_tile;
  // forward: rows = out-channels, columns = 128 x the output plane
  CHECK(choose_tile(ConvPass::forward, 64, 128 * 1024, 1) == TileChoice::k64x128);    // 64 rows: never 128-row tiles
  CHECK(choose_tile(ConvPass::forward, 128, 128 * 256, 1) == TileChoice::k128x128);   // 256 blocks
  CHECK(choose_tile(ConvPass::forward, 256, 128 * 64, 1) == TileChoice::k128x128);    // exactly 128 blocks
  CHECK(choose_tile(ConvPass::forward, 256, 128 * 63, 1) == TileChoice::k128x64);     // 126 of 128 x 128
  CHECK(choose_tile(ConvPass::forward, 512, 128 * 16, 1) == TileChoice::k128x64);     // 128 blocks of 128 x 64
  CHECK(choose_tile(ConvPass::forward, 512, 128 * 15, 1) == TileChoice::k64x64);      // 120 of either larger tile
  // backward data: rows = in-channels, columns = the widest stride class, layers = the classes
  CHECK(choose_tile(ConvPass::data, 3, 128 * 1024, 1) == TileChoice::k64x128);
  CHECK(choose_tile(ConvPass::data, 64, 128 * 256, 4) == TileChoice::k64x128);
  CHECK(choose_tile(ConvPass::data, 128, 128 * 64, 4) == TileChoice::k128x128);       // 256 blocks over 4 classes
  CHECK(choose_tile(ConvPass::data, 256, 128 * 64, 1) == TileChoice::k128x128);
  CHECK(choose_tile(ConvPass::data, 512, 128 * 16, 1) == TileChoice::k128x64);
  CHECK(choose_tile(ConvPass::data, 512, 64, 64) == TileChoice::k128x64);             // 64 columns: 128-row tiles
  // backward weight: rows = out-channels, columns = in-channels x taps, layers = the K slices
  CHECK(choose_tile(ConvPass::weight, 64, 576, 64) == TileChoice::k64x64);            // 64 rows, never 64 x 128
  CHECK(choose_tile(ConvPass::weight, 128, 576, 32) == TileChoice::k128x64);          // 160 < 192 blocks of 128 x 128
  CHECK(choose_tile(ConvPass::weight, 128, 1152, 28) == TileChoice::k128x128);        // 252 blocks
  CHECK(choose_tile(ConvPass::weight, 256, 2304, 7) == TileChoice::k128x128);
  CHECK(choose_tile(ConvPass::weight, 512, 4608, 1) == TileChoice::k128x64);          // 144 blocks of 128 x 128
  CHECK(choose_tile(ConvPass::weight, 128, 64, 32) == TileChoice::k64x64);            // 64 columns, 32 blocks
  CHECK(choose_tile(ConvPass::weight, 64, 128 * 1024, 1) == TileChoice::k64x64);      // never 64 x 128
  // small products keep the small tile
  for (const ConvPass pass : {ConvPass::forward, ConvPass::data, ConvPass::weight}) {
    CHECK(choose_tile(pass, 65, 65, 1) == TileChoice::k64x64);
    CHECK(choose_tile(pass, 0, 0, 1) == TileChoice::k64x64);
    CHECK(choose_tile(pass, 1 << 20, 1 << 20, 64) == TileChoice::k128x128);
  }
}

TEST_CASE("conv2d tiling: split_k cuts K into ordered, non-empty, tile-aligned slices") {
  for (std::int64_t total = 1; total <= 700; ++total)
    for (std::int64_t wanted = 1; wanted <= 12; ++wanted) {
      const tiling::SplitK split = tiling::split_k(total, wanted);
      INFO("K = ", total, ", wanted ", wanted);
      REQUIRE(split.slices >= 1);
      REQUIRE(split.slices <= wanted);
      REQUIRE(split.slice_length % tiling::kTileK == 0);
      REQUIRE(split.begin(0) == 0);
      REQUIRE(split.end(split.slices - 1) == total);
      for (std::int64_t s = 0; s < split.slices; ++s) {
        REQUIRE(split.begin(s) < split.end(s));
        REQUIRE(split.begin(s) % tiling::kTileK == 0);
        if (s > 0) REQUIRE(split.begin(s) == split.end(s - 1));
      }
      // as many slices as asked for whenever K has enough tile steps to fill them evenly
      if ((total + tiling::kTileK - 1) / tiling::kTileK % wanted == 0) CHECK(split.slices == wanted);
    }
  // K = 0 (an empty batch): one empty slice
  CHECK(tiling::split_k(0, 4).slices == 1);
  CHECK(tiling::split_k(0, 4).end(0) == 0);
}

TEST_CASE("conv2d tiling: the weight gradient's slices respect their bounds") {
  // (batch, C, H, W, O, k, stride, pad)
  struct Case {
    std::int64_t batch, c, h, w, o, k, stride, pad;
  };
  const std::vector<Case> cases = {
      {1, 1, 1, 1, 1, 1, 1, 0},        {3, 1, 27, 27, 1, 1, 1, 0},      {256, 64, 56, 56, 64, 3, 1, 1},
      {256, 3, 224, 224, 64, 7, 2, 3}, {256, 512, 7, 7, 512, 3, 1, 1},  {128, 2048, 7, 7, 512, 1, 1, 0},
      {1, 4096, 3, 3, 4096, 3, 1, 1},  {4096, 1, 64, 64, 1, 1, 1, 0},   {2, 8, 33, 33, 8, 3, 2, 1},
  };
  for (const Case& c : cases) {
    const Conv2dShape s = petra::kernels::conv2d_shape(c.batch, c.c, c.h, c.w, c.o, c.k, c.stride, c.pad);
    const std::int64_t k = s.batch * s.out_h() * s.out_w();
    const std::int64_t slices = tiling::weight_split_slices(s);
    INFO(describe(s), " -> ", slices, " slices");
    CHECK(slices >= 1);
    CHECK(slices <= tiling::kWeightMaxSlices);
    CHECK(slices == tiling::split_k(k, slices).slices);  // what the kernel will run
    if (slices > 1) {
      CHECK(slices * s.weight_size() * 4 <= tiling::kWeightMaxPartialBytes);
      CHECK(tiling::split_k(k, slices).slice_length >= tiling::kWeightSliceMinK);
    }
  }
  CHECK(tiling::weight_split_slices(petra::kernels::conv2d_shape(1, 1, 1, 1, 1, 1, 1, 0)) == 1);
  CHECK(tiling::weight_split_slices(petra::kernels::conv2d_shape(3, 1, 19, 19, 1, 1, 1, 0)) == 1);  // K = 1083
  CHECK(tiling::weight_split_slices(petra::kernels::conv2d_shape(3, 1, 27, 27, 1, 1, 1, 0)) == 2);  // K = 2187
  CHECK(tiling::weight_split_slices(petra::kernels::conv2d_shape(256, 64, 56, 56, 64, 3, 1, 1)) == 64);
  // 4096 x 36864 weights: 576 MiB of partials per slice, so no split
  CHECK(tiling::weight_split_slices(petra::kernels::conv2d_shape(1, 4096, 3, 3, 4096, 3, 1, 1)) == 1);
}

TEST_CASE("conv2d tiling: the forward's and backward data's K slices (split-K), on the ResNet-18 CIFAR layers") {
  using petra::kernels::conv2d_shape;
  // batch 128: the 512-channel 4 x 4 layers have 4 x 16 = 64 tiles of 128 x 128: two slices
  const Conv2dShape layer4 = conv2d_shape(128, 512, 4, 4, 512, 3, 1, 1);
  CHECK(tiling::forward_output_split(layer4).slices == 2);
  CHECK(tiling::data_output_split(layer4).slices == 2);
  CHECK(tiling::forward_output_split(layer4).slice_length == 2304);
  // the stride-2 layer into it: 64 tiles, K = 2304 (forward); backward data at stride 2 never splits
  const Conv2dShape layer4_down = conv2d_shape(128, 256, 8, 8, 512, 3, 2, 1);
  CHECK(tiling::forward_output_split(layer4_down).slices == 2);
  CHECK(tiling::data_output_split(layer4_down).slices == 1);
  // its 1x1 shortcut: K = 256, under two slices of 512 terms
  CHECK(tiling::forward_output_split(conv2d_shape(128, 256, 8, 8, 512, 1, 2, 0)).slices == 1);
  // 128 tiles or more: no split (the 8 x 8 and larger layers)
  for (const Conv2dShape& s : {conv2d_shape(128, 256, 8, 8, 256, 3, 1, 1), conv2d_shape(128, 128, 16, 16, 128, 3, 1, 1),
                               conv2d_shape(128, 64, 32, 32, 64, 3, 1, 1)}) {
    INFO(describe(s));
    CHECK(tiling::forward_output_split(s).slices == 1);
    CHECK(tiling::data_output_split(s).slices == 1);
  }
  // batch 64: 32 tiles, four slices of 1152 terms
  const tiling::SplitK four = tiling::forward_output_split(conv2d_shape(64, 512, 4, 4, 512, 3, 1, 1));
  CHECK(four.slices == 4);
  CHECK(four.slice_length == 1152);
  // a side of 64 or less, or K under two slices of min_k: no split
  CHECK(tiling::output_split(64, 4096, 1 << 16).slices == 1);
  CHECK(tiling::output_split(4096, 64, 1 << 16).slices == 1);
  CHECK(tiling::output_split(512, 2048, 1023).slices == 1);
  CHECK(tiling::output_split(512, 2048, 1024).slices == 2);
  CHECK(tiling::output_split(512, 2048, 1024, 64).slices == 2);
  CHECK(tiling::output_split(65, 65, 1 << 20).slices == 4);   // one tile: at most four slices
  CHECK(tiling::output_split(65, 65, 255, 64).slices == 3);   // 255 / 64: three
  // every split is split_k's (ordered, tile-aligned slices covering K), each slice >= min_k terms
  // but the last
  for (std::int64_t rows : {65, 200, 512, 1000})
    for (std::int64_t columns : {65, 300, 2048, 5000})
      for (std::int64_t depth : {1, 100, 600, 1500, 4608, 9999}) {
        const tiling::SplitK split = tiling::output_split(rows, columns, depth);
        INFO(rows, " x ", columns, ", K = ", depth, ": ", split.slices, " slices");
        CHECK(split.total == depth);
        CHECK(split.slices >= 1);
        CHECK(split.slices <= tiling::kOutputMaxSlices);
        CHECK(split.end(split.slices - 1) == depth);
        if (split.slices > 1) {
          CHECK(split.slice_length >= tiling::kOutputSliceMinK);
          CHECK(split.slice_length % tiling::kTileK == 0);
          CHECK(tiling::ceil_div(rows, 128) * tiling::ceil_div(columns, 128) < tiling::kMinBlocksFor128x128);
        }
      }
}

TEST_CASE("conv2d tiling: tf32_round keeps 10 mantissa bits, to nearest, ties away from zero") {
  const auto bits = [](float f) { return std::bit_cast<std::uint32_t>(f); };
  const float one = 1.0f, ulp = std::ldexp(1.0f, -10);  // TF32's unit in the last place at 1
  CHECK(tiling::tf32_round(one) == one);
  CHECK(tiling::tf32_round(one + ulp) == one + ulp);
  CHECK(tiling::tf32_round(one + ulp / 2) == one + ulp);                        // a tie: away from zero
  CHECK(tiling::tf32_round(-(one + ulp / 2)) == -(one + ulp));
  CHECK(tiling::tf32_round(std::nextafter(one + ulp / 2, 0.0f)) == one);        // below the tie: down
  CHECK(tiling::tf32_round(one + 3 * ulp / 2) == one + 2 * ulp);                // a tie with an odd last bit
  CHECK(tiling::tf32_round(std::nextafter(2.0f, 0.0f)) == 2.0f);                // carries into the exponent
  CHECK(tiling::tf32_round(0.0f) == 0.0f);
  CHECK(std::signbit(tiling::tf32_round(-0.0f)));
  CHECK(std::isinf(tiling::tf32_round(std::numeric_limits<float>::infinity())));
  CHECK(std::isnan(tiling::tf32_round(std::numeric_limits<float>::quiet_NaN())));
  std::mt19937_64 gen(11);
  std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
  for (int trial = 0; trial < 100000; ++trial) {
    const float x = trial % 2 ? dist(gen) : std::ldexp(dist(gen), -120);  // normal and subnormal
    const float r = tiling::tf32_round(x);
    REQUIRE((bits(r) & 0x1fffu) == 0);                                      // 13 low bits gone
    // the nearest of the two TF32 neighbours of x (ties away from zero)
    const float down = std::bit_cast<float>(bits(x) & ~0x1fffu);            // towards zero
    const float up = std::bit_cast<float>((bits(x) & ~0x1fffu) + 0x2000u);  // away from zero
    const double dd = std::abs(double(x) - double(down)), du = std::abs(double(up) - double(x));
    REQUIRE(r == (du <= dd ? up : down));
  }
}

TEST_CASE("conv2d tiling: tf32_operand_bits hands the tensor cores tf32_round's 19 leading bits") {
  const auto bits = [](float f) { return std::bit_cast<std::uint32_t>(f); };
  // what an mma reads of an operand: its 19 leading bits (it truncates the 13 others)
  const auto read = [](std::uint32_t b) { return std::bit_cast<float>(b & ~0x1fffu); };
  const float one = 1.0f, ulp = std::ldexp(1.0f, -10);
  CHECK(read(bits(one + 0.75f * ulp)) == one);  // truncated, the value the rounding must avoid
  CHECK(read(tiling::tf32_operand_bits(bits(one + 0.75f * ulp))) == one + ulp);
  CHECK(read(tiling::tf32_operand_bits(bits(-(one + ulp / 2)))) == -(one + ulp));  // a tie: away from zero
  const float inf = std::numeric_limits<float>::infinity(), max = std::numeric_limits<float>::max();
  CHECK(read(tiling::tf32_operand_bits(bits(max))) == inf);  // rounds up out of range, as tf32_round
  CHECK(tiling::tf32_round(max) == inf);
  CHECK(read(tiling::tf32_operand_bits(bits(-inf))) == -inf);
  // NaNs stay NaNs, the all-ones payload included (a plain add would carry it into the sign: -0)
  for (const std::uint32_t nan : {0x7fffffffu, 0xffffffffu, 0x7fc00000u, 0x7fffe000u})
    CHECK(std::isnan(read(tiling::tf32_operand_bits(nan))));
  std::mt19937_64 gen(12);
  std::uniform_int_distribution<std::uint32_t> any;
  for (int trial = 0; trial < 200000; ++trial) {
    const std::uint32_t b = any(gen);
    const float x = std::bit_cast<float>(b);
    if (!std::isfinite(x)) continue;
    REQUIRE(bits(read(tiling::tf32_operand_bits(b))) == bits(tiling::tf32_round(x)));
  }
}

namespace {
// Tile's warps (WarpLayout) and their lanes' mma.m16n8k8 accumulator elements (Tf32Fragment)
// cover its output once; the A tile's places (a_row, a_column) hold each A(m, k) once, and a
// lane's four A operands of a k8 step, in the mma's order, are one aligned 16-byte load, as are
// the B columns of four fragments (tf32_b_slot) at one of its k (tf32_b_row); each shared load of
// a fragment puts the lanes of a quarter-warp (how the hardware serves 16-byte accesses) on 32
// different banks. The 16-byte A copies land where their values belong (so their thread rounds
// them into place alone) on 32 banks; the scalar ones reach at most 2 ways of a bank, B's 32.
template <class Tile>
void check_warp_layout() {
  using Warps = tiling::WarpLayout<Tile>;
  constexpr int FM = Warps::kFragmentsM, FN = Warps::kFragmentsN;
  using Fragment = tiling::Tf32Fragment<FM>;
  CAPTURE(Tile::kM);
  CAPTURE(Tile::kN);
  CAPTURE(Tile::kK);
  std::vector<int> c(Tile::kM * Tile::kN, 0);
  for (int warp = 0; warp < Warps::kWarps; ++warp)
    for (int lane = 0; lane < 32; ++lane)
      for (int fm = 0; fm < FM; ++fm)
        for (int fn = 0; fn < FN; ++fn)
          for (int e = 0; e < 4; ++e) {
            const int row = Warps::row(warp) + Fragment::row(fm, e / 2, lane / 4);
            const int column = Warps::column(warp) + Fragment::column(fn, lane % 4, e % 2);
            REQUIRE(row < Tile::kM);
            REQUIRE(column < Tile::kN);
            ++c[row * Tile::kN + column];
          }
  for (const int count : c) CHECK(count == 1);
  // B's columns: a permutation of each row's N slots; a warp of writers (32 consecutive columns of
  // one k) on 32 banks
  std::set<int> slots;
  for (int n = 0; n < Tile::kN; ++n) slots.insert(Tile::b_slot(n));
  CHECK(slots.size() == std::size_t(Tile::kN));
  CHECK(*slots.rbegin() == Tile::kN - 1);
  for (int first = 0; first < Tile::kN; first += 32) {
    std::set<int> banks;
    for (int n = first; n < first + 32; ++n) banks.insert((Tile::b_row(3) * Tile::kLdB + Tile::b_slot(n)) % 32);
    CHECK(banks.size() == 32);
  }
  // The A tile's places (a_row, a_column) hold each A(m, k) of the step once.
  std::map<std::pair<int, int>, std::pair<int, int>> a_of;  // (row, column) -> (m, k)
  for (int m = 0; m < Tile::kM; ++m)
    for (int k = 0; k < Tile::kK; ++k) {
      const int row = Tile::a_row(m, k), column = Tile::a_column(m, k);
      REQUIRE(row < Tile::kARows);
      REQUIRE(column < Tile::kLdA);
      a_of[{row, column}] = {m, k};
    }
  CHECK(a_of.size() == std::size_t(Tile::kM * Tile::kK));
  // The 16-byte A copies (a_vector_load): threads below kVectorThreadsA copy k 4 j .. 4 j + 3 of
  // two rows each to a_tile[row][4 j ..], covering the tile once; the 8 places a thread's copies
  // land on are where a_row and a_column put the same 8 values (so it rounds them into place
  // alone); a quarter-warp's 8 copies on 32 banks.
  // (At K = 32 the thread copies the same cells of k + 16 into the second block of M rows.)
  std::vector<int> landed(Tile::kARows * Tile::kLdA, 0);
  for (int t = 0; t < Tile::kVectorThreadsA; ++t)
    for (int group = 0; group < Tile::kVectorGroupsA; ++group) {
      std::set<std::pair<int, int>> lands, places;
      for (int v = 0; v < Tile::kVectorLoadsA; ++v) {
        const tiling::TileCoordinate at = Tile::a_vector_load(t, v);
        REQUIRE(at.mn < Tile::kM);
        REQUIRE(at.k % 4 == 0);
        REQUIRE(at.k + 4 <= 16);
        const int row = group * Tile::kABlockRows + at.mn, k = 16 * group + at.k;
        for (int i = 0; i < 4; ++i) {
          ++landed[row * Tile::kLdA + at.k + i];
          lands.insert({row, at.k + i});
          places.insert({Tile::a_row(at.mn, k + i), Tile::a_column(at.mn, k + i)});
        }
      }
      CHECK(lands == places);
    }
  for (int i = 0; i < int(landed.size()); ++i)  // (once each, but the padding row after a block's M)
    CHECK(landed[std::size_t(i)] == (i / Tile::kLdA % Tile::kABlockRows < Tile::kM ? 1 : 0));
  for (int v = 0; v < Tile::kVectorLoadsA; ++v)
    for (int first = 0; first < Tile::kVectorThreadsA; first += 8) {
      std::set<int> banks;
      for (int t = first; t < first + 8; ++t) {
        const tiling::TileCoordinate at = Tile::a_vector_load(t, v);
        for (int i = 0; i < 4; ++i) banks.insert((at.mn * Tile::kLdA + at.k + i) % 32);
      }
      CHECK(banks.size() == 32);
    }
  // The 16-byte B copies (b_vector_load, a B already in tf32_b_slot's order): every thread's
  // copies cover each (k, slot) of the step once, each within a row, 4-aligned; a quarter-warp's 8
  // copies on 32 banks of b_tile.
  // (such a B's copy puts column o at slot tf32_b_slot(o): tf32_b_column_of_slot undoes it)
  for (int n = 0; n < 256; ++n) {
    CHECK(tiling::tf32_b_column_of_slot(tiling::tf32_b_slot(n)) == n);
    CHECK(tiling::tf32_b_slot(tiling::tf32_b_column_of_slot(n)) == n);
  }
  std::vector<int> b_landed(Tile::kK * Tile::kN, 0);
  for (int t = 0; t < tiling::kThreads; ++t)
    for (int v = 0; v < Tile::kVectorLoadsB; ++v) {
      const tiling::TileCoordinate at = Tile::b_vector_load(t, v);
      REQUIRE(at.k < Tile::kK);
      REQUIRE(at.mn % 4 == 0);
      REQUIRE(at.mn + 4 <= Tile::kN);
      for (int i = 0; i < 4; ++i) ++b_landed[at.k * Tile::kN + at.mn + i];
    }
  for (const int count : b_landed) CHECK(count == 1);
  for (int v = 0; v < Tile::kVectorLoadsB; ++v)
    for (int first = 0; first < tiling::kThreads; first += 8) {
      std::set<int> banks;
      for (int t = first; t < first + 8; ++t) {
        const tiling::TileCoordinate at = Tile::b_vector_load(t, v);
        for (int i = 0; i < 4; ++i) banks.insert((Tile::b_row(at.k) * Tile::kLdB + at.mn + i) % 32);
      }
      CHECK(banks.size() == 32);
    }
  // A's scalar writers (the copies where A's rows do not allow 16-byte ones): a warp's 32 on
  // at most 2 ways of a bank (16 k of two rows, each row's k spread over a row pair)
  for (int warp = 0; warp < Warps::kWarps; ++warp)
    for (int q = 0; q < Tile::kLoadsA; ++q) {
      std::map<int, int> ways;
      for (int t = 32 * warp; t < 32 * warp + 32; ++t) {
        const tiling::TileCoordinate at = Tile::a_load(t, q);
        ++ways[(Tile::a_row(at.mn, at.k) * Tile::kLdA + Tile::a_column(at.mn, at.k)) % 32];
      }
      for (const auto& [bank, count] : ways) CHECK(count <= 2);
    }
  for (int warp = 0; warp < Warps::kWarps; ++warp) {
    // lane (g, t)'s A operands of fragment fm, k8 step h: the aligned float4 at row
    // row(warp) + 16 fm + g + 8 h, column 4 t, holding A(g, 4t + 2h), A(g + 8, 4t + 2h), A(g, 4t
    // + 2h + 1), A(g + 8, 4t + 2h + 1) of the fragment's rows, the mma's order; 32 banks per
    // quarter-warp
    // (each 16 k of the step, q: its block of M rows of A, its 16 rows of B)
    for (int q = 0; q < Tile::kK / 16; ++q)
    for (int fm = 0; fm < FM; ++fm)
      for (int h = 0; h < 2; ++h)
        for (int first_lane = 0; first_lane < 32; first_lane += 8) {
          std::set<int> a_banks;
          for (int lane = first_lane; lane < first_lane + 8; ++lane) {
            const int g = lane / 4, t = lane % 4, row = q * Tile::kABlockRows + Warps::row(warp) + 16 * fm + g + 8 * h;
            for (int e = 0; e < 4; ++e) {
              const auto [m, k] = a_of.at({row, 4 * t + e});
              CHECK(m == Warps::row(warp) + Fragment::row(fm, e % 2, g));
              CHECK(k == 16 * q + tiling::tf32_step_k(t, h, e / 2));
              a_banks.insert((row * Tile::kLdA + 4 * t + e) % 32);
            }
          }
          CHECK(a_banks.size() == 32);
        }
    // B at lane t's k 4 t + u (u < 4: the two k8 steps' k t and t + 4): the float4 of fragments
    // 4 j .. 4 j + 3, at slot column(warp) + 32 j + 4 g
    for (int u = 0; u < Tile::kK / 4; ++u)  // (u >= 4: the next 16 k's rows)
      for (int j = 0; j < FN / 4; ++j)
        for (int first_lane = 0; first_lane < 32; first_lane += 8) {
          std::set<int> b_banks;
          for (int lane = first_lane; lane < first_lane + 8; ++lane) {
            const int slot = Warps::column(warp) + 32 * j + 4 * (lane / 4);
            CHECK(slot % 4 == 0);
            for (int f = 0; f < 4; ++f)  // the float4 holds the columns of fragments 4 j + f, column g
              CHECK(Tile::b_slot(Warps::column(warp) + 8 * (4 * j + f) + lane / 4) == slot + f);
            const int word = Tile::b_row(16 * (u / 4) + 4 * (lane % 4) + u % 4) * Tile::kLdB + slot;
            for (int f = 0; f < 4; ++f) b_banks.insert((word + f) % 32);
          }
          CHECK(b_banks.size() == 32);
        }
  }
  // The products a warp's two k8 steps make, as the PTX defines mma.m16n8k8 (C(r, c) += sum over
  // k' < 8 of A(r, k') B(k', c), A(r, k') in lane (r % 8, k' % 4)'s element r / 8 + 2 (k' / 4), B(k',
  // c) in lane (c, k' % 4)'s element k' / 4), from where WarpTileTf32 reads them (A: element
  // tf32_step_k(t, h, high) - 4 t of the float4 at a_tile[its row][4 t]; B: element fn % 4 of the
  // float4 at b_tile[tf32_b_row(tf32_step_k(t, h, high))][column(warp) + 32 (fn / 4) + 4 g]), each
  // position read back through the gather's layout (which A(m, k), which B(k, n) the gather puts
  // there): each output of the piece gets A(its row, k) B(k, its column) for each k of the step once.
  const auto a_at = [](int row, int column) {  // the (m, k) the gather stores at a_tile[row][column]
    for (int m = 0; m < Tile::kM; ++m)
      for (int k = 0; k < Tile::kK; ++k)
        if (Tile::a_row(m, k) == row && Tile::a_column(m, k) == column) return std::pair{m, k};
    FAIL("no A value at " << row << ", " << column);
    return std::pair{-1, -1};
  };
  std::map<std::pair<int, int>, std::pair<int, int>> b_at;  // (row, slot) -> (k, n)
  for (int k = 0; k < Tile::kK; ++k)
    for (int n = 0; n < Tile::kN; ++n) b_at[{Tile::b_row(k), Tile::b_slot(n)}] = {k, n};
  for (int warp = 0; warp < Warps::kWarps; ++warp)
    for (int fm = 0; fm < FM; ++fm)
      for (int fn = 0; fn < FN; ++fn)
        for (int r = 0; r < 16; ++r)
          for (int cc = 0; cc < 8; ++cc) {
            const int m = Warps::row(warp) + Fragment::row(fm, r / 8, r % 8);
            const int n = Warps::column(warp) + 8 * fn + cc;
            std::set<int> ks;
            for (int q = 0; q < Tile::kK / 16; ++q)  // (the kernel hands mma each 16 k's tiles)
            for (int h = 0; h < 2; ++h)
              for (int kk = 0; kk < 8; ++kk) {
                const int t = kk % 4, high = kk / 4;
                // lane (r % 8, t)'s element r / 8 + 2 high, of the float4 at row + 16 fm + r % 8 + 8 h, 4 t
                const auto [a_m, a_k] =
                    a_at(q * Tile::kABlockRows + Warps::row(warp) + 16 * fm + r % 8 + 8 * h, 4 * t + r / 8 + 2 * high);
                const int b_row = 16 * q + tiling::tf32_step_b_row(t, h, high);  // lane (cc, t)
                CHECK(b_row == tiling::tf32_b_row(16 * q + tiling::tf32_step_k(t, h, high)));
                const int b_slot = Warps::column(warp) + 32 * (fn / 4) + 4 * cc + fn % 4;
                REQUIRE(b_at.count({b_row, b_slot}) == 1);
                const auto [b_k, b_n] = b_at[{b_row, b_slot}];
                CHECK(a_m == m);
                CHECK(b_n == n);
                CHECK(a_k == b_k);
                ks.insert(a_k);
              }
            CHECK(ks.size() == std::size_t(Tile::kK));
          }
}
}  // namespace

TEST_CASE("conv2d tiling: the TF32 path's warps and fragments cover every block tile once, bank-conflict free") {
  check_warp_layout<tiling::Tf32Tile<64, 64>>();
  check_warp_layout<tiling::Tf32Tile<64, 128>>();
  check_warp_layout<tiling::Tf32Tile<128, 64>>();
  check_warp_layout<tiling::Tf32Tile<128, 128>>();
  check_warp_layout<tiling::Tf32TileK32<128, 128>>();
  // the 64 x 64 tile keeps its 16 x 32 pieces; the others have pieces of 32 x 32 or 32 x 64
  CHECK(tiling::WarpLayout<tiling::SmallTile>::kFragmentsM == 1);
  CHECK(tiling::WarpLayout<tiling::SmallTile>::kFragmentsN == 4);
  CHECK(tiling::WarpLayout<tiling::TileShape<64, 128>>::kFragmentsM == 2);
  CHECK(tiling::WarpLayout<tiling::TileShape<64, 128>>::kFragmentsN == 4);
  CHECK(tiling::WarpLayout<tiling::TileShape<128, 128>>::kFragmentsN == 8);
  // the TF32 tiles' A rows: one K step, unpadded; B's rows 8 banks apart; the FP32 tiles':
  // multiples of 4 floats (float4 reads)
  CHECK(tiling::Tf32Tile<64, 64>::kLdA == 16);
  CHECK(tiling::Tf32Tile<128, 128>::kARows == 128);
  CHECK(tiling::Tf32Tile<128, 128>::kLdB % 32 == 8);
  CHECK(tiling::TileShape<128, 64>::kARows == 16);
  CHECK(tiling::TileShape<64, 128>::kLdB % 4 == 0);
  // the FP32 tiles keep B's columns in order; the TF32 tiles' order, spelled out on one group
  CHECK(tiling::TileShape<128, 128>::b_slot(37) == 37);
  CHECK(tiling::Tf32Tile<64, 64>::b_slot(8 * 3 + 5) == 4 * 5 + 3);
  CHECK(tiling::Tf32Tile<64, 64>::b_slot(32 + 8 * 1 + 7) == 32 + 4 * 7 + 1);
  // and B's rows: k 4 t + u at row 4 u + t, a permutation of the 16; the FP32 tiles' in order
  CHECK(tiling::TileShape<64, 64>::b_row(6) == 6);
  CHECK(tiling::Tf32Tile<64, 64>::b_row(4 * 3 + 1) == 4 * 1 + 3);
  std::set<int> rows;
  for (int k = 0; k < 16; ++k) rows.insert(tiling::tf32_b_row(k));
  CHECK(rows.size() == 16);
  CHECK(*rows.rbegin() == 15);
}
