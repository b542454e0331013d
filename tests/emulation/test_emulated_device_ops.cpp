// tests/emulation/test_emulated_device_ops.cpp: the backend-ops matrix (tests/support/backend_ops.hpp)
// on the emulated cuda:0 and cuda:1: every registered case through petra::ops, dispatched to
// kernels::cuda as on a GPU (the kernels compiled by g++ against the CUDA emulation), against
// float64 through kernels::ref, with the cuda tolerances of the table. The cuda suite runs the same
// table on a real GPU.
#include <doctest/doctest.h>

#include <vector>

#include "petra/device.hpp"
#include "tests/emulation/emulated_device.hpp"
#include "tests/support/backend_ops.hpp"

namespace bo = petra::testing::backend_ops;

TEST_CASE("backend ops: every registered case on the emulated cuda:0 matches ref") {
  const std::int64_t before = petra::emulated_device::launches(0);
  // Every family has a CUDA kernel: every case is compared, none skipped.
  CHECK(bo::check_backend(bo::cuda_backend(0)) == bo::registry().size());
  CHECK(petra::emulated_device::launches(0) > before);
}

TEST_CASE("backend ops: a sample of the cases on the emulated cuda:1") {
  const auto& all = bo::registry();
  std::vector<bo::Case> sample;
  for (std::size_t i = 0; i < all.size(); i += 7) sample.push_back(all[i]);
  const std::int64_t before = petra::emulated_device::launches(1);
  CHECK(bo::check_backend(bo::cuda_backend(1), sample) == sample.size());
  CHECK(petra::emulated_device::launches(1) > before);
}
