// tests/fuzz/fuzz_cifar.cpp: the CIFAR binary reader (data/cifar.cpp).
//
// Input: sections (tests/fuzz/fuzz_files.hpp), each one batch file (bytes before any header: the
// first). Named as CIFAR-100's files (train.bin, test.bin: the first name starts with "t") they are
// read as CIFAR-100 (2 label bytes, 100 classes), otherwise as CIFAR-10 (1 label byte, 10 classes).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "petra/data/readers.hpp"
#include "tests/fuzz/fuzz_files.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace petra;
  static fuzz::Scratch scratch("cifar");
  const auto sections = fuzz::write_sections(scratch.fresh(), {data, size}, "data_batch_1.bin");
  std::vector<std::filesystem::path> files;
  for (const fuzz::Section& s : sections) files.push_back(s.path);
  const bool cifar100 = !sections.empty() && sections[0].name.starts_with("t");
  fuzz::only_petra_errors([&] { data::read_cifar_batches(files, cifar100 ? 2 : 1, cifar100 ? 100 : 10); });
  return 0;
}
