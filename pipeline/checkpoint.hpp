// pipeline/checkpoint.hpp: training checkpoints that survive crashes and refuse corruption.
//
// A checkpoint is a directory <root>/epoch-NNNNNN/ holding
//   model/       the model's state (one .npy per parameter and buffer, nn::Module::save_state)
//   optimizer/   the optimizer's state (nn::Optimizer::save_state)
//   grads/       parameter gradients, only when an accumulation window was open
//   trainer.txt  key = value lines: configuration and counters
//   MANIFEST     size and CRC-32 of every other file, written last
// It is written under a temporary name, every file fsynced, then renamed into place; then the
// file <root>/latest, which names the newest complete checkpoint, is replaced atomically
// (temporary file, fsync, rename). A crash at any point leaves the previous checkpoint valid.
// Reading verifies every file against the MANIFEST and raises CheckpointError on any difference.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "nn/module.hpp"
#include "nn/optimizer.hpp"

namespace petra::pipeline {

class CheckpointError : public IOError {
 public:
  using IOError::IOError;
};

using CheckpointMeta = std::map<std::string, std::string>;

// Writes checkpoint `name` under `root` and makes it the latest; keeps the newest `keep` ones.
// Returns its directory.
std::filesystem::path write_checkpoint(const std::filesystem::path& root, const std::string& name,
                                       const nn::Module& model, const nn::Optimizer& optimizer,
                                       const CheckpointMeta& meta, bool with_gradients, int keep = 2);

// The directory of the newest complete checkpoint under `root`, verified; CheckpointError if there
// is none or it is damaged.
std::filesystem::path latest_checkpoint(const std::filesystem::path& root);

// Verifies every file of the checkpoint directory against its MANIFEST.
void verify_checkpoint(const std::filesystem::path& dir);

CheckpointMeta read_checkpoint_meta(const std::filesystem::path& dir);

// Loads model, optimizer (and gradients, if saved) from a verified checkpoint directory.
void restore_checkpoint(const std::filesystem::path& dir, const nn::Module& model, nn::Optimizer& optimizer);

}  // namespace petra::pipeline
