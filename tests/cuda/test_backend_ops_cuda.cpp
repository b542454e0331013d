// tests/cuda/test_backend_ops_cuda.cpp: the backend-ops matrix (tests/support/backend_ops.hpp) on
// the cuda:0 backend: every registered case, float32 through kernels::cuda, against float64
// through kernels::ref. Without a GPU (or in a build without CUDA) the case says so and returns;
// an op that has no CUDA kernel yet (ops:: raises DeviceError "no CUDA kernel yet") is reported
// once per op as "no CUDA kernel yet for <op>" and its cases are counted as skipped, not passed.
#include <doctest/doctest.h>

#include <string>

#include "petra/cuda_backend.hpp"
#include "petra/device.hpp"
#include "tests/support/backend_ops.hpp"

namespace bo = petra::testing::backend_ops;

TEST_CASE("backend ops: every registered case on cuda:0 matches ref, or is skipped for want of a kernel") {
  if (!petra::cuda_available()) {
    const std::string why =
        petra::cuda_backend::compiled() ? "no usable CUDA device on this machine" : "petra was built without CUDA";
    MESSAGE(why, ": the backend-ops cases for cuda:0 (", bo::registry().size(), " of them) are skipped");
    return;
  }
  const std::size_t compared = bo::check_backend(bo::cuda_backend(0));
  MESSAGE(compared, " of ", bo::registry().size(), " cases compared on cuda:0");
}
