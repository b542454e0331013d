// data/dataset.hpp: the one in-memory form of every data set, and the factory that loads one by name.
//
// Whatever the file format, a data set ends up as a Dataset: all images in one CPU tensor
// [N, C, H, W] (uint8 as stored on disk, or float32 for bring-your-own float data), all labels in
// one int64 tensor [N] with values in [0, classes), plus the per-channel normalisation and the
// default augmentation that go with it. A Split holds the training and the test set.
//
//   petra::data::Split split = petra::data::load_dataset("cifar10", "/data/cifar-10-batches-bin");
//   petra::data::Loader train(split.train, {.batch_size = 128, .seed = 1});
//
// Readers for each format are in data/readers.hpp; the loader (shuffling, augmentation, batches,
// prefetching) is in data/loader.hpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "petra/tensor.hpp"

namespace petra::data {

// Limits every reader enforces, far above any real data set: a header beyond them is corrupt (IOError
// naming the file, the field and the limit), and they bound what a corrupt header can make petra
// allocate or loop over. kMaxClasses also bounds --classes.
inline constexpr std::int64_t kMaxClasses = 100'000;     // ImageNet-21k, the largest in common use, has 21,841
inline constexpr std::int64_t kMaxChannels = 1'024;      // hyperspectral images have a few hundred bands
inline constexpr std::int64_t kMaxImageSide = 65'536;    // pixels, for the height and the width
inline constexpr std::int64_t kMaxSyntheticImages = 10'000'000;  // --synthetic-size (ImageNet has 1.28 million)

// Per-channel normalisation: a pixel x becomes (x - mean[c]) / std[c], where x = byte / 255 for
// uint8 images and the stored value for float32 images.
struct Normalization {
  std::vector<float> mean;
  std::vector<float> std;
};

// The usual per-channel statistics of the training sets (pixel values scaled to [0, 1]), as
// published with these data sets and used by most training scripts; not recomputed here.
inline const Normalization kFashionMnistNormalization{{0.2860f}, {0.3530f}};
inline const Normalization kMnistNormalization{{0.1307f}, {0.3081f}};
inline const Normalization kCifar10Normalization{{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}};
inline const Normalization kCifar100Normalization{{0.5071f, 0.4865f, 0.4409f}, {0.2673f, 0.2564f, 0.2762f}};
inline const Normalization kImagenet32Normalization{{0.481f, 0.457f, 0.408f}, {0.260f, 0.253f, 0.268f}};

// Training-time augmentation: a random crop of the image padded by crop_padding pixels on each
// side (the padding is black, i.e. pixel value 0 before normalisation), then a horizontal flip with
// probability 1/2. crop_padding = 0 and horizontal_flip = false is the identity.
struct Augmentation {
  int crop_padding = 0;
  bool horizontal_flip = false;
};

struct Dataset {
  std::string name;         // e.g. "cifar10/train"
  Tensor images;            // CPU, contiguous, uint8 or float32 [N, C, H, W]
  Tensor labels;            // CPU, contiguous, int64 [N], each in [0, classes)
  std::int64_t classes = 0;
  Normalization normalization;  // one mean and one std per channel
  Augmentation augmentation;    // the default for training on this data set

  std::int64_t size() const { return images.defined() ? images.size(0) : 0; }
  std::int64_t channels() const { return images.size(1); }
  std::int64_t height() const { return images.size(2); }
  std::int64_t width() const { return images.size(3); }
};

struct Split {
  Dataset train;
  Dataset test;
};

// Parameters of the synthetic data set (make_synthetic in data/readers.hpp).
struct SyntheticSpec {
  std::int64_t train_size = 5000;
  std::int64_t test_size = 1000;
  std::int64_t channels = 3;
  std::int64_t height = 32;
  std::int64_t width = 32;
  std::int64_t classes = 10;
  std::uint64_t seed = 0;
};

// The names load_dataset knows, in the order a help text lists them.
inline constexpr std::string_view kDatasetNames[] = {"fashion-mnist", "mnist", "cifar10", "cifar100",
                                                     "imagenet32", "npy", "synthetic"};

// The directory a data set is read from when none is given: fashion-mnist has one (Debian's
// dataset-fashion-mnist package); the others return an empty path (a directory must be given).
std::filesystem::path default_directory(std::string_view name);

// Loads a data set by name (one of kDatasetNames) from `directory` (default_directory(name) when
// empty). "synthetic" ignores the directory and uses `synthetic`. `classes` is the number of classes
// for a format whose files may not say (an npy directory without classes.txt); 0: none given.
// Throws ValueError for an unknown name or a missing directory argument, IOError for anything
// wrong with the files.
Split load_dataset(std::string_view name, const std::filesystem::path& directory = {},
                   const SyntheticSpec& synthetic = {}, std::int64_t classes = 0);

// Per-channel mean and (population) standard deviation of a data set's images, on the same scale
// as Normalization; a channel with zero spread gets std 1. Double accumulation.
Normalization compute_normalization(const Tensor& images);

// The usual augmentation for images of this height: crop padding height / 8 from 32 pixels up (4
// for 32x32, as for CIFAR), 2 from 16 up (28x28, as for MNIST), else 1.
Augmentation default_augmentation(std::int64_t height, bool horizontal_flip);

// The first n samples of a data set (views, no copy): for quick runs and tests.
Dataset take(const Dataset& dataset, std::int64_t n);

}  // namespace petra::data
