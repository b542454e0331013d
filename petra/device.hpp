// petra/device.hpp: where a tensor lives and where a kernel runs: "cpu:0", "cuda:1".
//
// With no GPU at run time (or a build without CUDA) everything runs on the CPU; the first query
// of cuda_available() prints one clear log line saying so.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace petra {

enum class DeviceType : std::uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static constexpr Device cpu(int index = 0) { return {DeviceType::cpu, index}; }
  static constexpr Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  // Parses "cpu", "cpu:1", "cuda", "cuda:0"; throws ValueError otherwise.
  static Device parse(std::string_view text);

  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  std::string str() const;  // "cpu:0"

  friend bool operator==(const Device&, const Device&) = default;
};

// True when petra was built with CUDA and at least one GPU is usable. Cached after the first call.
bool cuda_available();

// cuda:0 when a GPU is available, cpu:0 otherwise.
Device default_device();

}  // namespace petra
