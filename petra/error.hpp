// petra/error.hpp: the exception types of petra, and the PETRA_CHECK macro.
//
// Every failure a user can cause (a wrong shape, a missing file, a CUDA call that fails) is
// reported as a petra::Error whose message names the operation and what was wrong. Library code
// never aborts or exits. This header depends on nothing else in petra, so every floor (kernels/,
// petra/, nn/, pipeline/, data/) may include it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace petra {

// Base class of everything petra throws.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A tensor has the wrong shape, dtype, or layout for an operation.
class ShapeError : public Error {
 public:
  using Error::Error;
};

// An argument is out of range or inconsistent (a negative stride, an unknown option).
class ValueError : public Error {
 public:
  using Error::Error;
};

// Reading or writing a file failed or the file is malformed; the message names file and offset.
class IOError : public Error {
 public:
  using Error::Error;
};

// A device is missing, unsupported, or mismatched between operands.
class DeviceError : public Error {
 public:
  using Error::Error;
};

// An allocation failed.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

namespace detail {
// Joins any streamable values into one string: concat("conv2d: x has ", 3, " dims").
template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}
}  // namespace detail

}  // namespace petra

// PETRA_CHECK(cond, ErrorType, parts...): throws ErrorType(concat(parts...)) when cond is false.
#define PETRA_CHECK(cond, ErrorType, ...)                          \
  do {                                                             \
    if (!(cond)) throw ErrorType(::petra::detail::concat(__VA_ARGS__)); \
  } while (0)
