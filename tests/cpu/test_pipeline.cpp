// tests/cpu/test_pipeline.cpp: the delayed-gradient runtime: with a learning rate of 0 every
// method's per-stage gradients equal exact backprop's; what each stage keeps, measured.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "petra/stream.hpp"
#include "petra/pipeline/backprop_reference.hpp"
#include "petra/pipeline/executor.hpp"
#include "petra/pipeline/placement.hpp"
#include "tests/support/fixtures.hpp"
#include "tests/support/testing.hpp"

using namespace petra;
using namespace petra::pipeline;

namespace {

// RevNet18 of width 4 on 12x12 single-channel images; mini-batch m has its own images and labels.
nn::ModelConfig small_revnet() { return testing::tiny_model_config("revnet18", 11); }
MiniBatch make_batch(std::int64_t m) { return testing::random_batch({4, 1, 12, 12}, 100 + m, 10, 3 * m); }

// Per stage: all parameter gradients concatenated.
std::vector<std::vector<float>> stage_gradients(nn::Model& model) {
  std::vector<std::vector<float>> out;
  for (std::size_t j = 0; j < model.num_stages(); ++j) {
    std::vector<float> g;
    for (const auto& p : model.stage(j).parameters()) {
      const auto v = p.grad().to_vector<float>();
      g.insert(g.end(), v.begin(), v.end());
    }
    out.push_back(g);
  }
  return out;
}

}  // namespace

TEST_CASE("with lr = 0, every delayed method's per-stage gradients equal backprop's") {
  // One block per stage (J = 10), and blocks grouped into 4 stages of every kind: a buffered stem,
  // a reversible pair, a buffered transition + reversible, and a head holding the last five blocks.
  for (const std::vector<std::int64_t>& sizes : {std::vector<std::int64_t>{}, std::vector<std::int64_t>{1, 2, 2, 5}}) {
    CAPTURE(sizes.size());
    nn::ModelConfig config = small_revnet();
    config.stage_sizes = sizes;
    const std::int64_t batches = 5;
    nn::Model reference(config);
    for (std::int64_t m = 0; m < batches; ++m) {
      const MiniBatch b = make_batch(m);
      backprop_step(reference, b.images, b.labels);  // gradients add up over the 5 mini-batches
    }
    const auto expected = stage_gradients(reference);

    for (PipelineMethod method : {PipelineMethod::petra, PipelineMethod::delayed_reversible, PipelineMethod::dsp,
                                  PipelineMethod::pipedream, PipelineMethod::revbackprop}) {
      CAPTURE(name_of(method));
      nn::Model model(config);
      RuntimeOptions options;
      options.method = method;
      options.apply_updates = false;  // lr = 0: the parameters never move
      SequentialExecutor executor(model, options);
      const Schedule schedule = make_schedule(method, static_cast<int>(model.num_stages()), batches, 1, /*drain=*/true);
      double loss = 0;
      executor.run(schedule, 0, schedule.steps, make_batch, [&](const HeadStats& s) { loss += s.numbers.read().loss; });
      CHECK(loss > 0);
      const auto got = stage_gradients(model);
      for (std::size_t j = 0; j < got.size(); ++j) {
        CAPTURE(j);
        CHECK(testing::relative_error(got[j], expected[j]) <= 1e-6);
      }
    }
  }
}

TEST_CASE("what a stage keeps in steady state: a FIFO of 2(J-1-j) inputs if buffered, nothing if reversible") {
  nn::Model model(small_revnet());
  RuntimeOptions options;
  options.method = PipelineMethod::petra;
  SequentialExecutor executor(model, options);
  const int J = static_cast<int>(model.num_stages());
  const Schedule schedule = make_schedule(PipelineMethod::petra, J, 40, 1, false);
  auto& alloc = Allocator::instance();
  for (std::int64_t t = 0; t < 30; ++t) {
    executor.run(schedule, t, t + 1, make_batch, {});
    if (t < 2 * (J - 1)) continue;  // filling the pipeline
    for (int j = 0; j + 1 < J; ++j) {
      CAPTURE(t);
      CAPTURE(j);
      CHECK(executor.stage(j).kept() == static_cast<std::size_t>(2 * (J - 1 - j)));  // mini-batches in flight
      CHECK(alloc.stats(Device::cpu(), MemoryTag::activations, j).current == 0);
      if (model.stage(j).kind() == nn::StageKind::reversible) {
        CHECK(alloc.stats(Device::cpu(), MemoryTag::input_buffer, j).current == 0);
      } else if (j > 0) {
        // The kept inputs, plus two messages in flight that share those bytes' tag: the next input,
        // sent up by stage j - 1, and the input j sent back down with its gradient this step.
        const std::int64_t one_input = [&] {
          NoGradGuard no_grad;
          nn::Model probe(small_revnet());
          Variable h(make_batch(0).images);
          for (int i = 0; i < j; ++i) h = probe.stage(i).forward(h);
          return static_cast<std::int64_t>(h.data().nbytes());
        }();
        CHECK(alloc.stats(Device::cpu(), MemoryTag::input_buffer, j).current == (2 * (J - 1 - j) + 2) * one_input);
      }
    }
  }
}

TEST_CASE("batch-norm running statistics move in the forward pass, or in the backward recomputation") {
  const auto buffers_of = [](const nn::Model& m) {
    std::vector<float> all;
    for (const auto& [name, t] : m.named_buffers()) {
      const auto v = t.to_vector<float>();
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  const std::int64_t batches = 6;
  std::vector<float> after_forward_pass;
  for (nn::StatisticsPass pass : {nn::StatisticsPass::forward, nn::StatisticsPass::backward}) {
    CAPTURE(static_cast<int>(pass));
    nn::Model model(small_revnet());
    const auto initial = buffers_of(model);
    RuntimeOptions options;
    options.method = PipelineMethod::petra;
    options.apply_updates = false;  // same parameters throughout: both options must agree at the end
    options.statistics_pass = pass;
    SequentialExecutor executor(model, options);
    const int J = static_cast<int>(model.num_stages());
    const Schedule schedule = make_schedule(PipelineMethod::petra, J, batches, 1, /*drain=*/true);
    // Step J-1 is the first head step: until then only forwards ran, below the head.
    executor.run(schedule, 0, J - 1, make_batch, {});
    const auto early = buffers_of(model);
    if (pass == nn::StatisticsPass::forward)
      CHECK(early != initial);
    else
      CHECK(early == initial);  // nothing moved before the first backward
    executor.run(schedule, J - 1, schedule.steps, make_batch, {});
    const auto final_buffers = buffers_of(model);
    CHECK(final_buffers != initial);
    if (pass == nn::StatisticsPass::forward) {
      after_forward_pass = final_buffers;
    } else {
      // The same mini-batches in the same order per stage, seen by the rebuilt inputs instead of the
      // forward's: equal up to the reconstruction's float rounding.
      CHECK(testing::relative_error(final_buffers, after_forward_pass) <= 1e-5);
    }
  }
}

TEST_CASE("a schedule that disagrees with the messages is refused") {
  nn::Model model(small_revnet());
  RuntimeOptions options;
  SequentialExecutor executor(model, options);
  Schedule schedule = make_schedule(PipelineMethod::petra, static_cast<int>(model.num_stages()), 6, 1, true);
  std::swap(schedule.cells[1][1], schedule.cells[2][1]);  // stage 1 forwards mini-batch 1 a step late... and 0 never
  CHECK_THROWS_AS(executor.run(schedule, 0, schedule.steps, make_batch, {}), Error);
}

TEST_CASE("the concurrent executor gives the sequential executor's parameters bit for bit") {
  struct Variant {
    PipelineMethod method;
    bool delay_compensation;
    std::vector<std::int64_t> stage_sizes;  // empty: one block per stage
  };
  for (const Variant& variant : {Variant{PipelineMethod::petra, false, {}},
                                 Variant{PipelineMethod::delayed_reversible, false, {}},
                                 Variant{PipelineMethod::dsp, false, {}}, Variant{PipelineMethod::pipedream, false, {}},
                                 Variant{PipelineMethod::petra, true, {}}, Variant{PipelineMethod::petra, false, {1, 2, 2, 5}}}) {
    const PipelineMethod method = variant.method;
    CAPTURE(name_of(method));
    CAPTURE(variant.delay_compensation);
    CAPTURE(variant.stage_sizes.size());
    nn::ModelConfig config = small_revnet();
    config.stage_sizes = variant.stage_sizes;
    RuntimeOptions options;
    options.method = method;
    options.delay_compensation = variant.delay_compensation;
    options.accumulation = 2;
    options.optimizer_options.nesterov = true;
    options.weight_decay = 5e-4;
    options.schedule.kind = "constant";
    options.schedule.base_lr = 0.05;
    nn::Model a(config), b(config);
    const int J = static_cast<int>(a.num_stages());
    const Schedule schedule = make_schedule(method, J, 24, 2, /*drain=*/true);
    std::vector<double> losses_a, losses_b;
    {
      Stream one_thread(Device::cpu(), 1);
      StreamGuard guard(one_thread);
      SequentialExecutor sequential(a, options);
      sequential.run(schedule, 0, schedule.steps, make_batch, [&](const HeadStats& s) { losses_a.push_back(s.numbers.read().loss); });
    }
    ConcurrentExecutor concurrent(b, options, {{Device::cpu(0), 1}, {Device::cpu(1), 1}},
                                  balanced_placement(std::vector<double>(J, 1.0), 2));
    // Epoch by epoch: the pipeline is not flushed in between.
    concurrent.run(schedule, 0, 10, make_batch, [&](const HeadStats& s) { losses_b.push_back(s.numbers.read().loss); });
    concurrent.run(schedule, 10, schedule.steps, make_batch, [&](const HeadStats& s) { losses_b.push_back(s.numbers.read().loss); });
    CHECK(losses_a == losses_b);
    const auto pa = a.named_parameters(), pb = b.named_parameters();
    for (std::size_t i = 0; i < pa.size(); ++i) {
      CAPTURE(pa[i].first);
      CHECK(pa[i].second.data().to_vector<float>() == pb[i].second.data().to_vector<float>());
    }
    const auto ba = a.named_buffers(), bb = b.named_buffers();
    for (std::size_t i = 0; i < ba.size(); ++i) CHECK(ba[i].second.to_vector<float>() == bb[i].second.to_vector<float>());
    // And the parameters did move.
    CHECK(pa[0].second.data().to_vector<float>() != nn::Model(small_revnet()).named_parameters()[0].second.data().to_vector<float>());
  }
}

TEST_CASE("balanced placement: contiguous stages, smallest largest load") {
  CHECK(balanced_placement({1, 1, 1, 1}, 2) == std::vector<int>{0, 0, 1, 1});
  CHECK(balanced_placement({5, 1, 1, 1, 1, 1}, 2) == std::vector<int>{0, 1, 1, 1, 1, 1});
  CHECK(balanced_placement({1, 2, 3}, 1) == std::vector<int>{0, 0, 0});
  CHECK(balanced_placement({3, 1, 1, 3}, 3) == std::vector<int>{0, 1, 1, 2});
}

TEST_CASE("delay compensation: stage j's gradients count as 2(J-1-j)/k updates late, and it changes the run") {
  CHECK(update_delay(PipelineMethod::petra, 0, 10, 1) == 18.0);
  CHECK(update_delay(PipelineMethod::petra, 0, 10, 4) == 4.5);
  CHECK(update_delay(PipelineMethod::pipedream, 7, 10, 2) == 2.0);
  CHECK(update_delay(PipelineMethod::dsp, 9, 10, 2) == 0.0);  // the head: no delay
  CHECK(update_delay(PipelineMethod::backprop, 0, 10, 1) == 0.0);
  CHECK(update_delay(PipelineMethod::revbackprop, 0, 10, 1) == 0.0);

  // Same run with and without: stage 0 (delay 2(J-1)) ends elsewhere; the first update of the
  // head (delay 0) is the same in both, as nothing below it has moved when mini-batch 0 passes.
  std::vector<std::vector<float>> first_stage, head;
  for (bool compensated : {false, true}) {
    RuntimeOptions options;
    options.method = PipelineMethod::petra;
    options.optimizer_options.nesterov = true;
    options.schedule.kind = "constant";
    options.schedule.base_lr = 0.05;
    options.delay_compensation = compensated;
    nn::Model model(small_revnet());
    const int J = static_cast<int>(model.num_stages());
    Stream one_thread(Device::cpu(), 1);
    StreamGuard guard(one_thread);
    SequentialExecutor executor(model, options);
    const Schedule schedule = make_schedule(PipelineMethod::petra, J, 24, 1, /*drain=*/true);
    executor.run(schedule, 0, J, make_batch, [](const HeadStats&) {});  // the head's first update only
    head.push_back(model.stage(J - 1).parameters()[0].data().to_vector<float>());
    executor.run(schedule, J, schedule.steps, make_batch, [](const HeadStats&) {});
    first_stage.push_back(model.stage(0).parameters()[0].data().to_vector<float>());
  }
  CHECK(head[0] == head[1]);
  nn::Model initial(small_revnet());
  CHECK(head[0] != initial.stage(initial.num_stages() - 1).parameters()[0].data().to_vector<float>());  // it moved
  CHECK(testing::relative_error(first_stage[1], first_stage[0]) > 1e-4);
}

TEST_CASE("a worker never waits for ever: a missing message is a PipelineStuckError naming the stage, the action "
          "and the mini-batch; a failing worker stops the others at once") {
  Channel<ForwardMessage> channel;
  try {
    channel.pop(/*wait=*/true, 7, 3, "forward", std::chrono::milliseconds(50));
    FAIL("pop must give up after its deadline");
  } catch (const PipelineStuckError& e) {
    const std::string message = e.what();
    CHECK(message.find("stage 3: forward of mini-batch 7: no message for") != std::string::npos);
  }
  // abort() wakes a waiting pop at once, whatever its deadline.
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    channel.abort();
  });
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(channel.pop(true, 8, 3, "forward", std::chrono::milliseconds(60000)), PipelineStuckError);
  aborter.join();
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));

  // Two workers; the data source fails at mini-batch 3 on worker 0. Worker 1 waits for messages
  // worker 0 will never send: the run must end with worker 0's error, long before the deadline.
  nn::Model model(small_revnet());
  RuntimeOptions options;
  options.method = PipelineMethod::petra;
  options.message_timeout_seconds = 120;
  ConcurrentExecutor executor(model, options, {{Device::cpu(0), 1}, {Device::cpu(1), 1}},
                              {0, 0, 0, 0, 0, 1, 1, 1, 1, 1});
  const auto grid = make_schedule(PipelineMethod::petra, static_cast<int>(model.num_stages()), 8, 1, true);
  const BatchSource failing = [](std::int64_t m) {
    if (m == 3) throw IOError("the data source failed at mini-batch 3");
    return make_batch(m);
  };
  const auto begin = std::chrono::steady_clock::now();
  try {
    executor.run(grid, 0, grid.steps, failing, {});
    FAIL("the run must fail");
  } catch (const IOError& e) {
    CHECK(std::string(e.what()).find("mini-batch 3") != std::string::npos);  // the cause, not a stuck worker
  }
  CHECK(std::chrono::steady_clock::now() - begin < std::chrono::seconds(30));
}
