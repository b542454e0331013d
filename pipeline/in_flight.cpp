// pipeline/in_flight.cpp: checkpoints of a pipeline that is not flushed. Between two steps, each
// stage holds a FIFO of kept inputs and stashed parameters and a count of gradients since its last
// update, and the channels hold the messages sent but not yet read. This file writes all of it as
// .npy files plus text indexes (stage-NN/state.txt, channels.txt) and reads it back into a fresh
// executor built for the same model, method and options.
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "petra/files.hpp"
#include "petra/npy.hpp"
#include "petra/pipeline/checkpoint.hpp"
#include "petra/pipeline/executor.hpp"

namespace petra::pipeline {

namespace {
namespace fs = std::filesystem;

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  PETRA_CHECK(in.is_open(), CheckpointError, "checkpoint: cannot read ", path.string());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

// On `device`: a stage's kept tensors on its own device, a message on its sender's.
Tensor load_tensor(const fs::path& path, MemoryTag tag, int owner, Device device) {
  PETRA_CHECK(fs::exists(path), CheckpointError, "checkpoint: ", path.string(), " is missing");
  MemoryScope scope(tag, owner);
  return load_npy(path, device);
}

std::string stage_dir(int j) { return fmt::format("stage-{:02d}", j); }
}  // namespace

void StageRuntime::save_in_flight(const fs::path& dir) const {
  fs::create_directories(dir);
  std::string index = fmt::format("received {}\n", received_);
  for (const Kept& k : fifo_) {
    index += fmt::format("kept {} {} {}\n", k.microbatch, k.input.defined() ? 1 : 0, k.parameters.size());
    if (k.input.defined()) save_npy(dir / fmt::format("kept-{}-input.npy", k.microbatch), k.input);
    for (std::size_t i = 0; i < k.parameters.size(); ++i)
      save_npy(dir / fmt::format("kept-{}-param-{}.npy", k.microbatch, i), k.parameters[i]);
  }
  write_file_atomically(dir / "state.txt", index);
}

void StageRuntime::load_in_flight(const fs::path& dir) {
  fifo_.clear();
  received_ = 0;
  for (const std::string& line : read_lines(dir / "state.txt")) {
    std::istringstream fields(line);
    std::string what;
    fields >> what;
    if (what == "received") {
      fields >> received_;
    } else if (what == "kept") {
      Kept k{-1, {}, {}, {}, {}};
      int has_input = 0;
      std::size_t parameters = 0;
      fields >> k.microbatch >> has_input >> parameters;
      PETRA_CHECK(!fields.fail() && parameters <= stage_.parameters().size(), CheckpointError, "checkpoint: ",
                  (dir / "state.txt").string(), ": malformed line '", line, "'");
      const Device device = stage_.device();
      if (has_input)
        k.input = load_tensor(dir / fmt::format("kept-{}-input.npy", k.microbatch), MemoryTag::input_buffer, index_, device);
      for (std::size_t i = 0; i < parameters; ++i)
        k.parameters.push_back(load_tensor(dir / fmt::format("kept-{}-param-{}.npy", k.microbatch, i),
                                           MemoryTag::param_stash, index_, device));
      fifo_.push_back(std::move(k));
    }
    PETRA_CHECK(!fields.fail(), CheckpointError, "checkpoint: ", (dir / "state.txt").string(), ": malformed line '",
                line, "'");
  }
}

void SequentialExecutor::save_in_flight(const fs::path& dir) const {
  fs::create_directories(dir);
  std::string index;
  for (std::size_t j = 0; j < stages_.size(); ++j) {
    stages_[j]->save_in_flight(dir / stage_dir(static_cast<int>(j)));
    index += fmt::format("last_backward {} {}\n", j, last_backward_[j]);
    for (const ForwardMessage& m : to_next_[j].pending()) {
      index += fmt::format("forward {} {}\n", j, m.microbatch);
      save_npy(dir / fmt::format("forward-{}-{}-activation.npy", j, m.microbatch), m.activation);
      save_npy(dir / fmt::format("forward-{}-{}-labels.npy", j, m.microbatch), m.labels);
    }
    for (const BackwardMessage& m : to_previous_[j].pending()) {
      index += fmt::format("backward {} {}\n", j, m.microbatch);
      if (m.input.defined())  // only where stage j rebuilds its input from it
        save_npy(dir / fmt::format("backward-{}-{}-input.npy", j, m.microbatch), m.input);
      save_npy(dir / fmt::format("backward-{}-{}-gradient.npy", j, m.microbatch), m.gradient);
    }
  }
  write_file_atomically(dir / "channels.txt", index);
}

void SequentialExecutor::load_in_flight(const fs::path& dir) {
  const int J = static_cast<int>(stages_.size());
  for (int j = 0; j < J; ++j) stages_[j]->load_in_flight(dir / stage_dir(j));
  for (const std::string& line : read_lines(dir / "channels.txt")) {
    std::istringstream fields(line);
    std::string what;
    int j = -1;
    std::int64_t m = -1;
    fields >> what >> j >> m;
    PETRA_CHECK(!fields.fail() && 0 <= j && j < J, CheckpointError, "checkpoint: ", (dir / "channels.txt").string(),
                ": malformed line '", line, "'");
    if (what == "last_backward") {
      last_backward_[j] = m;
    } else if (what == "forward") {  // from stage j to j + 1: tagged as the sender's forward tags it
      const bool kept_above = j + 1 < J && stages_[j + 1]->keeps_input();
      const MemoryTag tag = kept_above ? MemoryTag::input_buffer : MemoryTag::messages;
      const int owner = kept_above ? j + 1 : j;
      const Device sender = stages_[j]->stage().device();
      to_next_[j].push({m, load_tensor(dir / fmt::format("forward-{}-{}-activation.npy", j, m), tag, owner, sender),
                        load_tensor(dir / fmt::format("forward-{}-{}-labels.npy", j, m), MemoryTag::messages, j, sender), nullptr});
    } else if (what == "backward") {  // from stage j + 1 to j
      PETRA_CHECK(j + 1 < J, CheckpointError, "checkpoint: ", (dir / "channels.txt").string(),
                  ": a backward message from above the head: '", line, "'");
      const Device sender = stages_[j + 1]->stage().device();
      const fs::path input = dir / fmt::format("backward-{}-{}-input.npy", j, m);
      to_previous_[j].push({m, fs::exists(input) ? load_tensor(input, MemoryTag::messages, j + 1, sender) : Tensor(),
                            load_tensor(dir / fmt::format("backward-{}-{}-gradient.npy", j, m), MemoryTag::messages,
                                        j + 1, sender), nullptr});
    } else {
      throw CheckpointError(fmt::format("checkpoint: {}: unknown line '{}'", (dir / "channels.txt").string(), line));
    }
  }
}

}  // namespace petra::pipeline
