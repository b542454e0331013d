// pipeline/memory_report.hpp: the allocator's peaks of one device read as a report: peak bytes by
// tag for the whole device, and for each pipeline stage its peak bytes by tag plus "total" (the most
// bytes of that stage live at once: what a device holding only that stage would need). The one place
// that turns allocator counters into the numbers petra-train's logs and --report-memory print.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "petra/device.hpp"

namespace petra::pipeline {

struct MemoryReport {
  std::map<std::string, std::int64_t> peak_bytes;  // by tag name, every tag listed
  // Per stage: tags with a non-zero peak, and "total".
  std::vector<std::map<std::string, std::int64_t>> stage_peak_bytes;
};

// The peaks since the device's last Allocator::reset_peaks, for stages 0 .. stages-1.
MemoryReport read_memory_report(Device device, int stages);
// Several devices (the GPUs of a pipeline): each number is the sum of the devices' own peaks (a
// stage lives on one device, so its row is that device's; the whole-run tags add peaks that may
// have happened at different times: an upper bound).
MemoryReport read_memory_report(const std::vector<Device>& devices, int stages);

// The report as the text petra-train --report-memory prints: a line of tags, then a table of MB
// per stage and tag.
std::string format_memory_report(const MemoryReport& report);

}  // namespace petra::pipeline
