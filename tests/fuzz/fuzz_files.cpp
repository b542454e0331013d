// tests/fuzz/fuzz_files.cpp: fuzz inputs as files (tests/fuzz/fuzz_files.hpp).
#include "tests/fuzz/fuzz_files.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <system_error>

namespace petra::fuzz {

namespace fs = std::filesystem;

Refusals& refusals() {
  static Refusals r;
  return r;
}

Scratch::Scratch(std::string_view target) {
  const fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  dir_ = base / ("petra-fuzz-" + std::string(target) + "-" + std::to_string(::getpid()));
  fresh();
}

Scratch::~Scratch() {
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
}

const fs::path& Scratch::fresh() {
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
  fs::create_directories(dir_);
  return dir_;
}

namespace {

constexpr std::size_t kMaxSections = 512;
constexpr int kMaxDepth = 6;

bool plain_name(std::string_view name) {
  if (name.empty() || name.front() == '/' || name.back() == '/') return false;
  int depth = 1;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-' || c == '/';
    if (!ok) return false;
    depth += c == '/';
  }
  if (depth > kMaxDepth) return false;
  for (const auto& part : fs::path(name))
    if (part == ".." || part == "." || part.empty()) return false;
  return true;
}

}  // namespace

fs::path write_file(const fs::path& dir, std::string_view name, std::span<const std::uint8_t> bytes) {
  const fs::path path = dir / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return path;
}

std::vector<Section> write_sections(const fs::path& dir, std::span<const std::uint8_t> input,
                                    std::string_view first_name) {
  const std::string_view text(reinterpret_cast<const char*>(input.data()), input.size());
  // Section boundaries: "@@ " at the start of the input or after a newline.
  std::vector<Section> sections;
  std::size_t at = 0;
  std::string name(first_name);
  if (text.substr(0, 3) == "@@ ") name.clear();
  while (at <= text.size() && sections.size() < kMaxSections) {
    if (name.empty()) {  // a header line at `at`
      const std::size_t end_of_line = text.find('\n', at);
      if (end_of_line == std::string_view::npos) break;
      name = std::string(text.substr(at + 3, end_of_line - at - 3));
      at = end_of_line + 1;
    }
    const std::size_t next = text.find("\n@@ ", at);
    const std::size_t end = next == std::string_view::npos ? text.size() : next;
    const auto bytes = input.subspan(at, end - at);
    std::error_code error;
    const fs::path path = dir / name;
    if (plain_name(name) && !fs::exists(path, error)) {
      fs::create_directories(path.parent_path(), error);
      if (!error && fs::is_directory(path.parent_path(), error)) {
        write_file(dir, name, bytes);
        sections.push_back({name, path, bytes});
      }
    }
    if (next == std::string_view::npos) break;
    at = next + 1;
    name.clear();
  }
  return sections;
}

}  // namespace petra::fuzz
