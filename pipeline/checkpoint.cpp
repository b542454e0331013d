// pipeline/checkpoint.cpp: atomic, checksummed checkpoint directories.
#include "petra/pipeline/checkpoint.hpp"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>
#include <vector>

#include "petra/files.hpp"
#include "petra/npy.hpp"

namespace petra::pipeline {

namespace fs = std::filesystem;

std::uint32_t crc32_of(std::span<const std::byte> bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes the length as uInt: feed large ranges in pieces.
  for (std::size_t at = 0; at < bytes.size(); at += 1u << 30) {
    const std::size_t n = std::min<std::size_t>(bytes.size() - at, 1u << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + at), static_cast<uInt>(n));
  }
  return static_cast<std::uint32_t>(crc);
}

namespace {

constexpr const char* kManifest = "MANIFEST";
constexpr const char* kMeta = "trainer.txt";
constexpr const char* kLatest = "latest";

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  PETRA_CHECK(in.is_open(), CheckpointError, "checkpoint: cannot read ", path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::uint32_t checksum(const std::string& bytes) { return crc32_of(std::as_bytes(std::span(bytes))); }

// Every regular file under dir except the manifest, as paths relative to dir, sorted.
std::vector<fs::path> files_of(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.is_regular_file() && entry.path().filename() != kManifest) files.push_back(fs::relative(entry.path(), dir));
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

void save_gradients(const fs::path& dir, const std::vector<std::pair<std::string, Variable>>& parameters) {
  fs::create_directories(dir);
  for (const auto& [name, p] : parameters)
    if (p.grad().defined()) save_npy(dir / (name + ".npy"), p.grad());
}

std::vector<FileBytes> read_tree(const fs::path& dir) {
  std::vector<FileBytes> files;
  std::vector<fs::path> paths;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.is_regular_file()) paths.push_back(fs::relative(entry.path(), dir));
  std::sort(paths.begin(), paths.end());
  for (const fs::path& p : paths) files.push_back({p.generic_string(), read_file(dir / p)});
  return files;
}

void write_tree(const fs::path& dir, const std::vector<FileBytes>& files) {
  for (const FileBytes& f : files) {
    const fs::path relative = fs::path(f.path).lexically_normal();
    PETRA_CHECK(!f.path.empty() && relative.is_relative() && *relative.begin() != "..", CheckpointError,
                "checkpoint: the part named '", f.path, "' would be written outside ", dir.string());
    fs::create_directories((dir / relative).parent_path());
    write_file_atomically(dir / relative, f.bytes);
  }
}

fs::path write_checkpoint(const fs::path& root, const std::string& name, const nn::Module& model,
                          const std::vector<CheckpointOptimizer>& optimizers, const CheckpointMeta& meta,
                          bool with_gradients, const std::function<void(const fs::path&)>& write_more, int keep) {
  std::error_code ec;
  fs::create_directories(root, ec);
  PETRA_CHECK(!ec, CheckpointError, "checkpoint: cannot create ", root.string(), ": ", ec.message());
  const fs::path staging = root / (".tmp-" + name), final_dir = root / name;
  fs::remove_all(staging);
  fs::create_directories(staging);
  model.save_state(staging / "model");  // save_npy writes each file atomically and fsyncs it
  for (const auto& [subdirectory, optimizer] : optimizers) {
    const fs::path dir = staging / "optimizer" / subdirectory;
    optimizer->save_state(dir);
    fsync_path(dir / "optimizer_state.txt");
  }
  if (with_gradients) save_gradients(staging / "grads", model.named_parameters());
  if (write_more) write_more(staging);  // its files are synced as written
  std::ostringstream text;
  for (const auto& [key, value] : meta) text << key << " = " << value << "\n";
  write_file_atomically(staging / kMeta, text.str());
  // The manifest: size and CRC-32 of every file, written last.
  std::ostringstream manifest;
  manifest << "petra-checkpoint 1\n";
  for (const fs::path& file : files_of(staging)) {
    const std::string bytes = read_file(staging / file);
    manifest << file.string() << " " << bytes.size() << " " << checksum(bytes) << "\n";
  }
  write_file_atomically(staging / kManifest, manifest.str());
  for (const auto& entry : fs::recursive_directory_iterator(staging))
    if (entry.is_directory()) fsync_path(entry.path());
  fsync_path(staging);
  fs::remove_all(final_dir);
  fs::rename(staging, final_dir, ec);
  PETRA_CHECK(!ec, CheckpointError, "checkpoint: cannot rename ", staging.string(), ": ", ec.message());
  fsync_path(root);
  write_file_atomically(root / kLatest, name + "\n");
  fsync_path(root);
  // Keep the newest `keep` checkpoints (names sort by epoch).
  std::vector<fs::path> old;
  for (const auto& entry : fs::directory_iterator(root))
    if (entry.is_directory() && entry.path().filename().string().rfind("epoch-", 0) == 0) old.push_back(entry.path());
  std::sort(old.begin(), old.end());
  for (std::size_t i = 0; i + keep < old.size(); ++i)
    if (old[i] != final_dir) fs::remove_all(old[i]);
  return final_dir;
}

void verify_checkpoint(const fs::path& dir) {
  const fs::path manifest_path = dir / kManifest;
  PETRA_CHECK(fs::exists(manifest_path), CheckpointError, "checkpoint ", dir.string(),
              " is incomplete: no MANIFEST (it was being written when the run stopped?)");
  std::istringstream lines(read_file(manifest_path));
  std::string line;
  std::getline(lines, line);
  PETRA_CHECK(line == "petra-checkpoint 1", CheckpointError, manifest_path.string(), ": not a petra checkpoint manifest");
  std::vector<fs::path> listed;
  int line_number = 1;
  while (std::getline(lines, line)) {
    ++line_number;
    std::istringstream fields(line);
    std::string file, extra;
    std::uint64_t size = 0, crc = 0;
    PETRA_CHECK(static_cast<bool>(fields >> file >> size >> crc) && !(fields >> extra), CheckpointError,
                manifest_path.string(), " line ", line_number, ": malformed");
    // A name inside the checkpoint, listed once: never a path that leads out of it (to a device or
    // a file elsewhere), nor one read twice.
    const fs::path relative = fs::path(file).lexically_normal();
    const bool inside = relative.is_relative() && !relative.empty() && *relative.begin() != ".." &&
                        relative.filename() != kManifest;
    PETRA_CHECK(inside && std::find(listed.begin(), listed.end(), relative) == listed.end(), CheckpointError,
                manifest_path.string(), " line ", line_number, ": '", file, "' is not a file of the checkpoint",
                inside ? " listed once" : "");
    const fs::path path = dir / relative;
    PETRA_CHECK(fs::is_regular_file(fs::symlink_status(path)), CheckpointError, "checkpoint: ", path.string(),
                " is missing (or not a regular file)");
    const std::uint64_t on_disk = fs::file_size(path);
    PETRA_CHECK(on_disk == size, CheckpointError, "checkpoint: ", path.string(), " has ", on_disk,
                " bytes, the manifest says ", size, " (truncated or modified)");
    const std::string bytes = read_file(path);
    PETRA_CHECK(bytes.size() == size, CheckpointError, "checkpoint: ", path.string(), " has ", bytes.size(),
                " bytes, the manifest says ", size, " (truncated or modified)");
    PETRA_CHECK(checksum(bytes) == crc, CheckpointError, "checkpoint: ", path.string(),
                " does not match its checksum (corrupted)");
    listed.push_back(relative);
  }
  std::sort(listed.begin(), listed.end());
  PETRA_CHECK(listed == files_of(dir), CheckpointError, "checkpoint ", dir.string(),
              ": files differ from the MANIFEST (added or removed)");
}

namespace {
fs::path latest_checkpoint_unchecked(const fs::path& root) {
  const fs::path pointer = root / kLatest;
  PETRA_CHECK(fs::exists(pointer), CheckpointError, "checkpoint: no checkpoint in ", root.string(), " (no '", kLatest,
              "' file)");
  PETRA_CHECK(fs::is_regular_file(fs::symlink_status(pointer)) && fs::file_size(pointer) <= 256, CheckpointError,
              pointer.string(), ": not the small file that names the latest checkpoint");
  std::string name = read_file(pointer);
  if (!name.empty() && name.back() == '\n') name.pop_back();
  PETRA_CHECK(!name.empty() && name != "." && name != ".." &&
                  name.find_first_of(std::string("/\n\0", 3)) == std::string::npos,
              CheckpointError, pointer.string(), ": bad checkpoint name '", name, "'");
  const fs::path dir = root / name;
  verify_checkpoint(dir);
  return dir;
}
}  // namespace

fs::path latest_checkpoint(const fs::path& root) {
  fs::path dir;
  reading_checkpoint(root, [&] { dir = latest_checkpoint_unchecked(root); });
  return dir;
}

CheckpointMeta read_checkpoint_meta(const fs::path& dir) {
  CheckpointMeta meta;
  std::istringstream lines(read_file(dir / kMeta));
  std::string line;
  while (std::getline(lines, line)) {
    const auto eq = line.find(" = ");
    PETRA_CHECK(eq != std::string::npos, CheckpointError, (dir / kMeta).string(), ": malformed line '", line, "'");
    meta[line.substr(0, eq)] = line.substr(eq + 3);
  }
  return meta;
}

std::int64_t checkpoint_integer(const CheckpointMeta& meta, const std::string& key, const fs::path& dir,
                                std::int64_t lowest, std::int64_t highest) {
  const auto found = meta.find(key);
  PETRA_CHECK(found != meta.end(), CheckpointError, "checkpoint ", (dir / kMeta).string(), ": no '", key, "'");
  const std::string& text = found->second;
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  PETRA_CHECK(error == std::errc() && end == text.data() + text.size(), CheckpointError, "checkpoint ",
              (dir / kMeta).string(), ": '", key, " = ", text, "' is not an integer");
  PETRA_CHECK(lowest <= value && value <= highest, CheckpointError, "checkpoint ", (dir / kMeta).string(), ": '", key,
              " = ", text, "' is outside [", lowest, ", ", highest, "]");
  return value;
}

namespace {
void restore_checkpoint_files(const fs::path& dir, const nn::Module& model,
                              const std::vector<CheckpointOptimizer>& optimizers) {
  model.load_state(dir / "model");
  for (const auto& [subdirectory, optimizer] : optimizers) optimizer->load_state(dir / "optimizer" / subdirectory);
  model.zero_grad();
  load_gradients(dir / "grads", model);
}
}  // namespace

void load_gradients(const fs::path& dir, const nn::Module& model) {
  if (!fs::exists(dir)) return;
  for (const auto& [name, p] : model.named_parameters()) {
    const fs::path file = dir / (name + ".npy");
    if (!fs::exists(file)) continue;
    MemoryScope scope(MemoryTag::gradients, p.data().storage()->owner());
    Tensor g = load_npy(file, p.data().device());
    PETRA_CHECK(g.shape() == p.shape() && g.dtype() == p.data().dtype(), CheckpointError, "checkpoint: ",
                file.string(), " holds ", g.str(), " for the gradient of ", p.data().str());
    p.set_grad(std::move(g));
  }
}

void reading_checkpoint(const fs::path& dir, const std::function<void()>& read) {
  const auto fail = [&](const std::exception& e) {
    throw CheckpointError(fmt::format("checkpoint {}: {}", dir.string(), e.what()));
  };
  try {
    read();
  } catch (const CheckpointError&) {
    throw;
  } catch (const IOError& e) {
    fail(e);
  } catch (const ValueError& e) {
    fail(e);
  } catch (const ShapeError& e) {
    fail(e);
  } catch (const fs::filesystem_error& e) {
    fail(e);
  }
}

void restore_checkpoint(const fs::path& dir, const nn::Module& model, const std::vector<CheckpointOptimizer>& optimizers) {
  reading_checkpoint(dir, [&] { restore_checkpoint_files(dir, model, optimizers); });
}

}  // namespace petra::pipeline
