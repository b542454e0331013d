// pipeline/schedule.cpp: builds, prints, parses and checks schedules (see schedule.hpp).
#include "petra/pipeline/schedule.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <map>
#include <sstream>
#include <utility>

#include "petra/checked.hpp"
#include "petra/error.hpp"

namespace petra::pipeline {

using detail::concat;

namespace {
constexpr std::array<std::pair<PipelineMethod, std::string_view>, 6> kMethodNames{{
    {PipelineMethod::backprop, "backprop"},
    {PipelineMethod::revbackprop, "revbackprop"},
    {PipelineMethod::pipedream, "pipedream"},
    {PipelineMethod::dsp, "dsp"},
    {PipelineMethod::delayed_reversible, "delayed-reversible"},
    {PipelineMethod::petra, "petra"},
}};
}  // namespace

PipelineMethod parse_pipeline_method(std::string_view name) {
  for (const auto& [method, method_name] : kMethodNames)
    if (name == method_name) return method;
  throw ValueError(concat("unknown pipeline method '", name,
                          "' (known: backprop, revbackprop, pipedream, dsp, delayed-reversible, petra)"));
}

std::string_view name_of(PipelineMethod method) {
  for (const auto& [known, name] : kMethodNames)
    if (known == method) return name;
  throw ValueError(concat("name_of: invalid PipelineMethod ", static_cast<int>(method)));
}

bool is_delayed(PipelineMethod method) {
  return method != PipelineMethod::backprop && method != PipelineMethod::revbackprop;
}

std::int64_t delay_of(int stage, int stages) {
  PETRA_CHECK(stages >= 1 && stage >= 0 && stage < stages, ValueError, "delay_of: stage ", stage,
              " is not one of ", stages, " stages");
  return 2 * static_cast<std::int64_t>(stages - 1 - stage);
}

std::int64_t fifo_depth(int stage, int stages) { return delay_of(stage, stages); }

// ---- actions as text ------------------------------------------------------------------------

namespace {
// The cell form, without the stage: "F7", "B1", "U".
std::string cell_text(const Action& action) {
  std::string text(1, static_cast<char>(action.kind));
  if (action.kind != Action::Kind::update) text += std::to_string(action.microbatch);
  return text;
}

// Reads a whole non-negative decimal number; false when `text` is not exactly one.
bool read_number(std::string_view text, std::int64_t& value) {
  if (text.empty()) return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size() && value >= 0;
}

// Reads "F7", "B1", "U", or with an explicit stage "3F7", "3B1", "3U". `default_stage` is used
// when the stage is omitted (-1: the stage is required). Returns an empty string on success, else
// what is wrong.
std::string read_action(std::string_view text, int default_stage, Action& action) {
  const std::size_t letter = text.find_first_of("FBU");
  if (letter == std::string_view::npos)
    return concat("'", text, "' is not an action (expected F<m>, B<m> or U, optionally after a stage)");
  std::int64_t stage = default_stage;
  if (letter > 0 && !read_number(text.substr(0, letter), stage))
    return concat("'", text, "' has a malformed stage '", text.substr(0, letter), "'");
  if (stage < 0) return concat("'", text, "' names no stage (expected e.g. 3F7, 3B1, 3U)");
  if (stage > 1'000'000) return concat("'", text, "' has an absurd stage");
  const auto kind = static_cast<Action::Kind>(text[letter]);
  const std::string_view rest = text.substr(letter + 1);
  std::int64_t microbatch = -1;
  if (kind == Action::Kind::update) {
    if (!rest.empty()) return concat("'", text, "': an update takes no mini-batch");
  } else if (!read_number(rest, microbatch)) {
    return concat("'", text, "' has a malformed mini-batch '", rest, "'");
  }
  action = Action{kind, static_cast<int>(stage), microbatch};
  return {};
}
}  // namespace

std::string to_text(const Action& action) { return std::to_string(action.stage) + cell_text(action); }

Action parse_action(std::string_view text) {
  Action action{};
  const std::string problem = read_action(text, -1, action);
  if (!problem.empty()) throw ValueError("parse_action: " + problem);
  return action;
}

// ---- building -------------------------------------------------------------------------------

namespace {
// Appends U after a backward when the stage's count of backwards reaches a multiple of k.
void count_backward(std::vector<Action>& cell, int stage, std::int64_t& backwards, std::int64_t k) {
  ++backwards;
  if (backwards % k == 0) cell.push_back({Action::Kind::update, stage, -1});
}

// The flush update: after its last backward, a stage with an incomplete window updates anyway.
void add_flush_updates(Schedule& s, const std::vector<std::int64_t>& backwards) {
  for (int j = 0; j < s.stages; ++j) {
    if (backwards[j] % s.accumulation == 0) continue;
    for (std::int64_t t = s.steps - 1; t >= 0; --t) {
      auto& cell = s.cells[t][j];
      if (!cell.empty() && cell.back().kind == Action::Kind::backward) {
        cell.push_back({Action::Kind::update, j, -1});
        break;
      }
    }
  }
}

bool entered(std::int64_t microbatch, std::int64_t batches) { return microbatch >= 0 && microbatch < batches; }

// Refuses a grid of `steps` rows of `stages` cells beyond kMaxScheduleCells, before it is allocated.
void check_grid_size(std::int64_t steps, int stages, std::int64_t batches) {
  const std::int64_t cells = checked_mul(steps, stages, "make_schedule: the grid's cells");
  PETRA_CHECK(cells <= kMaxScheduleCells, ValueError, "make_schedule: ", batches, " mini-batches on ", stages,
              " stages make a grid of ", steps, " steps x ", stages, " stages = ", cells,
              " cells, above the limit of ", kMaxScheduleCells, " (the whole grid is held in memory)");
}
}  // namespace

Schedule make_schedule(PipelineMethod method, int stages, std::int64_t batches, std::int64_t accumulation,
                       bool drain) {
  PETRA_CHECK(stages >= 2, ValueError, "make_schedule: needs at least 2 stages, got ", stages);
  PETRA_CHECK(batches >= 0, ValueError, "make_schedule: negative number of mini-batches ", batches);
  PETRA_CHECK(accumulation >= 1, ValueError, "make_schedule: accumulation must be >= 1, got ", accumulation);
  const bool delayed = is_delayed(method);
  const int head = stages - 1;
  Schedule s{method, stages, batches, accumulation, batches, {}};
  if (delayed && drain) s.steps = checked_add(s.steps, 2 * head, "make_schedule: the grid's steps");
  check_grid_size(s.steps, stages, batches);
  s.cells.assign(s.steps, std::vector<std::vector<Action>>(stages));
  std::vector<std::int64_t> backwards(stages, 0);

  for (std::int64_t t = 0; t < s.steps; ++t) {
    for (int j = 0; j < stages; ++j) {
      auto& cell = s.cells[t][j];
      // Synchronous: everything on mini-batch t. Delayed: the head turns t-(J-1) around at once;
      // below it the backward of a mini-batch comes back 2(J-1-j) steps after its forward.
      const std::int64_t forward = delayed ? t - j : t;
      const std::int64_t backward = !delayed ? t : (j == head ? t - head : t - 2 * head + j);
      if (entered(forward, batches)) cell.push_back({Action::Kind::forward, j, forward});
      if (entered(backward, batches)) {
        cell.push_back({Action::Kind::backward, j, backward});
        count_backward(cell, j, backwards[j], accumulation);
      }
    }
  }
  if (drain) add_flush_updates(s, backwards);
  return s;
}

Schedule make_flushed_schedule(PipelineMethod method, int stages, std::int64_t batches, std::int64_t accumulation,
                               std::int64_t segment) {
  PETRA_CHECK(segment >= 1, ValueError, "make_flushed_schedule: segment must be >= 1, got ", segment);
  Schedule whole = make_schedule(method, stages, 0, accumulation, /*drain=*/false);  // no rows yet
  PETRA_CHECK(batches >= 0, ValueError, "make_flushed_schedule: negative number of mini-batches ", batches);
  const std::int64_t segments = batches / segment + (batches % segment != 0);
  const std::int64_t drain_steps = is_delayed(method) ? 2 * std::int64_t{stages - 1} : 0;
  check_grid_size(checked_add(batches, checked_mul(segments, drain_steps, "make_flushed_schedule: the drain steps"),
                              "make_flushed_schedule: the grid's steps"),
                  stages, batches);
  whole.batches = batches;
  for (std::int64_t offset = 0; offset < batches; offset += segment) {
    Schedule part = make_schedule(method, stages, std::min(segment, batches - offset), accumulation, /*drain=*/true);
    for (auto& row : part.cells) {
      for (auto& cell : row)
        for (Action& a : cell)
          if (a.kind != Action::Kind::update) a.microbatch += offset;
      whole.cells.push_back(std::move(row));
    }
    whole.steps += part.steps;
  }
  return whole;
}

// ---- printing -------------------------------------------------------------------------------

namespace {
std::string cell_to_text(const std::vector<Action>& cell, int column) {
  if (cell.empty()) return ".";
  std::string text;
  for (const Action& action : cell) {
    if (!text.empty()) text += ' ';
    text += action.stage == column ? cell_text(action) : to_text(action);
  }
  return text;
}

std::string step_label(std::int64_t step, std::size_t width) {
  std::string number = std::to_string(step);
  return "t=" + std::string(width > number.size() ? width - number.size() : 0, ' ') + number;
}

std::string pad(std::string text, std::size_t width) {
  if (text.size() < width) text.append(width - text.size(), ' ');
  return text;
}
}  // namespace

std::string to_text(const Schedule& s) {
  const std::size_t rows = s.cells.size();
  const std::size_t number_width = std::max<std::size_t>(3, std::to_string(rows > 0 ? rows - 1 : 0).size());
  // table[0] holds the column titles, table[1 + t] the cells of step t.
  std::vector<std::vector<std::string>> table(rows + 1);
  table[0].push_back("step");
  for (int j = 0; j < s.stages; ++j) table[0].push_back("stage " + std::to_string(j));
  for (std::size_t t = 0; t < rows; ++t) {
    table[t + 1].push_back(step_label(static_cast<std::int64_t>(t), number_width));
    for (std::size_t j = 0; j < s.cells[t].size(); ++j)
      table[t + 1].push_back(cell_to_text(s.cells[t][j], static_cast<int>(j)));
  }
  std::vector<std::size_t> width;
  for (const auto& row : table)
    for (std::size_t c = 0; c < row.size(); ++c) {
      if (width.size() <= c) width.push_back(0);
      width[c] = std::max(width[c], row[c].size());
    }

  std::ostringstream out;
  out << "# petra schedule: method=" << name_of(s.method) << " stages=" << s.stages << " batches=" << s.batches
      << " accumulation=" << s.accumulation << " steps=" << s.steps << '\n';
  for (const auto& row : table) {
    for (std::size_t c = 0; c < row.size(); ++c) {
      if (c > 0) out << " | ";
      out << (c + 1 < row.size() ? pad(row[c], width[c]) : row[c]);  // no trailing blanks
    }
    out << '\n';
  }
  return out.str();
}

// ---- parsing --------------------------------------------------------------------------------

namespace {
// Splits text into lines and remembers each line's 1-based number, to name it in errors.
class LineReader {
 public:
  explicit LineReader(std::string_view text) : text_(text) {}
  // The next line that is not blank; false at the end of the text.
  bool next(std::string_view& line) {
    while (position_ < text_.size()) {
      const std::size_t end = std::min(text_.find('\n', position_), text_.size());
      line = text_.substr(position_, end - position_);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      position_ = end + 1;
      ++number_;
      if (line.find_first_not_of(" \t") != std::string_view::npos) return true;
    }
    return false;
  }
  int number() const { return number_; }

 private:
  std::string_view text_;
  std::size_t position_ = 0;
  int number_ = 0;
};

[[noreturn]] void fail(int line, std::size_t column, const std::string& what) {
  throw ValueError(concat("parse_schedule: line ", line, ", column ", column + 1, ": ", what));
}

struct Token {
  std::string_view text;
  std::size_t column;  // 0-based offset of its first character in the line
};

// Splits `line[begin, end)` on blanks.
std::vector<Token> tokens_of(std::string_view line, std::size_t begin, std::size_t end) {
  std::vector<Token> tokens;
  std::size_t i = begin;
  while (i < end) {
    while (i < end && (line[i] == ' ' || line[i] == '\t')) ++i;
    const std::size_t start = i;
    while (i < end && line[i] != ' ' && line[i] != '\t') ++i;
    if (i > start) tokens.push_back({line.substr(start, i - start), start});
  }
  return tokens;
}

// Splits a line on '|' into fields [begin, end).
std::vector<std::pair<std::size_t, std::size_t>> fields_of(std::string_view line) {
  std::vector<std::pair<std::size_t, std::size_t>> fields;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t bar = line.find('|', begin);
    fields.emplace_back(begin, bar == std::string_view::npos ? line.size() : bar);
    if (bar == std::string_view::npos) return fields;
    begin = bar + 1;
  }
}

void read_header(std::string_view line, int line_number, Schedule& s) {
  constexpr std::string_view prefix = "# petra schedule:";
  if (line.substr(0, prefix.size()) != prefix)
    fail(line_number, 0, concat("expected the header '", prefix, " method=... stages=... batches=... ",
                                "accumulation=... steps=...'"));
  std::map<std::string_view, Token> values;
  for (const Token& token : tokens_of(line, prefix.size(), line.size())) {
    const std::size_t equals = token.text.find('=');
    if (equals == std::string_view::npos) fail(line_number, token.column, concat("expected key=value, got '", token.text, "'"));
    const std::string_view key = token.text.substr(0, equals);
    if (key != "method" && key != "stages" && key != "batches" && key != "accumulation" && key != "steps")
      fail(line_number, token.column, concat("unknown header key '", key, "'"));
    values[key] = {token.text.substr(equals + 1), token.column + equals + 1};
  }
  const auto number = [&](std::string_view key, std::int64_t lowest) {
    const auto found = values.find(key);
    if (found == values.end()) fail(line_number, line.size(), concat("the header lacks '", key, "='"));
    std::int64_t value = 0;
    if (!read_number(found->second.text, value) || value < lowest)
      fail(line_number, found->second.column, concat(key, " must be an integer >= ", lowest, ", got '",
                                                     found->second.text, "'"));
    return value;
  };
  const auto method = values.find("method");
  if (method == values.end()) fail(line_number, line.size(), "the header lacks 'method='");
  try {
    s.method = parse_pipeline_method(method->second.text);
  } catch (const ValueError& error) {
    fail(line_number, method->second.column, error.what());
  }
  const std::int64_t stages = number("stages", 1);
  if (stages > 1'000'000) fail(line_number, values.at("stages").column, "absurd number of stages");
  s.stages = static_cast<int>(stages);
  s.batches = number("batches", 0);
  s.accumulation = number("accumulation", 1);
  s.steps = number("steps", 0);
}

void read_titles(std::string_view line, int line_number, int stages) {
  const auto fields = fields_of(line);
  if (static_cast<int>(fields.size()) != stages + 1)
    fail(line_number, 0, concat("expected the column titles 'step | stage 0 | ... | stage ", stages - 1,
                                "', found ", fields.size(), " columns"));
}

void read_step(std::string_view line, int line_number, std::int64_t step, Schedule& s) {
  const auto fields = fields_of(line);
  const auto label = tokens_of(line, fields[0].first, fields[0].second);
  // "t=  5" reads as the tokens "t=" and "5" (or "t=5" when the number is long).
  std::string joined;
  for (const Token& token : label) joined += token.text;
  std::int64_t number = -1;
  if (joined.substr(0, 2) != "t=" || !read_number(std::string_view(joined).substr(2), number))
    fail(line_number, label.empty() ? 0 : label[0].column, concat("expected a step label 't= ", step, "'"));
  if (number != step) fail(line_number, label[0].column, concat("expected step ", step, ", found step ", number));
  if (static_cast<int>(fields.size()) != s.stages + 1)  // point at the end of the line or the extra cell
    fail(line_number, static_cast<int>(fields.size()) < s.stages + 1 ? line.size() : fields[s.stages + 1].first,
         concat("expected ", s.stages, " cells, found ", fields.size() - 1));
  auto& row = s.cells.emplace_back(s.stages);
  for (int j = 0; j < s.stages; ++j) {
    const auto [begin, end] = fields[j + 1];
    const auto tokens = tokens_of(line, begin, end);
    if (tokens.empty()) fail(line_number, begin, "empty cell (write '.' for a cell with no action)");
    if (tokens.size() == 1 && tokens[0].text == ".") continue;
    for (const Token& token : tokens) {
      Action action{};
      const std::string problem = read_action(token.text, j, action);
      if (!problem.empty()) fail(line_number, token.column, problem);
      row[j].push_back(action);
    }
  }
}
}  // namespace

Schedule parse_schedule(std::string_view text) {
  LineReader lines(text);
  std::string_view line;
  Schedule s{PipelineMethod::petra, 0, 0, 1, 0, {}};
  if (!lines.next(line)) fail(1, 0, "empty text, expected a schedule");
  read_header(line, lines.number(), s);
  if (!lines.next(line)) fail(lines.number() + 1, 0, "missing the column titles line");
  read_titles(line, lines.number(), s.stages);
  for (std::int64_t t = 0; t < s.steps; ++t) {
    if (!lines.next(line)) fail(lines.number() + 1, 0, concat("missing step ", t, " (the header says ", s.steps, " steps)"));
    read_step(line, lines.number(), t, s);
  }
  if (lines.next(line)) fail(lines.number(), 0, concat("more lines than the ", s.steps, " steps the header says"));
  return s;
}

// ---- checking -------------------------------------------------------------------------------

namespace {
class Checker {
 public:
  explicit Checker(const Schedule& s)
      : s_(s),
        delayed_(is_delayed(s.method)),
        lag_(delayed_ ? 1 : 0),
        head_(s.stages - 1),
        forward_step_(std::max(s.stages, 0), std::vector<std::int64_t>(std::max<std::int64_t>(s.batches, 0), -1)),
        backward_step_(forward_step_) {}

  std::vector<std::string> run() {
    if (!shape_is_valid()) return problems_;
    read_cells();
    check_entry_order();
    check_backwards_follow_forwards();
    check_messages();
    check_fifo_depth();
    check_accumulation();
    return problems_;
  }

 private:
  template <class... Parts>
  void report(Parts&&... parts) {
    problems_.push_back(concat(std::forward<Parts>(parts)...));
  }
  static std::string where(std::int64_t step, int stage) { return concat("step ", step, ", stage ", stage, ": "); }

  bool shape_is_valid() {
    if (s_.stages < 2) report("a schedule needs at least 2 stages, has ", s_.stages);
    if (s_.accumulation < 1) report("accumulation must be >= 1, is ", s_.accumulation);
    if (s_.batches < 0) report("negative number of mini-batches ", s_.batches);
    if (s_.batches > s_.steps)
      report(s_.batches, " mini-batches cannot enter stage 0 (one per step) in ", s_.steps, " steps");
    if (static_cast<std::int64_t>(s_.cells.size()) != s_.steps)
      report("the grid has ", s_.cells.size(), " rows but steps = ", s_.steps);
    for (std::size_t t = 0; t < s_.cells.size(); ++t)
      if (static_cast<int>(s_.cells[t].size()) != s_.stages)
        report("step ", t, " has ", s_.cells[t].size(), " cells but stages = ", s_.stages);
    return problems_.empty();
  }

  // One action per kind and cell, in the order F, B, U; fills forward_step_ and backward_step_.
  void read_cells() {
    for (std::int64_t t = 0; t < s_.steps; ++t)
      for (int j = 0; j < s_.stages; ++j) read_cell(t, j);
  }

  void read_cell(std::int64_t t, int j) {
    int previous_rank = -1;
    for (const Action& action : s_.cells[t][j]) {
      const int rank = action.kind == Action::Kind::forward ? 0 : action.kind == Action::Kind::backward ? 1 : 2;
      if (rank <= previous_rank) {
        report(where(t, j), "actions out of order in '", cell_to_text(s_.cells[t][j], j),
               "' (a cell holds at most one F, one B, one U, in that order)");
        return;
      }
      previous_rank = rank;
      if (action.stage != j) {
        report(where(t, j), "action ", to_text(action), " is in the column of stage ", j);
        continue;
      }
      if (action.kind == Action::Kind::update) {
        if (action.microbatch != -1) report(where(t, j), "an update names mini-batch ", action.microbatch);
        continue;
      }
      if (action.microbatch < 0 || action.microbatch >= s_.batches) {
        report(where(t, j), to_text(action), " names a mini-batch outside 0 .. ", s_.batches - 1);
        continue;
      }
      const bool forward = action.kind == Action::Kind::forward;
      std::int64_t& seen = (forward ? forward_step_ : backward_step_)[j][action.microbatch];
      if (seen >= 0) {
        report(where(t, j), "stage ", j, " runs the ", forward ? "forward" : "backward", " of mini-batch ",
               action.microbatch, " again (first at step ", seen, ")");
        continue;
      }
      seen = t;
    }
  }

  // Mini-batches enter stage 0 in order, each one exactly once.
  void check_entry_order() {
    for (std::int64_t m = 0; m < s_.batches; ++m) {
      const std::int64_t entry = forward_step_[0][m];
      if (entry < 0)
        report("mini-batch ", m, " never enters stage 0");
      else if (m > 0 && forward_step_[0][m - 1] >= entry)
        report(where(entry, 0), "mini-batch ", m, " enters before mini-batch ", m - 1, " (step ",
               forward_step_[0][m - 1], ")");
    }
  }

  void check_backwards_follow_forwards() {
    for (int j = 0; j < s_.stages; ++j)
      for (std::int64_t m = 0; m < s_.batches; ++m) {
        const std::int64_t b = backward_step_[j][m], f = forward_step_[j][m];
        if (b < 0) continue;
        if (f < 0)
          report(where(b, j), "backward of mini-batch ", m, " but stage ", j, " never ran its forward");
        else if (f > b)
          report(where(b, j), "backward of mini-batch ", m, " before its forward (step ", f, ")");
        else if (f == b && delayed_ && j != head_)
          report(where(b, j), "backward of mini-batch ", m, " in the same step as its forward ",
                 "(in a delayed method only the head may do that)");
      }
  }

  // Every consumer reads a message its producer made `lag_` steps before, and every message due
  // inside the grid is read.
  void check_messages() {
    const char* hop = delayed_ ? "one hop per step" : "a synchronous method passes messages within the step";
    for (int j = 0; j < s_.stages; ++j)
      for (std::int64_t m = 0; m < s_.batches; ++m) {
        const std::int64_t f = forward_step_[j][m], b = backward_step_[j][m];
        if (f >= 0 && j > 0) {
          const std::int64_t sent = forward_step_[j - 1][m];
          if (sent < 0)
            report(where(f, j), "forward of mini-batch ", m, " but stage ", j - 1, " never sent its output");
          else if (sent != f - lag_)
            report(where(f, j), "forward of mini-batch ", m, " reads the output stage ", j - 1, " sent at step ",
                   sent, " (", hop, ": expected step ", f - lag_, ")");
        }
        if (f >= 0 && j < head_ && f + lag_ < s_.steps && forward_step_[j + 1][m] < 0)
          report(where(f, j), "the output of forward ", m, " is never read by stage ", j + 1,
                 " (due at step ", f + lag_, ")");
        if (b >= 0 && j < head_) {
          const std::int64_t sent = backward_step_[j + 1][m];
          if (sent < 0)
            report(where(b, j), "backward of mini-batch ", m, " but stage ", j + 1, " never sent its gradient");
          else if (sent != b - lag_)
            report(where(b, j), "backward of mini-batch ", m, " reads the gradient stage ", j + 1,
                   " sent at step ", sent, " (", hop, ": expected step ", b - lag_, ")");
        }
        if (b >= 0 && j > 0 && b + lag_ < s_.steps && backward_step_[j - 1][m] < 0)
          report(where(b, j), "the gradient of backward ", m, " is never read by stage ", j - 1,
                 " (due at step ", b + lag_, ")");
      }
  }

  // Mini-batches awaiting their backward at the end of each step; the first excess per stage.
  void check_fifo_depth() {
    for (int j = 0; j < s_.stages; ++j) {
      const std::int64_t limit = delayed_ ? fifo_depth(j, s_.stages) : 0;
      std::vector<std::int64_t> change(s_.steps + 1, 0);
      for (std::int64_t m = 0; m < s_.batches; ++m) {
        if (forward_step_[j][m] >= 0) ++change[forward_step_[j][m]];
        if (backward_step_[j][m] >= forward_step_[j][m] && forward_step_[j][m] >= 0) --change[backward_step_[j][m]];
      }
      std::int64_t waiting = 0;
      for (std::int64_t t = 0; t < s_.steps; ++t) {
        waiting += change[t];
        if (waiting > limit) {
          report(where(t, j), waiting, waiting == 1 ? " mini-batch awaits its" : " mini-batches await their",
                 " backward at the end of the step, more than the ",
                 delayed_ ? concat("FIFO depth 2(J-1-j) = ", limit) : std::string("0 a synchronous method keeps"));
          break;
        }
      }
    }
  }

  void check_accumulation() {
    const std::int64_t k = s_.accumulation;
    for (int j = 0; j < s_.stages; ++j) {
      std::int64_t last_backward_step = -1;
      for (std::int64_t t = 0; t < s_.steps; ++t)
        for (const Action& a : s_.cells[t][j])
          if (a.kind == Action::Kind::backward) last_backward_step = t;
      std::int64_t since_update = 0, in_flight = 0;
      for (std::int64_t t = 0; t < s_.steps; ++t) {
        bool backward_here = false, update_here = false;
        for (const Action& a : s_.cells[t][j]) {
          if (a.kind == Action::Kind::forward) {
            ++in_flight;
          } else if (a.kind == Action::Kind::backward) {
            backward_here = true;
            ++since_update;
            --in_flight;
          } else if (a.kind == Action::Kind::update) {
            update_here = true;
          }
        }
        const bool flushed = t == last_backward_step || (delayed_ && in_flight == 0);
        if (update_here && !backward_here) {
          report(where(t, j), "update without a backward in the same cell");
        } else if (update_here && since_update != k) {
          if (since_update > k || !flushed)  // a short window only when the stage is flushed
            report(where(t, j), "update after ", since_update, " backward", since_update == 1 ? "" : "s",
                   " since the previous update, expected k = ", k);
        } else if (!update_here && backward_here && since_update == k) {
          report(where(t, j), "no update after ", since_update, " backwards since the previous one (k = ", k, ")");
        }
        if (update_here) since_update = 0;
      }
    }
  }

  const Schedule& s_;
  const bool delayed_;
  const std::int64_t lag_;
  const int head_;
  std::vector<std::vector<std::int64_t>> forward_step_, backward_step_;  // [stage][mini-batch], -1: never
  std::vector<std::string> problems_;
};
}  // namespace

std::vector<std::string> check_schedule(const Schedule& schedule) { return Checker(schedule).run(); }

}  // namespace petra::pipeline
