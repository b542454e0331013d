// tests/fuzz/fuzz_idx.cpp: the IDX reader of MNIST and Fashion-MNIST (data/idx.cpp), raw or gzipped.
//
// Input: sections (tests/fuzz/fuzz_files.hpp); the first is the image file (bytes before any header
// too), the second the label file. read_idx checks both, with 10 classes.
#include <cstddef>
#include <cstdint>

#include "petra/data/readers.hpp"
#include "tests/fuzz/fuzz_files.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace petra;
  static fuzz::Scratch scratch("idx");
  const auto& dir = scratch.fresh();
  const auto sections = fuzz::write_sections(dir, {data, size}, "train-images-idx3-ubyte");
  const auto images = sections.size() > 0 ? sections[0].path : dir / "missing-images";
  const auto labels = sections.size() > 1 ? sections[1].path : dir / "missing-labels";
  fuzz::only_petra_errors([&] { data::read_idx(images, labels, /*classes=*/10); });
  return 0;
}
