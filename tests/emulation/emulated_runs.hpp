// tests/emulation/emulated_runs.hpp: tiny training runs for the emulated device's tests
// (test_emulated_training.cpp, test_emulated_pipeline.cpp): an npy directory of small RGB images,
// the run's configuration, and the model's numbers to compare runs by.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "petra/nn/module.hpp"
#include "petra/npy.hpp"
#include "petra/pipeline/run_config.hpp"
#include "tests/support/fixtures.hpp"

namespace petra::testing {

// Every parameter and buffer of `m`, in order, on the host.
inline std::vector<std::vector<float>> parameters_and_buffers(const nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const auto& p : m.parameters()) out.push_back(p.data().to_vector<float>());
  for (const auto& [name, b] : m.named_buffers()) out.push_back(b.to_vector<float>());
  return out;
}

// images.npy / labels.npy (and test_ ones): `train` and `test` float32 RGB images of side x side,
// channels first, with cyclic labels of 10 classes.
inline void write_tiny_dataset(const std::filesystem::path& dir, std::int64_t train, std::int64_t test,
                               std::int64_t side, std::uint64_t seed) {
  const auto write = [&](const std::string& prefix, std::int64_t n, std::uint64_t s) {
    save_npy(dir / (prefix + "images.npy"), random_tensor({n, 3, side, side}, s, DType::f32));
    save_npy(dir / (prefix + "labels.npy"), cyclic_labels(n, 10, static_cast<std::int64_t>(s % 10)));
  };
  write("", train, seed);
  if (test > 0) write("test_", test, seed + 1);
}

// A RevNet18 of `width` on that directory: batch 4, 2 epochs, SGD at a constant 0.05, no
// augmentation, one CPU thread, on the CPU until the test sets devices.
inline pipeline::TrainConfig tiny_run(const std::filesystem::path& data, pipeline::PipelineMethod method,
                                      std::int64_t width, std::uint64_t seed) {
  pipeline::TrainConfig c;
  c.dataset = "npy";
  c.data_dir = data;
  c.classes = 10;
  c.arch = "revnet18";
  c.width = width;
  c.batch_size = 4;
  c.epochs = 2;
  c.augment = false;
  c.method = method;
  c.lr = 0.05;
  c.warmup_epochs = 0;
  c.schedule = "constant";
  c.seed = seed;
  c.threads = 1;
  return c;
}

}  // namespace petra::testing
