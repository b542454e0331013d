// petra/files.hpp: durable writes for what must survive a crash (checkpoints, logs, results): a
// reader sees either the old file or the whole new one, never a part.
#pragma once

#include <filesystem>
#include <string_view>

namespace petra {

// Flushes a file's or a directory's contents to the disk (fsync). IOError if it cannot.
void fsync_path(const std::filesystem::path& path);

// Replaces `path` by `text`: a temporary file beside it, fsync, rename, fsync of the directory.
// IOError naming the file if any step fails.
void write_file_atomically(const std::filesystem::path& path, std::string_view text);

}  // namespace petra
