// data/reader_support.hpp: what the readers share (internal, not installed): error messages that
// name the file and byte offset, a sequential file reader that gunzips transparently, and checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>

#include "petra/error.hpp"
#include "petra/tensor.hpp"

namespace petra::data::detail {

// Throws IOError "<format> file '<file>', byte <offset>[ of the decompressed stream]: <what>".
[[noreturn]] void fail(std::string_view format, const std::filesystem::path& file, std::uint64_t offset,
                       bool decompressed, const std::string& what);

// Reads a file front to back. A gzip file (magic 1f 8b) is decompressed on the fly; any other file
// is read as is (zlib's gz* functions do both). Offsets count bytes of the decompressed stream.
class ByteStream {
 public:
  ByteStream(const std::filesystem::path& path, std::string_view format);
  ~ByteStream();
  ByteStream(const ByteStream&) = delete;
  ByteStream& operator=(const ByteStream&) = delete;

  bool compressed() const { return compressed_; }
  std::uint64_t file_size() const { return file_size_; }  // on disk
  std::uint64_t offset() const { return offset_; }        // bytes delivered so far
  const std::filesystem::path& path() const { return path_; }

  // Reads exactly n bytes, or throws IOError saying where the stream ended (`what` names the
  // bytes wanted: "the header", "image 7", ...).
  void read(void* out, std::size_t n, std::string_view what);
  // Throws IOError if any byte is left (a file longer than its header says is not the file we think).
  void expect_end();
  // Throws IOError before a huge allocation if the header promises more than `total` bytes can
  // come from this file: the exact file size for a plain file, the deflate limit (1032:1) for gzip.
  void expect_total_size(std::uint64_t total, std::string_view what);

  [[noreturn]] void fail(std::uint64_t offset, const std::string& what) const;

 private:
  std::filesystem::path path_;
  std::string format_;
  void* gz_ = nullptr;  // gzFile
  bool compressed_ = false;
  std::uint64_t file_size_ = 0;
  std::uint64_t offset_ = 0;
};

// Throws IOError unless every label (int64, contiguous) is in [0, classes). Label i lies at byte
// first_offset + i * stride of `file`.
void check_labels(const Tensor& labels, std::int64_t classes, std::string_view format,
                  const std::filesystem::path& file, std::uint64_t first_offset, std::uint64_t stride,
                  bool decompressed);

// The first of `names` that exists in `directory` (each tried as is), or IOError listing them all.
std::filesystem::path find_file(const std::filesystem::path& directory, std::initializer_list<std::string_view> names,
                                std::string_view format);

}  // namespace petra::data::detail
