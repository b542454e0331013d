// data/reader_support.hpp: what the readers share (internal, not installed): error messages that
// name the file and byte offset, a sequential file reader that gunzips transparently, and checks.
// Sizes read from files are combined with petra/checked.hpp, and bounded by the limits of
// data/dataset.hpp (kMaxClasses, kMaxChannels, kMaxImageSide).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "petra/checked.hpp"
#include "petra/data/dataset.hpp"
#include "petra/error.hpp"
#include "petra/tensor.hpp"

namespace petra::data::detail {

// Throws IOError "<format> file '<file>', byte <offset>[ of the decompressed stream]: <what>".
[[noreturn]] void fail(std::string_view format, const std::filesystem::path& file, std::uint64_t offset,
                       bool decompressed, const std::string& what);

// Bytes that arrive in pieces (inflated data), kept in chunks allocated as the bytes come: the first
// of 1 MiB, each next one as large as what is held, none past `limit` in all. So the memory follows
// the data, never a header's claim, and nothing is copied or zero-filled on the way.
class ChunkedBuffer {
 public:
  explicit ChunkedBuffer(std::uint64_t limit) : limit_(limit) {}
  std::uint64_t size() const { return size_; }
  std::uint64_t limit() const { return limit_; }
  // Room for more bytes at the end (empty once size() == limit()); commit(n) keeps n of them.
  std::span<std::byte> room();
  void commit(std::size_t n);
  void copy_to(void* out) const;      // all size() bytes
  std::vector<std::byte> to_vector() const;

 private:
  struct Chunk {
    std::unique_ptr<std::byte[]> bytes;
    std::size_t capacity = 0, used = 0;
  };
  std::vector<Chunk> chunks_;
  std::uint64_t limit_ = 0, size_ = 0;
};

// Reads a file front to back. A gzip file (magic 1f 8b) is inflated on the fly, member after
// member; any other file is read as is. Offsets count bytes of the decompressed stream. Corrupt gzip
// data is reported where inflate finds it: the decompressed byte reached and the compressed byte
// (a damaged CRC-32 where the member ends); bytes after the last member that are not another gzip
// member are refused.
class ByteStream {
 public:
  ByteStream(const std::filesystem::path& path, std::string_view format);
  ~ByteStream();
  ByteStream(const ByteStream&) = delete;
  ByteStream& operator=(const ByteStream&) = delete;

  bool compressed() const { return gzip_ != nullptr; }
  std::uint64_t file_size() const { return file_size_; }  // on disk
  std::uint64_t offset() const { return offset_; }        // bytes delivered so far
  const std::filesystem::path& path() const { return path_; }

  // Reads exactly n bytes, or throws IOError saying where the stream ended (`what` names the
  // bytes wanted: "the header", "image 7", ...).
  void read(void* out, std::size_t n, std::string_view what);
  // Reads exactly n bytes. For a compressed stream into chunks that come with the data, so a header
  // promising more than the stream holds costs about what did arrive; a plain file is checked
  // against its size before anything is allocated.
  ChunkedBuffer read_chunked(std::uint64_t n, std::string_view what);
  // Throws IOError if any byte is left (a file longer than its header says is not the file we think).
  void expect_end();
  // Throws IOError before a huge allocation if the header promises more than `total` bytes can
  // come from this file: the exact file size for a plain file, the deflate limit (1032:1) for gzip.
  void expect_total_size(std::uint64_t total, std::string_view what);

  // "<format> file '<file>', byte <offset>[ of the decompressed stream]": the start of a message.
  std::string where(std::uint64_t offset) const;
  [[noreturn]] void fail(std::uint64_t offset, const std::string& what) const;

 private:
  struct Gzip;  // zlib's state, the compressed input buffer
  // Up to n bytes into out, advancing offset(); fewer only at the end of the data.
  std::size_t pull(unsigned char* out, std::size_t n, std::string_view what);
  std::size_t read_file(unsigned char* out, std::size_t n);  // raw bytes of the file, 0 at its end

  std::filesystem::path path_;
  std::string format_;
  int fd_ = -1;
  std::unique_ptr<Gzip> gzip_;
  std::uint64_t file_size_ = 0;
  std::uint64_t offset_ = 0;
};

// Throws IOError unless every label (int64, contiguous) is in [0, classes), naming the file, the
// label's byte (label i lies at first_offset + i * stride), its sample, and `classes_source` (where
// the number of classes came from) if given.
void check_labels(const Tensor& labels, std::int64_t classes, std::string_view format,
                  const std::filesystem::path& file, std::uint64_t first_offset, std::uint64_t stride,
                  bool decompressed, std::string_view classes_source = {});

// The first of `names` that exists in `directory` (each tried as is), or IOError listing them all.
std::filesystem::path find_file(const std::filesystem::path& directory, std::initializer_list<std::string_view> names,
                                std::string_view format);

}  // namespace petra::data::detail
