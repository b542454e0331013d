// data/reader_support.cpp: error messages with file and offset, the gunzipping ByteStream, label
// checks and file lookup shared by the readers.
#include "petra/data/reader_support.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

namespace petra::data::detail {

namespace fs = std::filesystem;

namespace {

// deflate cannot compress better than about 1032:1 (zlib's FAQ): a gzip file of n bytes holds at
// most ~1032 n bytes, so a header promising more is corrupt; checked before allocating.
constexpr std::uint64_t kMaxDeflateRatio = 1032;
constexpr unsigned kGzipBufferBytes = 1u << 18;  // zlib's default 8 KiB makes reading ~2x slower

gzFile as_gz(void* p) { return static_cast<gzFile>(p); }

}  // namespace

void fail(std::string_view format, const fs::path& file, std::uint64_t offset, bool decompressed,
          const std::string& what) {
  throw IOError(::petra::detail::concat(format, " file '", file.string(), "', byte ", offset,
                                        decompressed ? " of the decompressed stream" : "", ": ", what));
}

ByteStream::ByteStream(const fs::path& path, std::string_view format) : path_(path), format_(format) {
  std::error_code error;
  const auto status = fs::status(path, error);
  if (!fs::exists(status)) throw IOError(::petra::detail::concat(format, " file '", path.string(), "' does not exist"));
  if (!fs::is_regular_file(status))
    throw IOError(::petra::detail::concat(format, " file '", path.string(), "' is not a regular file"));
  file_size_ = fs::file_size(path, error);
  gz_ = gzopen(path.c_str(), "rb");
  if (gz_ == nullptr)
    throw IOError(::petra::detail::concat(format, " file '", path.string(), "': cannot open: ", std::strerror(errno)));
  gzbuffer(as_gz(gz_), kGzipBufferBytes);
  compressed_ = gzdirect(as_gz(gz_)) == 0;  // reads the first buffer to look for the gzip magic
}

ByteStream::~ByteStream() {
  if (gz_ != nullptr) gzclose_r(as_gz(gz_));
}

void ByteStream::fail(std::uint64_t offset, const std::string& what) const {
  detail::fail(format_, path_, offset, compressed_, what);
}

void ByteStream::read(void* out, std::size_t n, std::string_view what) {
  auto* bytes = static_cast<unsigned char*>(out);
  std::size_t done = 0;
  while (done < n) {
    const auto chunk = static_cast<unsigned>(std::min<std::size_t>(n - done, std::size_t{1} << 30));
    const int got = gzread(as_gz(gz_), bytes + done, chunk);
    if (got > 0) done += static_cast<std::size_t>(got);
    if (got == static_cast<int>(chunk)) continue;
    // Short read: the end of the data, or a zlib error (corrupt or truncated gzip data).
    int code = Z_OK;
    const char* message = gzerror(as_gz(gz_), &code);
    const auto reached = static_cast<std::uint64_t>(std::max<z_off_t>(gztell(as_gz(gz_)), 0));
    if (code != Z_OK)
      fail(reached, ::petra::detail::concat("gzip error reading ", what, " (", n, " bytes from byte ", offset_,
                                            "; near compressed byte ", gzoffset(as_gz(gz_)), "): ", message));
    fail(reached, ::petra::detail::concat("truncated: ", what, " needs ", n, " bytes from byte ", offset_,
                                          ", the data ends at byte ", reached));
  }
  offset_ += n;
}

void ByteStream::expect_end() {
  unsigned char extra = 0;
  const int got = gzread(as_gz(gz_), &extra, 1);  // for gzip this also checks the CRC-32 trailer
  int code = Z_OK;
  const char* message = gzerror(as_gz(gz_), &code);
  if (code != Z_OK) fail(offset_, ::petra::detail::concat("gzip error at the end of the data: ", message));
  if (got > 0) fail(offset_, "unexpected data after the last record (the file is longer than its header says)");
}

void ByteStream::expect_total_size(std::uint64_t total, std::string_view what) {
  if (!compressed_) {
    if (total > file_size_)
      fail(file_size_, ::petra::detail::concat("truncated: ", what, " needs ", total, " bytes, the file ends at byte ",
                                               file_size_));
    if (total < file_size_)
      fail(total, ::petra::detail::concat(file_size_ - total, " unexpected bytes after ", what, " (", total,
                                          " bytes expected, the file has ", file_size_, ")"));
    return;
  }
  if (total / kMaxDeflateRatio > file_size_ + 1024)
    fail(offset_, ::petra::detail::concat(what, " needs ", total, " bytes, more than a gzip file of ", file_size_,
                                          " bytes can hold (corrupt header?)"));
}

void check_labels(const Tensor& labels, std::int64_t classes, std::string_view format, const fs::path& file,
                  std::uint64_t first_offset, std::uint64_t stride, bool decompressed) {
  const std::int64_t* label = labels.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < labels.numel(); ++i) {
    if (label[i] >= 0 && label[i] < classes) continue;
    fail(format, file, first_offset + static_cast<std::uint64_t>(i) * stride, decompressed,
         ::petra::detail::concat("label ", label[i], " of sample ", i, " is outside [0, ", classes, ")"));
  }
}

fs::path find_file(const fs::path& directory, std::initializer_list<std::string_view> names, std::string_view format) {
  std::string tried;
  for (std::string_view name : names) {
    const fs::path candidate = directory / name;
    std::error_code error;
    if (fs::exists(candidate, error)) return candidate;
    tried += (tried.empty() ? "" : ", ") + std::string(name);
  }
  throw IOError(::petra::detail::concat(format, ": none of ", tried, " exists in '", directory.string(), "'"));
}

}  // namespace petra::data::detail
