// tests/cpu/test_synchronous.cpp: the synchronous methods as the trainer runs them, on the executor:
// backprop there is the one-graph reference bit for bit, reversible backprop agrees with it, and
// reversible backprop's activation memory does not grow with the number of reversible blocks.
#include <doctest/doctest.h>

#include <cmath>

#include "petra/pipeline/backprop_reference.hpp"
#include "petra/pipeline/executor.hpp"
#include "tests/support/fixtures.hpp"
#include "tests/support/testing.hpp"

using namespace petra;

namespace {
// Runs `steps` mini-batches (all the same: x, labels) of a synchronous method on the executor, with
// no optimizer step, so the gradients add up. Returns the head's numbers of the last one.
nn::HeadNumbers::Values executor_steps(nn::Model& model, pipeline::PipelineMethod method, const Tensor& x,
                                   const Tensor& labels, std::int64_t steps = 1) {
  pipeline::RuntimeOptions options;
  options.method = method;
  options.apply_updates = false;
  pipeline::SequentialExecutor executor(model, options);
  const auto grid = pipeline::make_schedule(method, static_cast<int>(model.num_stages()), steps, 1, false);
  pipeline::HeadStats last;
  executor.run(grid, 0, steps, [&](std::int64_t) { return pipeline::MiniBatch{x, labels}; },
               [&](const pipeline::HeadStats& s) { last = s; });
  return last.numbers.read();
}
}  // namespace

TEST_CASE("backprop on the executor is the one-graph reference, bit for bit") {
  for (const std::string arch : {"revnet18", "resnet18"}) {
    CAPTURE(arch);
    nn::Model a(testing::tiny_model_config(arch, 5)), b(testing::tiny_model_config(arch, 5));
    const Tensor x = testing::random_tensor({6, 1, 12, 12}, 3, DType::f32), labels = testing::cyclic_labels(6, 10, 3);
    const auto ra = pipeline::backprop_step(a, x, labels);
    const auto rb = executor_steps(b, pipeline::PipelineMethod::backprop, x, labels);
    CHECK(ra.loss == rb.loss);
    CHECK(ra.correct == rb.correct);
    const auto pa = a.named_parameters(), pb = b.named_parameters();
    REQUIRE(pa.size() == pb.size());
    for (std::size_t i = 0; i < pa.size(); ++i) {
      CAPTURE(pa[i].first);
      REQUIRE(pb[i].second.grad().defined());
      CHECK(pa[i].second.grad().to_vector<float>() == pb[i].second.grad().to_vector<float>());
    }
    const auto ba = a.named_buffers(), bb = b.named_buffers();  // batch norm's running statistics, moved once
    REQUIRE(ba.size() == bb.size());
    for (std::size_t i = 0; i < ba.size(); ++i) CHECK(ba[i].second.to_vector<float>() == bb[i].second.to_vector<float>());
  }
}

TEST_CASE("revbackprop gives backprop's loss and parameter gradients") {
  for (const std::string arch : {"revnet18", "revnet50"}) {
    CAPTURE(arch);
    nn::Model a(testing::tiny_model_config(arch, 5)), b(testing::tiny_model_config(arch, 5));  // same seed: same parameters
    const Tensor x = testing::random_tensor({6, 1, 12, 12}, 1, DType::f32), labels = testing::cyclic_labels(6, 10, 3);
    const auto ra = pipeline::backprop_step(a, x, labels);
    const auto rb = executor_steps(b, pipeline::PipelineMethod::revbackprop, x, labels);
    CHECK(ra.loss == doctest::Approx(rb.loss).epsilon(1e-6));
    CHECK(ra.correct == rb.correct);
    const auto pa = a.named_parameters(), pb = b.named_parameters();
    REQUIRE(pa.size() == pb.size());
    for (std::size_t i = 0; i < pa.size(); ++i) {
      CAPTURE(pa[i].first);
      REQUIRE(pa[i].second.grad().defined());
      // Relative 1e-5, with an absolute floor: the bias of a conv followed by batch norm has an
      // exactly zero gradient in exact arithmetic (BN removes the mean), ~1e-7 of rounding here.
      const auto ga = pa[i].second.grad().to_vector<float>(), gb = pb[i].second.grad().to_vector<float>();
      const double norm = std::sqrt([&] { double s = 0; for (float v : ga) s += double(v) * v; return s; }());
      CHECK(testing::relative_error(gb, ga) * norm <= 1e-5 * norm + 1e-5);
    }
  }
}

namespace {
// Peak bytes a training step allocates on top of what exists before it (parameters, gradients,
// workspaces: a first step is run to create them).
std::int64_t step_peak_bytes(const std::string& arch, pipeline::PipelineMethod method) {
  nn::Model model(testing::tiny_model_config(arch, 5));
  const Tensor x = testing::random_tensor({8, 1, 16, 16}, 2, DType::f32), labels = testing::cyclic_labels(8, 10, 3);
  pipeline::RuntimeOptions options;
  options.method = method;
  options.apply_updates = false;
  pipeline::SequentialExecutor executor(model, options);
  const auto grid = pipeline::make_schedule(method, static_cast<int>(model.num_stages()), 2, 1, false);
  const pipeline::BatchSource batch = [&](std::int64_t) { return pipeline::MiniBatch{x, labels}; };
  executor.run(grid, 0, 1, batch, {});
  auto& alloc = Allocator::instance();
  alloc.reset_peaks(Device::cpu());
  const std::int64_t before = alloc.stats(Device::cpu()).current;
  executor.run(grid, 1, 2, batch, {});
  return alloc.stats(Device::cpu()).peak - before;
}
}  // namespace

TEST_CASE("reversible backprop's activation memory does not grow with the number of reversible blocks") {
  // RevNet34 has 12 reversible blocks, RevNet18 4, with the same transitions and activation shapes.
  const double bp18 = double(step_peak_bytes("revnet18", pipeline::PipelineMethod::backprop));
  const double bp34 = double(step_peak_bytes("revnet34", pipeline::PipelineMethod::backprop));
  const double rev18 = double(step_peak_bytes("revnet18", pipeline::PipelineMethod::revbackprop));
  const double rev34 = double(step_peak_bytes("revnet34", pipeline::PipelineMethod::revbackprop));
  MESSAGE("peak step bytes: backprop ", bp18, " -> ", bp34, ", revbackprop ", rev18, " -> ", rev34);
  CHECK(bp34 / bp18 > 1.3);
  CHECK(rev34 / rev18 < 1.05);
  CHECK(rev34 < bp34 / 2);
}
