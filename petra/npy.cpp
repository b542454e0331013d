// petra/npy.cpp: the .npy reader (preamble, a small parser of the header's dict literal, size
// checks) and the atomic writer. The format is described in petra/npy.hpp.
#include "petra/npy.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "petra/checked.hpp"
#include "petra/error.hpp"

namespace petra {

namespace {

constexpr unsigned char kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
constexpr std::size_t kPreambleBytes = 8;  // magic and version
constexpr std::size_t kArrayAlign = 64;    // numpy's ARRAY_ALIGN: where the data starts
constexpr std::size_t kGrowthAxisMaxDigits = 21;  // numpy leaves room to grow shape[0] in place

[[noreturn]] void fail(std::string_view file, std::size_t offset, const std::string& what) {
  throw IOError(detail::concat("npy file '", file, "', byte ", offset, ": ", what));
}

std::string shape_string(std::span<const std::int64_t> shape) {  // as Python prints the tuple
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + (shape.size() == 1 ? ",)" : ")");
}

std::string_view descr_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return "<f4";
    case DType::f64: return "<f8";
    case DType::i32: return "<i4";
    case DType::i64: return "<i8";
    case DType::u8: return "|u1";
  }
  return "?";
}

std::optional<DType> dtype_of_descr(std::string_view descr) {
  for (DType t : {DType::f32, DType::f64, DType::i32, DType::i64, DType::u8})
    if (descr == descr_of(t)) return t;
  if (descr == "<u1") return DType::u8;  // one byte has no byte order; some writers say '<'
  return std::nullopt;
}

// Number of data bytes of an array (petra/checked.hpp: the product of the non-zero dims must fit too).
template <class E, class What>
std::size_t data_bytes_of(DType dtype, std::span<const std::int64_t> shape, const What& what) {
  return static_cast<std::size_t>(checked_nbytes<E>(shape, size_of(dtype), what));
}

// ---- Reading ----

// Where the header lies, read from the fixed-size start of the file.
struct Preamble {
  std::size_t header_offset;  // 10 (version 1.0) or 12 (2.0, 3.0)
  std::size_t header_length;
};

// `start` holds the first min(file_bytes, 12) bytes of the file.
Preamble parse_preamble(std::span<const std::byte> start, std::size_t file_bytes, std::string_view file) {
  if (start.size() < sizeof kMagic || std::memcmp(start.data(), kMagic, sizeof kMagic) != 0)
    fail(file, 0, "bad magic: a .npy file starts with \"\\x93NUMPY\" (" + std::to_string(file_bytes) + " bytes in the file)");
  if (start.size() < kPreambleBytes) fail(file, sizeof kMagic, "the file ends inside the version bytes");
  const int major = std::to_integer<int>(start[6]), minor = std::to_integer<int>(start[7]);
  if (major < 1 || major > 3 || minor != 0)
    fail(file, 6, "unsupported format version " + std::to_string(major) + "." + std::to_string(minor) +
                      " (supported: 1.0, 2.0, 3.0)");
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  if (start.size() < kPreambleBytes + length_bytes) fail(file, kPreambleBytes, "the file ends inside the header length");
  std::size_t header_length = 0;
  for (std::size_t i = 0; i < length_bytes; ++i)
    header_length |= std::to_integer<std::size_t>(start[kPreambleBytes + i]) << (8 * i);
  const std::size_t header_offset = kPreambleBytes + length_bytes;
  if (header_length > file_bytes - header_offset)
    fail(file, kPreambleBytes, "header length " + std::to_string(header_length) + " runs past the end of the file (" +
                                   std::to_string(file_bytes - header_offset) + " bytes follow the length)");
  return {header_offset, header_length};
}

struct Header {
  DType dtype;
  std::vector<std::int64_t> shape;
};

// A recursive-descent parser of the one Python literal a .npy header holds:
//   dict  := '{' [ key ':' value { ',' key ':' value } [','] ] '}'
//   key   := string;  string := '...' | "..."
//   value := string (descr) | True | False (fortran_order) | tuple of ints (shape)
//   tuple := '(' ')' | '(' int ',' ')' | '(' int { ',' int } [','] ')'
// Spaces and newlines may appear between tokens. Errors report the offset in the file.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::size_t text_offset, std::string_view file)
      : text_(text), text_offset_(text_offset), file_(file) {}

  Header parse() {
    skip_spaces();
    if (!consume('{')) fail_here("the header is not a dict: it does not start with '{'");
    std::optional<DType> dtype;
    std::optional<std::vector<std::int64_t>> shape;
    bool saw_fortran_order = false;
    skip_spaces();
    while (!consume('}')) {
      const std::size_t key_position = position_;
      const std::string key = parse_string("a quoted key");
      skip_spaces();
      if (!consume(':')) fail_here("expected ':' after the key '" + key + "'");
      skip_spaces();
      if (key == "descr") {
        if (dtype) fail_at(key_position, "duplicate key 'descr'");
        dtype = parse_descr();
      } else if (key == "fortran_order") {
        if (saw_fortran_order) fail_at(key_position, "duplicate key 'fortran_order'");
        parse_fortran_order();
        saw_fortran_order = true;
      } else if (key == "shape") {
        if (shape) fail_at(key_position, "duplicate key 'shape'");
        shape = parse_shape();
      } else {
        fail_at(key_position, "unexpected key '" + key + "' (a .npy header has 'descr', 'fortran_order' and 'shape')");
      }
      skip_spaces();
      if (consume(',')) {
        skip_spaces();
      } else if (peek() != '}') {
        fail_here("expected ',' or '}' after the value of '" + key + "'");
      }
    }
    const std::size_t end_of_dict = position_ - 1;
    skip_spaces();
    if (position_ != text_.size()) fail_here("unexpected text after the header dict");
    if (!dtype) fail_at(end_of_dict, "the header has no 'descr' key");
    if (!saw_fortran_order) fail_at(end_of_dict, "the header has no 'fortran_order' key");
    if (!shape) fail_at(end_of_dict, "the header has no 'shape' key");
    return {*dtype, std::move(*shape)};
  }

 private:
  [[noreturn]] void fail_at(std::size_t position, const std::string& what) const {
    fail(file_, text_offset_ + position, what);
  }
  [[noreturn]] void fail_here(const std::string& what) const { fail_at(position_, what); }

  char peek() const { return position_ < text_.size() ? text_[position_] : '\0'; }
  bool consume(char c) {
    if (position_ >= text_.size() || text_[position_] != c) return false;
    ++position_;
    return true;
  }
  bool consume(std::string_view word) {
    if (text_.substr(position_, word.size()) != word) return false;
    position_ += word.size();
    return true;
  }
  void skip_spaces() {
    while (position_ < text_.size() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++position_;
  }

  std::string parse_string(std::string_view expected) {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail_here("expected " + std::string(expected));
    const std::size_t start = position_ + 1;
    const std::size_t end = text_.find(quote, start);
    if (end == std::string_view::npos) fail_here("unterminated string");
    position_ = end + 1;
    return std::string(text_.substr(start, end - start));
  }

  DType parse_descr() {
    const std::size_t value_position = position_;
    const std::string descr = parse_string("a dtype string for 'descr' (structured dtypes are not supported)");
    if (const auto dtype = dtype_of_descr(descr)) return *dtype;
    if (!descr.empty() && descr[0] == '>')
      fail_at(value_position, "big-endian dtype '" + descr + "' is not supported (convert with arr.astype('<" + descr.substr(1) + "'))");
    fail_at(value_position, "unsupported dtype '" + descr + "' (supported: '<f4', '<f8', '<i4', '<i8', '|u1')");
  }

  void parse_fortran_order() {
    const std::size_t value_position = position_;
    if (consume(std::string_view("False"))) return;
    if (consume(std::string_view("True")))
      fail_at(value_position, "fortran_order is True: Fortran-order arrays are not supported (save np.ascontiguousarray(arr))");
    fail_here("'fortran_order' must be True or False");
  }

  std::vector<std::int64_t> parse_shape() {
    if (!consume('(')) fail_here("'shape' must be a tuple such as (2, 3)");
    std::vector<std::int64_t> shape;
    bool trailing_comma = false;
    skip_spaces();
    while (!consume(')')) {
      shape.push_back(parse_dimension());
      skip_spaces();
      trailing_comma = consume(',');
      skip_spaces();
      if (!trailing_comma && peek() != ')') fail_here("bad shape tuple: expected ',' or ')'");
    }
    if (shape.size() == 1 && !trailing_comma) fail_at(position_ - 1, "bad shape tuple: a 1-dim shape is written (n,)");
    return shape;
  }

  std::int64_t parse_dimension() {
    if (peek() == '-') fail_here("bad shape tuple: negative dimension");
    if (peek() < '0' || peek() > '9') fail_here("bad shape tuple: expected a non-negative integer");
    std::int64_t value = 0;
    while (peek() >= '0' && peek() <= '9') {
      const int digit = peek() - '0';
      if (value > (std::numeric_limits<std::int64_t>::max() - digit) / 10) fail_here("bad shape tuple: dimension too large");
      value = 10 * value + digit;
      ++position_;
    }
    return value;
  }

  std::string_view text_;
  std::size_t text_offset_;
  std::string_view file_;
  std::size_t position_ = 0;
};

Header parse_header(std::span<const std::byte> header, std::size_t header_offset, std::string_view file) {
  const std::string_view text(reinterpret_cast<const char*>(header.data()), header.size());
  return HeaderParser(text, header_offset, file).parse();
}

// The data bytes the header promises, checked against what the file holds after the header.
std::size_t checked_data_bytes(const Header& header, std::size_t data_offset, std::size_t file_bytes, std::string_view file) {
  const std::size_t needed = data_bytes_of<IOError>(header.dtype, header.shape, [&] {
    return detail::concat("npy file '", file, "', byte ", data_offset, ": the shape ", shape_string(header.shape),
                          " has too many elements");
  });
  const std::size_t present = file_bytes - data_offset;
  const std::string what = "the shape " + shape_string(header.shape) + " of " + std::string(name_of(header.dtype)) + " needs " +
                           std::to_string(needed) + " data bytes, ";
  if (present < needed) fail(file, data_offset, what + "the file has only " + std::to_string(present) + " (truncated file)");
  if (present > needed) fail(file, data_offset + needed, what + "the file has " + std::to_string(present - needed) + " more");
  return needed;
}

// A file descriptor closed on scope exit.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

std::string errno_text() { return std::strerror(errno); }

void read_exactly(int fd, std::size_t offset, std::span<std::byte> out, const std::string& file) {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t got = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail(file, offset + done, "read failed: " + errno_text());
    if (got == 0) fail(file, offset + done, "the file ended while reading (it shrank?)");
    done += static_cast<std::size_t>(got);
  }
}

// ---- Writing ----

void write_all(int fd, const void* data, std::size_t bytes, const std::string& temporary) {
  const auto* p = static_cast<const std::byte*>(data);
  while (bytes > 0) {
    const ssize_t put = ::write(fd, p, bytes);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) throw IOError("write_npy: writing '" + temporary + "' failed: " + errno_text());
    p += put;
    bytes -= static_cast<std::size_t>(put);
  }
}

// A name in the same directory (so rename is atomic), unique within this machine: pid and a counter.
std::filesystem::path temporary_path_for(const std::filesystem::path& path) {
  static std::atomic<std::uint64_t> counter{0};
  std::string name = ".";
  name += path.filename().string();
  name += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  return path.parent_path() / name;
}

void write_file_contents(int fd, const std::vector<std::byte>& header, const void* data, std::size_t data_bytes,
                         const std::string& temporary) {
  write_all(fd, header.data(), header.size(), temporary);
  if (data_bytes > 0) write_all(fd, data, data_bytes, temporary);
  if (::fsync(fd) != 0) throw IOError("write_npy: fsync of '" + temporary + "' failed: " + errno_text());
}

// Makes the rename itself durable. Best effort: the file is already complete and in place.
void sync_directory(const std::filesystem::path& directory) {
  const FileDescriptor dir(::open(directory.empty() ? "." : directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() >= 0) ::fsync(dir.get());
}

}  // namespace

std::vector<std::byte> npy_header(DType dtype, std::span<const std::int64_t> shape) {
  // Byte for byte what numpy.lib.format._write_array_header writes (numpy >= 1.23).
  std::string dict = "{'descr': '" + std::string(descr_of(dtype)) + "', 'fortran_order': False, 'shape': " + shape_string(shape) + ", }";
  if (!shape.empty()) {
    const std::size_t digits = std::to_string(shape[0]).size();
    dict.append(kGrowthAxisMaxDigits > digits ? kGrowthAxisMaxDigits - digits : 0, ' ');
  }
  // Spaces then '\n' pad the header so that the data starts at a multiple of kArrayAlign (numpy
  // pads a full kArrayAlign when it is already aligned); version 2.0 only when 1.0's uint16 is too small.
  const std::size_t text_bytes = dict.size() + 1;
  auto padding_after = [&](std::size_t length_bytes) {
    return kArrayAlign - (kPreambleBytes + length_bytes + text_bytes) % kArrayAlign;
  };
  const bool fits_version_1 = text_bytes + padding_after(2) <= 0xFFFF;
  const std::size_t length_bytes = fits_version_1 ? 2 : 4;
  const std::size_t padding = padding_after(length_bytes);
  const std::size_t header_length = text_bytes + padding;

  std::vector<std::byte> out;
  out.reserve(kPreambleBytes + length_bytes + header_length);
  for (unsigned char c : kMagic) out.push_back(std::byte{c});
  out.push_back(std::byte{static_cast<unsigned char>(fits_version_1 ? 1 : 2)});
  out.push_back(std::byte{0});
  for (std::size_t i = 0; i < length_bytes; ++i) out.push_back(static_cast<std::byte>((header_length >> (8 * i)) & 0xFF));
  for (char c : dict) out.push_back(static_cast<std::byte>(c));
  out.insert(out.end(), padding, std::byte{' '});
  out.push_back(std::byte{'\n'});
  return out;
}

NpyArray parse_npy(std::span<const std::byte> bytes, std::string_view name_for_errors) {
  const Preamble preamble = parse_preamble(bytes.first(std::min<std::size_t>(bytes.size(), 12)), bytes.size(), name_for_errors);
  Header header = parse_header(bytes.subspan(preamble.header_offset, preamble.header_length), preamble.header_offset, name_for_errors);
  const std::size_t data_offset = preamble.header_offset + preamble.header_length;
  const std::size_t data_bytes = checked_data_bytes(header, data_offset, bytes.size(), name_for_errors);
  const auto data = bytes.subspan(data_offset, data_bytes);
  return NpyArray{header.dtype, std::move(header.shape), std::vector<std::byte>(data.begin(), data.end())};
}

NpyArray read_npy(const std::filesystem::path& path) {
  const std::string file = path.string();
  const FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw IOError("read_npy: cannot open '" + file + "': " + errno_text());
  struct stat status {};
  if (::fstat(fd.get(), &status) != 0) throw IOError("read_npy: cannot stat '" + file + "': " + errno_text());
  if (!S_ISREG(status.st_mode)) throw IOError("read_npy: '" + file + "' is not a regular file");
  const auto file_bytes = static_cast<std::size_t>(status.st_size);

  // The header first, then the data straight into the array (no second copy of a large file).
  std::vector<std::byte> start(std::min<std::size_t>(file_bytes, 12));
  read_exactly(fd.get(), 0, start, file);
  const Preamble preamble = parse_preamble(start, file_bytes, file);
  std::vector<std::byte> header_bytes(preamble.header_length);
  read_exactly(fd.get(), preamble.header_offset, header_bytes, file);
  Header header = parse_header(header_bytes, preamble.header_offset, file);
  const std::size_t data_offset = preamble.header_offset + preamble.header_length;
  const std::size_t data_bytes = checked_data_bytes(header, data_offset, file_bytes, file);
  NpyArray array{header.dtype, std::move(header.shape), std::vector<std::byte>(data_bytes)};
  read_exactly(fd.get(), data_offset, array.data, file);
  return array;
}

void write_npy(const std::filesystem::path& path, DType dtype, std::span<const std::int64_t> shape, const void* data) {
  const std::size_t data_bytes = data_bytes_of<ValueError>(dtype, shape, [&] {
    return detail::concat("write_npy('", path.string(), "'): invalid shape ", shape_string(shape));
  });
  PETRA_CHECK(data != nullptr || data_bytes == 0, ValueError, "write_npy('", path.string(), "'): data is null for shape ",
              shape_string(shape));
  const std::vector<std::byte> header = npy_header(dtype, shape);

  const std::filesystem::path temporary = temporary_path_for(path);
  FileDescriptor fd(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
  if (fd.get() < 0)
    throw IOError("write_npy: cannot create the temporary file '" + temporary.string() + "' for '" + path.string() + "': " + errno_text());
  try {
    write_file_contents(fd.get(), header, data, data_bytes, temporary.string());
    if (::close(fd.release()) != 0) throw IOError("write_npy: closing '" + temporary.string() + "' failed: " + errno_text());
    if (::rename(temporary.c_str(), path.c_str()) != 0)
      throw IOError("write_npy: cannot rename '" + temporary.string() + "' to '" + path.string() + "': " + errno_text());
  } catch (...) {
    ::unlink(temporary.c_str());
    throw;
  }
  sync_directory(path.parent_path());
}

void write_npy(const std::filesystem::path& path, const NpyArray& array) {
  const std::size_t data_bytes = data_bytes_of<ValueError>(array.dtype, array.shape, [&] {
    return detail::concat("write_npy('", path.string(), "'): invalid shape ", shape_string(array.shape));
  });
  PETRA_CHECK(data_bytes == array.data.size(), ValueError, "write_npy('", path.string(), "'): shape ", shape_string(array.shape),
              " of ", name_of(array.dtype), " needs ", data_bytes, " bytes, the array holds ", array.data.size());
  write_npy(path, array.dtype, array.shape, array.data.data());
}

Tensor load_npy(const std::filesystem::path& path, Device device) {
  const NpyArray array = read_npy(path);
  PETRA_CHECK(array.shape.size() <= static_cast<std::size_t>(Shape::kMaxDims), IOError, path.string(), ": ",
              array.shape.size(), " dims, petra tensors have at most ", Shape::kMaxDims);
  const Tensor host = Tensor::empty(Shape(std::span<const std::int64_t>(array.shape)), array.dtype, Device::cpu());
  // An array with no elements has no data pointer on either side: memcpy(dst, nullptr, 0) is
  // undefined behaviour (UBSan, found by tests/fuzz/fuzz_npy.cpp).
  if (!array.data.empty()) std::memcpy(host.raw_data(), array.data.data(), array.data.size());
  return host.to(device);
}

void save_npy(const std::filesystem::path& path, const Tensor& tensor) {
  PETRA_CHECK(tensor.defined(), ValueError, "save_npy(", path.string(), "): undefined tensor");
  const Tensor host = tensor.to(Device::cpu()).contiguous();
  write_npy(path, host.dtype(), host.shape().dims(), host.raw_data());
}

}  // namespace petra
