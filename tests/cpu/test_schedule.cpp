// tests/cpu/test_schedule.cpp: schedules as data. The builder follows the method's formulas, the
// text form round-trips, the grids match the golden files in tests/golden/ byte for byte, and the
// checker accepts every built schedule and catches each kind of broken one with its own message.
//
// To regenerate the golden files after an intended change, run from the build directory
//   PETRA_UPDATE_GOLDEN=1 tests/test-cpu --source-file='*test_schedule.cpp'
// and review the diff: the grids are what docs/ shows.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "petra/error.hpp"
#include "petra/pipeline/schedule.hpp"

using namespace petra;
using namespace petra::pipeline;

namespace {
Action forward(int stage, std::int64_t m) { return {Action::Kind::forward, stage, m}; }
Action backward(int stage, std::int64_t m) { return {Action::Kind::backward, stage, m}; }
Action update(int stage) { return {Action::Kind::update, stage, -1}; }

std::string joined(const std::vector<std::string>& problems) {
  std::string all;
  for (const auto& p : problems) all += p + "\n";
  return all;
}
bool mentions(const std::vector<std::string>& problems, const std::string& fragment) {
  for (const auto& p : problems)
    if (p.find(fragment) != std::string::npos) return true;
  return false;
}

// Steps at which stage j runs the action of `kind` on mini-batch m; -1 if none.
std::int64_t step_of(const Schedule& s, Action::Kind kind, int j, std::int64_t m) {
  for (std::int64_t t = 0; t < s.steps; ++t)
    for (const Action& a : s.cells[t][j])
      if (a.kind == kind && a.microbatch == m) return t;
  return -1;
}

struct Golden {
  const char* file;
  PipelineMethod method;
  int stages;
  std::int64_t batches;
  std::int64_t accumulation;
};
// All drained. petra-J4-k2 has 13 mini-batches so its last window is incomplete (flush update).
const Golden kGoldens[] = {
    {"petra-J3.txt", PipelineMethod::petra, 3, 12, 1},    {"petra-J4.txt", PipelineMethod::petra, 4, 14, 1},
    {"petra-J10.txt", PipelineMethod::petra, 10, 30, 1},  {"petra-J4-k2.txt", PipelineMethod::petra, 4, 13, 2},
    {"dsp-J4.txt", PipelineMethod::dsp, 4, 14, 1},        {"backprop-J3.txt", PipelineMethod::backprop, 3, 5, 2},
};

// tests/golden, found from the path the compiler was given for this file (meson gives it relative
// to the build directory, where meson test runs), else from the source root.
std::filesystem::path golden_dir() {
  std::vector<std::filesystem::path> candidates{
      std::filesystem::path(__FILE__).parent_path().parent_path() / "golden", "tests/golden"};
#ifdef PETRA_SOURCE_DIR
  candidates.insert(candidates.begin(), std::filesystem::path(PETRA_SOURCE_DIR) / "tests" / "golden");
#endif
  for (const auto& dir : candidates)
    if (std::filesystem::exists(dir / "petra-J3.txt")) return dir;
  std::string tried;
  for (const auto& dir : candidates) tried += " " + dir.string();
  FAIL("tests/golden not found; tried (relative to " << std::filesystem::current_path() << "):" << tried);
  return {};
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

Schedule petra_grid(int stages, std::int64_t batches, std::int64_t k = 1, bool drain = true) {
  return make_schedule(PipelineMethod::petra, stages, batches, k, drain);
}
}  // namespace

TEST_CASE("pipeline method names round trip; four methods are delayed") {
  const PipelineMethod all[] = {PipelineMethod::backprop, PipelineMethod::revbackprop, PipelineMethod::pipedream,
                                PipelineMethod::dsp, PipelineMethod::delayed_reversible, PipelineMethod::petra};
  for (PipelineMethod m : all) CHECK(parse_pipeline_method(name_of(m)) == m);
  CHECK(name_of(PipelineMethod::delayed_reversible) == "delayed-reversible");
  CHECK_FALSE(is_delayed(PipelineMethod::backprop));
  CHECK_FALSE(is_delayed(PipelineMethod::revbackprop));
  CHECK(is_delayed(PipelineMethod::pipedream));
  CHECK(is_delayed(PipelineMethod::dsp));
  CHECK(is_delayed(PipelineMethod::delayed_reversible));
  CHECK(is_delayed(PipelineMethod::petra));
  CHECK_THROWS_AS(parse_pipeline_method("PETRA"), ValueError);
  CHECK_THROWS_WITH(parse_pipeline_method("gpipe"), doctest::Contains("unknown pipeline method 'gpipe'"));
}

TEST_CASE("actions read and write as 3F7, 3B1, 3U") {
  CHECK(to_text(forward(3, 7)) == "3F7");
  CHECK(to_text(backward(3, 1)) == "3B1");
  CHECK(to_text(update(3)) == "3U");
  CHECK(parse_action("3F7") == forward(3, 7));
  CHECK(parse_action("12B104") == backward(12, 104));
  CHECK(parse_action("0U") == update(0));
  for (const char* bad : {"F7", "3X7", "3F", "3U2", "-1F3", "3F7x", "3F-1", ""}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_action(bad), ValueError);
  }
}

TEST_CASE("delay_of and fifo_depth: 2(J-1-j) steps, the head none") {
  // RevNet18 has J = 10 stages: delays 18, 16, ..., 2, 0 (petra-method.md §1.4).
  for (int j = 0; j < 10; ++j) {
    CHECK(delay_of(j, 10) == 18 - 2 * j);
    CHECK(fifo_depth(j, 10) == delay_of(j, 10));
  }
  CHECK_THROWS_AS(delay_of(3, 3), ValueError);
  CHECK_THROWS_AS(delay_of(-1, 3), ValueError);
}

TEST_CASE("make_schedule rejects arguments out of range") {
  CHECK_THROWS_AS(make_schedule(PipelineMethod::petra, 1, 4, 1, true), ValueError);
  CHECK_THROWS_AS(make_schedule(PipelineMethod::petra, 3, -1, 1, true), ValueError);
  CHECK_THROWS_AS(make_schedule(PipelineMethod::petra, 3, 4, 0, true), ValueError);
}

TEST_CASE("a delayed grid: forward at step m+j, backward at step m+2(J-1)-j, the head turns at once") {
  for (int J : {2, 3, 4, 7}) {
    CAPTURE(J);
    const std::int64_t batches = 9;
    const Schedule s = petra_grid(J, batches);
    REQUIRE(s.steps == batches + 2 * (J - 1));
    REQUIRE(s.cells.size() == static_cast<std::size_t>(s.steps));
    for (int j = 0; j < J; ++j)
      for (std::int64_t m = 0; m < batches; ++m) {
        CAPTURE(j);
        CAPTURE(m);
        CHECK(step_of(s, Action::Kind::forward, j, m) == m + j);
        CHECK(step_of(s, Action::Kind::backward, j, m) == m + 2 * (J - 1) - j);
        CHECK(step_of(s, Action::Kind::backward, j, m) - step_of(s, Action::Kind::forward, j, m) ==
              delay_of(j, J));
      }
    // The first backward at stage 0 happens at step 2(J-1); the head's first cell is "F0 B0 U".
    const std::vector<Action> first_return{backward(0, 0), update(0)};
    CHECK(std::vector<Action>(s.cells[2 * (J - 1)][0].end() - 2, s.cells[2 * (J - 1)][0].end()) == first_return);
    CHECK(s.cells[J - 1][J - 1] == std::vector<Action>{forward(J - 1, 0), backward(J - 1, 0), update(J - 1)});
    if (J == 3 || J == 4)  // steady state at stage 1: forward of one mini-batch, backward of an older one
      CHECK(s.cells[8][1] == std::vector<Action>{forward(1, 7), backward(1, 8 - 2 * (J - 1) + 1), update(1)});
    CHECK(check_schedule(s).empty());
  }
}

TEST_CASE("the FIFO measured on the grid reaches exactly fifo_depth(j) at every stage") {
  const int J = 6;
  const Schedule s = petra_grid(J, 30);
  for (int j = 0; j < J; ++j) {
    std::int64_t waiting = 0, most = 0;
    for (std::int64_t t = 0; t < s.steps; ++t) {
      for (const Action& a : s.cells[t][j]) waiting += a.kind == Action::Kind::forward ? 1 : a.kind == Action::Kind::backward ? -1 : 0;
      most = std::max(most, waiting);
    }
    CAPTURE(j);
    CHECK(most == fifo_depth(j, J));
    CHECK(waiting == 0);  // drained: nothing left behind
  }
}

TEST_CASE("accumulation: an update after every k-th backward of a stage, a flush update when drained") {
  const int J = 4;
  const std::int64_t batches = 10, k = 3;
  const Schedule drained = petra_grid(J, batches, k, true);
  const Schedule open = petra_grid(J, batches, k, false);
  for (int j = 0; j < J; ++j) {
    CAPTURE(j);
    std::vector<std::int64_t> updates, expected;
    for (std::int64_t t = 0; t < drained.steps; ++t)
      for (const Action& a : drained.cells[t][j])
        if (a.kind == Action::Kind::update) updates.push_back(t);
    // After the 3rd, 6th and 9th backward (mini-batches 2, 5, 8), then the flush after the 10th.
    for (std::int64_t m : {2, 5, 8, 9}) expected.push_back(step_of(drained, Action::Kind::backward, j, m));
    CHECK(updates == expected);
    CHECK(drained.cells[expected.back()][j].back() == update(j));
  }
  CHECK(check_schedule(drained).empty());
  CHECK(check_schedule(open).empty());
  // A window that divides the count exactly needs no flush: one update per 5 backwards, 2 per stage.
  const Schedule exact = petra_grid(J, batches, 5, true);
  for (int j = 0; j < J; ++j) {
    int count = 0;
    for (const auto& row : exact.cells)
      for (const Action& a : row[j]) count += a.kind == Action::Kind::update;
    CHECK(count == 2);
  }
}

TEST_CASE("without drain the grid is the first `batches` rows of the drained grid") {
  for (PipelineMethod method : {PipelineMethod::petra, PipelineMethod::pipedream, PipelineMethod::backprop})
    for (int J : {2, 4, 5}) {
      CAPTURE(J);
      const Schedule drained = make_schedule(method, J, 11, 2, true);
      const Schedule open = make_schedule(method, J, 11, 2, false);
      REQUIRE(open.steps == 11);
      for (std::int64_t t = 0; t < open.steps; ++t) {
        std::vector<std::vector<Action>> row = drained.cells[t];
        if (!is_delayed(method) && t == open.steps - 1)  // the synchronous flush lies in the last row
          for (auto& cell : row) cell.pop_back();
        CHECK(open.cells[t] == row);
      }
    }
}

TEST_CASE("a synchronous grid: every stage runs F t and B t at step t, updates every k") {
  const Schedule s = make_schedule(PipelineMethod::backprop, 3, 5, 2, true);
  REQUIRE(s.steps == 5);
  for (std::int64_t t = 0; t < s.steps; ++t)
    for (int j = 0; j < 3; ++j) {
      std::vector<Action> expected{forward(j, t), backward(j, t)};
      if (t == 1 || t == 3 || t == 4) expected.push_back(update(j));  // t = 4: the flush update
      CHECK(s.cells[t][j] == expected);
    }
  const Schedule open = make_schedule(PipelineMethod::revbackprop, 3, 5, 2, false);
  CHECK(open.cells[4][0] == std::vector<Action>{forward(0, 4), backward(0, 4)});
  CHECK(check_schedule(s).empty());
  CHECK(check_schedule(open).empty());
}

TEST_CASE("a flushed schedule: drained segments one after the other, ids continuing") {
  const int J = 4;
  const std::int64_t batches = 11, k = 2, segment = 5;  // segments of 5, 5 and 1 mini-batches
  const Schedule s = make_flushed_schedule(PipelineMethod::petra, J, batches, k, segment);
  const Schedule first = make_schedule(PipelineMethod::petra, J, 5, k, true);
  const std::int64_t L = first.steps;  // 5 + 2(J-1) = 11 steps per full segment
  REQUIRE(L == 11);
  REQUIRE(s.steps == 2 * L + (1 + 2 * (J - 1)));
  CHECK(s.batches == batches);
  for (std::int64_t t = 0; t < L; ++t) CHECK(s.cells[t] == first.cells[t]);
  // The second segment is the first shifted by L steps and 5 mini-batches.
  for (std::int64_t t = 0; t < L; ++t)
    for (int j = 0; j < J; ++j) {
      std::vector<Action> shifted = first.cells[t][j];
      for (Action& a : shifted)
        if (a.kind != Action::Kind::update) a.microbatch += 5;
      CHECK(s.cells[L + t][j] == shifted);
    }
  // Nothing is in flight across a boundary: mini-batch 5 enters only after 4 has left stage 0.
  CHECK(step_of(s, Action::Kind::forward, 0, 5) > step_of(s, Action::Kind::backward, 0, 4));
  // Each segment of 5 ends with a flush update after its 5th backward (an odd count for k = 2).
  for (int j = 0; j < J; ++j) {
    const std::int64_t t4 = step_of(s, Action::Kind::backward, j, 4);
    CHECK(s.cells[t4][j].back() == update(j));
  }
  const auto problems = check_schedule(s);
  INFO(joined(problems));
  CHECK(problems.empty());
  // The checker still refuses a short window while mini-batches are in flight.
  Schedule broken = make_schedule(PipelineMethod::petra, J, 9, k, true);
  const std::int64_t t0 = step_of(broken, Action::Kind::backward, 0, 0);
  broken.cells[t0][0].push_back(update(0));
  CHECK(mentions(check_schedule(broken), "update after 1 backward since the previous update, expected k = 2"));
}

TEST_CASE("the four delayed methods share one grid") {
  const Schedule petra = petra_grid(5, 9, 2);
  for (PipelineMethod method : {PipelineMethod::pipedream, PipelineMethod::dsp, PipelineMethod::delayed_reversible})
    CHECK(make_schedule(method, 5, 9, 2, true).cells == petra.cells);
}

TEST_CASE("check_schedule accepts every schedule make_schedule builds") {
  for (PipelineMethod method : {PipelineMethod::backprop, PipelineMethod::revbackprop, PipelineMethod::pipedream,
                                PipelineMethod::dsp, PipelineMethod::delayed_reversible, PipelineMethod::petra})
    for (int J : {2, 3, 4, 5, 10})
      for (std::int64_t batches : {0, 1, 3, 8, 21})
        for (std::int64_t k : {1, 2, 3})
          for (bool drain : {true, false}) {
            const Schedule s = make_schedule(method, J, batches, k, drain);
            const auto problems = check_schedule(s);
            INFO(name_of(method), " J=", J, " batches=", batches, " k=", k, " drain=", drain, "\n", joined(problems));
            CHECK(problems.empty());
          }
}

TEST_CASE("golden grids: to_text matches tests/golden byte for byte, parses back, and checks clean") {
  const std::filesystem::path dir = golden_dir();
  const bool update_files = std::getenv("PETRA_UPDATE_GOLDEN") != nullptr;
  for (const Golden& g : kGoldens) {
    CAPTURE(g.file);
    const Schedule s = make_schedule(g.method, g.stages, g.batches, g.accumulation, true);
    const std::string text = to_text(s);
    if (update_files) std::ofstream(dir / g.file, std::ios::binary) << text;
    CHECK(text == read_text(dir / g.file));
    CHECK(parse_schedule(text) == s);
    CHECK(check_schedule(s).empty());
  }
}

TEST_CASE("the J = 3 example in pipeline/schedule.hpp is what to_text prints") {
  const std::string header = read_text(golden_dir().parent_path().parent_path() / "pipeline" / "schedule.hpp");
  std::istringstream grid(to_text(petra_grid(3, 4)));
  int lines = 0;
  for (std::string line; std::getline(grid, line); ++lines) {
    CAPTURE(line);
    CHECK(header.find("//   " + line + "\n") != std::string::npos);
  }
  CHECK(lines == 10);
}

TEST_CASE("to_text and parse_schedule round trip exactly") {
  for (const Schedule& s : {petra_grid(2, 0), petra_grid(2, 1), petra_grid(3, 7, 4, false), petra_grid(12, 120, 3),
                            make_schedule(PipelineMethod::revbackprop, 6, 4, 3, false)}) {
    const std::string text = to_text(s);
    CHECK(parse_schedule(text) == s);
    CHECK(to_text(parse_schedule(text)) == text);
  }
  // A broken grid round-trips too: an action outside its own stage's column prints in full.
  Schedule broken = petra_grid(3, 4);
  std::swap(broken.cells[3][0], broken.cells[3][1]);
  const std::string text = to_text(broken);
  CHECK(text.find("t=  3 | 1F2 1B0 1U | 0F3") != std::string::npos);
  CHECK(parse_schedule(text) == broken);
  // Blank lines, CRLF line ends and other spacing are accepted.
  std::string loose = "\n" + to_text(petra_grid(3, 2));
  for (std::size_t at = loose.find('\n', 1); at != std::string::npos; at = loose.find('\n', at + 2)) loose.insert(at, "\r");
  CHECK(parse_schedule(loose) == petra_grid(3, 2));
  CHECK(parse_schedule("# petra schedule: steps=1 method=dsp stages=2 accumulation=1 batches=1\n"
                       "step|stage 0|stage 1\n"
                       "t=0|F0|   .  \n") == make_schedule(PipelineMethod::dsp, 2, 1, 1, false));
}

TEST_CASE("parse_schedule names the line and column of what it cannot read") {
  const std::string good = to_text(petra_grid(3, 4));
  // Line 5 is "t=  2 | F2      | F1      | F0 B0 U"; the action F1 begins at column 19.
  std::string text = good;
  const std::size_t line5 = text.find("t=  2");
  text.replace(text.find("F1", line5), 2, "X1");
  CHECK_THROWS_WITH_AS(parse_schedule(text), doctest::Contains("line 5, column 19: 'X1' is not an action"), ValueError);

  text = good;
  text.replace(text.find("t=  4"), 5, "t=  5");
  CHECK_THROWS_WITH_AS(parse_schedule(text), doctest::Contains("line 7, column 1: expected step 4, found step 5"), ValueError);

  text = good;
  text.replace(text.find("| F3 B3 U"), 9, "");
  CHECK_THROWS_WITH_AS(parse_schedule(text), doctest::Contains("line 8, column 27: expected 3 cells, found 2"), ValueError);

  text = good;
  text.replace(text.find("F0 B0 U"), 7, "F0 B U");
  CHECK_THROWS_WITH_AS(parse_schedule(text), doctest::Contains("line 5, column 32: 'B' has a malformed mini-batch"),
                       ValueError);

  CHECK_THROWS_WITH_AS(parse_schedule(good.substr(0, good.find("t=  7"))),
                       doctest::Contains("line 10, column 1: missing step 7"), ValueError);
  CHECK_THROWS_WITH_AS(parse_schedule(good + "t=  8 | . | . | .\n"),
                       doctest::Contains("line 11, column 1: more lines than the 8 steps"), ValueError);
  CHECK_THROWS_WITH_AS(parse_schedule("step | stage 0\n"), doctest::Contains("line 1, column 1: expected the header"),
                       ValueError);
  CHECK_THROWS_WITH_AS(parse_schedule("# petra schedule: method=petra stages=3 batches=4 accumulation=0 steps=8\n"),
                       doctest::Contains("line 1, column 64: accumulation must be an integer >= 1"), ValueError);
  CHECK_THROWS_WITH_AS(parse_schedule("# petra schedule: method=sgd stages=3 batches=4 accumulation=1 steps=8\n"),
                       doctest::Contains("line 1, column 26: unknown pipeline method 'sgd'"), ValueError);
  CHECK_THROWS_WITH_AS(parse_schedule(""), doctest::Contains("line 1, column 1: empty text"), ValueError);
}

// ---- broken schedules: each is caught, with a message that says what is wrong ----------------

TEST_CASE("checker: two cells of one stage swapped") {
  Schedule s = petra_grid(4, 14);
  std::swap(s.cells[8][1], s.cells[9][1]);  // "F7 B3 U" and "F8 B4 U"
  const auto problems = check_schedule(s);
  INFO(joined(problems));
  CHECK(mentions(problems, "step 8, stage 1: forward of mini-batch 8 reads the output stage 0 sent at step 8 "
                           "(one hop per step: expected step 7)"));
  CHECK(mentions(problems, "step 9, stage 2: forward of mini-batch 8 reads the output stage 1 sent at step 8 "
                           "(one hop per step: expected step 8)") == false);
  CHECK(mentions(problems, "step 9, stage 1: backward of mini-batch 3 reads the gradient stage 2 sent at step 7 "
                           "(one hop per step: expected step 8)"));
}

TEST_CASE("checker: a dropped backward") {
  Schedule s = petra_grid(4, 14);
  REQUIRE(s.cells[10][1] == std::vector<Action>{forward(1, 9), backward(1, 5), update(1)});
  s.cells[10][1] = {forward(1, 9)};
  const auto problems = check_schedule(s);
  INFO(joined(problems));
  CHECK(mentions(problems, "step 11, stage 0: backward of mini-batch 5 but stage 1 never sent its gradient"));
  CHECK(mentions(problems, "step 9, stage 2: the gradient of backward 5 is never read by stage 1 (due at step 10)"));
  CHECK(mentions(problems, "step 10, stage 1: 5 mini-batches await their backward at the end of the step, "
                           "more than the FIFO depth 2(J-1-j) = 4"));
}

TEST_CASE("checker: a message delayed by one step") {
  Schedule s = petra_grid(4, 14);
  // The head turns the last mini-batch around one step late.
  REQUIRE(s.cells[16][3] == std::vector<Action>{forward(3, 13), backward(3, 13), update(3)});
  REQUIRE(s.cells[17][3].empty());
  std::swap(s.cells[16][3], s.cells[17][3]);
  const auto problems = check_schedule(s);
  INFO(joined(problems));
  CHECK(mentions(problems, "step 17, stage 3: forward of mini-batch 13 reads the output stage 2 sent at step 15 "
                           "(one hop per step: expected step 16)"));
  CHECK(mentions(problems, "step 17, stage 2: backward of mini-batch 13 reads the gradient stage 3 sent at step 17 "
                           "(one hop per step: expected step 16)"));
  CHECK(mentions(problems, "step 15, stage 2: the output of forward 13 is never read") == false);  // it is, late
}

TEST_CASE("checker: an accumulation window of the wrong length") {
  Schedule s = petra_grid(4, 13, 2);
  // Stage 0's first update moves from after its 2nd backward (step 7) to after its 3rd (step 8).
  REQUIRE(s.cells[7][0] == std::vector<Action>{forward(0, 7), backward(0, 1), update(0)});
  s.cells[7][0].pop_back();
  REQUIRE(s.cells[8][0] == std::vector<Action>{forward(0, 8), backward(0, 2)});
  s.cells[8][0].push_back(update(0));
  const auto problems = check_schedule(s);
  INFO(joined(problems));
  CHECK(mentions(problems, "step 7, stage 0: no update after 2 backwards since the previous one (k = 2)"));
  CHECK(mentions(problems, "step 8, stage 0: update after 3 backwards since the previous update, expected k = 2"));
  CHECK(mentions(problems, "step 9, stage 0: update after 1 backward since the previous update, expected k = 2"));
  CHECK(problems.size() == 3);  // nothing else is wrong: the accumulation is stage-local
}

TEST_CASE("checker: updates, cell order, columns, duplicates, same-step backward") {
  {
    Schedule s = petra_grid(3, 4);
    s.cells[0][0].push_back(update(0));
    CHECK(check_schedule(s) == std::vector<std::string>{"step 0, stage 0: update without a backward in the same cell"});
  }
  {
    Schedule s = petra_grid(3, 4);
    std::swap(s.cells[3][1][0], s.cells[3][1][1]);  // "B0 F2 U"
    CHECK(mentions(check_schedule(s), "step 3, stage 1: actions out of order in 'B0 F2 U'"));
  }
  {
    Schedule s = petra_grid(3, 4);
    std::swap(s.cells[3][0], s.cells[3][1]);
    CHECK(mentions(check_schedule(s), "step 3, stage 1: action 0F3 is in the column of stage 1"));
  }
  {
    Schedule s = petra_grid(3, 4);
    s.cells[6][0] = {forward(0, 3), backward(0, 2), update(0)};
    const auto problems = check_schedule(s);
    INFO(joined(problems));
    CHECK(mentions(problems, "step 6, stage 0: stage 0 runs the forward of mini-batch 3 again (first at step 3)"));
  }
  {
    // Stage 1 of J = 3 turns mini-batch 0 around at once, as if it were the head.
    Schedule s = petra_grid(3, 1);
    s.cells[1][1] = {forward(1, 0), backward(1, 0), update(1)};
    s.cells[3][1].clear();
    const auto problems = check_schedule(s);
    INFO(joined(problems));
    CHECK(mentions(problems, "step 1, stage 1: backward of mini-batch 0 in the same step as its forward "
                             "(in a delayed method only the head may do that)"));
  }
  {
    Schedule s = petra_grid(3, 4);
    s.cells.pop_back();
    CHECK(check_schedule(s) == std::vector<std::string>{"the grid has 7 rows but steps = 8"});
  }
}

TEST_CASE("checker: a synchronous grid with a dropped backward") {
  Schedule s = make_schedule(PipelineMethod::backprop, 3, 5, 1, true);
  s.cells[2][1] = {forward(1, 2)};
  const auto problems = check_schedule(s);
  INFO(joined(problems));
  CHECK(mentions(problems, "step 2, stage 0: backward of mini-batch 2 but stage 1 never sent its gradient"));
  CHECK(mentions(problems, "step 2, stage 1: 1 mini-batch awaits its backward at the end of the step, "
                           "more than the 0 a synchronous method keeps"));
}
