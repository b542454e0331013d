// petra/shape.hpp: the shape of a tensor, up to six dimensions, stored inline (no allocation).
//
// A Shape's dims are >= 0 and their product fits 64 bits (the product of the non-zero dims too, as
// in NumPy): construction and with() throw ShapeError otherwise, so numel() never overflows.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

namespace petra {

class Shape {
 public:
  static constexpr int kMaxDims = 6;

  Shape() = default;  // a scalar: zero dims, one element
  Shape(std::initializer_list<std::int64_t> dims);
  explicit Shape(std::span<const std::int64_t> dims);

  int ndim() const { return ndim_; }
  std::int64_t operator[](int i) const;         // negative i counts from the end
  std::int64_t numel() const;                   // product of the dims (1 for a scalar)
  std::span<const std::int64_t> dims() const { return {dims_.data(), static_cast<std::size_t>(ndim_)}; }
  std::string str() const;                      // "[64, 3, 32, 32]"

  Shape with(int dim, std::int64_t size) const; // a copy with dims[dim] replaced

  friend bool operator==(const Shape& a, const Shape& b);

 private:
  std::array<std::int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

}  // namespace petra
