// petra/device.cpp: device names and GPU detection.
#include "petra/device.hpp"

#include <charconv>
#include <cstdio>

#include "petra/cuda_backend.hpp"
#include "petra/error.hpp"

namespace petra {

Device Device::parse(std::string_view text) {
  const auto colon = text.find(':');
  const std::string_view kind = text.substr(0, colon);
  int index = 0;
  if (colon != std::string_view::npos) {
    const std::string_view digits = text.substr(colon + 1);
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    PETRA_CHECK(ec == std::errc() && end == digits.data() + digits.size() && index >= 0, ValueError,
                "Device::parse: bad device index in '", text, "' (expected for example cpu:0 or cuda:1)");
  }
  if (kind == "cpu") return cpu(index);
  if (kind == "cuda") return cuda(index);
  throw ValueError(detail::concat("Device::parse: unknown device '", text, "' (expected cpu[:N] or cuda[:N])"));
}

std::string Device::str() const { return (is_cpu() ? "cpu:" : "cuda:") + std::to_string(index); }

bool cuda_available() {
  static const bool available = [] {
    const bool yes = cuda_backend::available();
    if (cuda_backend::compiled() && !yes)
      std::fprintf(stderr, "petra: built with CUDA but no GPU is usable here; running on the CPU\n");
    return yes;
  }();
  return available;
}

Device default_device() { return cuda_available() ? Device::cuda(0) : Device::cpu(0); }

}  // namespace petra
