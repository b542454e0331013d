// data/reader_support.cpp: error messages with file and offset, the gunzipping ByteStream (zlib's
// inflate on the file's bytes, so that an error's offsets are known), label checks and file lookup
// shared by the readers.
#include "petra/data/reader_support.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
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
constexpr std::size_t kGzipBufferBytes = std::size_t{1} << 18;  // compressed bytes read at a time
constexpr std::size_t kFirstStepBytes = std::size_t{1} << 20;   // ChunkedBuffer's first chunk
constexpr unsigned kMaxInflateStep = 1u << 30;                  // zlib counts in 32-bit uInt
constexpr std::uint64_t kDrainBytes = std::uint64_t{1} << 26;   // inflated past the end to check a CRC

}  // namespace

struct ByteStream::Gzip {
  z_stream z{};
  std::vector<unsigned char> input = std::vector<unsigned char>(kGzipBufferBytes);
  std::uint64_t input_read = 0;  // compressed bytes read from the file so far
  bool ended = false;            // the last member is complete and nothing follows it
  // The compressed byte inflate read last (where an error it reports lies).
  std::uint64_t compressed_position() const {
    const std::uint64_t consumed = input_read - z.avail_in;
    return consumed > 0 ? consumed - 1 : 0;
  }
  ~Gzip() { inflateEnd(&z); }
};

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
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0)
    throw IOError(::petra::detail::concat(format, " file '", path.string(), "': cannot open: ", std::strerror(errno)));
  struct stat file_status {};
  if (::fstat(fd_, &file_status) != 0) {
    ::close(fd_);
    throw IOError(::petra::detail::concat(format, " file '", path.string(), "': cannot stat: ", std::strerror(errno)));
  }
  file_size_ = static_cast<std::uint64_t>(file_status.st_size);
  try {
    // A gzip file starts with 1f 8b; anything else (a file of 0 or 1 byte too) is read as is.
    unsigned char magic[2] = {0, 0};
    const std::size_t got = read_file(magic, 2);
    if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
      gzip_ = std::make_unique<Gzip>();
      if (inflateInit2(&gzip_->z, 16 + MAX_WBITS) != Z_OK) {  // gzip members only, no zlib or raw streams
        gzip_.reset();
        throw IOError(::petra::detail::concat(format, " file '", path.string(), "': zlib's inflateInit2 failed"));
      }
      std::memcpy(gzip_->input.data(), magic, 2);
      gzip_->input_read = 2;
      gzip_->z.next_in = gzip_->input.data();
      gzip_->z.avail_in = 2;
    } else if (::lseek(fd_, 0, SEEK_SET) != 0) {
      throw IOError(::petra::detail::concat(format, " file '", path.string(), "': cannot seek: ", std::strerror(errno)));
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

ByteStream::~ByteStream() {
  gzip_.reset();
  if (fd_ >= 0) ::close(fd_);
}

std::string ByteStream::where(std::uint64_t offset) const {
  return ::petra::detail::concat(format_, " file '", path_.string(), "', byte ", offset,
                                 compressed() ? " of the decompressed stream" : "");
}

void ByteStream::fail(std::uint64_t offset, const std::string& what) const {
  detail::fail(format_, path_, offset, compressed(), what);
}

std::size_t ByteStream::read_file(unsigned char* out, std::size_t n) {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t got = ::read(fd_, out + done, std::min<std::size_t>(n - done, std::size_t{1} << 30));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail(offset_, ::petra::detail::concat("read failed: ", std::strerror(errno)));
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return done;
}

std::size_t ByteStream::pull(unsigned char* out, std::size_t n, std::string_view what) {
  if (!gzip_) {
    const std::size_t got = read_file(out, n);
    offset_ += got;
    return got;
  }
  Gzip& g = *gzip_;
  std::size_t done = 0;
  while (done < n && !g.ended) {
    if (g.z.avail_in == 0) {
      const std::size_t got = read_file(g.input.data(), g.input.size());
      g.input_read += got;
      g.z.next_in = g.input.data();
      g.z.avail_in = static_cast<uInt>(got);
      if (got == 0)
        fail(offset_, ::petra::detail::concat("truncated gzip data: the file ends (compressed byte ", file_size_,
                                              ") inside a gzip member, reading ", what));
    }
    const auto step = static_cast<uInt>(std::min<std::size_t>(n - done, kMaxInflateStep));
    g.z.next_out = out + done;
    g.z.avail_out = step;
    const int status = inflate(&g.z, Z_NO_FLUSH);
    const std::size_t produced = step - g.z.avail_out;
    done += produced;
    offset_ += produced;
    if (status == Z_STREAM_END) {
      // Another member may follow (gzip files may be concatenated); anything else is refused.
      if (g.z.avail_in == 0) {
        const std::size_t got = read_file(g.input.data(), g.input.size());
        g.input_read += got;
        g.z.next_in = g.input.data();
        g.z.avail_in = static_cast<uInt>(got);
      }
      if (g.z.avail_in == 0) {
        g.ended = true;
      } else if (g.z.next_in[0] != 0x1f) {
        fail(offset_, ::petra::detail::concat("the gzip data ends at compressed byte ", g.input_read - g.z.avail_in, ", and the ",
                                              file_size_ - (g.input_read - g.z.avail_in),
                                              " bytes after it are not another gzip member"));
      } else {
        inflateReset(&g.z);
      }
    } else if (status != Z_OK && status != Z_BUF_ERROR) {
      const char* message = g.z.msg != nullptr ? g.z.msg : status == Z_MEM_ERROR ? "out of memory" : "corrupt data";
      fail(offset_, ::petra::detail::concat("gzip error reading ", what, " at compressed byte ", g.compressed_position(),
                                            ": ", message));
    }
  }
  return done;
}

void ByteStream::read(void* out, std::size_t n, std::string_view what) {
  const std::uint64_t start = offset_;
  const std::size_t got = pull(static_cast<unsigned char*>(out), n, what);
  if (got < n)
    fail(offset_, ::petra::detail::concat("truncated: ", what, " needs ", n, " bytes from byte ", start,
                                          ", the data ends at byte ", offset_));
}

ChunkedBuffer ByteStream::read_chunked(std::uint64_t n, std::string_view what) {
  const std::uint64_t start = offset_;
  if (!gzip_ && n > file_size_ - std::min(offset_, file_size_))
    fail(file_size_, ::petra::detail::concat("truncated: ", what, " needs ", n, " bytes from byte ", start,
                                             ", the file ends at byte ", file_size_));
  ChunkedBuffer out(n);
  while (out.size() < n) {
    const std::span<std::byte> room = out.room();
    const std::size_t got = pull(reinterpret_cast<unsigned char*>(room.data()), room.size(), what);
    out.commit(got);
    if (got < room.size())
      fail(offset_, ::petra::detail::concat("truncated: ", what, " needs ", n, " bytes from byte ", start,
                                            ", the data ends at byte ", offset_));
  }
  return out;
}

std::span<std::byte> ChunkedBuffer::room() {
  if (size_ == limit_) return {};
  if (chunks_.empty() || chunks_.back().used == chunks_.back().capacity) {
    const auto capacity = static_cast<std::size_t>(std::min<std::uint64_t>(limit_ - size_, std::max<std::uint64_t>(kFirstStepBytes, size_)));
    chunks_.push_back({std::unique_ptr<std::byte[]>(new std::byte[capacity]), capacity, 0});  // not zero-filled
  }
  Chunk& last = chunks_.back();
  return {last.bytes.get() + last.used, last.capacity - last.used};
}

void ChunkedBuffer::commit(std::size_t n) {
  if (n == 0) return;  // nothing came (room() may have had none to give: an entry of 0 bytes)
  PETRA_CHECK(!chunks_.empty() && n <= chunks_.back().capacity - chunks_.back().used, ValueError,
              "ChunkedBuffer::commit: ", n, " bytes, more than the room");
  chunks_.back().used += n;
  size_ += n;
}

void ChunkedBuffer::copy_to(void* out) const {
  auto* to = static_cast<std::byte*>(out);
  for (const Chunk& c : chunks_) {
    if (c.used > 0) std::memcpy(to, c.bytes.get(), c.used);
    to += c.used;
  }
}

std::vector<std::byte> ChunkedBuffer::to_vector() const {
  std::vector<std::byte> out;
  out.reserve(static_cast<std::size_t>(size_));
  for (const Chunk& c : chunks_) out.insert(out.end(), c.bytes.get(), c.bytes.get() + c.used);
  return out;
}

void ByteStream::expect_end() {
  const std::uint64_t end = offset_;
  unsigned char extra = 0;
  // For gzip this also reads the CRC-32 trailer, which fails here when the data is damaged.
  if (pull(&extra, 1, "the end of the data") == 0) return;
  // More data: for gzip, inflate on (into a small buffer, up to kDrainBytes) to find out whether
  // the data is damaged, which its CRC-32 at the end of the member tells, and how much follows.
  if (compressed()) {
    std::vector<unsigned char> scratch(std::size_t{1} << 16);
    while (offset_ - end < kDrainBytes && pull(scratch.data(), scratch.size(), "the data after the last record") > 0) {
    }
  }
  fail(end, ::petra::detail::concat("unexpected data after the last record: ", offset_ - end,
                                    offset_ - end >= kDrainBytes ? " or more" : "",
                                    " bytes more than the header says"));
}

void ByteStream::expect_total_size(std::uint64_t total, std::string_view what) {
  if (!compressed()) {
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
                  std::uint64_t first_offset, std::uint64_t stride, bool decompressed, std::string_view classes_source) {
  const std::int64_t* label = labels.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < labels.numel(); ++i) {
    if (label[i] >= 0 && label[i] < classes) continue;
    fail(format, file, first_offset + static_cast<std::uint64_t>(i) * stride, decompressed,
         ::petra::detail::concat("label ", label[i], " of sample ", i, " is outside [0, ", classes, ")",
                                 classes_source.empty() ? "" : " (", classes_source, classes_source.empty() ? "" : " classes)"));
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
