// pipeline/in_flight.cpp: checkpoints of a pipeline that is not flushed. Between two steps, each
// stage holds a FIFO of kept inputs and stashed parameters and a count of gradients since its last
// update, and the channels hold the messages sent but not yet read. This file writes all of it as
// .npy files plus text indexes (stage-NN/state.txt, channels.txt) and reads it back into a fresh
// executor built for the same model, method and options.
#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

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
  Tensor t;
  reading_checkpoint(path.parent_path(), [&] { t = load_npy(path, device); });
  return t;
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
      // What this stage's backward will need must be there: its input if the method keeps it, every
      // parameter if it stashes them (with their shapes), nothing more.
      const auto params = stage_.parameters();
      PETRA_CHECK(!fields.fail() && k.microbatch >= 0 && (has_input == 0 || has_input == 1) &&
                      (has_input == 1 || !keeping_.input) && parameters == (keeping_.parameters ? params.size() : 0),
                  CheckpointError, "checkpoint: ", (dir / "state.txt").string(), ": line '", line, "' does not fit stage ",
                  index_, " (it keeps ", keeping_.input ? "its input" : "no input", " and ",
                  keeping_.parameters ? params.size() : 0, " stashed parameters)");
      const Device device = stage_.device();
      if (has_input)
        k.input = load_tensor(dir / fmt::format("kept-{}-input.npy", k.microbatch), MemoryTag::input_buffer, index_, device);
      for (std::size_t i = 0; i < parameters; ++i) {
        const fs::path file = dir / fmt::format("kept-{}-param-{}.npy", k.microbatch, i);
        Tensor stashed = load_tensor(file, MemoryTag::param_stash, index_, device);
        const Tensor& current = params[i].data();
        PETRA_CHECK(stashed.shape() == current.shape() && stashed.dtype() == current.dtype(), CheckpointError,
                    "checkpoint: ", file.string(), " holds ", stashed.str(), " for parameter ", current.str());
        k.parameters.push_back(std::move(stashed));
      }
      fifo_.push_back(std::move(k));
    }
    PETRA_CHECK(!fields.fail() && received_ >= 0, CheckpointError, "checkpoint: ", (dir / "state.txt").string(),
                ": malformed line '", line, "'");
  }
}

std::vector<std::int64_t> StageRuntime::in_flight() const {
  std::vector<std::int64_t> ids;
  for (const Kept& k : fifo_) ids.push_back(k.microbatch);
  return ids;
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

void SequentialExecutor::load_in_flight(const fs::path& dir, const Schedule& schedule, std::int64_t step) {
  const int J = static_cast<int>(stages_.size());
  PETRA_CHECK(schedule.stages == J && 0 <= step, CheckpointError, "checkpoint ", dir.string(), ": step ", step,
              " of a schedule of ", schedule.stages, " stages for ", J, " stages");
  for (auto& c : to_next_) c.clear();
  for (auto& c : to_previous_) c.clear();
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
  check_in_flight(dir, schedule, step);
}

namespace {
// The ids of `sent` (in order) that the receiver, having taken `taken` of them, has not taken yet.
std::vector<std::int64_t> not_taken(const std::vector<std::int64_t>& sent, std::size_t taken) {
  return {sent.begin() + static_cast<std::ptrdiff_t>(std::min(taken, sent.size())), sent.end()};
}
}  // namespace

// The state the first `step` steps of the grid leave, derived from the grid: stage j's FIFO holds the
// forwards it ran minus the backwards it ran; the channel up from j the forwards of j that j + 1 did
// not run yet; the channel down to j the backwards of j + 1 that j did not run yet. A checkpoint
// whose state differs would stop the run later with a message about the executor (or, with two
// workers, a stuck pipeline): it is refused here, naming what differs.
void SequentialExecutor::check_in_flight(const fs::path& dir, const Schedule& schedule, std::int64_t step) const {
  if (step > schedule.steps) return;  // a finished run resumed with fewer epochs: nothing runs
  const int J = static_cast<int>(stages_.size());
  std::vector<std::vector<std::int64_t>> forwards(J), backwards(J);
  std::vector<std::int64_t> since_update(J, 0);
  for (std::int64_t t = 0; t < step; ++t)
    for (int j = 0; j < J; ++j)
      for (const Action& a : schedule.cells[t][j]) {
        if (a.kind == Action::Kind::forward) forwards[j].push_back(a.microbatch);
        if (a.kind == Action::Kind::backward) backwards[j].push_back(a.microbatch), ++since_update[j];
        if (a.kind == Action::Kind::update) since_update[j] = 0;
      }
  const auto expect = [&](const std::string& what, const std::vector<std::int64_t>& found,
                          const std::vector<std::int64_t>& expected) {
    PETRA_CHECK(found == expected, CheckpointError, "checkpoint ", dir.string(), ": ", what, " holds mini-batches [",
                fmt::format("{}", fmt::join(found, ", ")), "] but step ", step, " of the schedule has [",
                fmt::format("{}", fmt::join(expected, ", ")), "] there (the pipeline state and the counters disagree)");
  };
  const auto ids = [](const auto& channel) {
    std::vector<std::int64_t> out;
    for (const auto& m : channel.pending()) out.push_back(m.microbatch);
    return out;
  };
  const std::vector<std::int64_t> none;
  for (int j = 0; j < J; ++j) {
    const StageRuntime& s = *stages_[j];
    const bool below_head = j + 1 < J;
    // A channel's messages are held where their receiver runs (an MPI process collects those sent to it).
    if (below_head && runs_stage(j + 1))
      expect(fmt::format("the channel from stage {} up", j), ids(to_next_[j]),
             not_taken(forwards[j], forwards[j + 1].size()));
    if (!runs_stage(j)) continue;  // another process holds this stage's state
    expect(fmt::format("stage {}'s kept mini-batches", j), s.in_flight(), not_taken(forwards[j], backwards[j].size()));
    if (!below_head) expect(fmt::format("the channel from stage {} up", j), ids(to_next_[j]), none);
    expect(fmt::format("the channel down to stage {}", j), ids(to_previous_[j]),
           below_head ? not_taken(backwards[j + 1], backwards[j].size()) : none);
    const std::int64_t last = backwards[j].empty() ? 0 : backwards[j].back();
    PETRA_CHECK(last_backward_[j] == last, CheckpointError, "checkpoint ", dir.string(), ": stage ", j,
                "'s last backward was of mini-batch ", last_backward_[j], " but step ", step, " of the schedule says ",
                last);
    // A synchronous run may resume with more epochs than it was written with: its last step then
    // flushed windows that the longer grid leaves open, so only the window's size is checked.
    const bool exact = is_delayed(schedule.method);
    PETRA_CHECK(exact ? s.received() == since_update[j] : s.received() < schedule.accumulation, CheckpointError,
                "checkpoint ", dir.string(), ": stage ", j, " has ", s.received(),
                " gradients since its last update but step ", step, " of the schedule says ", since_update[j]);
  }
}

}  // namespace petra::pipeline
