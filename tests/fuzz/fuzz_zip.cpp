// tests/fuzz/fuzz_zip.cpp: the zip reader (data/zip.hpp) and the ImageNet32 .npz reader on top of it
// (data/imagenet.cpp).
//
// Input: one .npz (zip) file. Every entry of its central directory is read (sizes and CRC-32
// checked), then the file is read as an ImageNet32 batch (data.npy and labels.npy).
#include <cstddef>
#include <cstdint>

#include "petra/data/readers.hpp"
#include "petra/data/zip.hpp"
#include "tests/fuzz/fuzz_files.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace petra;
  static fuzz::Scratch scratch("zip");
  const std::filesystem::path file = fuzz::write_file(scratch.fresh(), "batch.npz", {data, size});
  fuzz::only_petra_errors([&] {
    const data::ZipArchive archive(file);
    for (const data::ZipEntry& entry : archive.entries()) fuzz::only_petra_errors([&] { archive.read(entry); });
  });
  const std::filesystem::path files[] = {file};
  fuzz::only_petra_errors([&] { data::read_imagenet_npz(files); });
  return 0;
}
