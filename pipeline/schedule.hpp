// pipeline/schedule.hpp: training schedules as data. A pure function builds, for a method, J stages,
// a number of mini-batches and an accumulation k, the grid of what every stage does at every step;
// a printer and a parser turn the grid into text and back; a single-threaded checker validates any
// grid. The executors only interpret a grid, so what they run can be printed, diffed and checked.
//
// Actions. Stage j either runs the forward of mini-batch m, its backward, or an optimizer update.
// Alone, an action is written "stage, letter, mini-batch": "3F7" (stage 3, forward of mini-batch 7),
// "3B1" (backward of mini-batch 1), "3U" (update). Inside a grid the column names the stage, so a
// cell holds "F7", "B1", "U" in execution order: forward, then backward, then update.
//
// Delayed methods (pipedream, dsp, delayed-reversible, petra), 0-based stage j and step t:
//   - stage j < J-1 runs forward on mini-batch t-j, then backward on mini-batch t-2(J-1)+j;
//   - the head (j = J-1) runs forward, loss and backward on mini-batch t-(J-1), in the same step;
//   - messages move one hop per step: the output of stage j at step t is read by stage j+1 at step
//     t+1, and the (input, gradient) pair stage j sends down at step t is read by stage j-1 at t+1;
//   - so stage j runs the backward of a mini-batch delay_of(j) = 2(J-1-j) steps after its forward,
//     and between steps it holds that many mini-batches awaiting their backward (fifo_depth).
// Example: petra, J = 3, 4 mini-batches, k = 1, drained (to_text of make_schedule):
//
//   # petra schedule: method=petra stages=3 batches=4 accumulation=1 steps=8
//   step  | stage 0 | stage 1 | stage 2
//   t=  0 | F0      | .       | .
//   t=  1 | F1      | F0      | .
//   t=  2 | F2      | F1      | F0 B0 U
//   t=  3 | F3      | F2 B0 U | F1 B1 U
//   t=  4 | B0 U    | F3 B1 U | F2 B2 U
//   t=  5 | B1 U    | B2 U    | F3 B3 U
//   t=  6 | B2 U    | B3 U    | .
//   t=  7 | B3 U    | .       | .
//
// Read a column downwards for one worker's life; read a mini-batch's number diagonally for its
// journey: F0 climbs one stage per step, turns at the head, and B0 comes back down one per step.
// All four delayed methods share this grid: they differ only in what a stage keeps (DESIGN.md §1).
//
// Synchronous methods (backprop, revbackprop): one step per mini-batch; at step t every stage's
// cell is "Ft Bt" (plus "U"). Such a grid is read differently: within a step the executor runs all
// forwards in stage order (0, 1, ..., J-1), then all backwards in reverse order (J-1, ..., 0), and
// messages are read in the same step they are produced. The checker checks it that way.
//
// Accumulation. Each stage counts the backwards it has run; the backward that makes the count a
// multiple of k is followed, in the same cell, by an update (DESIGN.md §1, petra-method.md §1.7:
// the phase differs per stage, as in the official code). With `drain`, a stage whose last window is
// incomplete (fewer than k backwards since its last update) gets a final "flush update" after its
// last backward, so no gradient is left behind; without `drain` the window stays open.
//
// Draining. `batches` mini-batches enter stage 0, one per step (ids 0 .. batches-1). Without
// `drain` the grid has exactly `batches` steps and the pipeline is not flushed: the backwards still
// in flight belong to the next grid (the next epoch keeps the pipeline full). With `drain` the grid
// has 2(J-1) more steps, so every mini-batch finishes its backward at stage 0. The grid without
// drain is the first `batches` rows of the grid with drain. Synchronous grids have `batches` steps
// either way; there `drain` only adds the flush update.
//
// Text form (to_text / parse_schedule, exact round trip):
//   line 1: "# petra schedule: method=M stages=J batches=N accumulation=k steps=S"
//   line 2: "step | stage 0 | stage 1 | ..." (column titles)
//   then one line per step: "t=  5 | F5 | F4 | F3 B1 U | ...", cells padded to equal width, an
//   empty cell shown as ".". An action whose stage is not its column's is printed "3F7" in full.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace petra::pipeline {

// The training methods a schedule can be built for. The first two are synchronous, the last four
// delayed (DESIGN.md §1 table). Names: "backprop", "revbackprop", "pipedream", "dsp",
// "delayed-reversible", "petra".
enum class PipelineMethod { backprop, revbackprop, pipedream, dsp, delayed_reversible, petra };
PipelineMethod parse_pipeline_method(std::string_view name);  // ValueError for an unknown name
std::string_view name_of(PipelineMethod method);
bool is_delayed(PipelineMethod method);  // pipedream, dsp, delayed-reversible, petra

// Steps between the forward and the backward of one mini-batch at stage j of J in a delayed
// method: 2(J-1-j) (stage 0 waits longest; the head, 0).
std::int64_t delay_of(int stage, int stages);
// Mini-batches stage j of J holds between two steps of a delayed method, forward done and backward
// not yet: equal to delay_of, because one mini-batch enters per step. This is the depth of a
// buffered stage's input FIFO. Within a step the forward runs before the backward, so for a
// moment one more input is held (2(J-1-j)+1) unless the executor pops before it pushes.
std::int64_t fifo_depth(int stage, int stages);

struct Action {
  enum class Kind : char { forward = 'F', backward = 'B', update = 'U' };
  Kind kind;
  int stage;
  std::int64_t microbatch;  // -1 for an update
  friend bool operator==(const Action&, const Action&) = default;
};
std::string to_text(const Action& action);   // "3F7", "3B1", "3U"
Action parse_action(std::string_view text);  // the inverse; ValueError when malformed

struct Schedule {
  PipelineMethod method;
  int stages;                  // J
  std::int64_t steps;          // rows of the grid
  std::int64_t accumulation;   // k: backwards per update
  std::int64_t batches;        // mini-batches that enter stage 0 (ids 0 .. batches-1)
  std::vector<std::vector<std::vector<Action>>> cells;  // [step][stage] -> actions in order
  friend bool operator==(const Schedule&, const Schedule&) = default;
};

// The whole grid is held in memory (a cell is about 100 bytes), so it has at most this many cells
// (steps x stages): 6.4 GB. 90 epochs of ImageNet32 in mini-batches of 64 on 18 stages need 32 million.
inline constexpr std::int64_t kMaxScheduleCells = std::int64_t{1} << 26;

// The schedule of `method` on `stages` (J >= 2) stages for `batches` (>= 0) mini-batches with
// accumulation k >= 1; `drain` adds the steps that finish every backward and the flush update.
// ValueError for an argument out of range, or a grid of more than kMaxScheduleCells cells.
Schedule make_schedule(PipelineMethod method, int stages, std::int64_t batches,
                       std::int64_t accumulation, bool drain);

// The pipeline drained every `segment` mini-batches (--flush-each-epoch: segment = one epoch): the
// drained schedules of consecutive segments of `batches` mini-batches, one after the other, with
// mini-batch ids continuing across segments (the last segment may be shorter). Each segment ends
// with its flush updates, so no gradient and no mini-batch crosses a segment boundary.
Schedule make_flushed_schedule(PipelineMethod method, int stages, std::int64_t batches, std::int64_t accumulation,
                               std::int64_t segment);

// The grid as text (format above) and back. parse_schedule raises ValueError naming the line and
// column of the first thing it cannot read; it does not judge the grid (check_schedule does).
std::string to_text(const Schedule& schedule);
Schedule parse_schedule(std::string_view text);

// Validates any grid by simulating it on one thread; returns one message per violation (empty:
// valid). It checks:
//   - shape: `steps` rows of `stages` cells; each action in its own stage's column, mini-batch ids
//     in 0 .. batches-1, a cell holding at most one F, one B, one U, in that order;
//   - each (stage, mini-batch) runs forward at most once and backward at most once, the backward
//     after the forward on the same stage (in the same step only for the head, or in a
//     synchronous method);
//   - messages: a forward at stage j > 0 reads the output stage j-1 produced one step before (the
//     same step, synchronous); a backward at stage j < J-1 reads the pair stage j+1 produced one
//     step before; every message that is due inside the grid is read;
//   - FIFO: at the end of each step stage j holds at most fifo_depth(j, J) mini-batches awaiting
//     their backward (none in a synchronous method);
//   - accumulation: an update follows a backward in the same cell, exactly k backwards after the
//     previous update, except a flush update after the stage's last backward or, in a delayed
//     method, after a backward that leaves the stage with nothing in flight (a flushed pipeline).
std::vector<std::string> check_schedule(const Schedule& schedule);

}  // namespace petra::pipeline
