// tests/cpu/test_npy.cpp: .npy reading and writing: byte-exact agreement with numpy.save, round
// trips of every dtype and of scalar and zero-size shapes, files written by real NumPy, every kind
// of malformed file (each must raise petra::IOError naming the byte offset), and atomic writes.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "petra/error.hpp"
#include "petra/npy.hpp"
#include "tests/support/fixtures.hpp"

namespace fs = std::filesystem;
using petra::DType;
using petra::NpyArray;
using petra::testing::TemporaryDirectory;

namespace {

// Files written by NumPy 1.24.2 (numpy.lib.format), byte for byte.
// np.save of np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5 - 1 (version 1.0, 152 bytes)
constexpr unsigned char kNumpyFloat32_2x3[] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x01, 0x00, 0x76, 0x00, 0x7b, 0x27, 0x64, 0x65, 0x73, 0x63,
    0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x66, 0x34, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f, 0x72, 0x74,
    0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61, 0x6c, 0x73,
    0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x32, 0x2c, 0x20,
    0x33, 0x29, 0x2c, 0x20, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
    0x00, 0x00, 0x80, 0xbf, 0x00, 0x00, 0x00, 0xbf, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x3f,
    0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0xc0, 0x3f,
};
// np.save of np.array(-7, dtype=np.int64) (shape (), 136 bytes)
constexpr unsigned char kNumpyInt64Scalar[] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x01, 0x00, 0x76, 0x00, 0x7b, 0x27, 0x64, 0x65, 0x73, 0x63,
    0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x69, 0x38, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f, 0x72, 0x74,
    0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61, 0x6c, 0x73,
    0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x29, 0x2c, 0x20,
    0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
    0xf9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
};
// np.lib.format.write_array(f, np.array([1, 2, 250], dtype=np.uint8), version=(2, 0)) (131 bytes)
constexpr unsigned char kNumpyUint8Version2[] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x02, 0x00, 0x74, 0x00, 0x00, 0x00, 0x7b, 0x27, 0x64, 0x65,
    0x73, 0x63, 0x72, 0x27, 0x3a, 0x20, 0x27, 0x7c, 0x75, 0x31, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f,
    0x72, 0x74, 0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61,
    0x6c, 0x73, 0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x33,
    0x2c, 0x29, 0x2c, 0x20, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
    0x01, 0x02, 0xfa,
};

template <std::size_t N>
std::span<const std::byte> bytes_of(const unsigned char (&array)[N]) {
  return std::as_bytes(std::span<const unsigned char>(array, N));
}

std::vector<std::byte> to_bytes(std::string_view text) {
  const auto view = std::as_bytes(std::span<const char>(text.data(), text.size()));
  return {view.begin(), view.end()};
}

std::vector<std::byte> file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return to_bytes(text);
}

template <class T>
std::vector<T> values_of(const NpyArray& array) {
  std::vector<T> values(array.data.size() / sizeof(T));
  std::memcpy(values.data(), array.data.data(), array.data.size());
  return values;
}

// The test pattern of every round trip, also recomputed by the NumPy script below:
// floats k / 4 - 3, signed ints (7919 k mod 2001) - 1000, uint8 k mod 251.
NpyArray pattern_array(DType dtype, std::vector<std::int64_t> shape) {
  std::int64_t count = 1;
  for (auto d : shape) count *= d;
  NpyArray array{dtype, std::move(shape), std::vector<std::byte>(static_cast<std::size_t>(count) * petra::size_of(dtype))};
  auto store = [&](auto value, std::int64_t k) { std::memcpy(array.data.data() + k * sizeof(value), &value, sizeof(value)); };
  for (std::int64_t k = 0; k < count; ++k) {
    switch (dtype) {
      case DType::f32: store(float(k) * 0.25f - 3.0f, k); break;
      case DType::f64: store(double(k) * 0.25 - 3.0, k); break;
      case DType::i32: store(std::int32_t(k * 7919 % 2001 - 1000), k); break;
      case DType::i64: store(std::int64_t(k * 7919 % 2001 - 1000), k); break;
      case DType::u8: store(std::uint8_t(k % 251), k); break;
    }
  }
  return array;
}

const std::vector<DType> kAllDTypes = {DType::f32, DType::f64, DType::i32, DType::i64, DType::u8};
// The last two have headers where numpy's padding rules matter: with 14 dims the header text ends
// exactly on a 64-byte boundary (numpy then pads a full 64 bytes); with 15 dims the 20 spaces numpy
// reserves for growing shape[0] push the header past 128 bytes.
const std::vector<std::vector<std::int64_t>> kShapes = {
    {}, {0}, {7}, {2, 3}, {3, 0, 2}, {2, 1, 3, 1, 2}, {1000}, {0, 1234567},
    {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 100}, {2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3}};

std::string short_descr(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f4";
    case DType::f64: return "f8";
    case DType::i32: return "i4";
    case DType::i64: return "i8";
    case DType::u8: return "u1";
  }
  return "?";
}

// "f4_2x3.npy", "u1_scalar.npy": the NumPy script recovers dtype and shape from the name.
std::string file_name_for(DType dtype, const std::vector<std::int64_t>& shape) {
  std::string name = short_descr(dtype) + "_";
  if (shape.empty()) name += "scalar";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) name += 'x';
    name += std::to_string(shape[i]);
  }
  return name + ".npy";
}

// A .npy file with this header text as is (no padding), for the malformed-file tests.
std::vector<std::byte> npy_with_header(std::string_view header, std::string_view data = "", int major = 1) {
  std::string file = "\x93NUMPY";
  file += char(major);
  file += '\0';
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  for (std::size_t i = 0; i < length_bytes; ++i) file += char((header.size() >> (8 * i)) & 0xFF);
  file += header;
  file += data;
  return to_bytes(file);
}

// The IOError message parse_npy raises for these bytes ("" if it raises nothing).
std::string parse_error(const std::vector<std::byte>& bytes) {
  try {
    petra::parse_npy(bytes, "bad.npy");
  } catch (const petra::IOError& e) {
    return e.what();
  }
  return "";
}

constexpr std::string_view kValidHeader = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n";
const std::string kSixFloats(24, '\0');

// The error names the file, "byte <offset>", and contains `what`.
void check_error(const std::vector<std::byte>& bytes, std::size_t offset, std::string_view what) {
  const std::string message = parse_error(bytes);
  INFO("message: ", message);
  CHECK(message.find("'bad.npy'") != std::string::npos);
  CHECK(message.find("byte " + std::to_string(offset) + ":") != std::string::npos);
  CHECK(message.find(what) != std::string::npos);
}

// Offset in the file of `needle` in a version-1.0 header.
std::size_t offset_in_header(std::string_view header, std::string_view needle) { return 10 + header.find(needle); }

}  // namespace

TEST_CASE("npy: the header is byte for byte what numpy.save writes") {
  const std::vector<std::int64_t> shape = {2, 3};
  const auto header = petra::npy_header(DType::f32, shape);
  const auto golden = bytes_of(kNumpyFloat32_2x3);
  REQUIRE(header.size() == 128);
  CHECK(std::equal(header.begin(), header.end(), golden.begin()));

  // The whole file, written through the atomic writer.
  TemporaryDirectory dir("npy");
  const float values[6] = {-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f};
  petra::write_npy(dir / "a.npy", DType::f32, shape, values);
  const auto written = file_bytes(dir / "a.npy");
  CHECK(std::equal(written.begin(), written.end(), golden.begin(), golden.end()));

  const std::vector<std::int64_t> scalar;
  const auto scalar_header = petra::npy_header(DType::i64, scalar);
  CHECK(std::equal(scalar_header.begin(), scalar_header.end(), bytes_of(kNumpyInt64Scalar).begin()));
}

TEST_CASE("npy: files written by NumPy are read") {
  const NpyArray a = petra::parse_npy(bytes_of(kNumpyFloat32_2x3), "float32.npy");
  CHECK(a.dtype == DType::f32);
  CHECK(a.shape == std::vector<std::int64_t>{2, 3});
  CHECK(values_of<float>(a) == std::vector<float>{-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f});

  const NpyArray s = petra::parse_npy(bytes_of(kNumpyInt64Scalar), "scalar.npy");
  CHECK(s.dtype == DType::i64);
  CHECK(s.shape.empty());
  CHECK(values_of<std::int64_t>(s) == std::vector<std::int64_t>{-7});

  const NpyArray v2 = petra::parse_npy(bytes_of(kNumpyUint8Version2), "version2.npy");
  CHECK(v2.dtype == DType::u8);
  CHECK(v2.shape == std::vector<std::int64_t>{3});
  CHECK(values_of<std::uint8_t>(v2) == std::vector<std::uint8_t>{1, 2, 250});

  // '<u1' is accepted as uint8; double quotes, no trailing comma and other spacing are valid Python.
  const NpyArray u = petra::parse_npy(npy_with_header("{\"descr\":\"<u1\",\"shape\":(2,),\"fortran_order\":False}", "\x05\x06"), "u.npy");
  CHECK(u.dtype == DType::u8);
  CHECK(values_of<std::uint8_t>(u) == std::vector<std::uint8_t>{5, 6});
  CHECK(petra::parse_npy(npy_with_header(kValidHeader, kSixFloats, 3), "v3.npy").shape == std::vector<std::int64_t>{2, 3});
}

TEST_CASE("npy: every dtype and shape survives a write and a read") {
  TemporaryDirectory dir("npy");
  for (DType dtype : kAllDTypes) {
    for (const auto& shape : kShapes) {
      const NpyArray original = pattern_array(dtype, shape);
      const fs::path path = dir / file_name_for(dtype, shape);
      INFO(path.filename().string());
      petra::write_npy(path, original);
      const NpyArray back = petra::read_npy(path);
      CHECK(back.dtype == dtype);
      CHECK(back.shape == shape);
      CHECK(back.data == original.data);
      // The data starts at a multiple of 64 bytes and nothing follows it.
      const auto size = fs::file_size(path);
      CHECK((size - original.data.size()) % 64 == 0);
      CHECK(petra::parse_npy(file_bytes(path), "in memory").data == original.data);
    }
  }
  CHECK(dir.entries().size() == kAllDTypes.size() * kShapes.size());  // no temporary files left
}

TEST_CASE("npy: a header beyond 64 KiB is written in version 2.0") {
  const std::vector<std::int64_t> shape(22000, 1);  // "1, " per dim: about 66000 header bytes
  const auto header = petra::npy_header(DType::u8, shape);
  REQUIRE(header.size() > 0xFFFF);
  CHECK(std::to_integer<int>(header[6]) == 2);
  CHECK(header.size() % 64 == 0);
  TemporaryDirectory dir("npy");
  const std::uint8_t value = 42;
  petra::write_npy(dir / "wide.npy", DType::u8, shape, &value);
  const NpyArray back = petra::read_npy(dir / "wide.npy");
  CHECK(back.shape == shape);
  CHECK(values_of<std::uint8_t>(back) == std::vector<std::uint8_t>{42});
}

TEST_CASE("npy: NumPy reads petra's files and writes the same bytes (needs /usr/bin/python3 with numpy)") {
  if (std::system("/usr/bin/python3 -c 'import numpy' > /dev/null 2>&1") != 0) {
    MESSAGE("skipped: /usr/bin/python3 with numpy is not available");
    return;
  }
  TemporaryDirectory dir("npy");
  for (DType dtype : kAllDTypes)
    for (const auto& shape : kShapes) petra::write_npy(dir / ("petra_" + file_name_for(dtype, shape)), pattern_array(dtype, shape));
  std::ofstream(dir / "check.py") << R"(
import os, sys
import numpy as np
d = sys.argv[1]
for name in sorted(os.listdir(d)):
    if not name.startswith('petra_'):
        continue
    code, dims = name[len('petra_'):-len('.npy')].split('_')
    shape = () if dims == 'scalar' else tuple(int(x) for x in dims.split('x'))
    n = int(np.prod(shape))
    k = np.arange(n, dtype=np.int64)
    if code[0] == 'f':
        expected = k.astype('<' + code) * 0.25 - 3
    elif code[0] == 'i':
        expected = (k * 7919 % 2001 - 1000).astype('<' + code)
    else:
        expected = (k % 251).astype(np.uint8)
    expected = expected.reshape(shape)
    got = np.load(os.path.join(d, name))
    assert got.dtype == expected.dtype and got.shape == shape and np.array_equal(got, expected), name
    np.save(os.path.join(d, 'numpy_' + name[len('petra_'):]), expected)
)";
  const std::string command = "/usr/bin/python3 " + (dir / "check.py").string() + " " + dir.path().string();
  REQUIRE(std::system(command.c_str()) == 0);
  for (DType dtype : kAllDTypes) {
    for (const auto& shape : kShapes) {
      const std::string name = file_name_for(dtype, shape);
      INFO(name);
      CHECK(file_bytes(dir / ("petra_" + name)) == file_bytes(dir / ("numpy_" + name)));
      const NpyArray from_numpy = petra::read_npy(dir / ("numpy_" + name));
      CHECK(from_numpy.dtype == dtype);
      CHECK(from_numpy.shape == shape);
      CHECK(from_numpy.data == pattern_array(dtype, shape).data);
    }
  }
}

TEST_CASE("npy: a malformed file raises IOError naming the byte offset and the problem") {
  CHECK(parse_error(npy_with_header(kValidHeader, kSixFloats)).empty());  // the base of the variations

  SUBCASE("bad magic") {
    auto bytes = npy_with_header(kValidHeader, kSixFloats);
    bytes[5] = std::byte{'X'};
    check_error(bytes, 0, "bad magic");
    check_error(to_bytes("\x93NUM"), 0, "bad magic");
    check_error({}, 0, "bad magic");
  }
  SUBCASE("unsupported version") {
    check_error(npy_with_header(kValidHeader, kSixFloats, 4), 6, "unsupported format version 4.0");
    auto bytes = npy_with_header(kValidHeader, kSixFloats);
    bytes[7] = std::byte{1};
    check_error(bytes, 6, "unsupported format version 1.1");
  }
  SUBCASE("the file ends in the preamble or the header length is beyond the file") {
    check_error(to_bytes(std::string_view("\x93NUMPY\x01", 7)), 6, "ends inside the version");
    check_error(to_bytes(std::string_view("\x93NUMPY\x02\x00\x10\x00", 10)), 8, "ends inside the header length");
    auto bytes = npy_with_header(kValidHeader, kSixFloats);
    bytes[8] = std::byte{0xFF};
    bytes[9] = std::byte{0x7F};
    check_error(bytes, 8, "runs past the end of the file");
  }
  SUBCASE("header not a dict") {
    check_error(npy_with_header("['descr', '<f4']\n", kSixFloats), 10, "not a dict");
    check_error(npy_with_header("  \n", kSixFloats), 13, "not a dict");
    const std::string_view unclosed = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)";
    check_error(npy_with_header(unclosed, kSixFloats), 10 + unclosed.size(), "expected ',' or '}'");
    const std::string_view trailing = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } x\n";
    check_error(npy_with_header(trailing, kSixFloats), offset_in_header(trailing, "x\n"), "after the header dict");
    const std::string_view no_colon = "{'descr' '<f4'}";
    check_error(npy_with_header(no_colon, kSixFloats), offset_in_header(no_colon, "'<f4'"), "expected ':'");
  }
  SUBCASE("missing, unexpected and duplicate keys") {
    const std::string_view no_shape = "{'descr': '<f4', 'fortran_order': False, }";
    check_error(npy_with_header(no_shape, kSixFloats), offset_in_header(no_shape, "}"), "no 'shape' key");
    const std::string_view no_descr = "{'fortran_order': False, 'shape': (2, 3)}";
    check_error(npy_with_header(no_descr, kSixFloats), offset_in_header(no_descr, "}"), "no 'descr' key");
    const std::string_view no_order = "{'descr': '<f4', 'shape': (2, 3)}";
    check_error(npy_with_header(no_order, kSixFloats), offset_in_header(no_order, "}"), "no 'fortran_order' key");
    const std::string_view extra = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'order': 'C'}";
    check_error(npy_with_header(extra, kSixFloats), offset_in_header(extra, "'order'"), "unexpected key 'order'");
    const std::string_view twice = "{'descr': '<f4', 'shape': (6,), 'fortran_order': False, 'shape': (2, 3)}";
    check_error(npy_with_header(twice, kSixFloats), offset_in_header(twice, "'shape': (2"), "duplicate key 'shape'");
  }
  SUBCASE("fortran_order True is refused") {
    const std::string_view fortran = "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }";
    check_error(npy_with_header(fortran, kSixFloats), offset_in_header(fortran, "True"), "Fortran-order arrays are not supported");
    const std::string_view not_bool = "{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3), }";
    check_error(npy_with_header(not_bool, kSixFloats), offset_in_header(not_bool, "0,"), "must be True or False");
  }
  SUBCASE("unknown and big-endian dtypes") {
    const std::string_view big = "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }";
    check_error(npy_with_header(big, kSixFloats), offset_in_header(big, "'>f4'"), "big-endian dtype '>f4' is not supported");
    const std::string_view complex = "{'descr': '<c8', 'fortran_order': False, 'shape': (2, 3), }";
    check_error(npy_with_header(complex, kSixFloats), offset_in_header(complex, "'<c8'"), "unsupported dtype '<c8'");
    const std::string_view structured = "{'descr': [('x', '<f4')], 'fortran_order': False, 'shape': (2, 3), }";
    check_error(npy_with_header(structured, kSixFloats), offset_in_header(structured, "["), "structured dtypes are not supported");
  }
  SUBCASE("bad shape tuples") {
    for (std::string_view shape : {"[2, 3]", "(2, x)", "(-2, 3)", "(6)", "(2,, 3)", "(99999999999999999999,)", "(2 3)"}) {
      const std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + std::string(shape) + ", }";
      INFO(header);
      const std::string message = parse_error(npy_with_header(header, kSixFloats));
      CHECK(message.find("byte ") != std::string::npos);
      CHECK((message.find("bad shape tuple") != std::string::npos || message.find("must be a tuple") != std::string::npos));
    }
    const std::string_view negative = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }";
    check_error(npy_with_header(negative, kSixFloats), offset_in_header(negative, "-3"), "negative dimension");
    const std::string_view overflow = "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }";
    check_error(npy_with_header(overflow, kSixFloats), 10 + overflow.size(), "too many elements");
  }
  SUBCASE("data shorter or longer than the shape needs") {
    const std::size_t data_offset = 10 + kValidHeader.size();
    check_error(npy_with_header(kValidHeader, kSixFloats.substr(1)), data_offset, "truncated file");
    check_error(npy_with_header(kValidHeader, ""), data_offset, "needs 24 data bytes, the file has only 0");
    check_error(npy_with_header(kValidHeader, kSixFloats + "!"), data_offset + 24, "the file has 1 more");
  }
}

// A zero dim once skipped the overflow check: (0, 2^40, 2^40, 2^40) needs 0 bytes and was accepted,
// though no array of its shape exists (NumPy refuses it too). The product of the other dims, in
// bytes, must fit 64 bits whatever the zeros.
TEST_CASE("npy: a zero dim does not hide an element count that overflows") {
  const std::string_view hidden = "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 1099511627776, 1099511627776, 1099511627776), }";
  check_error(npy_with_header(hidden, ""), 10 + hidden.size(), "too many elements");
  const std::string_view last = "{'descr': '<f8', 'fortran_order': False, 'shape': (16, 0, 1152921504606846976), }";
  check_error(npy_with_header(last, ""), 10 + last.size(), "too many elements");
  // Zero-size arrays whose other dims fit are still read.
  const std::string_view fine = "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 1099511627776, 1, 1), }";
  CHECK(parse_error(npy_with_header(fine, "")).empty());
}

TEST_CASE("npy: read_npy reports missing and truncated files") {
  TemporaryDirectory dir("npy");
  CHECK_THROWS_WITH_AS(petra::read_npy(dir / "missing.npy"), doctest::Contains("missing.npy"), petra::IOError);
  CHECK_THROWS_AS(petra::read_npy(dir.path()), petra::IOError);  // a directory

  const auto golden = bytes_of(kNumpyFloat32_2x3);
  std::ofstream(dir / "cut.npy", std::ios::binary).write(reinterpret_cast<const char*>(golden.data()), 150);
  CHECK_THROWS_WITH_AS(petra::read_npy(dir / "cut.npy"), doctest::Contains("byte 128: the shape (2, 3) of float32 needs 24"),
                       petra::IOError);
}

TEST_CASE("npy: write_npy is atomic and leaves no temporary file on failure") {
  TemporaryDirectory dir("npy");
  const float value = 1.0f;
  const std::vector<std::int64_t> shape = {1};

  // A directory that does not exist: IOError, nothing created.
  CHECK_THROWS_AS(petra::write_npy(dir / "no" / "such" / "dir.npy", DType::f32, shape, &value), petra::IOError);
  CHECK(dir.entries().empty());

  // The target is a directory: the temporary file is written, the rename fails, the temporary is removed.
  fs::create_directory(dir / "taken.npy");
  fs::create_directory(dir / "taken.npy" / "inside");
  CHECK_THROWS_WITH_AS(petra::write_npy(dir / "taken.npy", DType::f32, shape, &value), doctest::Contains("rename"),
                       petra::IOError);
  CHECK(dir.entries() == std::set<std::string>{"taken.npy"});

  // Overwriting replaces the old contents completely.
  const std::vector<std::int64_t> long_shape = {100};
  const std::vector<float> hundred(100, 2.0f);
  petra::write_npy(dir / "x.npy", DType::f32, long_shape, hundred.data());
  petra::write_npy(dir / "x.npy", DType::f32, shape, &value);
  const NpyArray back = petra::read_npy(dir / "x.npy");
  CHECK(back.shape == shape);
  CHECK(values_of<float>(back) == std::vector<float>{1.0f});
  CHECK(dir.entries() == std::set<std::string>{"taken.npy", "x.npy"});

  // Arguments that cannot describe an array are ValueErrors, before any file is touched.
  const std::vector<std::int64_t> negative = {-1};
  CHECK_THROWS_AS(petra::write_npy(dir / "y.npy", DType::f32, negative, &value), petra::ValueError);
  CHECK_THROWS_AS(petra::write_npy(dir / "y.npy", DType::f32, shape, nullptr), petra::ValueError);
  NpyArray inconsistent{DType::f64, {3}, std::vector<std::byte>(8)};
  CHECK_THROWS_AS(petra::write_npy(dir / "y.npy", inconsistent), petra::ValueError);
  CHECK(dir.entries() == std::set<std::string>{"taken.npy", "x.npy"});
}

TEST_CASE("tensors round-trip through .npy, strided views included") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "petra-npy-tensor-test";
  fs::create_directories(dir);
  const petra::Tensor x = petra::Tensor::from_vector<float>({2, 4, 1}, {1, 2, 3, 4, 5, 6, 7, 8});
  const petra::Tensor second_stream = x.slice(1, 2, 4);  // channels 2, 3: a strided view
  petra::save_npy(dir / "s.npy", second_stream);
  const petra::Tensor back = petra::load_npy(dir / "s.npy");
  CHECK(back.shape() == petra::Shape{2, 2, 1});
  CHECK(back.to_vector<float>() == std::vector<float>{3, 4, 7, 8});
  const std::int64_t seven_dims[] = {1, 1, 1, 1, 1, 1, 1};
  const float one = 1.0f;
  petra::write_npy(dir / "7d.npy", petra::DType::f32, seven_dims, &one);
  CHECK_THROWS_AS(petra::load_npy(dir / "7d.npy"), petra::IOError);
  fs::remove_all(dir);
}
