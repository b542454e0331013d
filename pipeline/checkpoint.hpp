// pipeline/checkpoint.hpp: training checkpoints that survive crashes and refuse corruption.
//
// A checkpoint is a directory <root>/epoch-NNNNNN/ holding
//   model/       the model's state (one .npy per parameter and buffer, nn::Module::save_state)
//   optimizer/   the optimizer's state (nn::Optimizer::save_state); a pipelined run has one
//                optimizer per stage, in optimizer/stage-NN/
//   grads/       parameter gradients, only when an accumulation window was open
//   pipeline/    a pipelined run's mini-batches in flight (SequentialExecutor::save_in_flight)
//   trainer.txt  key = value lines: configuration and counters
//   MANIFEST     size and CRC-32 of every other file, written last
// It is written under a temporary name, every file fsynced, then renamed into place; then the
// file <root>/latest, which names the newest complete checkpoint, is replaced atomically
// (temporary file, fsync, rename). A crash at any point leaves the previous checkpoint valid.
// Reading verifies every file against the MANIFEST and raises CheckpointError on any difference.
#pragma once

#include <filesystem>
#include <functional>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "petra/nn/module.hpp"
#include "petra/nn/optimizer.hpp"

namespace petra::pipeline {

class CheckpointError : public IOError {
 public:
  using IOError::IOError;
};

using CheckpointMeta = std::map<std::string, std::string>;

// An optimizer and the subdirectory of optimizer/ its state goes to ("" = optimizer/ itself).
struct CheckpointOptimizer {
  std::string subdirectory;
  nn::Optimizer* optimizer;
};

// Writes checkpoint `name` under `root` and makes it the latest; keeps the newest `keep` ones.
// `write_more`, if set, writes further files (the pipeline's state in flight, in pipeline/) into the
// checkpoint directory it is given, before the MANIFEST is written. Returns the checkpoint's directory.
std::filesystem::path write_checkpoint(const std::filesystem::path& root, const std::string& name,
                                       const nn::Module& model, const std::vector<CheckpointOptimizer>& optimizers,
                                       const CheckpointMeta& meta, bool with_gradients,
                                       const std::function<void(const std::filesystem::path&)>& write_more = {},
                                       int keep = 2);

// Saves the gradients of `parameters` that have one as dir/<name>.npy (the grads/ of a checkpoint);
// load_gradients sets the gradient of each of the model's parameters that has a file there.
void save_gradients(const std::filesystem::path& dir, const std::vector<std::pair<std::string, Variable>>& parameters);
void load_gradients(const std::filesystem::path& dir, const nn::Module& model);

// A file as bytes, named by its path relative to some directory: how the parts of a checkpoint
// travel between the processes of an --mpi run.
struct FileBytes {
  std::string path;
  std::string bytes;
};
// Every regular file under `dir`, sorted by path.
std::vector<FileBytes> read_tree(const std::filesystem::path& dir);
// Writes each file under `dir` (creating directories), fsynced. CheckpointError on a path that
// is absolute or leaves `dir`.
void write_tree(const std::filesystem::path& dir, const std::vector<FileBytes>& files);

// The directory of the newest complete checkpoint under `root`, verified; CheckpointError if there
// is none or it is damaged.
std::filesystem::path latest_checkpoint(const std::filesystem::path& root);

// Verifies every file of the checkpoint directory against its MANIFEST.
void verify_checkpoint(const std::filesystem::path& dir);

// The key = value lines of the checkpoint's trainer.txt (CheckpointError for a malformed line).
CheckpointMeta read_checkpoint_meta(const std::filesystem::path& dir);

// meta[key] as an integer from `lowest` to `highest`; CheckpointError naming the checkpoint's
// trainer.txt, the key and the text when it is missing, not a decimal integer or out of range.
std::int64_t checkpoint_integer(const CheckpointMeta& meta, const std::string& key, const std::filesystem::path& dir,
                                std::int64_t lowest, std::int64_t highest);

// Runs `read`, which reads from checkpoint `dir`, and turns an error of what it reads (IOError,
// ValueError, ShapeError from the .npy and optimizer readers, a filesystem error) into a
// CheckpointError naming the checkpoint: whatever is wrong in a checkpoint is the checkpoint's fault.
void reading_checkpoint(const std::filesystem::path& dir, const std::function<void()>& read);

// CRC-32 (zlib's) of a byte range of any length: the MANIFEST's checksums and the data set's identity.
std::uint32_t crc32_of(std::span<const std::byte> bytes);

// Loads model, optimizers (and gradients, if saved) from a verified checkpoint directory; the
// pipeline's state, if any, is the caller's to load from dir / "pipeline". CheckpointError for any
// file that does not fit the model or the optimizers.
void restore_checkpoint(const std::filesystem::path& dir, const nn::Module& model,
                        const std::vector<CheckpointOptimizer>& optimizers);

}  // namespace petra::pipeline
