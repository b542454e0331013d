// petra/checked.hpp: the one way petra computes sizes that come from outside: from a file header, a
// flag, or a shape a caller passes in.
//
// Every count, shape, byte size and offset that a file or a flag decides is combined with these
// functions, never with plain `*` and `+`: wrapping arithmetic once turned a 16-byte IDX file into a
// 65,536-image tensor (2^64 pixels wrapped to 0). They refuse negative operands and any result
// above kMaxSize (INT64_MAX, so that a result fits std::int64_t and std::size_t alike), and throw the
// error type asked for (IOError in the readers, ValueError for arguments, ShapeError for shapes)
// with a message that says what overflowed. `what` names it: a string, or a callable returning one,
// which is only called on failure (so Tensor::empty pays nothing for its message).
//
//   const std::int64_t pixels = checked_mul<IOError>(n, height * width, "idx file 'x': the pixel count");
//   const std::int64_t bytes = checked_nbytes<ShapeError>(dims, 4, [&] { return "Tensor::empty(" + ...; });
//   check_at_most<IOError>(channels, kMaxChannels, "npy file 'x': the channel count");
//
// Element counts follow NumPy: a shape with a zero dim has no elements, but the product of its other
// dims must fit all the same, so (0, 2^40, 2^40, 2^40) is refused rather than accepted as empty.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "petra/error.hpp"

namespace petra {

// The largest size, count or offset petra computes.
inline constexpr std::int64_t kMaxSize = std::numeric_limits<std::int64_t>::max();

namespace detail {

template <class What>
std::string describe(const What& what) {
  if constexpr (std::is_invocable_v<const What&>) {
    return std::string(what());
  } else {
    return std::string(std::string_view(what));
  }
}

// A size operand as int64: negative values and unsigned ones above kMaxSize are refused.
template <class E, class T, class What>
std::int64_t as_size(T value, const What& what) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>, "sizes are integers");
  if constexpr (std::is_signed_v<T>) {
    if (value < 0) throw E(::petra::detail::concat(describe(what), ": ", static_cast<long long>(value), " is negative"));
    return static_cast<std::int64_t>(value);
  } else {
    if (static_cast<std::uint64_t>(value) > static_cast<std::uint64_t>(kMaxSize))
      throw E(::petra::detail::concat(describe(what), ": ", static_cast<unsigned long long>(value), " is above the limit of ", kMaxSize));
    return static_cast<std::int64_t>(value);
  }
}

// The product of the non-zero dims times `factor` (>= 1), checked; has_zero says whether a dim is 0.
template <class E, class What>
std::int64_t checked_product(std::span<const std::int64_t> dims, std::int64_t factor, const What& what, bool& has_zero) {
  std::int64_t product = factor;
  has_zero = false;
  for (std::int64_t d : dims) {
    if (d < 0) throw E(::petra::detail::concat(describe(what), ": dimension ", d, " is negative"));
    if (d == 0) {
      has_zero = true;
      continue;
    }
    if (__builtin_mul_overflow(product, d, &product)) {
      std::string shape = "[";
      for (std::size_t i = 0; i < dims.size(); ++i) shape += (i ? ", " : "") + std::to_string(dims[i]);
      throw E(::petra::detail::concat(describe(what), ": the size of ", shape, "]", factor > 1 ? ::petra::detail::concat(" x ", factor, " bytes") : "",
                     " overflows 64 bits (the limit is ", kMaxSize, ")"));
    }
  }
  return product;
}

}  // namespace detail

// a + b, both sizes (>= 0); throws E naming `what` if the sum exceeds kMaxSize.
template <class E = ValueError, class A, class B, class What>
std::int64_t checked_add(A a, B b, const What& what) {
  const std::int64_t x = detail::as_size<E>(a, what), y = detail::as_size<E>(b, what);
  std::int64_t sum = 0;
  if (__builtin_add_overflow(x, y, &sum))
    throw E(::petra::detail::concat(detail::describe(what), ": ", x, " + ", y, " overflows 64 bits (the limit is ", kMaxSize, ")"));
  return sum;
}

// a * b, both sizes (>= 0); throws E naming `what` if the product exceeds kMaxSize.
template <class E = ValueError, class A, class B, class What>
std::int64_t checked_mul(A a, B b, const What& what) {
  const std::int64_t x = detail::as_size<E>(a, what), y = detail::as_size<E>(b, what);
  std::int64_t product = 0;
  if (__builtin_mul_overflow(x, y, &product))
    throw E(::petra::detail::concat(detail::describe(what), ": ", x, " x ", y, " overflows 64 bits (the limit is ", kMaxSize, ")"));
  return product;
}

// The number of elements of a shape (1 for no dims, 0 if a dim is 0), with NumPy's rule that the
// product of the non-zero dims must fit too. Throws E naming `what` and the shape.
template <class E = ValueError, class What>
std::int64_t checked_numel(std::span<const std::int64_t> dims, const What& what) {
  bool has_zero = false;
  const std::int64_t product = detail::checked_product<E>(dims, 1, what, has_zero);
  return has_zero ? 0 : product;
}

// The bytes of a shape of elements of `element_size` bytes, by the same rule.
template <class E = ValueError, class What>
std::int64_t checked_nbytes(std::span<const std::int64_t> dims, std::size_t element_size, const What& what) {
  bool has_zero = false;
  const std::int64_t product = detail::checked_product<E>(dims, detail::as_size<E>(element_size, what), what, has_zero);
  return has_zero ? 0 : product;
}

// Returns value if 0 <= value <= limit, else throws E "<what> is <value>, above the limit of <limit>".
template <class E = ValueError, class T, class What>
std::int64_t check_at_most(T value, std::int64_t limit, const What& what) {
  const std::int64_t v = detail::as_size<E>(value, what);
  if (v > limit) throw E(::petra::detail::concat(detail::describe(what), " is ", v, ", above the limit of ", limit));
  return v;
}

}  // namespace petra
