// tests/support/resume.hpp: the crash-and-resume check of the training loop, shared by the CPU
// tests (tests/cpu/test_trainer.cpp) and the emulated device's (tests/emulation/).
//
//   resume_after_first_epoch(config, dir)   runs `config` with checkpoints in `dir`, "crashing"
//                                           right after epoch 1's checkpoint (an exception from the
//                                           epoch callback), checks that the checkpoint holds the
//                                           pipeline's state in flight, and returns a trainer
//                                           resumed from it (at epoch 1, not yet run)
#pragma once

#include <doctest/doctest.h>

#include <filesystem>
#include <memory>

#include "petra/pipeline/checkpoint.hpp"
#include "petra/pipeline/trainer.hpp"

namespace petra::testing {

inline std::unique_ptr<pipeline::Trainer> resume_after_first_epoch(pipeline::TrainConfig config,
                                                                   const std::filesystem::path& dir) {
  struct Crash {};
  config.checkpoint_dir = dir;
  config.resume = false;
  {
    pipeline::Trainer crashing(config);
    CHECK_THROWS_AS(crashing.run({}, [](const pipeline::EpochReport&) { throw Crash{}; }), Crash);
  }
  CHECK(std::filesystem::exists(pipeline::latest_checkpoint(dir) / "pipeline" / "channels.txt"));
  config.resume = true;
  auto resumed = std::make_unique<pipeline::Trainer>(config);
  CHECK(resumed->epoch() == 1);
  return resumed;
}

}  // namespace petra::testing
