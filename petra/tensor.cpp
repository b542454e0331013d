// petra/tensor.cpp: Storage, Tensor views and copies.
#include "petra/tensor.hpp"

#include <cstring>

#include "petra/checked.hpp"
#include "petra/cuda_backend.hpp"
#include "petra/rng.hpp"
#include "petra/stream.hpp"

namespace petra {

using detail::concat;

Storage::Storage(std::size_t bytes, Device device)
    : Storage(bytes, device, MemoryScope::current_tag(), MemoryScope::current_owner()) {}

Storage::Storage(std::size_t bytes, Device device, MemoryTag tag, int owner)
    : allocation_(Allocator::instance().allocate(bytes, device, tag, owner)) {}

Storage::~Storage() { Allocator::instance().deallocate(allocation_); }

Tensor::Tensor(std::shared_ptr<Storage> storage, std::int64_t offset, const Shape& shape, DType dtype)
    : storage_(std::move(storage)), offset_(offset), shape_(shape), dtype_(dtype) {
  std::int64_t s = 1;
  for (int d = shape_.ndim() - 1; d >= 0; --d) {
    strides_[d] = s;
    s *= shape_[d];
  }
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  if (device.is_cuda()) PETRA_CHECK(cuda_available(), DeviceError, "Tensor::empty: no usable GPU for ", device.str());
  const std::int64_t bytes = checked_nbytes<ShapeError>(shape.dims(), size_of(dtype), [&] {
    return concat("Tensor::empty(", shape.str(), ", ", name_of(dtype), ")");
  });
  return Tensor(std::make_shared<Storage>(static_cast<std::size_t>(bytes), device), 0, shape, dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor host = empty(shape, dtype, Device::cpu());
  host.fill(value);
  return host.to(device);
}

namespace {
// A float32 CPU tensor filled by `fill` from Philox(seed), converted to `dtype` (exact for float64).
template <class Fill>
Tensor random_tensor(const Shape& shape, DType dtype, const char* op, Fill fill) {
  PETRA_CHECK(is_floating(dtype), ValueError, "Tensor::", op, ": dtype must be float32 or float64, got ", name_of(dtype));
  Tensor draws = Tensor::empty(shape, DType::f32, Device::cpu());
  fill(draws.data_ptr<float>(), static_cast<std::size_t>(draws.numel()));
  return dtype == DType::f32 ? draws : draws.to(dtype);
}
}  // namespace

Tensor Tensor::uniform(const Shape& shape, std::uint64_t seed, double lo, double hi, DType dtype) {
  return random_tensor(shape, dtype, "uniform", [&](float* out, std::size_t n) {
    Philox(seed).fill_uniform(out, n, static_cast<float>(lo), static_cast<float>(hi));
  });
}

Tensor Tensor::normal(const Shape& shape, std::uint64_t seed, double mean, double std, DType dtype) {
  return random_tensor(shape, dtype, "normal", [&](float* out, std::size_t n) {
    Philox(seed).fill_normal(out, n, static_cast<float>(mean), static_cast<float>(std));
  });
}

Device Tensor::device() const { return storage_ ? storage_->device() : Device::cpu(); }

std::int64_t Tensor::stride(int dim) const {
  const int k = dim < 0 ? dim + ndim() : dim;
  PETRA_CHECK(k >= 0 && k < ndim(), ShapeError, "Tensor::stride: dim ", dim, " out of range for ", str());
  return strides_[k];
}

bool Tensor::is_contiguous() const {
  std::int64_t s = 1;
  for (int d = ndim() - 1; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[d] != s) return false;
    s *= shape_[d];
  }
  return true;
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return "Tensor" + shape_.str() + " " + std::string(name_of(dtype_)) + " " + device().str();
}

void* Tensor::raw_data() const {
  PETRA_CHECK(defined(), ShapeError, "Tensor::raw_data: undefined tensor");
  return static_cast<std::byte*>(storage_->data()) + offset_ * static_cast<std::int64_t>(size_of(dtype_));
}

Tensor Tensor::reshape(const Shape& shape) const {
  PETRA_CHECK(defined(), ShapeError, "Tensor::reshape: undefined tensor");
  PETRA_CHECK(shape.numel() == numel(), ShapeError, "Tensor::reshape: cannot view ", str(), " as ", shape.str());
  PETRA_CHECK(is_contiguous(), ShapeError, "Tensor::reshape: ", str(), " is a strided view; call contiguous() first");
  return Tensor(storage_, offset_, shape, dtype_);
}

Tensor Tensor::slice(int dim, std::int64_t start, std::int64_t stop) const {
  PETRA_CHECK(defined(), ShapeError, "Tensor::slice: undefined tensor");
  PETRA_CHECK(dim == 0 || dim == 1, ShapeError, "Tensor::slice: only dims 0 (batch) and 1 (channels) are sliced, got ", dim);
  PETRA_CHECK(dim < ndim(), ShapeError, "Tensor::slice: dim ", dim, " out of range for ", str());
  PETRA_CHECK(0 <= start && start <= stop && stop <= shape_[dim], ShapeError, "Tensor::slice: range [", start, ", ",
              stop, ") out of bounds for dim ", dim, " of ", str());
  Tensor view = *this;
  view.shape_ = shape_.with(dim, stop - start);
  view.offset_ = offset_ + start * strides_[dim];
  return view;
}

namespace {

// Copies the elements of `src` (any strides) into the packed buffer `dst`, one innermost row at a time.
void pack_strided(const Tensor& src, std::byte* dst, const std::array<std::int64_t, Shape::kMaxDims>& strides,
                  std::int64_t offset) {
  const int nd = src.ndim();
  const std::size_t esize = size_of(src.dtype());
  const auto* base = static_cast<const std::byte*>(src.storage()->data());
  if (nd == 0) {
    std::memcpy(dst, base + offset * esize, esize);
    return;
  }
  const std::int64_t inner = src.size(nd - 1);
  const std::int64_t rows = src.numel() / std::max<std::int64_t>(inner, 1);
  std::array<std::int64_t, Shape::kMaxDims> index{};
  for (std::int64_t r = 0; r < rows && inner > 0; ++r) {
    std::int64_t pos = offset;
    for (int d = 0; d < nd - 1; ++d) pos += index[d] * strides[d];
    const std::byte* from = base + pos * esize;
    std::byte* to = dst + r * inner * esize;
    if (strides[nd - 1] == 1) {
      std::memcpy(to, from, inner * esize);
    } else {
      for (std::int64_t i = 0; i < inner; ++i) std::memcpy(to + i * esize, from + i * strides[nd - 1] * esize, esize);
    }
    for (int d = nd - 2; d >= 0; --d) {  // odometer increment over the outer dims
      if (++index[d] < src.size(d)) break;
      index[d] = 0;
    }
  }
}

}  // namespace

Tensor Tensor::contiguous() const {
  if (!defined() || is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  PETRA_CHECK(defined(), ShapeError, "Tensor::clone: undefined tensor");
  Tensor copy = empty(shape_, dtype_, device());
  copy.copy_from(*this);
  return copy;
}

Tensor Tensor::to(Device target) const {
  PETRA_CHECK(defined(), ShapeError, "Tensor::to: undefined tensor");
  if (target == device()) return *this;
  Tensor copy = empty(shape_, dtype_, target);
  copy.copy_from(*this);
  return copy;
}

namespace {
template <class To>
void convert_into(const Tensor& src, To* dst) {
  const std::int64_t n = src.numel();
  switch (src.dtype()) {
    case DType::f32: { const float* p = src.data_ptr<float>(); for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<To>(p[i]); break; }
    case DType::f64: { const double* p = src.data_ptr<double>(); for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<To>(p[i]); break; }
    case DType::i32: { const std::int32_t* p = src.data_ptr<std::int32_t>(); for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<To>(p[i]); break; }
    case DType::i64: { const std::int64_t* p = src.data_ptr<std::int64_t>(); for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<To>(p[i]); break; }
    case DType::u8: { const std::uint8_t* p = src.data_ptr<std::uint8_t>(); for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<To>(p[i]); break; }
  }
}
}  // namespace

Tensor Tensor::to(DType target) const {
  PETRA_CHECK(defined(), ShapeError, "Tensor::to: undefined tensor");
  if (target == dtype_) return *this;
  PETRA_CHECK(device().is_cpu(), DeviceError, "Tensor::to(", name_of(target), "): dtype conversion runs on the CPU; ", str());
  const Tensor src = contiguous();
  Tensor out = empty(shape_, target, Device::cpu());
  switch (target) {
    case DType::f32: convert_into(src, out.data_ptr<float>()); break;
    case DType::f64: convert_into(src, out.data_ptr<double>()); break;
    case DType::i32: convert_into(src, out.data_ptr<std::int32_t>()); break;
    case DType::i64: convert_into(src, out.data_ptr<std::int64_t>()); break;
    case DType::u8: convert_into(src, out.data_ptr<std::uint8_t>()); break;
  }
  return out;
}

void Tensor::copy_from(const Tensor& source) const {
  PETRA_CHECK(defined() && source.defined(), ShapeError, "Tensor::copy_from: undefined tensor");
  PETRA_CHECK(shape_ == source.shape_ && dtype_ == source.dtype_, ShapeError, "Tensor::copy_from: ", source.str(),
              " into ", str());
  PETRA_CHECK(is_contiguous(), ShapeError, "Tensor::copy_from: destination ", str(), " is a strided view");
  if (device().is_cpu() && source.device().is_cpu()) {
    pack_strided(source, static_cast<std::byte*>(raw_data()), source.strides_, source.offset_);
    return;
  }
  // At least one side is on a GPU: copy packed bytes on the current stream, then wait for it.
  const Tensor packed = source.device().is_cpu() ? source.contiguous() : source;
  PETRA_CHECK(packed.is_contiguous(), ShapeError, "Tensor::copy_from: strided GPU source ", source.str());
  Stream& stream = Stream::current();
  cuda_backend::memcpy_async(raw_data(), packed.raw_data(), nbytes(), stream.handle().cuda_stream);
  cuda_backend::stream_synchronize(stream.handle().cuda_stream);
}

namespace {
template <class T>
void fill_as(const Tensor& t, double value) {
  T* p = t.data_ptr<T>();
  std::fill(p, p + t.numel(), static_cast<T>(value));
}
}  // namespace

void Tensor::fill(double value) const {
  PETRA_CHECK(defined(), ShapeError, "Tensor::fill: undefined tensor");
  PETRA_CHECK(device().is_cpu() && is_contiguous(), ShapeError, "Tensor::fill: needs a contiguous CPU tensor, got ", str());
  switch (dtype_) {
    case DType::f32: fill_as<float>(*this, value); break;
    case DType::f64: fill_as<double>(*this, value); break;
    case DType::i32: fill_as<std::int32_t>(*this, value); break;
    case DType::i64: fill_as<std::int64_t>(*this, value); break;
    case DType::u8: fill_as<std::uint8_t>(*this, value); break;
  }
}

double Tensor::item() const {
  PETRA_CHECK(defined() && numel() == 1, ShapeError, "Tensor::item: needs exactly one element, got ", str());
  const Tensor t = to(Device::cpu()).contiguous().to(DType::f64);
  return *t.data_ptr<double>();
}

void require_contiguous(const Tensor& t, const char* op, const char* what) {
  PETRA_CHECK(t.defined(), ShapeError, op, ": ", what, " is undefined");
  PETRA_CHECK(t.is_contiguous(), ShapeError, op, ": ", what, " ", t.str(), " must be contiguous");
}

void require_same_shape(const Tensor& a, const Tensor& b, const char* op) {
  PETRA_CHECK(a.shape() == b.shape(), ShapeError, op, ": shapes differ: ", a.shape().str(), " and ", b.shape().str());
}

}  // namespace petra
