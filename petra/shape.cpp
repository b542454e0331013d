// petra/shape.cpp: Shape construction, indexing and printing.
#include "petra/shape.hpp"

#include <algorithm>

#include "petra/checked.hpp"
#include "petra/error.hpp"

namespace petra {

Shape::Shape(std::initializer_list<std::int64_t> dims) : Shape(std::span<const std::int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const std::int64_t> dims) {
  PETRA_CHECK(dims.size() <= kMaxDims, ShapeError, "Shape: ", dims.size(), " dims given, at most ", kMaxDims, " supported");
  for (std::int64_t d : dims) PETRA_CHECK(d >= 0, ShapeError, "Shape: negative dimension ", d);
  checked_numel<ShapeError>(dims, "Shape");  // numel() of every Shape fits 64 bits
  std::copy(dims.begin(), dims.end(), dims_.begin());
  ndim_ = static_cast<int>(dims.size());
}

std::int64_t Shape::operator[](int i) const {
  const int k = i < 0 ? i + ndim_ : i;
  PETRA_CHECK(k >= 0 && k < ndim_, ShapeError, "Shape", str(), ": dim ", i, " out of range");
  return dims_[k];
}

std::int64_t Shape::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[i];
  return n;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < ndim_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + "]";
}

Shape Shape::with(int dim, std::int64_t size) const {
  const int k = dim < 0 ? dim + ndim_ : dim;
  PETRA_CHECK(k >= 0 && k < ndim_, ShapeError, "Shape", str(), ": dim ", dim, " out of range");
  std::array<std::int64_t, kMaxDims> dims = dims_;
  dims[k] = size;
  return Shape(std::span<const std::int64_t>(dims.data(), static_cast<std::size_t>(ndim_)));
}

bool operator==(const Shape& a, const Shape& b) {
  return a.ndim_ == b.ndim_ && std::equal(a.dims_.begin(), a.dims_.begin() + a.ndim_, b.dims_.begin());
}

}  // namespace petra
