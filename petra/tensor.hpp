// petra/tensor.hpp: the N-d array of petra.
//
// A Tensor is a view: a reference-counted Storage (bytes on one device, tagged for the allocator),
// an offset, a shape (up to 6 dims), strides and a dtype. Copying a Tensor copies the view, not
// the data (use clone() for that). Tensors made by petra are contiguous (row-major); reshape() of a
// contiguous tensor and slice() along dim 0 (the batch) stay contiguous and share storage; slice()
// along dim 1 (the channels: the two streams of a reversible block are channel halves) gives a
// strided view, which contiguous() turns into a packed copy. Kernels require contiguous operands.
//
// Element access from host code (data_ptr<T>() dereferenced, raw pointers) is for CPU tensors only;
// to(), to_vector and item copy from any device. Copies and fills of GPU tensors run on
// Stream::for_device (petra/stream.hpp), in order with the ops of the same thread; a copy to the
// host waits for its stream, a copy from the host as well (its source may be a temporary).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "petra/allocator.hpp"
#include "petra/device.hpp"
#include "petra/dtype.hpp"
#include "petra/error.hpp"
#include "petra/shape.hpp"

namespace petra {

class Stream;

// Bytes on one device, returned to the caching allocator when the last view goes away.
class Storage {
 public:
  // Tag and owner default to the calling thread's MemoryScope.
  Storage(std::size_t bytes, Device device);
  Storage(std::size_t bytes, Device device, MemoryTag tag, int owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return allocation_.ptr; }
  std::size_t bytes() const { return allocation_.bytes; }
  Device device() const { return allocation_.device; }
  MemoryTag tag() const { return allocation_.tag; }
  int owner() const { return allocation_.owner; }
  void retag(MemoryTag tag, int owner) { Allocator::instance().retag(allocation_, tag, owner); }
  // The bytes are also used by work queued on `stream` (a GPU stream other than the one they were
  // allocated for): freeing them waits for that work (Allocator::record_stream).
  void record_stream(const Stream& stream);
  // Moves the bytes to `device` in place (same tag and owner): every Tensor viewing this storage
  // follows, so a layer's parameters, its aliases and an optimizer's references all move at once
  // (nn::Module::to). Not while other threads use the storage.
  void move_to(Device device);

 private:
  Allocation allocation_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false

  // New tensors. Memory tag and owner come from the calling thread's MemoryScope. A shape whose byte
  // size does not fit 64 bits is refused (ShapeError naming the shape and dtype; petra/checked.hpp).
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = Device::cpu());
  template <class T>
  static Tensor from_vector(const Shape& shape, const std::vector<T>& values, Device device = Device::cpu());
  // Random CPU tensors from the Philox generator of petra/rng.hpp: element i is element i of
  // Philox(seed).fill_uniform / fill_normal (stream 0, offset 0), so the same seed gives the same
  // values. Draws are float32; a float64 tensor holds the same draws, widened exactly. lo, hi, mean
  // and std are rounded to float; uniform needs lo < hi (values in [lo, hi)), normal std >= 0.
  static Tensor uniform(const Shape& shape, std::uint64_t seed, double lo = 0.0, double hi = 1.0,
                        DType dtype = DType::f32);
  static Tensor normal(const Shape& shape, std::uint64_t seed, double mean = 0.0, double std = 1.0,
                       DType dtype = DType::f32);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const;
  int ndim() const { return shape_.ndim(); }
  std::int64_t size(int dim) const { return shape_[dim]; }
  std::int64_t stride(int dim) const;
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * size_of(dtype_); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  std::string str() const;  // "Tensor[64, 3, 32, 32] float32 cpu:0"

  // Typed pointer to the first element; throws ShapeError if T is not the dtype.
  template <class T> T* data_ptr() const;
  void* raw_data() const;

  // Views (share storage).
  Tensor reshape(const Shape& shape) const;  // contiguous only; same number of elements
  Tensor slice(int dim, std::int64_t start, std::int64_t stop) const;  // dim 0 or 1

  // Copies.
  Tensor contiguous() const;                     // this if already contiguous, else a packed copy
  Tensor clone() const;                          // a packed copy (new storage, current MemoryScope)
  Tensor to(Device device) const;                // a copy on `device` (this if already there)
  Tensor to(DType dtype) const;                  // a converted copy, on the same device
  void copy_from(const Tensor& source) const;    // same shape and dtype; any devices; any layout
  void fill(double value) const;                 // every element (contiguous; any device)

  template <class T> std::vector<T> to_vector() const;  // CPU; any layout
  double item() const;                                   // single element as double (CPU)

 private:
  Tensor(std::shared_ptr<Storage> storage, std::int64_t offset, const Shape& shape, DType dtype);
  std::shared_ptr<Storage> storage_;
  std::int64_t offset_ = 0;  // in elements
  Shape shape_;
  std::array<std::int64_t, Shape::kMaxDims> strides_{};
  DType dtype_ = DType::f32;
};

// Throws ShapeError naming `op` unless t is defined, contiguous, and of dtype/device as required.
void require_contiguous(const Tensor& t, const char* op, const char* what);
void require_same_shape(const Tensor& a, const Tensor& b, const char* op);

// --- template definitions
template <class T>
T* Tensor::data_ptr() const {
  PETRA_CHECK(defined(), ShapeError, "Tensor::data: undefined tensor");
  PETRA_CHECK(dtype_v<T> == dtype_, ShapeError, "Tensor::data_ptr<", name_of(dtype_v<T>), ">: tensor is ", name_of(dtype_));
  return static_cast<T*>(storage_->data()) + offset_;
}

template <class T>
Tensor Tensor::from_vector(const Shape& shape, const std::vector<T>& values, Device device) {
  PETRA_CHECK(static_cast<std::int64_t>(values.size()) == shape.numel(), ShapeError, "Tensor::from_vector: ",
              values.size(), " values for shape ", shape.str());
  Tensor host = empty(shape, dtype_v<T>, Device::cpu());
  std::copy(values.begin(), values.end(), host.data_ptr<T>());
  return host.to(device);
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  const Tensor packed = to(Device::cpu()).contiguous();
  const T* p = packed.data_ptr<T>();
  return std::vector<T>(p, p + numel());
}

}  // namespace petra
