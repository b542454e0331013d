// data/synthetic.cpp: a seeded synthetic image data set that a model can learn (see
// make_synthetic in data/readers.hpp), for tests and benchmarks that must not need files.
//
// Class k, channel c has the pattern
//   p(y, x) = 0.6 cos(2 pi f1 y / H + phi1) cos(2 pi g1 x' / W) + 0.4 cos(2 pi f2 y / H + phi2) cos(2 pi g2 x' / W)
// with x' = x - (W - 1) / 2 (so p is symmetric left-right), frequencies f in 1..3 and g in 0..2 and
// phases phi drawn from Philox. A sample of class k is 128 + 70 a p + b + noise, rounded and
// clamped to a byte, with contrast a in [0.6, 1.2), brightness b in [-20, 20) and noise uniform in
// [-48, 48]: the classes overlap enough that a model has to learn, not just memorise one pixel.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <tuple>
#include <vector>

#include "petra/checked.hpp"
#include "petra/data/readers.hpp"
#include "petra/error.hpp"
#include "petra/rng.hpp"

namespace petra::data {

using ::petra::detail::concat;

namespace {

// Philox streams of the synthetic data, far from the loader's (2 epoch, 2 epoch + 1).
constexpr std::uint64_t kPatternStream = std::uint64_t{1} << 62;
constexpr std::uint64_t kTrainStream = kPatternStream + 1;
constexpr std::uint64_t kTestStream = kPatternStream + 2;

// patterns[((k * C) + c) * H * W + y * W + x]
std::vector<float> class_patterns(const SyntheticSpec& spec) {
  const std::int64_t plane = spec.height * spec.width;
  std::vector<float> patterns(static_cast<std::size_t>(spec.classes * spec.channels * plane));
  const Philox rng(spec.seed, kPatternStream);
  const double two_pi = 2.0 * std::numbers::pi;
  for (std::int64_t kc = 0; kc < spec.classes * spec.channels; ++kc) {
    const PhiloxCounter a = rng.block(2 * static_cast<std::uint64_t>(kc));
    const PhiloxCounter b = rng.block(2 * static_cast<std::uint64_t>(kc) + 1);
    const double f1 = 1 + a.word[0] % 3, g1 = a.word[1] % 3, phi1 = two_pi * unit_float(a.word[2]);
    const double f2 = 1 + b.word[0] % 3, g2 = b.word[1] % 3, phi2 = two_pi * unit_float(b.word[2]);
    float* p = patterns.data() + kc * plane;
    for (std::int64_t y = 0; y < spec.height; ++y)
      for (std::int64_t x = 0; x < spec.width; ++x) {
        const double yy = static_cast<double>(y) / static_cast<double>(spec.height);
        const double xx = (static_cast<double>(x) - 0.5 * static_cast<double>(spec.width - 1)) / static_cast<double>(spec.width);
        p[y * spec.width + x] = static_cast<float>(0.6 * std::cos(two_pi * f1 * yy + phi1) * std::cos(two_pi * g1 * xx) +
                                                   0.4 * std::cos(two_pi * f2 * yy + phi2) * std::cos(two_pi * g2 * xx));
      }
  }
  return patterns;
}

Dataset make_samples(const SyntheticSpec& spec, std::int64_t n, std::uint64_t stream, const std::vector<float>& patterns,
                     const char* name) {
  const std::int64_t pixels = spec.channels * spec.height * spec.width;
  // Block 0 of a sample: contrast and brightness; then one block per 16 pixels (a byte each).
  const std::uint64_t blocks_per_sample = 1 + static_cast<std::uint64_t>((pixels + 15) / 16);
  Dataset d;
  d.name = name;
  d.classes = spec.classes;
  d.images = Tensor::empty({n, spec.channels, spec.height, spec.width}, DType::u8);
  d.labels = Tensor::empty({n}, DType::i64);
  const Philox rng(spec.seed, stream);
  std::int64_t* labels = d.labels.data_ptr<std::int64_t>();
  std::uint8_t* images = d.images.data_ptr<std::uint8_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t label = i % spec.classes;
    labels[i] = label;
    const std::uint64_t first_block = static_cast<std::uint64_t>(i) * blocks_per_sample;
    const PhiloxCounter look = rng.block(first_block);
    const float contrast = 70.0f * (0.6f + 0.6f * unit_float(look.word[0]));
    const float brightness = -20.0f + 40.0f * unit_float(look.word[1]);
    const float* pattern = patterns.data() + label * pixels;
    std::uint8_t* out = images + i * pixels;
    PhiloxCounter noise{};
    for (std::int64_t p = 0; p < pixels; ++p) {
      if (p % 16 == 0) noise = rng.block(first_block + 1 + static_cast<std::uint64_t>(p / 16));
      const auto byte = static_cast<float>((noise.word[(p % 16) / 4] >> (8 * (p % 4))) & 0xFFu);
      const float value = 128.0f + contrast * pattern[p] + brightness + (byte - 127.5f) * (48.0f / 127.5f);
      out[p] = static_cast<std::uint8_t>(std::clamp(std::nearbyint(value), 0.0f, 255.0f));
    }
  }
  return d;
}

}  // namespace

Split make_synthetic(const SyntheticSpec& spec) {
  PETRA_CHECK(spec.train_size >= 0 && spec.test_size >= 0 && spec.channels > 0 && spec.height > 0 && spec.width > 0 &&
                  spec.classes > 0,
              ValueError, "make_synthetic: sizes must be positive (train ", spec.train_size, ", test ", spec.test_size,
              ", ", spec.channels, "x", spec.height, "x", spec.width, ", ", spec.classes, " classes)");
  check_at_most<ValueError>(spec.classes, kMaxClasses, "make_synthetic: the number of classes");
  check_at_most<ValueError>(spec.train_size, kMaxSyntheticImages, "make_synthetic: the training images (--synthetic-size)");
  check_at_most<ValueError>(spec.test_size, kMaxSyntheticImages, "make_synthetic: the test images");
  check_at_most<ValueError>(spec.channels, kMaxChannels, "make_synthetic: the channel count");
  check_at_most<ValueError>(spec.height, kMaxImageSide, "make_synthetic: the height");
  check_at_most<ValueError>(spec.width, kMaxImageSide, "make_synthetic: the width");
  for (const auto& [count, element_bytes, what] : {std::tuple{spec.train_size, 1, "the training images (--synthetic-size)"},
                                                   std::tuple{spec.test_size, 1, "the test images"},
                                                   std::tuple{spec.classes, 4, "the class patterns"}}) {
    const std::int64_t dims[] = {count, spec.channels, spec.height, spec.width};
    checked_nbytes<ValueError>(dims, static_cast<std::size_t>(element_bytes), concat("make_synthetic: ", what));
  }
  const std::vector<float> patterns = class_patterns(spec);
  Split split{make_samples(spec, spec.train_size, kTrainStream, patterns, "synthetic/train"),
              make_samples(spec, spec.test_size, kTestStream, patterns, "synthetic/test")};
  const Normalization normalization = compute_normalization(split.train.images);
  for (Dataset* d : {&split.train, &split.test}) {
    d->normalization = normalization;
    d->augmentation = default_augmentation(spec.height, true);
  }
  return split;
}

}  // namespace petra::data
