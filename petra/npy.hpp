// petra/npy.hpp: reading and writing NumPy .npy files (arrays on raw buffers).
//
// The format (numpy/lib/format.py, "NEP 1"): the magic "\x93NUMPY", a major and a minor version
// byte, the header length (little-endian uint16 in version 1.0, uint32 in 2.0 and 3.0), then the
// header: a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and ended by '\n' so that the data starts at a multiple of 64 bytes. The
// data follows: the elements in C order, nothing after them.
//
// Supported: versions 1.0, 2.0 and 3.0 on read; little-endian C-order arrays of float32 ('<f4'),
// float64 ('<f8'), int32 ('<i4'), int64 ('<i8') and uint8 ('|u1', also '<u1'); any number of dims,
// the scalar shape () and zero-size dims included. Anything else raises petra::IOError naming the
// file, the byte offset and what was wrong (a Fortran-order or big-endian array is refused, not
// silently reinterpreted). write_npy writes exactly the bytes numpy.save writes for the same
// array, in version 1.0 (2.0 only if the header outgrows 64 KiB).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

#include "petra/dtype.hpp"
#include "petra/tensor.hpp"

namespace petra {

struct NpyArray {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;  // empty for a scalar
  std::vector<std::byte> data;      // the elements in C order, little-endian
};

// Reads a whole .npy file. Throws IOError if it cannot be read or is malformed.
NpyArray read_npy(const std::filesystem::path& path);

// Parses the bytes of a .npy file held in memory; name_for_errors names it in messages.
NpyArray parse_npy(std::span<const std::byte> bytes, std::string_view name_for_errors);

// Writes an array of `shape` (C order, product of the dims elements of `dtype` at `data`; data may
// be null when that product is 0). Atomic: the bytes go to a temporary file in the same directory,
// which is flushed to disk (fsync) and renamed over `path`, so a reader sees the old file or the
// complete new one, never a partial one. On failure the temporary file is removed and IOError is
// thrown.
void write_npy(const std::filesystem::path& path, DType dtype, std::span<const std::int64_t> shape, const void* data);
void write_npy(const std::filesystem::path& path, const NpyArray& array);

// Tensor forms: load_npy returns a contiguous tensor on `device` (allocated in the calling
// thread's MemoryScope); a file with more than Shape::kMaxDims dims raises IOError.
// save_npy writes any tensor (any device, any layout) atomically, as numpy.save would.
Tensor load_npy(const std::filesystem::path& path, Device device = Device::cpu());
void save_npy(const std::filesystem::path& path, const Tensor& tensor);

// The header bytes numpy.save writes for this dtype and shape (magic to final '\n'); exposed for tests.
std::vector<std::byte> npy_header(DType dtype, std::span<const std::int64_t> shape);

}  // namespace petra
