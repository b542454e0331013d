// tests/emulation/test_emulated_training.cpp: models, optimizers and the trainer on the emulated
// cuda:0 (tests/emulation/emulated_device.hpp): Module::to, optimizer state following its
// parameters, and petra-train's loop (--devices cuda:0) for backprop and PETRA: the parameters end
// within a stated tolerance of the CPU run's, bit-identical from one run to the next, and a run
// resumed from a checkpoint ends as the uninterrupted one. Tiny shapes: every kernel's block runs as
// host threads here.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "petra/nn/models.hpp"
#include "petra/nn/optimizer.hpp"
#include "petra/pipeline/checkpoint.hpp"
#include "petra/pipeline/trainer.hpp"
#include "petra/functions.hpp"
#include "petra/npy.hpp"
#include "tests/emulation/emulated_device.hpp"
#include "tests/emulation/emulated_runs.hpp"
#include "tests/support/resume.hpp"
#include "tests/support/fixtures.hpp"

using namespace petra;
using namespace petra::pipeline;
using petra::testing::random_tensor;
using petra::testing::TemporaryDirectory;
using petra::testing::parameters_and_buffers;
using petra::testing::tiny_run;
using petra::testing::write_tiny_dataset;
namespace fs = std::filesystem;

namespace {

const Device kGpu0 = Device::cuda(0);

// The largest ||a - b|| / ||b|| over the tensors (parameters and buffers).
double worst_relative_difference(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].size() == b[i].size());
    double diff = 0, norm = 0;
    for (std::size_t k = 0; k < a[i].size(); ++k) {
      diff += (double(a[i][k]) - b[i][k]) * (double(a[i][k]) - b[i][k]);
      norm += double(b[i][k]) * b[i][k];
    }
    worst = std::max(worst, std::sqrt(diff / std::max(norm, 1e-30)));
  }
  return worst;
}

// 12x12 images: RevNet18's transitions take them to 6x6, 3x3 and 2x2, so batch norm in the last
// stages still normalises 16 values per channel at batch 4. (With 8x8 images the last ones normalise
// 4 values, a channel is often nearly constant, and the CPU and GPU runs part ways within a few
// steps: 1/sqrt(eps) times their rounding differences.) Width 4.
constexpr std::int64_t kSide = 12, kWidth = 4;

}  // namespace

TEST_CASE("emulated training: Module::to moves parameters, buffers and every alias of them, both ways") {
  nn::ModelConfig mc = petra::testing::tiny_model_config("revnet18", 2);
  mc.width = 2;
  nn::Model model(mc);
  const auto before = parameters_and_buffers(model);
  const Tensor x = random_tensor({2, 1, 8, 8}, 4, DType::f32);
  Tensor y_cpu;
  {
    NoGradGuard no_grad;
    model.eval();
    y_cpu = model.forward(Variable(x)).data();
  }
  model.to(kGpu0);
  CHECK(model.device() == kGpu0);
  for (const auto& [name, p] : model.named_parameters()) CHECK_MESSAGE(p.data().device() == kGpu0, name);
  for (const auto& [name, b] : model.named_buffers()) CHECK_MESSAGE(b.device() == kGpu0, name);
  CHECK(parameters_and_buffers(model) == before);
  {
    NoGradGuard no_grad;  // the layers read their own members (running statistics): they moved too
    const Tensor y_gpu = model.forward(Variable(x.to(kGpu0))).data();
    CHECK(y_gpu.device() == kGpu0);
    CHECK(ops::relative_error(y_gpu, y_cpu) < 1e-5);
  }
  model.to(Device::cpu());
  CHECK(model.device().is_cpu());
  CHECK(parameters_and_buffers(model) == before);
}

TEST_CASE("emulated training: an optimizer's state follows its parameters to the device") {
  nn::ModelConfig mc = petra::testing::tiny_model_config("resnet18", 3);
  mc.width = 2;
  nn::Model model(mc);
  auto optimizer = nn::make_optimizer("sgd", nn::decay_groups(model.named_parameters(), 1e-4), {.momentum = 0.9});
  const std::string first = model.named_parameters().front().first;
  const auto step = [&](Device d) {
    const Tensor x = random_tensor({2, 1, 8, 8}, 9, DType::f32).to(d);
    const Tensor labels = petra::testing::cyclic_labels(2, 10).to(d);
    cross_entropy(model.forward(Variable(x)), labels).backward();
    optimizer->step(0.1);
    optimizer->zero_grad();
  };
  step(Device::cpu());
  CHECK(optimizer->state(first, "momentum_buffer").device().is_cpu());
  model.to(kGpu0);
  step(kGpu0);  // the step finds the state on the CPU and moves it first
  CHECK(optimizer->state(first, "momentum_buffer").device() == kGpu0);
  optimizer->to(Device::cpu());
  CHECK(optimizer->state(first, "momentum_buffer").device().is_cpu());
}

TEST_CASE("emulated training: --devices cuda:0 trains where the CPU does, bit-identical from run to run") {
  const TemporaryDirectory data("emulated-training-data");
  write_tiny_dataset(data.path(), 12, 4, kSide, 1);  // 3 mini-batches of 4 per epoch
  for (const PipelineMethod method : {PipelineMethod::backprop, PipelineMethod::petra}) {
    CAPTURE(name_of(method));
    TrainConfig cpu = tiny_run(data.path(), method, kWidth, 5);
    TrainConfig gpu = cpu;
    gpu.devices = {kGpu0};
    Trainer on_cpu(cpu), on_gpu(gpu), again(gpu);
    CHECK(on_gpu.device() == kGpu0);
    CHECK(on_gpu.model().device() == kGpu0);
    std::vector<EpochReport> reports;
    on_cpu.run({}, {});
    on_gpu.run({}, [&](const EpochReport& r) { reports.push_back(r); });
    again.run({}, {});
    // The same kernels in the same order: the same bits.
    CHECK(parameters_and_buffers(again.model()) == parameters_and_buffers(on_gpu.model()));
    // Other kernels (cuda:: against cpu::) sum in other orders: within a tolerance of the CPU run.
    // Measured: about 5e-6 after 6 updates (each kernel's rounding differs in the last bits; the
    // differences grow slowly with the steps); 1e-4 leaves room and still catches any real error.
    const double difference = worst_relative_difference(parameters_and_buffers(on_gpu.model()), parameters_and_buffers(on_cpu.model()));
    MESSAGE(name_of(method), ": cuda:0 against the CPU after ", on_gpu.global_step(),
            " steps: worst relative difference of a parameter or buffer ", difference);
    CHECK(difference < 1e-4);
    CHECK(parameters_and_buffers(on_gpu.model()) != parameters_and_buffers(on_cpu.model()));  // really other kernels
    // The epoch reports count the device's memory, by tag.
    REQUIRE(reports.size() == 2);
    CHECK(reports[0].peak_device_bytes > 0);
    CHECK(reports[0].peak_bytes.at("parameters") > 0);
    CHECK(reports[0].peak_bytes.at("activations") > 0);
    CHECK(std::isfinite(reports.back().test_loss));
    // The evaluation ran on the device as well.
    const Evaluation e_gpu = on_gpu.evaluate(), e_cpu = on_cpu.evaluate();
    CHECK(e_gpu.samples == 4);
    CHECK(std::abs(e_gpu.loss - e_cpu.loss) < 1e-4 * std::max(1.0, std::abs(e_cpu.loss)));
  }
}

TEST_CASE("emulated training: a cuda:0 run resumed from its checkpoint ends bit-identical to an uninterrupted one") {
  const TemporaryDirectory data("emulated-resume-data"), checkpoints("emulated-resume");
  write_tiny_dataset(data.path(), 8, 4, kSide, 1);  // 2 mini-batches per epoch
  TrainConfig c = tiny_run(data.path(), PipelineMethod::petra, kWidth, 5);
  c.devices = {kGpu0};
  Trainer straight(c);
  straight.run({}, {});

  // The checkpoint is written from device tensors (PETRA's pipeline holds mini-batches in flight)
  // and read back onto the device.
  const auto resumed = petra::testing::resume_after_first_epoch(c, checkpoints.path());
  CHECK(resumed->model().device() == kGpu0);
  resumed->run({}, {});
  CHECK(parameters_and_buffers(resumed->model()) == parameters_and_buffers(straight.model()));
}
