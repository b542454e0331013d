// tests/emulation/test_emulated_pipeline.cpp: the concurrent executor with GPU workers on the two
// emulated GPUs (tests/emulation/emulated_device.hpp): stages on cuda:0 and cuda:1, and two workers
// (two streams) on one GPU, give the sequential executor's parameters bit for bit. The emulation
// runs every launch and copy synchronously, so what this checks is the protocol (every message
// carries an event and is waited for, messages change devices through the copy stream, every
// stream and event is used on its own device) and the arithmetic, not the overlap.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "petra/pipeline/batch_upload.hpp"
#include "petra/pipeline/executor.hpp"
#include "petra/pipeline/trainer.hpp"
#include "tests/emulation/emulated_device.hpp"
#include "tests/emulation/emulated_runs.hpp"
#include "tests/support/fixtures.hpp"

using namespace petra;
using namespace petra::pipeline;
using petra::testing::TemporaryDirectory;
namespace ed = petra::emulated_device;

namespace {

// 8x8 images and width 2: the smallest a RevNet18 takes (the comparison is bit for bit, so the
// conditioning that test_emulated_training.cpp needs 12x12 for does not matter here).
TrainConfig tiny_pipeline(const std::filesystem::path& data) {
  TrainConfig c = petra::testing::tiny_run(data, PipelineMethod::petra, 2, 11);
  c.message_timeout = 120;  // a protocol error fails in two minutes instead of hanging
  return c;  // 2 epochs: the pipeline is not flushed between them, messages stay in flight across run()
}

}  // namespace

TEST_CASE("emulated pipeline: GPU workers on two devices, or two streams of one, equal the sequential executor") {
  const TemporaryDirectory data("emulated-pipeline-data");
  petra::testing::write_tiny_dataset(data.path(), 8, 4, 8, 21);

  TrainConfig sequential = tiny_pipeline(data.path());
  sequential.devices = {Device::cuda(0)};
  Trainer oracle(sequential);
  oracle.run({}, {});
  const auto expected = petra::testing::parameters_and_buffers(oracle.model());

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
    CHECK(petra::testing::parameters_and_buffers(t.model()) == expected);
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
    const std::int64_t streams_before = ed::live().streams;
    Trainer t(c);
    t.run({}, {});
    CHECK(petra::testing::parameters_and_buffers(t.model()) == expected);
    // The workers' compute and copy streams live as long as the executor, across its run() calls:
    // tensors kept across a call (stage 0's images, a kept input) were recorded on them, and new
    // streams per call let the allocator reuse such a block under a queued kernel (on an H200 PETRA
    // on two streams drifted from the sequential executor that way; the emulation runs kernels at
    // once, so only the streams' lifetime can be checked here).
    CHECK(ed::live().streams >= streams_before + 4);
  }
}

TEST_CASE("emulated pipeline, asynchronous streams: GPU workers equal the sequential executor, bit for bit") {
  // Streams run their work only when waited for, copies on idle streams at once
  // (emulated_device.hpp): a tensor used on a stream that the allocator does not know of can be
  // overwritten by an upload before a queued kernel reads it. 40 steps: the trainer's run() calls
  // then hold 2 steps each, so stage 0's kept images cross a call and are freed, and reused by the
  // upload, inside the next one. (Before the executor kept its streams across calls, the two-worker
  // runs here ended at other parameters; on an H200, at another loss.)
  const ed::AsynchronousScope asynchronous;
  const TemporaryDirectory data("emulated-pipeline-asynchronous");
  petra::testing::write_tiny_dataset(data.path(), 160, 4, 8, 41);
  TrainConfig base = tiny_pipeline(data.path());
  base.epochs = 1;

  TrainConfig sequential = base;
  sequential.devices = {Device::cuda(0)};
  Trainer oracle(sequential);
  oracle.run({}, {});
  const auto expected = petra::testing::parameters_and_buffers(oracle.model());

  for (const std::vector<Device>& devices : {std::vector<Device>{Device::cuda(0), Device::cuda(0)},
                                             std::vector<Device>{Device::cuda(0), Device::cuda(1)}}) {
    CAPTURE(devices[1].str());
    TrainConfig c = base;
    c.devices = devices;
    c.placement = {0, 0, 0, 0, 1, 1, 1, 1, 1, 1};
    Trainer t(c);
    t.run({}, {});
    CHECK(petra::testing::parameters_and_buffers(t.model()) == expected);
  }
}

TEST_CASE("emulated pipeline: a GPU pipeline leaves no stream or event behind, and no device memory but the cache") {
  const ed::Live before = ed::live();
  {
    const TemporaryDirectory data("emulated-pipeline-leaks");
    petra::testing::write_tiny_dataset(data.path(), 4, 0, 8, 31);
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

TEST_CASE("emulated pipeline, asynchronous streams: a training step on a GPU never makes the host wait") {
  // The head leaves its loss, accuracy and label check on the device (nn::HeadNumbers) and the
  // batches come through the uploader's pinned buffers, so run() only queues work: the host can
  // launch step t + 1 while the GPU runs step t. Reading the numbers afterwards is where it waits.
  // (Before the head kept them there, every step waited once, for cross_entropy's label check.)
  const ed::AsynchronousScope asynchronous;
  const std::int64_t steps = 6;
  const Tensor images = petra::testing::random_tensor({4, 1, 12, 12}, 3, DType::f32);
  const Tensor labels = petra::testing::cyclic_labels(4, 10, 3);
  const BatchSource host = [&](std::int64_t) { return MiniBatch{images, labels}; };
  const auto waits = [] { return ed::live().host_waits; };
  for (const PipelineMethod method : {PipelineMethod::backprop, PipelineMethod::revbackprop, PipelineMethod::petra}) {
    for (const bool concurrent : {false, true}) {
      if (concurrent && !is_delayed(method)) continue;
      CAPTURE(name_of(method));
      CAPTURE(concurrent);
      nn::Model model(petra::testing::tiny_model_config("revnet18", 5));
      RuntimeOptions options;
      options.method = method;
      const int J = static_cast<int>(model.num_stages());
      std::unique_ptr<SequentialExecutor> executor;
      if (concurrent) {  // two workers (two streams) on cuda:0
        std::vector<int> placement(static_cast<std::size_t>(J), 1);
        for (int j = 0; j < J / 2; ++j) placement[static_cast<std::size_t>(j)] = 0;
        executor = std::make_unique<ConcurrentExecutor>(
            model, options, std::vector<ConcurrentExecutor::Worker>{{Device::cuda(0)}, {Device::cuda(0)}}, placement);
      } else {
        model.to(Device::cuda(0));
        executor = std::make_unique<SequentialExecutor>(model, options);
      }
      DeviceBatches batches(Device::cuda(0), host, steps);
      const Schedule schedule = make_schedule(method, J, steps, 1, /*drain=*/true);
      std::vector<HeadStats> stats;
      const std::int64_t before = waits();
      executor->run(schedule, 0, schedule.steps, std::ref(batches), [&](const HeadStats& s) { stats.push_back(s); });
      // The concurrent executor's run() ends by synchronising each worker's two streams.
      CHECK(waits() - before == (concurrent ? 4 : 0));
      REQUIRE(stats.size() == static_cast<std::size_t>(steps));
      for (const HeadStats& s : stats) {
        const nn::HeadNumbers::Values v = s.numbers.read();
        CHECK(std::isfinite(v.loss));
        CHECK(v.loss > 0);
      }
      if (!concurrent) CHECK(waits() > before);  // the reads waited
    }
  }
}
