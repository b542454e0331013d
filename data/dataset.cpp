// data/dataset.cpp: the data set factory, default directories and augmentations, normalisation
// statistics, and take().
#include "petra/data/dataset.hpp"

#include <array>
#include <cmath>
#include <string>

#include "petra/data/readers.hpp"
#include "petra/error.hpp"

namespace petra::data {

namespace fs = std::filesystem;

fs::path default_directory(std::string_view name) {
  if (name == "fashion-mnist") return "/usr/share/datasets/fashion-mnist";  // Debian: dataset-fashion-mnist
  return {};
}

Split load_dataset(std::string_view name, const fs::path& directory, const SyntheticSpec& synthetic,
                   std::int64_t classes) {
  if (name == "synthetic") return make_synthetic(synthetic);
  const fs::path dir = directory.empty() ? default_directory(name) : directory;
  auto known = [&] {
    std::string names;
    for (std::string_view n : kDatasetNames) names += (names.empty() ? "" : ", ") + std::string(n);
    return names;
  };
  bool is_known = false;
  for (std::string_view n : kDatasetNames) is_known = is_known || n == name;
  PETRA_CHECK(is_known, ValueError, "load_dataset: unknown data set '", name, "' (known: ", known(), ")");
  PETRA_CHECK(!dir.empty(), ValueError, "load_dataset('", name, "'): a data directory is needed");
  if (name == "fashion-mnist") return read_fashion_mnist(dir);
  if (name == "mnist") return read_mnist(dir);
  if (name == "cifar10") return read_cifar10(dir);
  if (name == "cifar100") return read_cifar100(dir);
  if (name == "imagenet32") return read_imagenet32(dir);
  return read_npy_directory(dir, classes);
}

Normalization compute_normalization(const Tensor& images) {
  PETRA_CHECK(images.defined() && images.ndim() == 4 && images.is_contiguous(), ShapeError,
              "compute_normalization: needs contiguous images [N, C, H, W], got ", images.str());
  const std::int64_t n = images.size(0), channels = images.size(1), plane = images.size(2) * images.size(3);
  Normalization out;
  for (std::int64_t c = 0; c < channels; ++c) {
    double sum = 0, sum_of_squares = 0;
    if (images.dtype() == DType::u8) {
      // A histogram per channel: exact, and one add per pixel.
      std::array<std::int64_t, 256> count{};
      const std::uint8_t* base = images.data_ptr<std::uint8_t>();
      for (std::int64_t i = 0; i < n; ++i) {
        const std::uint8_t* p = base + (i * channels + c) * plane;
        for (std::int64_t k = 0; k < plane; ++k) ++count[p[k]];
      }
      for (int v = 0; v < 256; ++v) {
        const double x = v / 255.0;
        sum += static_cast<double>(count[static_cast<std::size_t>(v)]) * x;
        sum_of_squares += static_cast<double>(count[static_cast<std::size_t>(v)]) * x * x;
      }
    } else {
      const float* base = images.data_ptr<float>();
      for (std::int64_t i = 0; i < n; ++i) {
        const float* p = base + (i * channels + c) * plane;
        for (std::int64_t k = 0; k < plane; ++k) {
          sum += p[k];
          sum_of_squares += static_cast<double>(p[k]) * p[k];
        }
      }
    }
    const double count = static_cast<double>(n * plane);
    const double mean = count > 0 ? sum / count : 0.0;
    const double variance = count > 0 ? std::max(sum_of_squares / count - mean * mean, 0.0) : 0.0;
    const double std = std::sqrt(variance);
    out.mean.push_back(static_cast<float>(mean));
    out.std.push_back(std > 1e-12 ? static_cast<float>(std) : 1.0f);
  }
  return out;
}

Augmentation default_augmentation(std::int64_t height, bool horizontal_flip) {
  const int padding = height >= 32 ? static_cast<int>(height / 8) : height >= 16 ? 2 : 1;
  return Augmentation{padding, horizontal_flip};
}

Dataset take(const Dataset& dataset, std::int64_t n) {
  PETRA_CHECK(n >= 0 && n <= dataset.size(), ValueError, "take(", dataset.name, ", ", n, "): the data set has ",
              dataset.size(), " samples");
  Dataset out = dataset;
  out.images = dataset.images.slice(0, 0, n);
  out.labels = dataset.labels.slice(0, 0, n);
  return out;
}

}  // namespace petra::data
