// data/transforms.hpp: augmentation (random crop with padding, horizontal flip) and normalisation,
// fused into one pass that turns dataset samples into a float32 batch.
//
// Randomness is a pure function of (seed, epoch, sample index): the transform of sample i in
// epoch e uses the four words of Philox block i of stream augment_stream(e) with key seed. It does
// not depend on which thread assembles the batch, on the batch size, or on the shuffle order.
//   word 0 -> vertical shift   in [-pad, pad]   (floor(word * (2 pad + 1) / 2^32))
//   word 1 -> horizontal shift in [-pad, pad]
//   word 2 -> flip if its top bit is set (probability exactly 1/2)
// A shift of (dy, dx) is the crop whose top-left corner is (pad + dy, pad + dx) in the padded
// image: output pixel (y, x) is input pixel (y + dy, x + dx), or padding when that is outside.
// The flip applies after the crop: output (y, x) is cropped (y, W - 1 - x).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "petra/data/dataset.hpp"

namespace petra::data {

// Philox streams (the upper 64 bits of the counter) used for data: one per (purpose, epoch).
inline constexpr std::uint64_t shuffle_stream(std::int64_t epoch) { return 2 * static_cast<std::uint64_t>(epoch); }
inline constexpr std::uint64_t augment_stream(std::int64_t epoch) { return 2 * static_cast<std::uint64_t>(epoch) + 1; }

struct SampleTransform {
  int shift_y = 0;
  int shift_x = 0;
  bool flip = false;
};

// The transform of `sample` in `epoch` (identity when augmentation is off).
SampleTransform draw_transform(const Augmentation& augmentation, std::uint64_t seed, std::int64_t epoch,
                               std::int64_t sample);

// Turns samples of one data set into float32 CHW images, normalised with the data set's statistics.
// Build once (it precomputes a 256-entry table per channel for uint8 images), then call from any
// thread: assemble() only reads the data set.
class BatchAssembler {
 public:
  // augmentation: what to apply; Augmentation{} for none (evaluation).
  BatchAssembler(const Dataset& dataset, const Augmentation& augmentation);

  // images: float [samples.size(), C, H, W] (=); labels: int64 [samples.size()] (=).
  void assemble(std::span<const std::int64_t> samples, std::uint64_t seed, std::int64_t epoch, float* images,
                std::int64_t* labels) const;

  // One sample with a given transform into out [C, H, W] (=).
  void transform_sample(std::int64_t sample, const SampleTransform& transform, float* out) const;

  const Augmentation& augmentation() const { return augmentation_; }

 private:
  template <class Convert, class Pixel>
  void transform_planes(const Pixel* source, const SampleTransform& transform, float* out, const Convert& convert) const;

  Dataset dataset_;
  Augmentation augmentation_;
  std::int64_t channels_, height_, width_;
  std::vector<float> byte_table_;  // uint8 images: [C][256] normalised value of each byte
  std::vector<float> padding_;     // [C]: the normalised value of a padding pixel (x = 0)
};

}  // namespace petra::data
