// tests/emulation/kernel_checks.hpp: what the emulated-kernel tests (test_emulated_<family>.cpp)
// share: aligned host arrays with guard elements, the sizes and grid caps to run, and how many
// blocks a grid-stride launch should have used.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "petra/kernels/common.hpp"
#include "tests/emulation/cuda_emulation.hpp"
#include "tests/support/testing.hpp"

namespace petra::emulation_testing {

// Floats whose first element is 64-byte aligned (as the allocator's are), so that `data() + 0`
// takes a kernel's float4 path and `data() + 1` its float path.
class AlignedFloats {
 public:
  explicit AlignedFloats(const std::vector<float>& values)
      : size_(values.size()),
        data_(static_cast<float*>(::operator new[](std::max<std::size_t>(size_, 1) * sizeof(float),
                                                   std::align_val_t(64)))) {
    std::copy(values.begin(), values.end(), data_.get());
  }
  float* data() const { return data_.get(); }
  std::size_t size() const { return size_; }
  std::vector<float> values() const { return std::vector<float>(data_.get(), data_.get() + size_); }

 private:
  struct Delete {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t(64)); }
  };
  std::size_t size_;
  std::unique_ptr<float[], Delete> data_;
};

// A stream whose kernels may take scratch memory (s.scratch(), from a host workspace).
struct ScratchStream {
  petra::kernels::HeapWorkspace workspace;
  petra::kernels::StreamHandle s;
  ScratchStream() { s.workspace = &workspace; }
};

// Elements after each array, which no kernel may touch.
inline constexpr std::size_t kGuard = 8;

// Pointer offsets in floats: 0 is 16-byte aligned (float4 path), 1 is not (float path).
inline const std::vector<std::size_t> kOffsets = {0, 1};

// Grid caps of grid_stride_blocks: the real one, and caps so low that every thread of the grid
// goes round its loop many times.
inline const std::vector<std::size_t> kGridCaps = {8192, 1, 3};

// Blocks of a grid-stride launch over `items` with the cap in force.
inline unsigned expected_blocks(std::int64_t items) {
  const std::size_t wanted = (std::size_t(items) + 255) / 256;
  return unsigned(std::clamp<std::size_t>(
      wanted, 1, petra::cuda_emulation::settings().grid_stride_block_cap));
}

// Indices where a and b differ bit for bit (NaN equals the same NaN), at most `limit` of them.
inline std::string bit_differences(const std::vector<float>& got, const std::vector<float>& want,
                                   std::size_t limit = 5) {
  std::string out;
  std::size_t shown = 0, total = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i])) {
      ++total;
      if (shown++ < limit)
        out += " [" + std::to_string(i) + "] got " + std::to_string(got[i]) + " want " +
               std::to_string(want[i]);
    }
  if (total > limit) out += " ... (" + std::to_string(total) + " in all)";
  return out;
}

}  // namespace petra::emulation_testing

// What every emulated-kernel test uses, in one line: `using namespace petra::emulation_testing::vocabulary;`
// (the emulation, the oracle and the kernels under test, and the helpers above).
namespace petra::emulation_testing::vocabulary {
namespace emu = petra::cuda_emulation;
namespace ref = petra::kernels::ref;
namespace cu = petra::kernels::cuda;
using petra::emulation_testing::AlignedFloats;
using petra::emulation_testing::bit_differences;
using petra::emulation_testing::expected_blocks;
using petra::emulation_testing::kGridCaps;
using petra::emulation_testing::kGuard;
using petra::emulation_testing::kOffsets;
using petra::emulation_testing::ScratchStream;
using petra::kernels::HeapWorkspace;
using petra::kernels::StreamHandle;
using petra::testing::max_abs_diff;
using petra::testing::random_values;
using petra::testing::relative_error;
}  // namespace petra::emulation_testing::vocabulary
