// tests/emulation/test_emulated_device_ops.cpp: the backend-ops matrix (tests/support/backend_ops.hpp)
// on the emulated cuda:0 and cuda:1: every registered case through petra::ops, dispatched to
// kernels::cuda as on a GPU (the kernels compiled by g++ against the CUDA emulation), against
// float64 through kernels::ref, with the cuda tolerances of the table. The cuda suite runs the same
// table on a real GPU.
#include <doctest/doctest.h>

#include <vector>

#include "petra/device.hpp"
#include "petra/ops.hpp"
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

TEST_CASE("backend ops: on a GPU, a bad label is reported at once, or later without a wait") {
  using namespace petra;
  const emulated_device::AsynchronousScope asynchronous;
  const Device gpu = Device::cuda(0);
  const Tensor logits = Tensor::zeros({3, 4}).to(gpu);
  const Tensor labels = Tensor::from_vector<std::int64_t>({3}, {0, -2, 9}).to(gpu);
  ops::CrossEntropySaved saved;
  CHECK_THROWS_WITH_AS(ops::cross_entropy_forward(logits, labels, &saved),
                       "cross_entropy: label -2 of sample 1 is outside [0, 4)", ValueError);
  const std::int64_t waits = emulated_device::live().host_waits;
  ops::cross_entropy_forward(logits, labels, &saved, ops::LabelCheck::deferred);
  const Tensor correct = ops::correct_predictions(logits, labels);
  CHECK(emulated_device::live().host_waits == waits);  // queued, not waited for
  CHECK_THROWS_WITH_AS(ops::check_labels(saved.first_bad, labels, 4),
                       "cross_entropy: label -2 of sample 1 is outside [0, 4)", ValueError);
  CHECK(correct.to_vector<std::int64_t>() == std::vector<std::int64_t>{1});  // argmax 0 of equal logits
}
