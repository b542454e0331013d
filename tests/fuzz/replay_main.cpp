// tests/fuzz/replay_main.cpp: runs a fuzz target (LLVMFuzzerTestOneInput) over files, without
// libFuzzer: the regression test of the cpu suite that replays a target's corpus.
//
//   build/tests/fuzz/fuzz-npy-replay tests/fuzz/corpus/npy [more files or directories]
//
// Each argument is a file or a directory (its regular files, in name order). Exits 0 after every
// input ran; a crash, an exception other than petra::Error (the targets let only those through as
// expected) or a sanitizer report fails it, naming the input that was running; so does any refusal
// (petra::Error) of an input whose name starts with "valid-".
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "tests/fuzz/fuzz_files.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg = argv[i];
    if (fs::is_directory(arg)) {
      std::vector<fs::path> files;
      for (const auto& entry : fs::directory_iterator(arg))
        if (entry.is_regular_file()) files.push_back(entry.path());
      std::sort(files.begin(), files.end());
      inputs.insert(inputs.end(), files.begin(), files.end());
    } else if (fs::is_regular_file(arg)) {
      inputs.push_back(arg);
    } else {
      std::fprintf(stderr, "replay: %s is neither a file nor a directory\n", argv[i]);
      return 2;
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "replay: no inputs (usage: %s FILE_OR_DIRECTORY...)\n", argv[0]);
    return 2;
  }
  for (const fs::path& input : inputs) {
    std::ifstream in(input, std::ios::binary);
    const std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    std::printf("replay: %s (%zu bytes)\n", input.c_str(), bytes.size());
    std::fflush(stdout);
    petra::fuzz::refusals() = {};
    try {
      LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "replay: %s: the target let an exception out: %s\n", input.c_str(), e.what());
      return 1;
    }
    const auto& refused = petra::fuzz::refusals();
    if (input.filename().string().rfind("valid-", 0) == 0 && refused.count > 0) {
      std::fprintf(stderr, "replay: %s is a valid input, but the readers refused it %d time(s), first: %s\n",
                   input.c_str(), refused.count, refused.first.c_str());
      return 1;
    }
    if (refused.count > 0) std::printf("  refused (%d): %s\n", refused.count, refused.first.c_str());
  }
  std::printf("replay: %zu inputs, no finding\n", inputs.size());
  return 0;
}
