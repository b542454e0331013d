// tests/cpu/test_delay_mitigation.cpp: linear weight prediction and PipeMare's learning-rate
// warm-up (pipeline/delay_mitigation.hpp): the formulas on hand-computed values, the forward that
// runs with the predicted parameters, nothing changed at delay 0, the concurrent executor equal
// to the sequential one bit for bit, a resumed run equal to an uninterrupted one, and the flags'
// validation and resume keys.
#include <doctest/doctest.h>

#include <cmath>

#include "petra/pipeline/executor.hpp"
#include "petra/pipeline/placement.hpp"
#include "petra/pipeline/trainer.hpp"
#include "petra/stream.hpp"
#include "tests/support/fixtures.hpp"
#include "tests/support/resume.hpp"
#include "tests/support/testing.hpp"

using namespace petra;
using namespace petra::pipeline;

namespace {

// RevNet18 of width 4 on 12x12 single-channel images: J = 10 stages, stage 0 is 18 updates late.
nn::ModelConfig small_revnet() { return testing::tiny_model_config("revnet18", 11); }
MiniBatch make_batch(std::int64_t m) { return testing::random_batch({4, 1, 12, 12}, 100 + m, 10, 3 * m); }

RuntimeOptions sgd_options(PipelineMethod method) {
  RuntimeOptions options;
  options.method = method;
  options.optimizer_options.nesterov = true;
  options.weight_decay = 5e-4;
  options.schedule.kind = "constant";
  options.schedule.base_lr = 0.05;
  return options;
}

RuntimeOptions with_both_options(RuntimeOptions options) {
  options.weight_prediction = WeightPrediction::linear;
  options.delay_lr_warmup = 16;
  return options;
}

std::vector<std::vector<float>> parameters_of(const nn::Model& model) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, p] : model.named_parameters()) out.push_back(p.data().to_vector<float>());
  return out;
}

// Runs `steps` steps of the method's schedule on one thread; returns the head's losses.
std::vector<double> train(nn::Model& model, const RuntimeOptions& options, std::int64_t batches) {
  const int J = static_cast<int>(model.num_stages());
  const Schedule schedule = make_schedule(options.method, J, batches, options.accumulation, /*drain=*/true);
  Stream one_thread(Device::cpu(), 1);
  StreamGuard guard(one_thread);
  SequentialExecutor executor(model, options);
  std::vector<double> losses;
  executor.run(schedule, 0, schedule.steps, make_batch, [&](const HeadStats& s) { losses.push_back(s.numbers.read().loss); });
  return losses;
}

TrainConfig tiny_petra() {
  TrainConfig c;
  c.dataset = "synthetic";
  c.synthetic_train_size = 256;
  c.width = 4;
  c.batch_size = 64;  // 4 steps per epoch
  c.epochs = 3;
  c.accumulation = 1;
  c.lr = 0.05;
  c.warmup_epochs = 1;
  c.schedule = "cosine";
  c.method = PipelineMethod::petra;
  c.seed = 3;
  c.threads = 1;
  return c;
}

}  // namespace

TEST_CASE("linear weight prediction: theta - lr * h * D * v, on hand-computed values") {
  const Tensor theta = Tensor::from_vector<float>({4}, {1.0f, -2.0f, 0.5f, 4.0f});
  const Tensor velocity = Tensor::from_vector<float>({4}, {0.25f, -1.0f, 2.0f, 0.0f});
  // lr 0.05, horizon 0.5, delay 20 updates: a step of 0.5 along the velocity.
  const Tensor predicted = predict_parameter(theta, velocity, 0.05 * 0.5 * 20);
  CHECK(predicted.to_vector<float>() == std::vector<float>{0.875f, -1.5f, -0.5f, 4.0f});
  CHECK(theta.to_vector<float>() == std::vector<float>{1.0f, -2.0f, 0.5f, 4.0f});  // not changed
  CHECK(predict_parameter(theta, velocity, 0).to_vector<float>() == theta.to_vector<float>());

  CHECK(parse_weight_prediction("linear") == WeightPrediction::linear);
  CHECK(name_of(parse_weight_prediction("none")) == "none");
  CHECK_THROWS_WITH_AS(parse_weight_prediction("quadratic"), doctest::Contains("--weight-prediction 'quadratic'"),
                       ValueError);
}

TEST_CASE("PipeMare's warm-up: lr * tau^-(1 - m/T), on hand-computed values") {
  // Delay 16 updates, T = 100 mini-batches: 1/16, then 16^-0.5 = 1/4 halfway, 16^-0.25 = 1/2 at 3/4.
  CHECK(delay_lr_factor(16, 0, 100) == doctest::Approx(0.0625).epsilon(1e-15));
  CHECK(delay_lr_factor(16, 50, 100) == doctest::Approx(0.25).epsilon(1e-15));
  CHECK(delay_lr_factor(16, 75, 100) == doctest::Approx(0.5).epsilon(1e-15));
  CHECK(delay_lr_factor(18, 0, 938) == doctest::Approx(1.0 / 18).epsilon(1e-15));
  // Exactly 1: from T on, with no warm-up, and for a delay of at most one update (never a raise).
  CHECK(delay_lr_factor(16, 100, 100) == 1.0);
  CHECK(delay_lr_factor(16, 5000, 100) == 1.0);
  CHECK(delay_lr_factor(16, 0, 0) == 1.0);
  CHECK(delay_lr_factor(1, 0, 100) == 1.0);
  CHECK(delay_lr_factor(0.5, 0, 100) == 1.0);
  CHECK(delay_lr_factor(0, 0, 100) == 1.0);

  // A stage runtime's rate: the schedule's (constant 0.05) times its stage's factor.
  nn::Model model(small_revnet());
  const int J = static_cast<int>(model.num_stages());
  REQUIRE(J == 10);
  RuntimeOptions options = sgd_options(PipelineMethod::petra);
  options.delay_lr_warmup = 100;
  StageRuntime first(model.stage(0), 0, J, options, false, false);  // 18 updates late
  StageRuntime eighth(model.stage(7), 7, J, options, false, true);  // 4 updates late
  StageRuntime head(model.stage(J - 1), J - 1, J, options, false, true);
  CHECK(first.learning_rate(0) == doctest::Approx(0.05 / 18).epsilon(1e-12));
  CHECK(first.learning_rate(50) == doctest::Approx(0.05 / std::sqrt(18.0)).epsilon(1e-12));
  CHECK(eighth.learning_rate(75) == doctest::Approx(0.05 / std::sqrt(2.0)).epsilon(1e-12));
  CHECK(first.learning_rate(100) == 0.05);
  CHECK(head.learning_rate(0) == 0.05);
}

TEST_CASE("the forward of a delayed stage runs with the predicted parameters, then puts the current ones back") {
  // Two copies of stage 0 (18 updates late), one update each with the same gradients, so each has
  // a momentum buffer; then a forward with prediction (horizon 0.5) against a forward without it
  // at parameters set to the prediction by hand.
  nn::Model predicting(small_revnet()), by_hand(small_revnet());
  const int J = static_cast<int>(predicting.num_stages());
  RuntimeOptions on = sgd_options(PipelineMethod::petra);
  on.weight_prediction = WeightPrediction::linear;
  on.prediction_horizon = 0.5;
  const RuntimeOptions off = sgd_options(PipelineMethod::petra);
  StageRuntime a(predicting.stage(0), 0, J, on, false, false), b(by_hand.stage(0), 0, J, off, false, false);
  std::uint64_t seed = 7;
  const auto pa = predicting.stage(0).named_parameters(), pb = by_hand.stage(0).named_parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    const Tensor g = testing::random_tensor(pa[i].second.shape(), seed++, DType::f32);
    pa[i].second.set_grad(g.clone());
    pb[i].second.set_grad(g.clone());
  }
  // update() steps after a backward: one of mini-batch 0 with a zero output gradient, which adds
  // zero to the gradients set above (both runtimes hold the same ones and take the same update).
  const ForwardMessage y0 = a.forward({0, make_batch(0).images, {}, nullptr});
  b.forward({0, make_batch(0).images, {}, nullptr});
  for (StageRuntime* r : {&a, &b})
    r->backward({0, {}, Tensor::zeros(y0.activation.shape(), DType::f32, Device::cpu()), nullptr});
  a.update(0);
  b.update(0);
  const auto current = parameters_of(predicting);
  REQUIRE(current == parameters_of(by_hand));

  // Stage 0's step: lr 0.05 * horizon 0.5 * delay 18 along each momentum buffer.
  for (const auto& [name, p] : pb) {
    const Tensor v = b.optimizer().state(name, "momentum_buffer");
    REQUIRE(v.defined());
    p.set_data(predict_parameter(p.data(), v, 0.05 * (0.5 * 18.0)));  // the runtime's order: lr * (h * D)
  }
  CHECK(parameters_of(by_hand) != current);
  const ForwardMessage ya = a.forward({1, make_batch(1).images, {}, nullptr});
  const ForwardMessage yb = b.forward({1, make_batch(1).images, {}, nullptr});
  CHECK(ya.activation.to_vector<float>() == yb.activation.to_vector<float>());
  CHECK(parameters_of(predicting) == current);  // the current parameters are back
}

TEST_CASE("at delay 0 the options leave the trajectory bit-identical; at a delay they change it") {
  // Synchronous methods: every stage has delay 0, so the whole run is unchanged.
  for (PipelineMethod method : {PipelineMethod::revbackprop, PipelineMethod::backprop}) {
    CAPTURE(name_of(method));
    nn::Model plain(small_revnet()), optioned(small_revnet());
    const auto losses_plain = train(plain, sgd_options(method), 12);
    const auto losses_optioned = train(optioned, with_both_options(sgd_options(method)), 12);
    CHECK(losses_plain == losses_optioned);
    CHECK(parameters_of(plain) == parameters_of(optioned));
  }
  // PETRA: the head (delay 0) takes its first update, before anything below it has moved, the
  // same with and without; stage 0 (delay 18) ends elsewhere with each option.
  std::vector<std::vector<float>> head_first_update, first_stage;
  for (int variant = 0; variant < 3; ++variant) {
    RuntimeOptions options = sgd_options(PipelineMethod::petra);
    if (variant == 1) options.weight_prediction = WeightPrediction::linear;
    if (variant == 2) options.delay_lr_warmup = 16;
    nn::Model model(small_revnet());
    const int J = static_cast<int>(model.num_stages());
    Stream one_thread(Device::cpu(), 1);
    StreamGuard guard(one_thread);
    SequentialExecutor executor(model, options);
    const Schedule schedule = make_schedule(PipelineMethod::petra, J, 24, 1, /*drain=*/true);
    executor.run(schedule, 0, J, make_batch, [](const HeadStats&) {});
    head_first_update.push_back(model.stage(J - 1).parameters()[0].data().to_vector<float>());
    executor.run(schedule, J, schedule.steps, make_batch, [](const HeadStats&) {});
    first_stage.push_back(model.stage(0).parameters()[0].data().to_vector<float>());
  }
  CHECK(head_first_update[1] == head_first_update[0]);
  CHECK(head_first_update[2] == head_first_update[0]);
  CHECK(testing::relative_error(first_stage[1], first_stage[0]) > 1e-4);
  CHECK(testing::relative_error(first_stage[2], first_stage[0]) > 1e-4);
  // A horizon of 0 predicts nothing: the whole PETRA run is unchanged.
  nn::Model plain(small_revnet()), zero_horizon(small_revnet());
  RuntimeOptions options = sgd_options(PipelineMethod::petra);
  options.weight_prediction = WeightPrediction::linear;
  options.prediction_horizon = 0;
  CHECK(train(plain, sgd_options(PipelineMethod::petra), 16) == train(zero_horizon, options, 16));
  CHECK(parameters_of(plain) == parameters_of(zero_horizon));
}

TEST_CASE("with the options on, the concurrent executor gives the sequential executor's parameters bit for bit") {
  for (PipelineMethod method : {PipelineMethod::petra, PipelineMethod::pipedream}) {
    for (bool compensated : {false, true}) {
      CAPTURE(name_of(method));
      CAPTURE(compensated);
      RuntimeOptions options = with_both_options(sgd_options(method));
      options.delay_compensation = compensated;
      options.accumulation = 2;
      nn::Model a(small_revnet()), b(small_revnet());
      const int J = static_cast<int>(a.num_stages());
      const std::vector<double> losses_a = train(a, options, 24);
      const Schedule schedule = make_schedule(method, J, 24, 2, /*drain=*/true);
      std::vector<double> losses_b;
      ConcurrentExecutor concurrent(b, options, {{Device::cpu(0), 1}, {Device::cpu(1), 1}},
                                    balanced_placement(std::vector<double>(J, 1.0), 2));
      concurrent.run(schedule, 0, 10, make_batch, [&](const HeadStats& s) { losses_b.push_back(s.numbers.read().loss); });
      concurrent.run(schedule, 10, schedule.steps, make_batch, [&](const HeadStats& s) { losses_b.push_back(s.numbers.read().loss); });
      CHECK(losses_a == losses_b);
      CHECK(parameters_of(a) == parameters_of(b));
      CHECK(parameters_of(a) != parameters_of(nn::Model(small_revnet())));  // it trained
    }
  }
}

TEST_CASE("a run with the options on, resumed from a checkpoint with mini-batches in flight, is bit-identical") {
  TrainConfig c = tiny_petra();
  c.weight_prediction = WeightPrediction::linear;
  c.prediction_horizon = 0.75;
  c.delay_lr_warmup = 6;  // the warm-up crosses the checkpoint at mini-batch 4
  Trainer straight(c);
  straight.run({}, {});
  const testing::TemporaryDirectory checkpoints("delay-mitigation-resume");
  const auto resumed = testing::resume_after_first_epoch(c, checkpoints.path());
  resumed->run({}, {});
  CHECK(parameters_of(resumed->model()) == parameters_of(straight.model()));
  // And the options did something.
  Trainer plain(tiny_petra());
  plain.run({}, {});
  CHECK(parameters_of(plain.model()) != parameters_of(straight.model()));
}

TEST_CASE("the options' flags are validated, and they are resume keys") {
  TrainConfig c = tiny_petra();
  c.weight_prediction = WeightPrediction::linear;
  c.optimizer = "adam";
  CHECK_THROWS_WITH_AS(Trainer{c}, doctest::Contains("--weight-prediction linear needs"), ValueError);
  c.optimizer = "sgd";
  c.momentum = 0;
  CHECK_THROWS_WITH_AS(Trainer{c}, doctest::Contains("0 < momentum < 1"), ValueError);
  c.momentum = 0.9;
  c.method = PipelineMethod::backprop;
  CHECK_THROWS_WITH_AS(Trainer{c}, doctest::Contains("--weight-prediction linear needs a pipelined method"),
                       ValueError);
  c = tiny_petra();
  c.prediction_horizon = 0.5;  // without --weight-prediction
  CHECK_THROWS_WITH_AS(Trainer{c}, doctest::Contains("--prediction-horizon 0.5"), ValueError);
  c.weight_prediction = WeightPrediction::linear;
  c.prediction_horizon = -1;
  CHECK_THROWS_WITH_AS(Trainer{c}, doctest::Contains("--prediction-horizon must be from 0 to 10"), ValueError);
  c.prediction_horizon = std::nan("");
  CHECK_THROWS_WITH_AS(Trainer{c}, doctest::Contains("--prediction-horizon"), ValueError);
  c = tiny_petra();
  c.delay_lr_warmup = -3;
  CHECK_THROWS_WITH_AS(Trainer{c}, doctest::Contains("--delay-lr-warmup must be >= 0"), ValueError);
  c.delay_lr_warmup = 100;
  c.method = PipelineMethod::revbackprop;
  CHECK_THROWS_WITH_AS(Trainer{c}, doctest::Contains("--delay-lr-warmup scales"), ValueError);

  // Resume keys: a checkpoint written before the options existed resumes with them off only.
  c = tiny_petra();
  const CheckpointMeta meta_now = describe(c);
  CHECK(meta_now.at("weight_prediction") == "none");
  CHECK(meta_now.at("prediction_horizon") == "1");
  CHECK(meta_now.at("delay_lr_warmup") == "0");
  CheckpointMeta older = meta_now;
  older.erase("weight_prediction");
  older.erase("prediction_horizon");
  older.erase("delay_lr_warmup");
  CHECK(resume_mismatch(older, c).empty());
  c.weight_prediction = WeightPrediction::linear;
  CHECK(resume_mismatch(older, c).find("weight_prediction = none") != std::string::npos);
  c.prediction_horizon = 0.5;
  CheckpointMeta written = describe(c);
  c.prediction_horizon = 1;
  CHECK(resume_mismatch(written, c).find("prediction_horizon = 0.5") != std::string::npos);
  c = tiny_petra();
  c.delay_lr_warmup = 938;
  CHECK(resume_mismatch(older, c).find("this run has delay_lr_warmup = 938") != std::string::npos);
}
