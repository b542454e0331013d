// tests/fuzz/fuzz_files.hpp: what the fuzz targets share.
//
// Each target (tests/fuzz/fuzz_<reader>.cpp) is a LLVMFuzzerTestOneInput that feeds its input to
// one of petra's readers. The readers read files, so an input becomes files in a scratch
// directory of the process (under /dev/shm where it exists). A target that reads several files at
// once (an IDX image file and its labels, an npy directory, a checkpoint) takes its input as
// sections, each a header line "@@ NAME\n" followed by the file's bytes up to the next "\n@@ ":
//
//   @@ images.npy
//   <bytes>
//   @@ labels.npy
//   <bytes>
//
// The rule every target checks: for bad input, petra::Error is the only way out. Anything else (a
// crash, another exception, a sanitizer report, a hang past libFuzzer's -timeout, an allocation
// past its -rss_limit_mb) reaches libFuzzer as a finding.
//
// Built two ways (tests/fuzz/meson.build): with clang's libFuzzer (-Dfuzz=true, scripts/fuzz.sh),
// and with the normal compiler against replay_main.cpp, which runs the target over every file of
// its corpus (tests/fuzz/corpus/<target>/) as a test of the cpu suite.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "petra/error.hpp"

namespace petra::fuzz {

// A directory of this process for the files of one input; fresh() empties it.
class Scratch {
 public:
  explicit Scratch(std::string_view target);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  const std::filesystem::path& fresh();  // removes everything in it; returns it
  const std::filesystem::path& path() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

struct Section {
  std::string name;               // relative path, as in the header line
  std::filesystem::path path;     // where it was written
  std::span<const std::uint8_t> bytes;
};

// Writes the sections of `input` into `dir` and returns those written, in input order. Bytes before
// the first header form a section named `first_name`. A name is kept only if it is a plain relative
// path (letters, digits, '.', '_', '-', '/'; no "..", at most 6 levels) that does not clash with
// another; others are skipped, as are sections beyond the 512th: the harness, not the reader, decides
// what is a file.
std::vector<Section> write_sections(const std::filesystem::path& dir, std::span<const std::uint8_t> input,
                                    std::string_view first_name);

// Writes `bytes` as the file dir/name.
std::filesystem::path write_file(const std::filesystem::path& dir, std::string_view name,
                                 std::span<const std::uint8_t> bytes);

// The petra::Errors only_petra_errors swallowed since the last reset, and the first one's message:
// replay_main requires none for the corpus's valid-* inputs, so a reader that starts refusing good
// files fails the test too.
struct Refusals {
  int count = 0;
  std::string first;
};
Refusals& refusals();

// Runs `read`: petra::Error is the expected outcome of bad input and is swallowed (and counted);
// anything else propagates to libFuzzer (or to replay_main, which then fails).
template <class Read>
void only_petra_errors(Read&& read) {
  try {
    read();
  } catch (const petra::Error& e) {
    if (refusals().count++ == 0) refusals().first = e.what();
  }
}

}  // namespace petra::fuzz
