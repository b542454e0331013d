// benchmarks/synthetic_setup.hpp: what bench-memory and bench-pipeline share: the model they
// measure, a few synthetic mini-batches made once (no loading inside a measurement), and the
// check that their --json file can be written before minutes are spent measuring.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "petra/data/dataset.hpp"
#include "petra/data/loader.hpp"
#include "petra/nn/models.hpp"
#include "petra/allocator.hpp"
#include "petra/error.hpp"
#include "petra/pipeline/messages.hpp"

namespace petra::bench {

// A RevNet with the CIFAR stem and 10 classes, seed 1.
inline nn::ModelConfig synthetic_model(const std::string& arch, std::int64_t width, std::int64_t channels) {
  nn::ModelConfig c;
  c.arch = arch;
  c.width = width;
  c.in_channels = channels;
  c.classes = 10;
  c.stem = "cifar";
  c.seed = 1;
  return c;
}

// `count` mini-batches of `batch` synthetic channels x size x size images, allocated under `tag`.
inline std::vector<pipeline::MiniBatch> synthetic_batches(std::int64_t batch, std::int64_t channels, std::int64_t size,
                                                  int count, MemoryTag tag = MemoryTag::messages) {
  data::SyntheticSpec spec;
  spec.train_size = batch * count;
  spec.test_size = 1;
  spec.channels = channels;
  spec.height = spec.width = size;
  spec.seed = 1;
  const data::Split split = data::load_dataset("synthetic", {}, spec);
  data::LoaderOptions options;
  options.batch_size = batch;
  options.shuffle = options.augment = options.prefetch = false;
  options.memory_tag = tag;
  const data::Loader loader(split.train, options);
  std::vector<pipeline::MiniBatch> batches;
  for (int i = 0; i < count; ++i) {
    data::Batch b = loader.batch(0, i);
    batches.push_back({std::move(b.images), std::move(b.labels)});
  }
  return batches;
}

// The directory that will receive `path` exists (the file is written atomically at the end).
inline void check_output_directory(const std::filesystem::path& path) {
  const std::filesystem::path directory = path.parent_path().empty() ? "." : path.parent_path();
  PETRA_CHECK(std::filesystem::is_directory(directory), IOError, "cannot write ", path.string(), ": no directory ",
              directory.string());
}

}  // namespace petra::bench
