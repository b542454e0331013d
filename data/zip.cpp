// data/zip.cpp: the zip reader of data/zip.hpp: end of central directory (and its ZIP64 form),
// central directory headers, local headers, stored and deflated entries (zlib, raw deflate).
#include "petra/data/zip.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "petra/checked.hpp"
#include "petra/data/reader_support.hpp"

namespace petra::data {

namespace fs = std::filesystem;
using ::petra::detail::concat;

namespace {

constexpr std::uint32_t kLocalHeaderSignature = 0x04034b50;
constexpr std::uint32_t kCentralHeaderSignature = 0x02014b50;
constexpr std::uint32_t kEndSignature = 0x06054b50;
constexpr std::uint32_t kZip64EndSignature = 0x06064b50;
constexpr std::uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr std::uint16_t kZip64ExtraId = 0x0001;
constexpr std::size_t kEndBytes = 22, kZip64EndBytes = 56, kZip64LocatorBytes = 20;
constexpr std::size_t kCentralHeaderBytes = 46, kLocalHeaderBytes = 30;
constexpr std::size_t kMaxCommentBytes = 0xFFFF;
// deflate cannot compress better than about 1032:1 (zlib's FAQ): a declared size beyond 1032 times
// the compressed size is a corrupt header.
constexpr std::uint64_t kMaxDeflateRatio = 1032;

// Little-endian fields of the mapped archive; `at` and `need` are checked against the size first.
class Bytes {
 public:
  Bytes(const std::byte* data, std::size_t size, const fs::path& path) : data_(data), size_(size), path_(path) {}
  void need(std::uint64_t at, std::uint64_t count, std::string_view what) const {
    if (at > size_ || count > size_ - at)
      fail(std::min<std::uint64_t>(at, size_), concat("truncated: ", what, " needs ", count, " bytes from byte ", at,
                                                      ", the archive has ", size_));
  }
  // a + b for offsets and sizes read from the archive (petra/checked.hpp), failing at `at`.
  std::uint64_t add(std::uint64_t a, std::uint64_t b, std::uint64_t at, std::string_view what) const {
    return static_cast<std::uint64_t>(checked_add<IOError>(a, b, [&] {
      return concat("zip file '", path_.string(), "', byte ", at, ": ", what);
    }));
  }
  std::uint64_t uint(std::uint64_t at, int bytes) const {
    std::uint64_t value = 0;
    for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | std::to_integer<std::uint64_t>(data_[at + i]);
    return value;
  }
  std::uint16_t u16(std::uint64_t at) const { return static_cast<std::uint16_t>(uint(at, 2)); }
  std::uint32_t u32(std::uint64_t at) const { return static_cast<std::uint32_t>(uint(at, 4)); }
  std::uint64_t u64(std::uint64_t at) const { return uint(at, 8); }
  [[noreturn]] void fail(std::uint64_t at, const std::string& what) const { detail::fail("zip", path_, at, false, what); }

 private:
  const std::byte* data_;
  std::size_t size_;
  const fs::path& path_;
};

// The end of central directory record: searched backwards, since a comment may follow it.
std::uint64_t find_end_record(const Bytes& in, std::size_t size) {
  if (size < kEndBytes) in.fail(0, concat("only ", size, " bytes: too small to be a zip archive"));
  const std::size_t lowest = size - kEndBytes - std::min(size - kEndBytes, kMaxCommentBytes);
  for (std::size_t at = size - kEndBytes + 1; at-- > lowest;)
    if (in.u32(at) == kEndSignature && at + kEndBytes + in.u16(at + 20) == size) return at;
  in.fail(size - kEndBytes, "no end of central directory record (not a zip archive, or truncated)");
}

// Replaces the 32-bit sizes and offset that are all ones by the 64-bit values of the ZIP64 extra field.
void apply_zip64_extra(const Bytes& in, std::uint64_t extra, std::uint64_t extra_end, ZipEntry& entry) {
  while (extra + 4 <= extra_end) {
    const std::uint16_t id = in.u16(extra), length = in.u16(extra + 2);
    std::uint64_t field = extra + 4;
    if (field + length > extra_end) in.fail(extra, concat("extra field of entry '", entry.name, "' overruns its header"));
    if (id == kZip64ExtraId) {
      auto take = [&](std::uint64_t& value) {
        if (value != 0xFFFFFFFFu) return;
        if (field + 8 > extra + 4 + length) in.fail(extra, concat("ZIP64 field of entry '", entry.name, "' is too short"));
        value = in.u64(field);
        field += 8;
      };
      take(entry.size);
      take(entry.compressed_size);
      take(entry.local_header_offset);
    }
    extra += 4 + length;
  }
}

}  // namespace

ZipArchive::ZipArchive(const fs::path& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IOError(concat("zip file '", path.string(), "': cannot open: ", std::strerror(errno)));
  struct stat status {};
  if (::fstat(fd, &status) != 0 || !S_ISREG(status.st_mode)) {
    ::close(fd);
    throw IOError(concat("zip file '", path.string(), "' is not a regular file"));
  }
  size_ = static_cast<std::size_t>(status.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      throw IOError(concat("zip file '", path.string(), "': cannot map: ", std::strerror(error)));
    }
    mapped_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);  // the mapping stays valid

  try {
    const Bytes in(mapped_, size_, path_);
    const std::uint64_t end = find_end_record(in, size_);
    std::uint64_t count = in.u16(end + 10);
    std::uint64_t directory_bytes = in.u32(end + 12);
    std::uint64_t directory = in.u32(end + 16);
    if (in.u16(end + 4) != 0 || in.u16(end + 6) != 0) in.fail(end + 4, "multi-disk archives are not supported");
    if (count == 0xFFFF || directory_bytes == 0xFFFFFFFFu || directory == 0xFFFFFFFFu) {
      // ZIP64: a locator just before the end record points at the 64-bit end record.
      if (end < kZip64LocatorBytes || in.u32(end - kZip64LocatorBytes) != kZip64LocatorSignature)
        in.fail(end, "the end record needs ZIP64 but no ZIP64 locator precedes it");
      const std::uint64_t end64 = in.u64(end - kZip64LocatorBytes + 8);
      in.need(end64, kZip64EndBytes, "the ZIP64 end of central directory");
      if (in.u32(end64) != kZip64EndSignature) in.fail(end64, "bad ZIP64 end of central directory signature");
      count = in.u64(end64 + 32);
      directory_bytes = in.u64(end64 + 40);
      directory = in.u64(end64 + 48);
    }
    in.need(directory, directory_bytes, "the central directory");

    std::uint64_t at = directory;
    for (std::uint64_t i = 0; i < count; ++i) {
      in.need(at, kCentralHeaderBytes, "a central directory header");
      if (in.u32(at) != kCentralHeaderSignature) in.fail(at, concat("bad signature of central directory header ", i));
      ZipEntry entry;
      const std::uint16_t flags = in.u16(at + 8);
      entry.method = in.u16(at + 10);
      entry.crc32 = in.u32(at + 16);
      entry.compressed_size = in.u32(at + 20);
      entry.size = in.u32(at + 24);
      const std::uint16_t name_bytes = in.u16(at + 28), extra_bytes = in.u16(at + 30), comment_bytes = in.u16(at + 32);
      entry.local_header_offset = in.u32(at + 42);
      in.need(at + kCentralHeaderBytes, std::uint64_t{name_bytes} + extra_bytes + comment_bytes, "a central directory header");
      entry.name.assign(reinterpret_cast<const char*>(mapped_ + at + kCentralHeaderBytes), name_bytes);
      const std::uint64_t extra = in.add(at, kCentralHeaderBytes + name_bytes, at, "the extra field's offset");
      apply_zip64_extra(in, extra, extra + extra_bytes, entry);
      if ((flags & 1u) != 0) in.fail(at + 8, concat("entry '", entry.name, "' is encrypted"));
      if (entry.method != 0 && entry.method != 8)
        in.fail(at + 10, concat("entry '", entry.name, "' uses compression method ", entry.method,
                                "; only stored (0) and deflated (8) are supported"));
      entries_.push_back(std::move(entry));
      at = in.add(extra, std::uint64_t{extra_bytes} + comment_bytes, at, "the next central directory header's offset");
    }
  } catch (...) {
    if (mapped_ != nullptr) ::munmap(const_cast<std::byte*>(mapped_), size_);
    throw;
  }
}

ZipArchive::~ZipArchive() {
  if (mapped_ != nullptr) ::munmap(const_cast<std::byte*>(mapped_), size_);
}

const ZipEntry* ZipArchive::find(std::string_view name) const {
  for (const ZipEntry& entry : entries_)
    if (entry.name == name) return &entry;
  return nullptr;
}

ZipEntryBytes ZipArchive::read(const ZipEntry& entry) const {
  const Bytes in(mapped_, size_, path_);
  const std::uint64_t local = entry.local_header_offset;
  in.need(local, kLocalHeaderBytes, concat("the local header of entry '", entry.name, "'"));
  if (in.u32(local) != kLocalHeaderSignature) in.fail(local, concat("bad local header signature of entry '", entry.name, "'"));
  const std::uint64_t start = in.add(local, kLocalHeaderBytes + in.u16(local + 26) + in.u16(local + 28), local,
                                     concat("the data offset of entry '", entry.name, "'"));
  in.need(start, entry.compressed_size, concat("the data of entry '", entry.name, "'"));
  const std::span<const std::byte> stored(mapped_ + start, static_cast<std::size_t>(entry.compressed_size));

  ZipEntryBytes out;
  if (entry.method == 0) {
    if (entry.compressed_size != entry.size)
      in.fail(local, concat("stored entry '", entry.name, "' has ", entry.compressed_size, " bytes stored but size ", entry.size));
    out.bytes = stored;
  } else {
    // The declared size is only a claim: refused at once if deflate could not reach it from the
    // compressed bytes there are, and otherwise never allocated ahead of the data: the output goes
    // into chunks allocated as inflate fills them (detail::ChunkedBuffer), up to the declared size.
    if (entry.size / kMaxDeflateRatio > entry.compressed_size)
      in.fail(local, concat("entry '", entry.name, "' declares ", entry.size, " bytes, more than its ", entry.compressed_size,
                            " compressed bytes can inflate to (deflate's limit is ", kMaxDeflateRatio, ":1; corrupt header?)"));
    detail::ChunkedBuffer inflated(entry.size);
    // zlib's state is freed however this ends (an exception used to leak it: found by fuzz-zip).
    struct Inflater {
      z_stream z{};
      bool open = false;
      ~Inflater() {
        if (open) inflateEnd(&z);
      }
    } inflater;
    z_stream& z = inflater.z;
    if (inflateInit2(&z, -MAX_WBITS) != Z_OK) in.fail(start, "zlib inflateInit2 failed");  // raw deflate: no zlib header
    inflater.open = true;
    // zlib counts in 32-bit uInt: feed and drain in pieces.
    std::uint64_t fed = 0;
    Bytef probe = 0;  // where inflate may write once the declared size is reached (it must not)
    int status = Z_OK;
    while (status == Z_OK) {
      if (z.avail_in == 0 && fed < stored.size()) {
        z.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(stored.data() + fed));
        z.avail_in = static_cast<uInt>(std::min<std::uint64_t>(stored.size() - fed, 1u << 30));
        fed += z.avail_in;
      }
      const std::span<std::byte> room = inflated.room();
      z.next_out = room.empty() ? &probe : reinterpret_cast<Bytef*>(room.data());
      z.avail_out = static_cast<uInt>(std::min<std::size_t>(room.size(), 1u << 30));
      const uInt before = z.avail_out;
      status = inflate(&z, Z_NO_FLUSH);
      inflated.commit(before - z.avail_out);
    }
    const std::uint64_t consumed = z.total_in, produced = inflated.size();
    const char* message = z.msg;
    const bool input_left = z.avail_in > 0 || fed < stored.size();
    if (status == Z_BUF_ERROR && produced == entry.size && input_left)
      in.fail(start + consumed, concat("entry '", entry.name, "' inflates to more than the ", entry.size, " bytes its header says"));
    if (status != Z_STREAM_END)
      in.fail(start + consumed, concat("inflating entry '", entry.name, "' failed after ", produced, " of ", entry.size,
                                       " bytes: ", message != nullptr ? message : "the compressed data ends early"));
    if (produced != entry.size)
      in.fail(start + consumed, concat("entry '", entry.name, "' inflates to ", produced, " bytes, its header says ", entry.size));
    out.inflated = inflated.to_vector();
    out.bytes = out.inflated;
  }
  // The CRC-32 catches corruption inside a stored entry, which nothing else would notice.
  std::uint64_t crc = crc32(0L, Z_NULL, 0);
  for (std::size_t done = 0; done < out.bytes.size();) {
    const auto piece = static_cast<uInt>(std::min<std::size_t>(out.bytes.size() - done, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(out.bytes.data() + done), piece);
    done += piece;
  }
  if (crc != entry.crc32)
    in.fail(start, concat("CRC-32 of entry '", entry.name, "' is ", crc, ", its header says ", entry.crc32, " (corrupt data)"));
  return out;
}

}  // namespace petra::data
