// tests/cpu/test_optimizers.cpp: the optimizers of nn/optimizer.hpp (SGD, Adam, LARS through the
// Optimizer API, parameter groups, skipped parameters, state files, memory tags) against numbers
// computed by hand from the formulas of kernels/optim.hpp, and the learning-rate schedules of
// nn/schedule.hpp.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "petra/nn/optimizer.hpp"
#include "petra/nn/schedule.hpp"
#include "petra/allocator.hpp"
#include "petra/error.hpp"
#include "tests/support/fixtures.hpp"
#include "tests/support/testing.hpp"

using petra::DType;
using petra::Tensor;
using petra::Variable;
using petra::testing::max_abs_diff;
using petra::testing::TemporaryDirectory;
namespace nn = petra::nn;
using Values = std::vector<double>;

namespace {

// The example of tests/cpu/test_optim.cpp: every parameter starts at kStart, and the gradients of
// steps 1, 2, 3 are kGrads[0..2].
const Values kStart = {1.0, -2.0, 0.5};
const std::vector<Values> kGrads = {{0.1, 0.2, -0.3}, {-0.2, 0.1, 0.4}, {0.3, -0.1, 0.0}};
const DType kDTypes[] = {DType::f32, DType::f64};  // f32 runs kernels::cpu, f64 kernels::ref

Tensor tensor_of(const Values& values, DType dtype) {
  return Tensor::from_vector<double>({static_cast<std::int64_t>(values.size())}, values).to(dtype);
}

Variable parameter(DType dtype, const Values& values = kStart) { return Variable(tensor_of(values, dtype), true); }

Values values_of(const Tensor& t) { return t.to(DType::f64).to_vector<double>(); }

double tolerance_of(DType dtype) { return dtype == DType::f32 ? 2e-6 : 1e-12; }

void check_close(const Tensor& got, const Values& expected, DType dtype) {
  INFO("got " << got.str() << " expected " << expected[0] << ", " << expected[1] << ", " << expected[2]);
  CHECK(max_abs_diff(values_of(got), expected) <= tolerance_of(dtype));
}

nn::ParamGroup group_of(nn::NamedParameters params, double weight_decay = 0, double lr_scale = 1) {
  nn::ParamGroup group;
  group.params = std::move(params);
  group.weight_decay = weight_decay;
  group.lr_scale = lr_scale;
  return group;
}

// Gives every parameter the gradient of step `step` (0-based) of the example, then steps.
void step_with_example_gradients(nn::Optimizer& optimizer, int step, double lr) {
  for (const auto& group : optimizer.groups())
    for (const auto& [name, param] : group.params) param.set_grad(tensor_of(kGrads[step], param.data().dtype()));
  optimizer.step(lr);
}

}  // namespace

// ---------------------------------------------------------------- SGD

TEST_CASE("sgd without momentum: p -= lr * grad") {
  for (DType dtype : kDTypes) {
    Variable w = parameter(dtype);
    nn::Sgd sgd({group_of({{"w", w}})});
    CHECK(sgd.state_names().empty());
    step_with_example_gradients(sgd, 0, 0.1);
    check_close(w.data(), {0.99, -2.02, 0.53}, dtype);  // 1 - 0.1*0.1, -2 - 0.1*0.2, 0.5 + 0.1*0.3
    step_with_example_gradients(sgd, 1, 0.1);
    check_close(w.data(), {1.01, -2.03, 0.49}, dtype);  // 0.99 + 0.02, -2.02 - 0.01, 0.53 - 0.04
    CHECK(sgd.step_count() == 2);
  }
}

TEST_CASE("sgd with momentum and dampening: the buffer starts as the first gradient") {
  for (DType dtype : kDTypes) {
    Variable w = parameter(dtype);
    nn::Sgd sgd({group_of({{"w", w}})}, 0.9, 0.5);
    step_with_example_gradients(sgd, 0, 0.1);  // buf = g1, not (1 - dampening) * g1
    check_close(sgd.state("w", "momentum_buffer"), {0.1, 0.2, -0.3}, dtype);
    check_close(w.data(), {0.99, -2.02, 0.53}, dtype);
    step_with_example_gradients(sgd, 1, 0.1);  // buf = 0.9 buf + 0.5 g2
    check_close(sgd.state("w", "momentum_buffer"), {-0.01, 0.23, -0.07}, dtype);
    check_close(w.data(), {0.991, -2.043, 0.537}, dtype);
    step_with_example_gradients(sgd, 2, 0.1);
    check_close(sgd.state("w", "momentum_buffer"), {0.141, 0.157, -0.063}, dtype);
    check_close(w.data(), {0.9769, -2.0587, 0.5433}, dtype);
  }
}

TEST_CASE("sgd nesterov: each group has its own weight decay and learning-rate scale") {
  for (DType dtype : kDTypes) {
    Variable decayed = parameter(dtype), plain = parameter(dtype);
    nn::Sgd sgd({group_of({{"decayed", decayed}}, 0.01), group_of({{"plain", plain}}, 0, 0.5)}, 0.9, 0, true);
    // decayed: g = grad + 0.01 p; buf = g (first), 0.9 buf + g; p -= 0.1 (g + 0.9 buf)
    // step 1: g = {0.11, 0.18, -0.295}, p -= 0.1 * 1.9 g
    step_with_example_gradients(sgd, 0, 0.1);
    check_close(decayed.data(), {0.9791, -2.0342, 0.55605}, dtype);
    check_close(plain.data(), {0.9905, -2.019, 0.5285}, dtype);  // p -= 0.05 * 1.9 g1
    step_with_example_gradients(sgd, 1, 0.1);
    check_close(sgd.state("decayed", "momentum_buffer"), {-0.091209, 0.241658, 0.1400605}, dtype);
    check_close(decayed.data(), {1.00632971, -2.06391502, 0.502888505}, dtype);
    check_close(sgd.state("plain", "momentum_buffer"), {-0.11, 0.28, 0.13}, dtype);
    check_close(plain.data(), {1.00545, -2.0366, 0.50265}, dtype);
    step_with_example_gradients(sgd, 2, 0.1);
    check_close(decayed.data(), {0.9548056125510, -2.060567879462, 0.4905881163405}, dtype);
    check_close(plain.data(), {0.981405, -2.03844, 0.497385}, dtype);
  }
}

TEST_CASE("parameters without a gradient are skipped and keep no state") {
  Variable a = parameter(DType::f32), b = parameter(DType::f32);
  nn::Sgd sgd({group_of({{"a", a}, {"b", b}})}, 0.9);
  a.set_grad(tensor_of(kGrads[0], DType::f32));
  sgd.step(0.1);
  check_close(b.data(), kStart, DType::f32);
  CHECK_FALSE(sgd.state("b", "momentum_buffer").defined());
  CHECK(sgd.parameter_steps("b") == 0);

  // Second step: b's first update initialises its buffer from its gradient, as PyTorch.
  a.set_grad(tensor_of(kGrads[1], DType::f32));
  b.set_grad(tensor_of(kGrads[0], DType::f32));
  sgd.step(0.1);
  check_close(a.data(), {1.001, -2.048, 0.517}, DType::f32);  // buf = 0.9 g1 + g2 = {-0.11, 0.28, 0.13}
  check_close(b.data(), {0.99, -2.02, 0.53}, DType::f32);
  check_close(sgd.state("b", "momentum_buffer"), kGrads[0], DType::f32);
  CHECK(sgd.parameter_steps("a") == 2);
  CHECK(sgd.parameter_steps("b") == 1);
  CHECK(sgd.step_count() == 2);

  sgd.zero_grad();
  CHECK_FALSE(a.grad().defined());
  CHECK_FALSE(b.grad().defined());
  sgd.step(0.1);  // nothing has a gradient: nothing moves
  check_close(a.data(), {1.001, -2.048, 0.517}, DType::f32);
  CHECK(sgd.parameter_steps("a") == 2);
}

// ---------------------------------------------------------------- Adam

TEST_CASE("adam: bias-corrected moments, per-group weight decay") {
  for (DType dtype : kDTypes) {
    Variable w = parameter(dtype), decayed = parameter(dtype);
    nn::Adam adam({group_of({{"w", w}}), group_of({{"decayed", decayed}}, 0.1)}, 0.9, 0.999, 1e-8);
    // step 1: m = 0.1 g, v = 0.001 g^2, so the update is 0.01 g / (|g| + 1e-8): 0.01 sign(g) less
    // 1e-10 / |g| (the eps term: 1e-9 for |g| = 0.1)
    step_with_example_gradients(adam, 0, 0.01);
    check_close(w.data(), {0.990000001, -2.0099999995, 0.5099999996667}, dtype);
    check_close(adam.state("w", "exp_avg"), {0.01, 0.02, -0.03}, dtype);
    check_close(adam.state("w", "exp_avg_sq"), {1e-5, 4e-5, 9e-5}, dtype);
    // decayed: g = grad + 0.1 p = {0.2, 0, -0.25}: the middle element does not move
    check_close(decayed.data(), {0.9900000005, -2.0, 0.5099999996}, dtype);
    // step 2: m = 0.9 m + 0.1 g2, v = 0.999 v + 0.001 g2^2, p -= 0.01/(1-0.81) m / (sqrt(v/(1-0.999^2)) + eps)
    step_with_example_gradients(adam, 1, 0.01);
    check_close(adam.state("w", "exp_avg"), {-0.011, 0.028, 0.013}, dtype);
    check_close(adam.state("w", "exp_avg_sq"), {4.999e-5, 4.996e-5, 2.4991e-4}, dtype);
    check_close(w.data(), {0.9936610360388, -2.0193217952985, 0.5080648956300}, dtype);
    check_close(decayed.data(), {0.9873751971761, -1.9925586328164, 0.5067382374829}, dtype);
    step_with_example_gradients(adam, 2, 0.01);
    check_close(w.data(), {0.9902286253948, -2.0232888474106, 0.5065690546107}, dtype);
    check_close(decayed.data(), {0.9808115946635, -1.9846772650798, 0.5036038487579}, dtype);
    CHECK(adam.parameter_steps("w") == 3);
  }
}

// ---------------------------------------------------------------- LARS

TEST_CASE("lars: trust ratio where weight decay is on, plain momentum SGD where it is off") {
  for (DType dtype : kDTypes) {
    Variable adapted = parameter(dtype), plain = parameter(dtype);
    nn::Lars lars({group_of({{"adapted", adapted}}, 0.01), group_of({{"plain", plain}}, 0)}, 0.9, 0.02);
    // step 1: trust = 0.02 ||p|| / (||g|| + 0.01 ||p||) = 0.02 sqrt(5.25) / (sqrt(0.14) + 0.01 sqrt(5.25))
    //         = 0.1154072643806; buf = 0.1 trust (g + 0.01 p) = 0.01154072643806 {0.11, 0.18, -0.295}
    step_with_example_gradients(lars, 0, 0.1);
    check_close(lars.state("adapted", "momentum_buffer"), {0.0012694799082, 0.0020773307589, -0.0034045142992},
                dtype);
    check_close(adapted.data(), {0.9987305200918, -2.0020773307589, 0.5034045142992}, dtype);
    // plain: momentum SGD, buf = g1, p -= 0.1 buf
    check_close(plain.data(), {0.99, -2.02, 0.53}, dtype);
    step_with_example_gradients(lars, 1, 0.1);  // trust = 0.0953174645671
    check_close(adapted.data(), {0.9993991410048, -2.0047092701525, 0.5026078953439}, dtype);
    check_close(plain.data(), {1.001, -2.048, 0.517}, dtype);  // buf = 0.9 g1 + g2
    step_with_example_gradients(lars, 2, 0.1);  // trust = 0.1353661576662
    check_close(adapted.data(), {0.9958046302749, -2.0054529842389, 0.5018229021845}, dtype);
    check_close(plain.data(), {0.9809, -2.0632, 0.5053}, dtype);  // buf = {0.201, 0.152, 0.117}
  }
}

// ---------------------------------------------------------------- groups, factory, errors

TEST_CASE("decay_groups: no weight decay on batch-norm parameters and biases") {
  CHECK(nn::takes_weight_decay("stages.3.f.conv1.weight"));
  CHECK(nn::takes_weight_decay("stages.0.conv.weight"));
  CHECK(nn::takes_weight_decay("stages.4.conv_proj.weight"));
  CHECK(nn::takes_weight_decay("stages.9.fc.weight"));
  CHECK(nn::takes_weight_decay("weight"));
  CHECK_FALSE(nn::takes_weight_decay("stages.3.f.bn1.weight"));
  CHECK_FALSE(nn::takes_weight_decay("stages.3.f.bn2.bias"));
  CHECK_FALSE(nn::takes_weight_decay("stages.0.bn.weight"));
  CHECK_FALSE(nn::takes_weight_decay("stages.4.bn_proj1.weight"));
  CHECK_FALSE(nn::takes_weight_decay("stages.3.f.conv1.bias"));
  CHECK_FALSE(nn::takes_weight_decay("stages.9.fc.bias"));
  CHECK_FALSE(nn::takes_weight_decay("bias"));
  CHECK_FALSE(nn::takes_weight_decay("bn.weight"));

  const nn::NamedParameters named = {{"stages.0.conv.weight", parameter(DType::f32)},
                                     {"stages.0.bn.weight", parameter(DType::f32)},
                                     {"stages.0.bn.bias", parameter(DType::f32)},
                                     {"stages.3.f.conv1.weight", parameter(DType::f32)},
                                     {"stages.3.f.conv1.bias", parameter(DType::f32)},
                                     {"stages.9.fc.weight", parameter(DType::f32)},
                                     {"stages.9.fc.bias", parameter(DType::f32)}};
  const auto groups = nn::decay_groups(named, 5e-4);
  REQUIRE(groups.size() == 2);
  CHECK(groups[0].weight_decay == 5e-4);
  CHECK(groups[1].weight_decay == 0);
  std::vector<std::string> decayed, not_decayed;
  for (const auto& [name, p] : groups[0].params) decayed.push_back(name);
  for (const auto& [name, p] : groups[1].params) not_decayed.push_back(name);
  CHECK(decayed == std::vector<std::string>{"stages.0.conv.weight", "stages.3.f.conv1.weight", "stages.9.fc.weight"});
  CHECK(not_decayed == std::vector<std::string>{"stages.0.bn.weight", "stages.0.bn.bias", "stages.3.f.conv1.bias",
                                                "stages.9.fc.bias"});
  CHECK(groups[0].params[0].second.same_as(named[0].second));  // the same Variables, not copies
}

TEST_CASE("make_optimizer builds each kind and refuses unknown names and bad settings") {
  auto groups = [] { return std::vector<nn::ParamGroup>{group_of({{"w", parameter(DType::f32)}})}; };
  CHECK(nn::make_optimizer("sgd", groups(), {.momentum = 0.9, .nesterov = true})->name() == "sgd");
  CHECK(nn::make_optimizer("adam", groups())->name() == "adam");
  CHECK(nn::make_optimizer("lars", groups())->name() == "lars");
  CHECK_THROWS_AS(nn::make_optimizer("rmsprop", groups()), petra::ValueError);
  CHECK_THROWS_AS(nn::make_optimizer("sgd", groups(), {.momentum = 0.9, .dampening = 0.1, .nesterov = true}),
                  petra::ValueError);
  CHECK_THROWS_AS(nn::make_optimizer("adam", groups(), {.beta1 = 1.0}), petra::ValueError);
  // delay compensation: sgd with 0 < momentum < 1 only
  CHECK(nn::make_optimizer("sgd", groups(), {.momentum = 0.9, .nesterov = true, .delay = 4})->name() == "sgd");
  CHECK_THROWS_AS(nn::make_optimizer("sgd", groups(), {.momentum = 0, .delay = 4}), petra::ValueError);
  CHECK_THROWS_AS(nn::make_optimizer("sgd", groups(), {.momentum = 0.9, .delay = -1}), petra::ValueError);
  CHECK_THROWS_AS(nn::make_optimizer("adam", groups(), {.delay = 4}), petra::ValueError);
  CHECK_THROWS_AS(nn::Sgd({group_of({{"w", parameter(DType::f32)}}), group_of({{"w", parameter(DType::f32)}})}),
                  petra::ValueError);  // a name twice
  CHECK_THROWS_AS(nn::Sgd({group_of({{"w", parameter(DType::f32)}}, -1)}), petra::ValueError);
  nn::Sgd sgd(groups());
  CHECK_THROWS_AS(sgd.step(-0.1), petra::ValueError);
  CHECK_THROWS_AS(sgd.state("nope", "momentum_buffer"), petra::ValueError);
}

// ---------------------------------------------------------------- state: memory and files

TEST_CASE("optimizer state is tagged optimizer_state with the parameter's owner") {
  constexpr int kStage = 7;
  Variable w;
  {
    petra::MemoryScope scope(petra::MemoryTag::parameters, kStage);
    w = parameter(DType::f32);
  }
  REQUIRE(w.data().storage()->owner() == kStage);
  const auto& allocator = petra::Allocator::instance();
  const auto before = allocator.stats(petra::Device::cpu(), petra::MemoryTag::optimizer_state, kStage).current;
  nn::Adam adam({group_of({{"w", w}})});
  CHECK_FALSE(adam.state("w", "exp_avg").defined());  // lazily allocated
  step_with_example_gradients(adam, 0, 0.01);
  for (const char* name : {"exp_avg", "exp_avg_sq"}) {
    const Tensor s = adam.state("w", name);
    REQUIRE(s.defined());
    CHECK(s.storage()->tag() == petra::MemoryTag::optimizer_state);
    CHECK(s.storage()->owner() == kStage);
  }
  const auto after = allocator.stats(petra::Device::cpu(), petra::MemoryTag::optimizer_state, kStage).current;
  CHECK(after - before == 2 * 3 * static_cast<std::int64_t>(sizeof(float)));
}

TEST_CASE("save_state / load_state: the next steps are identical") {
  for (const std::string kind : {"sgd", "adam", "lars"}) {
    INFO(kind);
    TemporaryDirectory dir("optimizer-" + kind);
    const nn::OptimizerOptions options{.momentum = 0.9, .nesterov = kind == "sgd"};
    auto make = [&](Variable w, Variable bias, Variable unused) {
      return nn::make_optimizer(kind, {group_of({{"stages.1.conv.weight", w}}, 0.01),
                                       group_of({{"stages.1.conv.bias", bias}, {"stages.1.bn.weight", unused}})},
                                options);
    };
    Variable w = parameter(DType::f32), bias = parameter(DType::f32), unused = parameter(DType::f32);
    auto original = make(w, bias, unused);
    w.set_grad(tensor_of(kGrads[0], DType::f32));
    bias.set_grad(tensor_of(kGrads[1], DType::f32));
    original->step(0.1);
    w.set_grad(tensor_of(kGrads[1], DType::f32));
    original->step(0.1);  // bias keeps its gradient: two updates each; "unused" never has one
    original->save_state(dir.path());
    CHECK(std::filesystem::exists(dir / "optimizer_state.txt"));
    CHECK(std::filesystem::exists(dir / ("stages.1.conv.weight." + original->state_names()[0] + ".npy")));
    CHECK_FALSE(std::filesystem::exists(dir / ("stages.1.bn.weight." + original->state_names()[0] + ".npy")));

    // Same parameter values, fresh optimizers: one loads the state, one does not.
    Variable w2(w.data().clone(), true), bias2(bias.data().clone(), true), unused2(unused.data().clone(), true);
    Variable w3(w.data().clone(), true), bias3(bias.data().clone(), true), unused3(unused.data().clone(), true);
    auto restored = make(w2, bias2, unused2);
    auto fresh = make(w3, bias3, unused3);
    restored->load_state(dir.path());
    CHECK(restored->step_count() == 2);
    CHECK(restored->parameter_steps("stages.1.conv.weight") == 2);
    CHECK(restored->parameter_steps("stages.1.bn.weight") == 0);

    for (int step = 0; step < 2; ++step) {
      for (const Variable& v : {w, w2, w3}) v.set_grad(tensor_of(kGrads[2 - step], DType::f32));
      for (const Variable& v : {bias, bias2, bias3, unused, unused2, unused3})
        v.set_grad(tensor_of(kGrads[step], DType::f32));
      original->step(0.05);
      restored->step(0.05);
      fresh->step(0.05);
    }
    for (const auto& [a, b] : {std::pair{w, w2}, std::pair{bias, bias2}, std::pair{unused, unused2}})
      CHECK(a.data().to_vector<float>() == b.data().to_vector<float>());  // bit for bit
    CHECK(max_abs_diff(w.data().to_vector<float>(), w3.data().to_vector<float>()) > 1e-4);  // state matters
    for (const std::string& state_name : original->state_names())
      CHECK(original->state("stages.1.conv.weight", state_name).to_vector<float>() ==
            restored->state("stages.1.conv.weight", state_name).to_vector<float>());
  }
}

TEST_CASE("load_state refuses another optimizer's state, other shapes, and missing files") {
  TemporaryDirectory dir("optimizer-mismatch");
  Variable w = parameter(DType::f32);
  nn::Sgd sgd({group_of({{"w", w}})}, 0.9);
  step_with_example_gradients(sgd, 0, 0.1);
  sgd.save_state(dir.path());

  nn::Adam adam({group_of({{"w", parameter(DType::f32)}})});
  CHECK_THROWS_AS(adam.load_state(dir.path()), petra::ValueError);
  nn::Sgd wider({group_of({{"w", parameter(DType::f32, {1, 2, 3, 4})}})}, 0.9);
  CHECK_THROWS_AS(wider.load_state(dir.path()), petra::ValueError);
  nn::Sgd renamed({group_of({{"v", parameter(DType::f32)}})}, 0.9);
  CHECK_THROWS_AS(renamed.load_state(dir.path()), petra::ValueError);
  CHECK_THROWS_AS(sgd.load_state(dir / "missing"), petra::IOError);
  std::filesystem::remove(dir / "w.momentum_buffer.npy");
  nn::Sgd other({group_of({{"w", parameter(DType::f32)}})}, 0.9);
  CHECK_THROWS_AS(other.load_state(dir.path()), petra::IOError);
  CHECK(other.parameter_steps("w") == 0);  // a failed load changes nothing
}

// ---------------------------------------------------------------- schedules

TEST_CASE("schedule warm-up: lr * (it + 1) / warm-up iterations, per iteration") {
  nn::ScheduleConfig config{.kind = "constant", .base_lr = 0.2, .warmup_epochs = 5};
  CHECK(nn::learning_rate(config, 0, 10) == doctest::Approx(0.2 / 50));
  CHECK(nn::learning_rate(config, 1, 10) == doctest::Approx(0.2 * 2 / 50));
  CHECK(nn::learning_rate(config, 24, 10) == doctest::Approx(0.1));
  CHECK(nn::learning_rate(config, 49, 10) == doctest::Approx(0.2));  // last warm-up iteration
  CHECK(nn::learning_rate(config, 50, 10) == doctest::Approx(0.2));
  CHECK(nn::learning_rate(config, 100000, 10) == doctest::Approx(0.2));
  config.warmup_epochs = 0;
  CHECK(nn::learning_rate(config, 0, 10) == doctest::Approx(0.2));
  config.warmup_epochs = 0.25;  // 2.5 iterations: never above base_lr
  CHECK(nn::learning_rate(config, 0, 10) == doctest::Approx(0.2 / 2.5));
  CHECK(nn::learning_rate(config, 2, 10) == doctest::Approx(0.2));
}

TEST_CASE("step schedule drops at the exact milestone iteration (absolute epochs)") {
  const nn::ScheduleConfig config{
      .kind = "step", .base_lr = 0.2, .warmup_epochs = 5, .milestones = {150, 225}, .factor = 0.1};
  CHECK(nn::learning_rate(config, 499, 100) == doctest::Approx(0.2));
  CHECK(nn::learning_rate(config, 500, 100) == doctest::Approx(0.2));
  CHECK(nn::learning_rate(config, 14999, 100) == doctest::Approx(0.2));
  CHECK(nn::learning_rate(config, 15000, 100) == doctest::Approx(0.02));
  CHECK(nn::learning_rate(config, 22499, 100) == doctest::Approx(0.02));
  CHECK(nn::learning_rate(config, 22500, 100) == doctest::Approx(0.002));
  CHECK(nn::learning_rate(config, 29999, 100) == doctest::Approx(0.002));
}

TEST_CASE("cosine and poly schedules decay over the post-warm-up iterations to 0") {
  nn::ScheduleConfig config{.kind = "cosine", .base_lr = 0.2, .warmup_epochs = 5, .total_epochs = 15};
  // 10 iterations per epoch: warm-up is iterations [0, 50), the decay runs over [50, 150]
  CHECK(nn::learning_rate(config, 49, 10) == doctest::Approx(0.2));
  CHECK(nn::learning_rate(config, 50, 10) == doctest::Approx(0.2));
  CHECK(nn::learning_rate(config, 75, 10) == doctest::Approx(0.2 * 0.5 * (1 + std::sqrt(0.5))));
  CHECK(nn::learning_rate(config, 100, 10) == doctest::Approx(0.1));  // midpoint: half
  CHECK(nn::learning_rate(config, 150, 10) == 0.0);                   // end
  CHECK(nn::learning_rate(config, 170, 10) == 0.0);
  config.kind = "poly";
  config.power = 2;
  CHECK(nn::learning_rate(config, 50, 10) == doctest::Approx(0.2));
  CHECK(nn::learning_rate(config, 100, 10) == doctest::Approx(0.2 * 0.25));  // (1 - 1/2)^2
  CHECK(nn::learning_rate(config, 125, 10) == doctest::Approx(0.2 * 0.0625));
  CHECK(nn::learning_rate(config, 150, 10) == 0.0);
  config.power = 1;
  CHECK(nn::learning_rate(config, 125, 10) == doctest::Approx(0.05));
}

TEST_CASE("schedule configs are validated; goyal scaling") {
  auto rejects = [](nn::ScheduleConfig c) {
    CHECK_THROWS_AS(nn::learning_rate(c, 0, 10), petra::ValueError);
  };
  rejects({.kind = "exponential"});
  rejects({.kind = "constant", .base_lr = -0.1});
  rejects({.kind = "constant", .warmup_epochs = -1});
  rejects({.kind = "step", .milestones = {30, 30}});
  rejects({.kind = "step", .milestones = {60, 30}});
  rejects({.kind = "step", .milestones = {-1}});
  rejects({.kind = "cosine", .warmup_epochs = 5, .total_epochs = 5});
  rejects({.kind = "poly", .power = -1, .total_epochs = 10});
  rejects({.kind = "constant", .base_lr = NAN});
  const nn::ScheduleConfig fine{.kind = "step", .milestones = {30, 60, 80}};
  CHECK_NOTHROW(nn::validate(fine));
  CHECK_THROWS_AS(nn::learning_rate(fine, -1, 10), petra::ValueError);
  CHECK_THROWS_AS(nn::learning_rate(fine, 0, 0), petra::ValueError);

  CHECK(nn::goyal_lr(0.1, 2, 64) == doctest::Approx(0.05));  // PETRA: lr = 0.1 * 64k / 256
  CHECK(nn::goyal_lr(0.1, 4, 64) == doctest::Approx(0.1));
  CHECK(nn::goyal_lr(0.1, 1, 256) == doctest::Approx(0.1));
  CHECK_THROWS_AS(nn::goyal_lr(0.1, 0, 64), petra::ValueError);
}
