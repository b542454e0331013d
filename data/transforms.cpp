// data/transforms.cpp: drawing a sample's transform from Philox, and the fused crop + flip +
// normalise pass that writes float32 batches.
//
// Speed: the pass is one read and one write per output pixel. A uint8 pixel is normalised by a
// table lookup (256 precomputed floats per channel), each output row is split into padding on the
// left, the copied span, and padding on the right, so the inner loop has no bounds tests.
#include "petra/data/transforms.hpp"

#include <algorithm>

#include "petra/error.hpp"
#include "petra/rng.hpp"

namespace petra::data {

namespace {

// floor(word * range / 2^32): uniform on [0, range) up to a bias below range / 2^32.
int scaled(std::uint32_t word, int range) {
  return static_cast<int>((static_cast<std::uint64_t>(word) * static_cast<std::uint64_t>(range)) >> 32);
}

}  // namespace

SampleTransform draw_transform(const Augmentation& augmentation, std::uint64_t seed, std::int64_t epoch,
                               std::int64_t sample) {
  if (augmentation.crop_padding == 0 && !augmentation.horizontal_flip) return {};
  const PhiloxCounter words = Philox(seed, augment_stream(epoch)).block(static_cast<std::uint64_t>(sample));
  const int pad = augmentation.crop_padding;
  SampleTransform t;
  t.shift_y = scaled(words.word[0], 2 * pad + 1) - pad;
  t.shift_x = scaled(words.word[1], 2 * pad + 1) - pad;
  t.flip = augmentation.horizontal_flip && (words.word[2] >> 31) != 0;
  return t;
}

BatchAssembler::BatchAssembler(const Dataset& dataset, const Augmentation& augmentation)
    : dataset_(dataset), augmentation_(augmentation) {
  const Tensor& images = dataset.images;
  PETRA_CHECK(images.defined() && images.ndim() == 4 && images.is_contiguous() && images.device().is_cpu(), ShapeError,
              "BatchAssembler(", dataset.name, "): images must be a contiguous CPU tensor [N, C, H, W], got ",
              images.defined() ? images.str() : std::string("undefined"));
  PETRA_CHECK(images.dtype() == DType::u8 || images.dtype() == DType::f32, ShapeError, "BatchAssembler(", dataset.name,
              "): images must be uint8 or float32, got ", name_of(images.dtype()));
  PETRA_CHECK(dataset.labels.defined() && dataset.labels.dtype() == DType::i64 && dataset.labels.ndim() == 1 &&
                  dataset.labels.size(0) == images.size(0) && dataset.labels.is_contiguous(),
              ShapeError, "BatchAssembler(", dataset.name, "): labels must be contiguous int64 [", images.size(0), "]");
  channels_ = images.size(1);
  height_ = images.size(2);
  width_ = images.size(3);
  const Normalization& norm = dataset.normalization;
  PETRA_CHECK(static_cast<std::int64_t>(norm.mean.size()) == channels_ && static_cast<std::int64_t>(norm.std.size()) == channels_,
              ValueError, "BatchAssembler(", dataset.name, "): normalisation has ", norm.mean.size(), " means and ",
              norm.std.size(), " stds for ", channels_, " channels");
  for (float s : norm.std) PETRA_CHECK(s > 0, ValueError, "BatchAssembler(", dataset.name, "): a std is ", s);
  PETRA_CHECK(augmentation.crop_padding >= 0 && augmentation.crop_padding <= std::min(height_, width_), ValueError,
              "BatchAssembler(", dataset.name, "): crop padding ", augmentation.crop_padding, " for ", height_, "x", width_,
              " images");

  padding_.resize(static_cast<std::size_t>(channels_));
  for (std::int64_t c = 0; c < channels_; ++c) {
    const auto k = static_cast<std::size_t>(c);
    padding_[k] = (0.0f - norm.mean[k]) / norm.std[k];
  }
  if (images.dtype() == DType::u8) {
    byte_table_.resize(static_cast<std::size_t>(channels_ * 256));
    for (std::int64_t c = 0; c < channels_; ++c)
      for (int v = 0; v < 256; ++v) {
        const auto k = static_cast<std::size_t>(c);
        byte_table_[k * 256 + static_cast<std::size_t>(v)] = (static_cast<float>(v) / 255.0f - norm.mean[k]) / norm.std[k];
      }
  }
}

// For each channel c and output row y: source row y + dy; output x reads source x + dx (or
// W - 1 - x + dx when flipped). Pixels whose source lies outside the image are padding.
template <class Convert, class Pixel>
void BatchAssembler::transform_planes(const Pixel* source, const SampleTransform& t, float* out,
                                      const Convert& convert) const {
  const std::int64_t h = height_, w = width_;
  // The output columns [x0, x1) have their source inside the image.
  const std::int64_t x0 = t.flip ? std::max<std::int64_t>(0, t.shift_x) : std::max<std::int64_t>(0, -t.shift_x);
  const std::int64_t x1 = t.flip ? std::min<std::int64_t>(w, w + t.shift_x) : std::min<std::int64_t>(w, w - t.shift_x);
  for (std::int64_t c = 0; c < channels_; ++c) {
    const float pad = padding_[static_cast<std::size_t>(c)];
    const Pixel* plane = source + c * h * w;
    for (std::int64_t y = 0; y < h; ++y, out += w) {
      const std::int64_t sy = y + t.shift_y;
      if (sy < 0 || sy >= h || x0 >= x1) {
        std::fill(out, out + w, pad);
        continue;
      }
      const Pixel* row = plane + sy * w;
      std::fill(out, out + x0, pad);
      if (t.flip) {
        const std::int64_t mirror = w - 1 + t.shift_x;
        for (std::int64_t x = x0; x < x1; ++x) out[x] = convert(c, row[mirror - x]);
      } else {
        for (std::int64_t x = x0; x < x1; ++x) out[x] = convert(c, row[x + t.shift_x]);
      }
      std::fill(out + x1, out + w, pad);
    }
  }
}

void BatchAssembler::transform_sample(std::int64_t sample, const SampleTransform& t, float* out) const {
  const std::int64_t pixels = channels_ * height_ * width_;
  if (dataset_.images.dtype() == DType::u8) {
    const float* table = byte_table_.data();
    transform_planes(dataset_.images.data_ptr<std::uint8_t>() + sample * pixels, t, out,
                     [table](std::int64_t c, std::uint8_t v) { return table[c * 256 + v]; });
  } else {
    const float* mean = dataset_.normalization.mean.data();
    const float* std = dataset_.normalization.std.data();
    transform_planes(dataset_.images.data_ptr<float>() + sample * pixels, t, out,
                     [mean, std](std::int64_t c, float v) { return (v - mean[c]) / std[c]; });
  }
}

void BatchAssembler::assemble(std::span<const std::int64_t> samples, std::uint64_t seed, std::int64_t epoch,
                              float* images, std::int64_t* labels) const {
  const std::int64_t pixels = channels_ * height_ * width_;
  const std::int64_t n = dataset_.size();
  const std::int64_t* label = dataset_.labels.data_ptr<std::int64_t>();
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const std::int64_t sample = samples[i];
    PETRA_CHECK(sample >= 0 && sample < n, ValueError, "BatchAssembler::assemble(", dataset_.name, "): sample ", sample,
                " of ", n);
    transform_sample(sample, draw_transform(augmentation_, seed, epoch, sample), images + static_cast<std::int64_t>(i) * pixels);
    labels[i] = label[sample];
  }
}

}  // namespace petra::data
