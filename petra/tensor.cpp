// petra/tensor.cpp: Storage, Tensor views and copies.
#include "petra/tensor.hpp"

#include <cmath>
#include <cstring>
#include <optional>

#include "petra/kernels/elementwise.hpp"
#include "petra/checked.hpp"
#include "petra/config.hpp"
#include "petra/cuda_backend.hpp"
#include "petra/rng.hpp"
#include "petra/stream.hpp"

namespace petra {

using detail::concat;

Storage::Storage(std::size_t bytes, Device device)
    : Storage(bytes, device, MemoryScope::current_tag(), MemoryScope::current_owner()) {}

namespace {
// The stream a new block of `device` is homed on: the one its first op will run on.
void* home_stream(Device device) {
  return device.is_cuda() ? Stream::for_device(device).handle().cuda_stream : nullptr;
}
}  // namespace

Storage::Storage(std::size_t bytes, Device device, MemoryTag tag, int owner)
    : allocation_(Allocator::instance().allocate(bytes, device, tag, owner, home_stream(device))) {}

Storage::~Storage() { Allocator::instance().deallocate(allocation_); }

void Storage::record_stream(const Stream& stream) {
  Allocator::instance().record_stream(allocation_, stream.handle().cuda_stream, stream.device());
}

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
  Tensor t = empty(shape, dtype, device);
  t.fill(value);
  return t;
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
  // There is no conversion kernel: a GPU tensor is converted on the host and copied back (a rare
  // operation: inputs, checks, checkpoints).
  if (!device().is_cpu()) return to(Device::cpu()).to(target).to(device());
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

namespace {

// A view as rows of packed bytes: `rows` rows of `width` bytes, consecutive rows `pitch` bytes
// apart. Every view petra makes has this form (a batch slice is one row; a channel slice of NCHW is
// one row per sample), so a GPU copy of it is one cudaMemcpy2DAsync.
struct RowLayout {
  std::int64_t rows = 1, width = 0, pitch = 0;  // width and pitch in bytes
};

std::optional<RowLayout> row_layout(const Shape& shape, const std::array<std::int64_t, Shape::kMaxDims>& strides,
                                    std::size_t esize) {
  const int nd = shape.ndim();
  std::int64_t packed = 1;  // elements of the packed inner dims
  int k = nd;
  while (k > 0 && (shape[k - 1] == 1 || strides[k - 1] == packed)) packed *= shape[--k];
  const auto bytes = static_cast<std::int64_t>(esize);
  if (k == 0) return RowLayout{1, packed * bytes, packed * bytes};
  // The outer dims [0, k) must step through memory as one progression of rows.
  std::int64_t rows = shape[k - 1], next = strides[k - 1] * shape[k - 1];
  for (int d = k - 2; d >= 0; --d) {
    if (shape[d] == 1) continue;
    if (strides[d] != next) return std::nullopt;
    rows *= shape[d];
    next = strides[d] * shape[d];
  }
  return RowLayout{rows, packed * bytes, strides[k - 1] * bytes};
}

}  // namespace

void Tensor::copy_from(const Tensor& source) const {
  PETRA_CHECK(defined() && source.defined(), ShapeError, "Tensor::copy_from: undefined tensor");
  PETRA_CHECK(shape_ == source.shape_ && dtype_ == source.dtype_, ShapeError, "Tensor::copy_from: ", source.str(),
              " into ", str());
  PETRA_CHECK(is_contiguous(), ShapeError, "Tensor::copy_from: destination ", str(), " is a strided view");
  if (device().is_cpu() && source.device().is_cpu()) {
    pack_strided(source, static_cast<std::byte*>(raw_data()), source.strides_, source.offset_);
    return;
  }
  if (numel() == 0) return;
  // At least one side is on a GPU. The copy runs on the stream the destination's ops would run on
  // (the source's for a copy to the host), in order with them.
  Stream& stream = Stream::for_device(device().is_cuda() ? device() : source.device());
  void* const cuda_stream = stream.handle().cuda_stream;
  if (source.device().is_cpu()) {
    // From the host: packed there first; waited for, since the packed source may be a temporary.
    const Tensor packed = source.contiguous();
    cuda_backend::memcpy_async(raw_data(), packed.raw_data(), nbytes(), cuda_stream);
    stream.synchronize();
    return;
  }
  if (device().is_cuda() && device() != source.device()) {
    // Between two GPUs: after the work queued so far on the source's stream, and the source's
    // block is not reused before the copy has read it.
    Event produced(source.device());
    produced.record(Stream::for_device(source.device()));
    stream.wait(produced);
    source.storage()->record_stream(stream);
  }
  const auto layout = row_layout(source.shape_, source.strides_, size_of(dtype_));
  PETRA_CHECK(layout.has_value(), ShapeError, "Tensor::copy_from: the GPU view ", source.str(),
              " is not rows of packed elements (only batch and channel slices are)");
  if (layout->pitch == layout->width)
    cuda_backend::memcpy_async(raw_data(), source.raw_data(), nbytes(), cuda_stream);
  else
    cuda_backend::memcpy_2d_async(raw_data(), static_cast<std::size_t>(layout->width), source.raw_data(),
                                  static_cast<std::size_t>(layout->pitch), static_cast<std::size_t>(layout->width),
                                  static_cast<std::size_t>(layout->rows), cuda_stream);
  if (device().is_cpu()) stream.synchronize();  // to the host: the caller reads it next
}

// A setup operation (Module::to): synchronous, so that the old block can be freed at once. The
// copy runs on the stream of the GPU side (the destination's when both are GPUs) after the work
// the calling thread queued on the source's device.
void Storage::move_to(Device device) {
  if (device == allocation_.device) return;
  Allocation moved =
      Allocator::instance().allocate(allocation_.bytes, device, allocation_.tag, allocation_.owner, home_stream(device));
  try {
    if (allocation_.bytes > 0 && device.is_cpu() && allocation_.device.is_cpu()) {
      std::memcpy(moved.ptr, allocation_.ptr, allocation_.bytes);
    } else if (allocation_.bytes > 0) {
      if (allocation_.device.is_cuda()) Stream::for_device(allocation_.device).synchronize();
      Stream& stream = Stream::for_device(device.is_cuda() ? device : allocation_.device);
      cuda_backend::memcpy_async(moved.ptr, allocation_.ptr, allocation_.bytes, stream.handle().cuda_stream);
      stream.synchronize();
    }
  } catch (...) {
    Allocator::instance().deallocate(moved);
    throw;
  }
  Allocator::instance().deallocate(allocation_);
  allocation_ = moved;
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
  PETRA_CHECK(is_contiguous(), ShapeError, "Tensor::fill: needs a contiguous tensor, got ", str());
  if (device().is_cuda()) {
    // On the stream the tensor's ops run on: zeros (all bytes 0) by a memset, float32 by the fill
    // kernel, anything else through the host.
    Stream& stream = Stream::for_device(device());
    if (value == 0 && !std::signbit(value)) {
      cuda_backend::memset_async(raw_data(), 0, nbytes(), stream.handle().cuda_stream);
#if PETRA_CUDA_ELEMENTWISE
    } else if (dtype_ == DType::f32) {
      kernels::cuda::fill(stream.handle(), numel(), value, data_ptr<float>());
#endif
    } else {
      copy_from(full(shape_, value, dtype_, Device::cpu()));
    }
    return;
  }
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
