// data/zip.hpp: a small zip archive reader, enough for NumPy's .npz files.
//
// A zip file ends with an "end of central directory" record that points at the central directory,
// one header per entry (name, method, CRC-32, sizes, offset of the entry's local header); each
// entry's data follows its local header. ZIP64 (NumPy's savez forces it in every local header) moves
// sizes and offsets that do not fit 32 bits into an extra field. Supported: stored (method 0) and
// deflated (method 8) entries, ZIP64, no encryption, one disk. The archive is memory-mapped;
// every entry's CRC-32 is checked when it is read. Sizes and offsets in the headers are claims,
// checked against the archive before use: a deflated entry's size must be reachable from its
// compressed bytes (deflate's 1032:1), and its output is allocated as inflate produces it (in chunks
// from 1 MiB, each as large as what came before), never ahead of the data, and refused as soon as it
// passes the declared size. Errors raise petra::IOError naming the archive,
// the entry and the byte offset in the archive. (Format: PKWARE APPNOTE.TXT, sections 4.3-4.5.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace petra::data {

struct ZipEntry {
  std::string name;
  std::uint16_t method = 0;  // 0 stored, 8 deflated
  std::uint32_t crc32 = 0;
  std::uint64_t compressed_size = 0;
  std::uint64_t size = 0;                  // uncompressed
  std::uint64_t local_header_offset = 0;
};

// The bytes of one entry: a view into the mapped archive for a stored entry, the inflated copy
// (held in `inflated`) for a deflated one. Valid while the archive and this object live.
struct ZipEntryBytes {
  std::span<const std::byte> bytes;
  std::vector<std::byte> inflated;
};

class ZipArchive {
 public:
  explicit ZipArchive(const std::filesystem::path& path);  // maps the file and reads the directory
  ~ZipArchive();
  ZipArchive(const ZipArchive&) = delete;
  ZipArchive& operator=(const ZipArchive&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::vector<ZipEntry>& entries() const { return entries_; }
  const ZipEntry* find(std::string_view name) const;  // nullptr if absent
  ZipEntryBytes read(const ZipEntry& entry) const;    // checks sizes and the CRC-32

 private:
  std::filesystem::path path_;
  const std::byte* mapped_ = nullptr;
  std::size_t size_ = 0;
  std::vector<ZipEntry> entries_;
};

}  // namespace petra::data
