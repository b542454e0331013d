// tests/emulation/test_emulated_channel.cpp: channel_split, channel_insert and channel_accumulate
// of kernels/cuda/channel.cu, run on the CPU by the CUDA emulation (emulated_channel.cpp), against
// kernels::ref, bit for bit (copies, and one addition per element).
//
// Planes of 1, 31, 33 and 4 x 4, channel ranges at the start, middle and end, batch 0 and 1;
// offsets 0 (float4 path where the row lengths allow) and 1 (float path); grid caps of 1 and 3
// blocks make the grid-stride loop go round across samples. Outputs are pre-filled (insert must
// leave the other channels as they were) with guard elements after them.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "petra/kernels/channel.hpp"
#include "petra/kernels/common.hpp"
#include "tests/emulation/kernel_checks.hpp"

namespace {

using namespace petra::emulation_testing::vocabulary;
using petra::kernels::ChannelShape;

struct Case {
  ChannelShape shape;
  std::int64_t first, count;
};

const std::vector<Case> kCases = {
    {{1, 1, 1, 1}, 0, 1},   {{2, 3, 1, 31}, 1, 1},  {{3, 5, 3, 11}, 2, 3},  {{2, 4, 4, 4}, 0, 2},
    {{2, 4, 4, 4}, 1, 2},   {{3, 6, 2, 2}, 4, 2},   {{1, 8, 4, 4}, 0, 8},   {{5, 2, 1, 33}, 1, 1},
    {{0, 3, 4, 4}, 1, 1},   {{2, 7, 5, 5}, 3, 4},
};

}  // namespace

TEST_CASE("emulated channel: split, insert and accumulate match ref bit for bit") {
  const StreamHandle s;
  int compared = 0;
  for (const std::size_t cap : kGridCaps) {
    const emu::GridStrideCap capped(cap);
    for (const Case& c : kCases)
      for (const std::size_t offset : kOffsets) {
        const auto full_size = std::size_t(c.shape.size());
        const auto part_size = std::size_t(c.shape.batch * c.count * c.shape.plane());
        const std::uint64_t seed = full_size + 7 * offset + std::uint64_t(c.first);
        INFO("N=", c.shape.batch, " C=", c.shape.channels, " H=", c.shape.height, " W=", c.shape.width,
             " first=", c.first, " count=", c.count, " offset=", offset, " grid cap=", cap);
        const bool vectors = c.count * c.shape.plane() % 4 == 0 && c.shape.channels * c.shape.plane() % 4 == 0 &&
                             c.first * c.shape.plane() % 4 == 0 && offset == 0;
        const std::int64_t items = c.shape.batch * c.count * c.shape.plane() / (vectors ? 4 : 1);
        {
          const AlignedFloats full(random_values(full_size + offset + kGuard, 100 + seed));
          const std::vector<float> before = random_values(part_size + offset + kGuard, 200 + seed, 5.0, 6.0);
          std::vector<float> expected = before;
          ref::channel_split<float>(s, c.shape, full.data() + offset, c.first, c.count, expected.data() + offset);
          const AlignedFloats part(before);
          const std::size_t launches = emu::launches();
          cu::channel_split(s, c.shape, full.data() + offset, c.first, c.count, part.data() + offset);
          CHECK_MESSAGE(bit_differences(part.values(), expected).empty(), bit_differences(part.values(), expected));
          if (items > 0) {
            CHECK(emu::last_launch().grid.x == expected_blocks(items));
            CHECK(emu::last_launch().kernel == std::string("channel_split"));
          } else {
            CHECK(emu::launches() == launches);
          }
        }
        // insert and accumulate: into full's range, the rest (and the guards) untouched
        const auto check_into = [&](const char* kernel, auto ref_kernel, auto cuda_kernel, std::uint64_t salt) {
          CAPTURE(kernel);
          const AlignedFloats part(random_values(part_size + offset + kGuard, salt + seed));
          const std::vector<float> before = random_values(full_size + offset + kGuard, salt + 100 + seed, 5.0, 6.0);
          std::vector<float> expected = before;
          ref_kernel(s, c.shape, part.data() + offset, c.first, c.count, expected.data() + offset);
          const AlignedFloats full(before);
          cuda_kernel(s, c.shape, part.data() + offset, c.first, c.count, full.data() + offset);
          CHECK_MESSAGE(bit_differences(full.values(), expected).empty(), bit_differences(full.values(), expected));
          if (items > 0) {
            CHECK(emu::last_launch().grid.x == expected_blocks(items));
            CHECK(emu::last_launch().kernel == std::string(kernel));
          }
        };
        check_into("channel_insert", ref::channel_insert<float>, cu::channel_insert, 300);
        check_into("channel_accumulate", ref::channel_accumulate<float>, cu::channel_accumulate, 500);
        compared += 3;
      }
  }
  MESSAGE("channel: ", compared, " comparisons");
}
