// petra/files.cpp: durable writes (temporary file, fsync, rename).
#include "petra/files.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>

#include "petra/error.hpp"

namespace petra {

void fsync_path(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  PETRA_CHECK(fd >= 0, IOError, "cannot open ", path.string(), " to sync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  PETRA_CHECK(rc == 0, IOError, "fsync failed on ", path.string());
}

void write_file_atomically(const std::filesystem::path& path, std::string_view text) {
  const std::filesystem::path temporary = path.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    PETRA_CHECK(out.good(), IOError, "cannot write ", temporary.string());
  }
  fsync_path(temporary);
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  PETRA_CHECK(!ec, IOError, "cannot rename ", temporary.string(), " to ", path.string(), ": ", ec.message());
  const std::filesystem::path directory = path.parent_path().empty() ? "." : path.parent_path();
  fsync_path(directory);
}

}  // namespace petra
