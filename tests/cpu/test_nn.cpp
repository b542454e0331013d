// tests/cpu/test_nn.cpp: modules and layers: initialisation, state directories, train/eval,
// running statistics.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>

#include "petra/nn/layers.hpp"
#include "petra/nn/models.hpp"
#include "petra/npy.hpp"
#include "tests/support/fixtures.hpp"

using namespace petra;
using namespace petra::nn;
namespace fs = std::filesystem;
using petra::testing::TemporaryDirectory;

TEST_CASE("PyTorch's default initialisation: U(+-1/sqrt(fan_in)), reproducible from the seed") {
  Init a(1), b(1), c(2);
  Conv2d conv_a(16, 32, 3, 1, 1, a), conv_b(16, 32, 3, 1, 1, b), conv_c(16, 32, 3, 1, 1, c);
  const auto w = conv_a.weight().data().to_vector<float>();
  const double bound = 1.0 / std::sqrt(16.0 * 9.0);
  double max_abs = 0, mean = 0, var = 0;
  for (float v : w) {
    max_abs = std::max(max_abs, double(std::abs(v)));
    mean += v;
  }
  mean /= double(w.size());
  for (float v : w) var += (v - mean) * (v - mean);
  var /= double(w.size());
  CHECK(max_abs <= bound);
  CHECK(max_abs > 0.95 * bound);
  CHECK(std::abs(mean) < 0.05 * bound);
  CHECK(var == doctest::Approx(bound * bound / 3).epsilon(0.05));  // variance of U(-b, b)
  CHECK(w == conv_b.weight().data().to_vector<float>());
  CHECK(w != conv_c.weight().data().to_vector<float>());
  CHECK(conv_a.bias().data().to_vector<float>()[0] != 0.0f);
  BatchNorm2d bn(3, a);
  CHECK(bn.named_parameters()[0].second.data().to_vector<float>() == std::vector<float>{1, 1, 1});
  CHECK(bn.running_var().to_vector<float>() == std::vector<float>{1, 1, 1});
}

TEST_CASE("state directories: one .npy per parameter and buffer, round trip, clear errors") {
  ModelConfig config;
  config.width = 4;
  config.in_channels = 1;
  Model a(config);
  config.seed = 99;
  Model b(config);
  const TemporaryDirectory temporary("nn-state");
  const fs::path& dir = temporary.path();
  a.save_state(dir);
  CHECK(fs::exists(dir / "stages.1.f.conv1.weight.npy"));
  CHECK(fs::exists(dir / "stages.0.bn.running_mean.npy"));
  CHECK(load_npy(dir / "stages.9.fc.weight.npy").shape() == Shape{10, 64});
  CHECK(b.named_parameters()[0].second.data().to_vector<float>() != a.named_parameters()[0].second.data().to_vector<float>());
  b.load_state(dir);
  for (std::size_t i = 0; i < a.named_parameters().size(); ++i)
    CHECK(b.named_parameters()[i].second.data().to_vector<float>() ==
          a.named_parameters()[i].second.data().to_vector<float>());
  // A tensor of the wrong shape, or a missing file, is refused and changes nothing.
  const auto before = b.named_parameters()[0].second.data().to_vector<float>();
  save_npy(dir / "stages.9.fc.weight.npy", Tensor::zeros({10, 65}));
  CHECK_THROWS_AS(b.load_state(dir), IOError);
  fs::remove(dir / "stages.9.fc.weight.npy");
  try {
    b.load_state(dir);
    FAIL("a missing file must be refused");
  } catch (const IOError& e) {
    CHECK(std::string(e.what()).find("stages.9.fc.weight.npy") != std::string::npos);
  }
  CHECK(b.named_parameters()[0].second.data().to_vector<float>() == before);
}

TEST_CASE("batch norm: running statistics move in training, are read in eval, and the guard freezes them") {
  Init init(0);
  BatchNorm2d bn(2, init);
  const Tensor x = Tensor::from_vector<float>({2, 2, 1, 2}, {1, 3, 10, 20, 5, 7, 30, 40});
  {
    NoGradGuard no_grad;
    RunningStatsGuard frozen;
    bn.forward(Variable(x));
  }
  CHECK(bn.running_mean().to_vector<float>() == std::vector<float>{0, 0});
  {
    NoGradGuard no_grad;
    bn.forward(Variable(x));
  }
  // channel 0 holds {1, 3, 5, 7}: mean 4, unbiased variance 20/3
  CHECK(bn.running_mean().to_vector<float>()[0] == doctest::Approx(0.4));
  CHECK(bn.running_var().to_vector<float>()[0] == doctest::Approx(0.9 + 0.1 * 20.0 / 3.0));
  bn.eval();
  NoGradGuard no_grad;
  const auto y = bn.forward(Variable(x)).data().to_vector<float>();
  CHECK(y[0] == doctest::Approx((1 - 0.4) / std::sqrt(0.9 + 0.1 * 20.0 / 3.0 + 1e-5)).epsilon(1e-5));
}

TEST_CASE("batch norm: a momentum guard of 1/(i+1) makes the running statistics a cumulative average") {
  Init init(0);
  BatchNorm2d bn(1, init);
  const Tensor a = Tensor::from_vector<float>({4, 1, 1, 1}, {1, 3, 5, 7});    // mean 4, unbiased var 20/3
  const Tensor b = Tensor::from_vector<float>({4, 1, 1, 1}, {10, 10, 12, 12});  // mean 11, unbiased var 4/3
  NoGradGuard no_grad;
  bn.forward(Variable(b));  // stale statistics, which the first guarded batch must forget
  {
    RunningStatsMomentumGuard first(1.0);
    bn.forward(Variable(a));
  }
  CHECK(bn.running_mean().to_vector<float>()[0] == doctest::Approx(4));
  CHECK(bn.running_var().to_vector<float>()[0] == doctest::Approx(20.0 / 3.0));
  {
    RunningStatsMomentumGuard second(0.5);
    bn.forward(Variable(b));
  }
  CHECK(bn.running_mean().to_vector<float>()[0] == doctest::Approx(7.5));
  CHECK(bn.running_var().to_vector<float>()[0] == doctest::Approx((20.0 / 3.0 + 4.0 / 3.0) / 2));
  // Without a guard the layer's own momentum (0.1) is back.
  bn.forward(Variable(a));
  CHECK(bn.running_mean().to_vector<float>()[0] == doctest::Approx(0.9 * 7.5 + 0.1 * 4));
  CHECK_THROWS_AS(RunningStatsMomentumGuard(0.0), ValueError);
}

TEST_CASE("train/eval and zero_grad reach every submodule") {
  ModelConfig config;
  config.width = 4;
  Model m(config);
  m.eval();
  CHECK_FALSE(m.stage(3).is_training());
  m.train();
  CHECK(m.stage(3).is_training());
  for (const auto& p : m.parameters()) p.set_grad(Tensor::zeros(p.shape()));
  m.zero_grad();
  for (const auto& p : m.parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("conv_batch_norm: batch norm's backward gives the convolution's bias gradient; the rest is unchanged") {
  // The same convolution and batch norm (+ ReLU) run as two recorded ops and through
  // conv_batch_norm, whose bias gradient is the sum of batch norm's dx taken as it is written.
  for (const bool relu : {false, true}) {
    CAPTURE(relu);
    Init init(11);
    Conv2d conv(3, 5, 3, 2, 1, init);
    BatchNorm2d bn(5, init);
    const Tensor x = Tensor::uniform({4, 3, 9, 8}, 12, -1, 1);
    const Tensor seed = Tensor::uniform({4, 5, 5, 4}, 13, -1, 1);
    auto run = [&](bool fused) {
      conv.zero_grad();
      bn.zero_grad();
      const Variable input(x, /*requires_grad=*/true);
      const Variable y = fused ? conv_batch_norm(conv, bn, input, relu)
                               : (relu ? bn.forward_relu(conv.forward(input)) : bn.forward(conv.forward(input)));
      const Variable outputs[] = {y};
      const Tensor seeds[] = {seed};
      const Variable capture[] = {input};
      const Tensor dx = backward(outputs, seeds, capture)[0];
      return std::vector<std::vector<float>>{y.data().to_vector<float>(), dx.to_vector<float>(),
                                             conv.weight().grad().to_vector<float>(),
                                             conv.bias().grad().to_vector<float>(),
                                             bn.parameters()[0].grad().to_vector<float>()};
    };
    const auto plain = run(false);
    const auto fused = run(true);
    CHECK(conv.bias().grad().defined());  // delivered by batch norm's node
    CHECK(fused[0] == plain[0]);  // y
    CHECK(fused[1] == plain[1]);  // dx
    CHECK(fused[2] == plain[2]);  // dw
    CHECK(fused[4] == plain[4]);  // dgamma
    // db: the same sum in another order. Through a training batch norm it is 0 up to rounding
    // (dx sums to zero over each channel), so both are compared with the size of its terms.
    REQUIRE(fused[3].size() == 5);
    for (std::size_t c = 0; c < 5; ++c) CHECK(std::abs(fused[3][c] - plain[3][c]) < 1e-5);
  }
}

TEST_CASE("conv_batch_norm_coupling: coupling with F's last batch norm + ReLU fused, the same bits forward and backward") {
  // A reversible block's coupling (x2 + relu(bn(conv(h))), x1) with h made from x's first stream,
  // as ReversibleStage::forward records it: once as coupling(x, conv_batch_norm(...)) and once
  // fused, which never stores F's output and takes batch norm's ReLU mask from z and the map.
  // Everything must match bit for bit, the running statistics too; the bias's gradient is the same
  // sum (both take it in batch norm's backward).
  const Tensor x = Tensor::uniform({5, 6, 7, 9}, 22, -1, 1);
  const Tensor seed = Tensor::uniform({5, 6, 7, 9}, 23, -1, 1);
  auto run = [&](bool fused) {
    Init init(21);  // the same parameters and running statistics for both runs
    Conv2d conv1(3, 3, 3, 1, 1, init), conv2(3, 3, 3, 1, 1, init);
    BatchNorm2d bn1(3, init), bn2(3, init);
    const Tensor running_before = bn2.running_mean().clone();
    const Variable input(x, /*requires_grad=*/true);
    const Variable h = conv_batch_norm(conv1, bn1, channel_view(input, 0, 3), /*relu=*/true);
    const Variable y = fused ? conv_batch_norm_coupling(conv2, bn2, h, input)
                             : coupling(input, conv_batch_norm(conv2, bn2, h, /*relu=*/true));
    CHECK(y.grad_fn()->name() == (fused ? "batch_norm_relu_coupling" : "coupling"));
    CHECK(bn2.running_mean().to_vector<float>() != running_before.to_vector<float>());  // moved in training
    const Variable outputs[] = {y};
    const Tensor seeds[] = {seed};
    const Variable capture[] = {input};
    const Tensor dx = backward(outputs, seeds, capture)[0];
    return std::vector<std::vector<float>>{
        y.data().to_vector<float>(),          dx.to_vector<float>(),
        conv2.weight().grad().to_vector<float>(), conv1.weight().grad().to_vector<float>(),
        bn2.parameters()[0].grad().to_vector<float>(), bn2.parameters()[1].grad().to_vector<float>(),
        conv2.bias().grad().to_vector<float>(), bn2.running_mean().to_vector<float>(),
        bn2.running_var().to_vector<float>()};
  };
  const auto plain = run(false);
  const auto fused = run(true);
  REQUIRE(plain.size() == fused.size());
  for (std::size_t i = 0; i < plain.size(); ++i) {
    CAPTURE(i);
    CHECK(fused[i] == plain[i]);
  }
}

