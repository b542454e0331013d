// tests/emulation/test_emulated_pipeline.cpp: the concurrent executor with GPU workers on the two
// emulated GPUs (tests/emulation/emulated_device.hpp): stages on cuda:0 and cuda:1, and two workers
// (two streams) on one GPU, give the sequential executor's parameters bit for bit. The emulation
// runs every launch and copy synchronously, so what this checks is the protocol (every message
// carries an event and is waited for, messages change devices through the copy stream, every
// stream and event is used on its own device) and the arithmetic, not the overlap.
#include <doctest/doctest.h>

#include <vector>

#include "petra/pipeline/trainer.hpp"
#include "petra/npy.hpp"
#include "tests/emulation/emulated_device.hpp"
#include "tests/support/fixtures.hpp"

using namespace petra;
using namespace petra::pipeline;
using petra::testing::random_tensor;
using petra::testing::TemporaryDirectory;
namespace ed = petra::emulated_device;

namespace {

std::vector<std::vector<float>> parameters_of(const nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const auto& p : m.parameters()) out.push_back(p.data().to_vector<float>());
  for (const auto& [name, b] : m.named_buffers()) out.push_back(b.to_vector<float>());
  return out;
}

TrainConfig tiny_pipeline(const std::filesystem::path& data) {
  TrainConfig c;
  c.dataset = "npy";
  c.data_dir = data;
  c.classes = 10;
  c.arch = "revnet18";
  c.width = 2;
  c.batch_size = 4;
  c.epochs = 2;  // the pipeline is not flushed between them: messages stay in flight across run() calls
  c.augment = false;
  c.method = PipelineMethod::petra;
  c.lr = 0.05;
  c.warmup_epochs = 0;
  c.schedule = "constant";
  c.seed = 11;
  c.threads = 1;
  c.message_timeout = 120;  // a protocol error fails in two minutes instead of hanging
  return c;
}

}  // namespace

TEST_CASE("emulated pipeline: GPU workers on two devices, or two streams of one, equal the sequential executor") {
  const TemporaryDirectory data("emulated-pipeline-data");
  save_npy(data / "images.npy", random_tensor({8, 3, 8, 8}, 21, DType::f32));
  save_npy(data / "labels.npy", petra::testing::cyclic_labels(8, 10, 3));
  save_npy(data / "test_images.npy", random_tensor({4, 3, 8, 8}, 22, DType::f32));
  save_npy(data / "test_labels.npy", petra::testing::cyclic_labels(4, 10, 1));

  TrainConfig sequential = tiny_pipeline(data.path());
  sequential.devices = {Device::cuda(0)};
  Trainer oracle(sequential);
  oracle.run({}, {});
  const auto expected = parameters_of(oracle.model());

  SUBCASE("stages on cuda:0 and cuda:1: messages cross between the GPUs") {
    TrainConfig c = tiny_pipeline(data.path());
    c.devices = {Device::cuda(0), Device::cuda(1)};
    c.placement = {0, 0, 0, 0, 0, 1, 1, 1, 1, 1};
    const std::int64_t on_second_before = ed::launches(1);
    Trainer t(c);
    CHECK(t.placement() == c.placement);
    CHECK(t.model().stage(0).device() == Device::cuda(0));
    CHECK(t.model().stage(9).device() == Device::cuda(1));
    std::vector<EpochReport> reports;
    t.run({}, [&](const EpochReport& r) { reports.push_back(r); });
    CHECK(ed::launches(1) > on_second_before);  // the upper stages' kernels ran on cuda:1
    CHECK(parameters_of(t.model()) == expected);
    CHECK(t.memory_devices().size() == 2);
    REQUIRE(!reports.empty());
    CHECK(reports.back().peak_device_bytes > 0);
    // Evaluation runs the model across both GPUs (the activations follow the stages).
    const Evaluation e = t.evaluate(), e_oracle = oracle.evaluate();
    CHECK(e.loss == e_oracle.loss);
  }
  SUBCASE("two workers on cuda:0, one stream each") {
    TrainConfig c = tiny_pipeline(data.path());
    c.devices = {Device::cuda(0), Device::cuda(0)};
    c.placement = {0, 0, 0, 1, 1, 1, 1, 1, 1, 1};
    Trainer t(c);
    t.run({}, {});
    CHECK(parameters_of(t.model()) == expected);
  }
}

TEST_CASE("emulated pipeline: a GPU pipeline leaves no stream or event behind, and no device memory but the cache") {
  const ed::Live before = ed::live();
  {
    const TemporaryDirectory data("emulated-pipeline-leaks");
    save_npy(data / "images.npy", random_tensor({4, 3, 8, 8}, 31, DType::f32));
    save_npy(data / "labels.npy", petra::testing::cyclic_labels(4, 10));
    TrainConfig c = tiny_pipeline(data.path());
    c.epochs = 1;
    c.devices = {Device::cuda(0), Device::cuda(1)};
    c.placement = {0, 0, 0, 0, 1, 1, 1, 1, 1, 1};
    Trainer t(c);
    t.run({}, {});
  }
  const ed::Live after = ed::live();
  CHECK(after.streams == before.streams);  // the workers' streams and the uploader's copy stream are gone
  CHECK(after.pinned_blocks == before.pinned_blocks);
  // What is still on the devices is the allocator's cache (and its reusable events) and the scratch
  // of this thread's default streams, nothing else.
  for (const Device d : {Device::cuda(0), Device::cuda(1)}) {
    CAPTURE(d.str());
    const auto& allocator = Allocator::instance();
    CHECK(allocator.stats(d).current == allocator.stats(d, MemoryTag::workspace).current);
  }
}
