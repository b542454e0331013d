// tests/fuzz/fuzz_npy.cpp: the .npy reader (petra/npy.hpp) and the npy-directory data set reader
// (data/readers.hpp: images.npy, labels.npy, classes.txt, test_*.npy).
//
// Input: sections (tests/fuzz/fuzz_files.hpp) named as the directory's files; bytes before the first
// header are images.npy. Each .npy section is parsed alone (parse_npy from memory, load_npy from
// its file), then the directory is read as a data set (with --classes 10 where it has no classes.txt).
#include <cstddef>
#include <cstdint>

#include "petra/data/readers.hpp"
#include "petra/npy.hpp"
#include "tests/fuzz/fuzz_files.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace petra;
  static fuzz::Scratch scratch("npy");
  const auto sections = fuzz::write_sections(scratch.fresh(), {data, size}, "images.npy");
  for (const fuzz::Section& s : sections) {
    if (!s.name.ends_with(".npy")) continue;
    fuzz::only_petra_errors([&] { parse_npy(std::as_bytes(s.bytes), s.name); });
    fuzz::only_petra_errors([&] { load_npy(s.path); });
  }
  fuzz::only_petra_errors([&] { data::read_npy_directory(scratch.path(), /*classes=*/10); });
  return 0;
}
