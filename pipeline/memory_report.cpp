// pipeline/memory_report.cpp: allocator peaks read per tag and per stage, and printed.
#include "petra/pipeline/memory_report.hpp"

#include <fmt/format.h>

#include "petra/allocator.hpp"

namespace petra::pipeline {

MemoryReport read_memory_report(Device device, int stages) { return read_memory_report(std::vector{device}, stages); }

MemoryReport read_memory_report(const std::vector<Device>& devices, int stages) {
  const Allocator& allocator = Allocator::instance();
  MemoryReport report;
  for (int t = 0; t < kNumMemoryTags; ++t) {
    const auto tag = static_cast<MemoryTag>(t);
    std::int64_t peak = 0;
    for (const Device& d : devices) peak += allocator.stats(d, tag).peak;
    report.peak_bytes[std::string(name_of(tag))] = peak;
  }
  for (int j = 0; j < stages; ++j) {
    std::map<std::string, std::int64_t> stage;
    for (int t = 0; t < kNumMemoryTags; ++t) {
      const auto tag = static_cast<MemoryTag>(t);
      std::int64_t peak = 0;
      for (const Device& d : devices) peak += allocator.stats(d, tag, j).peak;
      if (peak > 0) stage[std::string(name_of(tag))] = peak;
    }
    std::int64_t total = 0;
    for (const Device& d : devices) total += allocator.stats_of_owner(d, j).peak;
    stage["total"] = total;
    report.stage_peak_bytes.push_back(std::move(stage));
  }
  return report;
}

std::string format_memory_report(const MemoryReport& report) {
  const auto mb = [](std::int64_t bytes) { return static_cast<double>(bytes) / 1e6; };
  std::string text = "peak bytes by tag: ";
  for (const auto& [tag, bytes] : report.peak_bytes)
    if (bytes > 0) text += fmt::format("{} {:.2f} MB  ", tag, mb(bytes));
  text += "\npeak MB per stage:\nstage";
  for (int t = 0; t < kNumMemoryTags; ++t) text += fmt::format(" {:>14}", name_of(static_cast<MemoryTag>(t)));
  text += fmt::format(" {:>14}\n", "total");
  for (std::size_t j = 0; j < report.stage_peak_bytes.size(); ++j) {
    const auto& stage = report.stage_peak_bytes[j];
    text += fmt::format("{:5}", j);
    for (int t = 0; t < kNumMemoryTags; ++t) {
      const auto found = stage.find(std::string(name_of(static_cast<MemoryTag>(t))));
      text += fmt::format(" {:14.3f}", found == stage.end() ? 0.0 : mb(found->second));
    }
    text += fmt::format(" {:14.3f}\n", mb(stage.at("total")));
  }
  return text;
}

}  // namespace petra::pipeline
