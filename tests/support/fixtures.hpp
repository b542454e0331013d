// tests/support/fixtures.hpp: tensors, batches, small models and temporary directories shared by
// the test files.
//
//   random_tensor(shape, seed, dtype)       testing::random_values in [-1, 1) as a CPU tensor
//                                           (float64 by default: gradient checks run in float64)
//   cyclic_labels(n, classes, first)        int64 labels (first + 7 i) mod classes: reproducible,
//                                           spread over the classes
//   random_batch(shape, seed, classes, first_label)
//                                           a pipeline::MiniBatch of float32 random_tensor images and
//                                           cyclic_labels
//   tiny_model_config(arch, seed)           a ModelConfig of width 4 on 1-channel images with 10
//                                           classes: a whole RevNet/ResNet that steps in
//                                           milliseconds (the pipeline and synchronous tests)
//   TemporaryDirectory                      a new directory under the system's temporary
//                                           directory, removed with its contents at scope exit
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "petra/pipeline/messages.hpp"
#include "petra/nn/models.hpp"
#include "petra/error.hpp"
#include "petra/tensor.hpp"
#include "tests/support/testing.hpp"

namespace petra::testing {

inline Tensor random_tensor(const Shape& shape, std::uint64_t seed, DType dtype = DType::f64) {
  return Tensor::from_vector<double>(shape, random_values<double>(static_cast<std::size_t>(shape.numel()), seed))
      .to(dtype);
}

inline Tensor cyclic_labels(std::int64_t n, std::int64_t classes, std::int64_t first = 0) {
  std::vector<std::int64_t> labels(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) labels[static_cast<std::size_t>(i)] = (first + i * 7) % classes;
  return Tensor::from_vector<std::int64_t>({n}, labels);
}

inline pipeline::MiniBatch random_batch(const Shape& images, std::uint64_t seed, std::int64_t classes,
                                std::int64_t first_label = 0) {
  pipeline::MiniBatch b;
  b.images = random_tensor(images, seed, DType::f32);
  b.labels = cyclic_labels(images[0], classes, first_label);
  return b;
}

inline nn::ModelConfig tiny_model_config(const std::string& arch, std::uint64_t seed) {
  nn::ModelConfig c;
  c.arch = arch;
  c.width = 4;
  c.in_channels = 1;
  c.classes = 10;
  c.seed = seed;
  return c;
}

class TemporaryDirectory {
 public:
  // <temp>/petra-test-<name>-XXXXXX, unique (mkdtemp), created empty.
  explicit TemporaryDirectory(const std::string& name) {
    std::string pattern = (std::filesystem::temp_directory_path() / ("petra-test-" + name + "-XXXXXX")).string();
    PETRA_CHECK(::mkdtemp(pattern.data()) != nullptr, IOError, "TemporaryDirectory: cannot create ", pattern);
    path_ = pattern;
  }
  ~TemporaryDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TemporaryDirectory(const TemporaryDirectory&) = delete;
  TemporaryDirectory& operator=(const TemporaryDirectory&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  // The names of what the directory holds (not recursive).
  std::set<std::string> entries() const {
    std::set<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(path_)) names.insert(entry.path().filename().string());
    return names;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace petra::testing
