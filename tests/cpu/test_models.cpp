// tests/cpu/test_models.cpp: the paper's models: stage layout (one block per stage, or grouped),
// parameter counts against the official code, exact inversion of reversible stages,
// reconstruct_and_backward against the stored-input gradients, and finite-difference checks of
// every kind of stage (grouped ones included) in float64.
#include <doctest/doctest.h>

#include "petra/nn/blocks.hpp"
#include "petra/nn/models.hpp"
#include "petra/nn/stage_group.hpp"
#include "tests/support/fixtures.hpp"
#include "tests/support/gradcheck.hpp"
#include "tests/support/testing.hpp"

using namespace petra;
using namespace petra::nn;
using testing::random_tensor;

namespace {

std::vector<int> non_reversible_stages(const Model& m) {
  std::vector<int> out;
  for (std::size_t j = 0; j < m.num_stages(); ++j)
    if (m.stage(j).kind() == StageKind::buffered) out.push_back(static_cast<int>(j));
  return out;
}

ModelConfig imagenet(const std::string& arch) {
  ModelConfig c;
  c.arch = arch;
  c.classes = 1000;
  c.stem = "imagenet";
  return c;
}

}  // namespace

TEST_CASE("parameter counts match the official code (1000 classes, ImageNet stem)") {
  // The paper's Table 2 rounds these to 11.7M, 12.2M, 22.3M, 25.6M, 30.4M.
  CHECK(Model(imagenet("resnet18")).parameter_count() == 11694312);
  CHECK(Model(imagenet("revnet18")).parameter_count() == 12215912);
  CHECK(Model(imagenet("revnet34")).parameter_count() == 22327784);
  CHECK(Model(imagenet("resnet50")).parameter_count() == 25583592);
  CHECK(Model(imagenet("revnet50")).parameter_count() == 30421608);
}

TEST_CASE("stage layout: J and which stages are buffered") {
  ModelConfig c;
  c.width = 4;
  c.arch = "revnet18";
  Model r18(c);
  CHECK(r18.num_stages() == 10);
  CHECK(non_reversible_stages(r18) == std::vector<int>{0, 3, 5, 7});
  CHECK(r18.stage(9).kind() == StageKind::head);
  c.arch = "revnet34";
  Model r34(c);
  CHECK(r34.num_stages() == 18);
  CHECK(non_reversible_stages(r34) == std::vector<int>{0, 4, 8, 14});
  c.arch = "revnet50";
  Model r50(c);
  CHECK(r50.num_stages() == 18);
  CHECK(non_reversible_stages(r50) == std::vector<int>{0, 1, 4, 8, 14});
  c.arch = "resnet18";
  CHECK(Model(c).num_stages() == 10);
  c.arch = "vgg11";
  CHECK_THROWS_AS(Model{c}, ValueError);
}

TEST_CASE("parameters are tagged with their stage; names are dotted paths") {
  ModelConfig c;
  c.width = 4;
  Model m(c);
  const auto params = m.named_parameters();
  CHECK(params.front().first == "stages.0.conv.weight");
  bool found = false;
  for (const auto& [name, v] : params) {
    const int stage = std::stoi(name.substr(7, name.find('.', 7) - 7));
    CHECK(v.data().storage()->tag() == MemoryTag::parameters);
    CHECK(v.data().storage()->owner() == stage);
    found = found || name == "stages.1.f.conv1.weight";
  }
  CHECK(found);
  const std::string text = m.summary({1, 3, 32, 32});
  CHECK(text.find("reversible") != std::string::npos);
  CHECK(text.find("[1, 64, 4, 4]") != std::string::npos);  // the head's input: 2 x 8w channels at 4x4
}

TEST_CASE("grouped stages: sizes, kinds, and the same parameters under the same names") {
  CHECK(block_count("revnet18") == 10);
  CHECK(block_count("revnet50") == 18);
  CHECK(even_stage_sizes(10, 3) == std::vector<std::int64_t>{3, 3, 4});
  CHECK(even_stage_sizes(18, 4) == std::vector<std::int64_t>{4, 4, 5, 5});
  CHECK(even_stage_sizes(10, 10) == std::vector<std::int64_t>(10, 1));
  CHECK_THROWS_AS(even_stage_sizes(10, 0), ValueError);
  CHECK_THROWS_AS(even_stage_sizes(10, 11), ValueError);
  CHECK(parse_stage_sizes("3", "revnet18") == std::vector<std::int64_t>{3, 3, 4});
  CHECK(parse_stage_sizes("1,2,2,5", "revnet18") == std::vector<std::int64_t>{1, 2, 2, 5});
  CHECK(parse_stage_sizes("18", "revnet50") == std::vector<std::int64_t>(18, 1));
  for (const char* bad : {"", "0", "3,", "x", "2,-1", "1 ,2", "11"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_stage_sizes(bad, "revnet18"), ValueError);
  }

  ModelConfig c;
  c.width = 4;
  const Model blocks(c);
  c.stage_sizes = {1, 2, 2, 5};  // stem | 2 reversible | transition, reversible | the rest and the head
  const Model grouped(c);
  REQUIRE(grouped.num_stages() == 4);
  CHECK(grouped.num_blocks() == 10);
  CHECK(grouped.stage(0).kind() == StageKind::buffered);
  CHECK(grouped.stage(1).kind() == StageKind::reversible);
  CHECK(grouped.stage(2).kind() == StageKind::buffered);
  CHECK(grouped.stage(3).kind() == StageKind::head);
  CHECK(grouped.stage(1).describe() == "blocks 1-2: reversible, reversible");
  // Same names and values as one block per stage (same seed), each tagged with its group.
  const auto a = blocks.named_parameters(), b = grouped.named_parameters();
  REQUIRE(a.size() == b.size());
  const int stage_of_block[] = {0, 1, 1, 2, 2, 3, 3, 3, 3, 3};
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(a[i].first);
    CHECK(a[i].first == b[i].first);
    CHECK(a[i].second.data().to_vector<float>() == b[i].second.data().to_vector<float>());
    const int block = std::stoi(b[i].first.substr(7, b[i].first.find('.', 7) - 7));
    CHECK(b[i].second.data().storage()->owner() == stage_of_block[block]);
  }
  std::int64_t per_stage = 0;
  for (std::size_t j = 0; j < grouped.num_stages(); ++j) per_stage += grouped.stage(j).parameter_count();
  CHECK(per_stage == blocks.parameter_count());

  c.stage_sizes = {3, 3};
  CHECK_THROWS_WITH_AS(Model{c}, doctest::Contains("add up to 6 blocks but revnet18 has 10"), ValueError);
  c.stage_sizes = {0, 10};
  CHECK_THROWS_AS(Model{c}, ValueError);
  c.stage_sizes = {10};  // one stage: the whole network is the head
  CHECK(Model(c).stage(0).kind() == StageKind::head);
}

TEST_CASE("reversible stages invert exactly in the first stream and within 1e-6 in the second") {
  for (const std::string arch : {"revnet18", "revnet50"}) {
    CAPTURE(arch);
    ModelConfig c;
    c.arch = arch;
    c.width = 8;
    Model m(c);
    NoGradGuard no_grad;
    Variable h(random_tensor({4, 3, 16, 16}, 1, DType::f32));
    for (std::size_t j = 0; j + 1 < m.num_stages(); ++j) {
      const Variable y = m.stage(j).forward(h);
      if (m.stage(j).kind() == StageKind::reversible) {
        const Tensor x = m.stage(j).inverse(y.data());
        const std::int64_t c2 = x.size(1) / 2;
        CHECK(ops::channel_slice(x, 0, c2).to_vector<float>() == ops::channel_slice(h.data(), 0, c2).to_vector<float>());
        CHECK(testing::relative_error(x.to_vector<float>(), h.data().to_vector<float>()) < 1e-6);
      }
      h = y;
    }
  }
}

TEST_CASE("a reversible stage's graph-free forward and inverse (F's last BN + ReLU fused into the coupling) "
          "equal the unfused path bit for bit") {
  // The unfused path is the one that keeps a graph (training mode only: evaluation keeps none);
  // the kernels' own tests compare the fused op with the unfused ops in both modes.
  ModelConfig c;
  c.width = 8;
  Model fused_model(c), unfused_model(c);
  const std::size_t j = 1;
  Stage& fused = fused_model.stage(j);
  Stage& unfused = unfused_model.stage(j);
  REQUIRE(fused.kind() == StageKind::reversible);
  const Tensor x = random_tensor({4, 16, 8, 8}, 4, DType::f32);
  auto buffers = [](const Stage& stage) {
    std::vector<std::vector<float>> values;
    for (const auto& [name, t] : stage.named_buffers()) values.push_back(t.to_vector<float>());
    return values;
  };
  Tensor y_fused;
  {
    NoGradGuard no_grad;  // the pipeline's forward: the fused op
    y_fused = fused.forward(Variable(x)).data();
  }
  const Tensor y_unfused = unfused.forward(Variable(x, true)).data();  // with a graph: BN + ReLU, then the coupling
  CHECK(y_fused.to_vector<float>() == y_unfused.to_vector<float>());
  CHECK(buffers(fused) == buffers(unfused));  // the running statistics moved alike
  CHECK(buffers(fused) != buffers(Model(c).stage(j)));
  // The inverse (fused) against reconstruct_and_backward's (unfused: F's output, then coupling_inverse).
  const Tensor x_fused = fused.inverse(y_fused);
  const Tensor x_unfused = unfused.reconstruct_and_backward(y_unfused, random_tensor(y_unfused.shape(), 5, DType::f32)).first;
  CHECK(x_fused.to_vector<float>() == x_unfused.to_vector<float>());
  CHECK(testing::relative_error(x_fused.to_vector<float>(), x.to_vector<float>()) < 1e-6);
  CHECK(buffers(fused) == buffers(unfused));  // neither inversion moved them

  // Evaluation: the running statistics are read, not moved, and the inverse still inverts.
  fused.eval();
  NoGradGuard no_grad;
  const auto before = buffers(fused);
  const Tensor y_eval = fused.forward(Variable(x)).data();
  CHECK(buffers(fused) == before);
  CHECK(y_eval.to_vector<float>() != y_fused.to_vector<float>());
  CHECK(testing::relative_error(fused.inverse(y_eval).to_vector<float>(), x.to_vector<float>()) < 1e-6);
}

TEST_CASE("reconstruct_and_backward gives the gradients of the stored input") {
  ModelConfig c;
  c.width = 8;
  Model m(c);
  Stage& stage = m.stage(1);
  REQUIRE(stage.kind() == StageKind::reversible);
  const Tensor x = random_tensor({4, 16, 8, 8}, 2, DType::f32), dy = random_tensor({4, 16, 8, 8}, 3, DType::f32);
  // Exact backprop: the graph of the stage from its true input.
  const Variable input(x, true);
  const Variable y = stage.forward(input);
  const Variable outputs[] = {y};
  const Tensor seeds[] = {dy};
  const Variable capture[] = {input};
  const Tensor dx_stored = backward(outputs, seeds, capture)[0];
  std::vector<std::vector<float>> grads_stored;
  for (const auto& p : stage.parameters()) grads_stored.push_back(p.grad().to_vector<float>());
  stage.zero_grad();
  // PETRA's path: rebuild the input from the output, then back-propagate through the same graph.
  const auto [x_rebuilt, dx] = stage.reconstruct_and_backward(y.data(), dy);
  CHECK(testing::relative_error(x_rebuilt.to_vector<float>(), x.to_vector<float>()) < 1e-6);
  CHECK(testing::relative_error(dx.to_vector<float>(), dx_stored.to_vector<float>()) < 1e-5);
  const auto params = stage.parameters();
  for (std::size_t i = 0; i < params.size(); ++i)
    CHECK(testing::relative_error(params[i].grad().to_vector<float>(), grads_stored[i]) < 1e-5);
}

namespace {
// Finite differences of L = <g, stage(x)> in float64 against the stage's own backward, for the
// input and for a few elements of every parameter.
void check_stage_gradients(Stage& stage, const Shape& x_shape, std::uint64_t seed) {
  const Tensor x = random_tensor(x_shape, seed, DType::f64);
  Tensor y;
  {
    NoGradGuard no_grad;
    y = stage.forward(Variable(x)).data();
  }
  const Tensor g = random_tensor(y.shape(), seed + 1, DType::f64);
  stage.zero_grad();
  Tensor dx;
  if (stage.kind() == StageKind::reversible)
    dx = stage.reconstruct_and_backward(y, g).second;
  else
    dx = stage.recompute_and_backward(x, g);
  // L(x) = <g, stage(x)>, the running statistics left alone.
  const auto loss_of_input = testing::vjp_loss(
      [&stage](const std::vector<Variable>& v) {
        RunningStatsGuard keep_stats;
        return stage.forward(v[0]);
      },
      {x}, 0, g);
  if (dx.defined()) {
    const auto r = testing::check_gradient(loss_of_input, x.to_vector<double>(), dx.to_vector<double>());
    CHECK_MESSAGE(r.ok, stage.describe(), ": input: ", r.worst);
  }
  for (const auto& [name, p] : stage.named_parameters())
    testing::check_sampled_gradient([&] { return loss_of_input(x.to_vector<double>()); }, p.data(),
                                    p.grad().to_vector<double>(), stage.describe() + ": " + name);
}
}  // namespace

TEST_CASE("finite differences of every kind of stage, float64") {
  Init init(7, DType::f64);
  SUBCASE("stem") {
    StemStage stem(2, 4, false, init);
    stem.set_input_gradient(true);
    check_stage_gradients(stem, {2, 2, 5, 5}, 10);
  }
  SUBCASE("ImageNet stem with max-pool") {
    StemStage stem(1, 4, true, init);
    stem.set_input_gradient(true);
    check_stage_gradients(stem, {2, 1, 9, 9}, 11);
  }
  SUBCASE("reversible basic") {
    ReversibleStage s(ResidualFunction::basic(3, 3, 1, init), 3, "basic");
    check_stage_gradients(s, {2, 6, 4, 4}, 12);
  }
  SUBCASE("reversible bottleneck") {
    ReversibleStage s(ResidualFunction::bottleneck(4, 2, 4, 1, init), 4, "bottleneck");
    check_stage_gradients(s, {2, 8, 3, 3}, 13);
  }
  SUBCASE("basic transition") {
    BasicTransitionStage s(2, 4, init);
    check_stage_gradients(s, {2, 4, 6, 6}, 14);
  }
  SUBCASE("bottleneck transition") {
    BottleneckTransitionStage s(2, 2, 4, 2, init);
    check_stage_gradients(s, {2, 4, 6, 6}, 15);
  }
  SUBCASE("ResNet basic block with projection") {
    ResidualStage s(false, 2, 3, 3, 2, init);
    check_stage_gradients(s, {2, 2, 6, 6}, 16);
  }
  SUBCASE("ResNet bottleneck block") {
    ResidualStage s(true, 4, 2, 4, 1, init);
    check_stage_gradients(s, {2, 4, 4, 4}, 17);
  }
  SUBCASE("a group of two reversible blocks: rebuilt block by block") {
    StageGroup s({std::make_shared<ReversibleStage>(ResidualFunction::basic(3, 3, 1, init), 3, "basic"),
                  std::make_shared<ReversibleStage>(ResidualFunction::basic(3, 3, 1, init), 3, "basic")},
                 1);
    REQUIRE(s.kind() == StageKind::reversible);
    check_stage_gradients(s, {2, 6, 4, 4}, 18);
  }
  SUBCASE("a buffered group: a transition then a reversible block") {
    StageGroup s({std::make_shared<BasicTransitionStage>(2, 3, init),
                  std::make_shared<ReversibleStage>(ResidualFunction::basic(3, 3, 1, init), 3, "basic")},
                 3);
    REQUIRE(s.kind() == StageKind::buffered);
    check_stage_gradients(s, {2, 4, 6, 6}, 19);
  }
}

TEST_CASE("the head: loss, accuracy and input gradient") {
  Init init(3, DType::f64);
  HeadStage head(4, 3, init);
  const Tensor x = random_tensor({5, 4, 2, 2}, 20, DType::f64);
  const Tensor labels = Tensor::from_vector<std::int64_t>({5}, {0, 2, 1, 1, 0});
  const HeadResult r = head.loss_and_backward(x, labels);
  const HeadNumbers::Values numbers = r.numbers.read();
  auto loss = [&](const std::vector<double>& values) {
    NoGradGuard no_grad;
    return cross_entropy(head.forward(Variable(Tensor::from_vector<double>(x.shape(), values))), labels).data().item();
  };
  CHECK(numbers.loss == doctest::Approx(loss(x.to_vector<double>())));
  const auto check = testing::check_gradient(loss, x.to_vector<double>(), r.dx.to_vector<double>());
  CHECK_MESSAGE(check.ok, check.worst);
  CHECK(numbers.correct >= 0);
  CHECK(numbers.correct <= 5);
}

TEST_CASE("a head group (reversible block, head): loss and input gradient through both") {
  Init init(4, DType::f64);
  StageGroup group({std::make_shared<ReversibleStage>(ResidualFunction::basic(2, 2, 1, init), 2, "basic"),
                    std::make_shared<HeadStage>(4, 3, init)},
                   8);
  REQUIRE(group.kind() == StageKind::head);
  const Tensor x = random_tensor({5, 4, 3, 3}, 21, DType::f64);
  const Tensor labels = Tensor::from_vector<std::int64_t>({5}, {0, 2, 1, 1, 0});
  const HeadResult r = group.loss_and_backward(x, labels);
  const HeadNumbers::Values numbers = r.numbers.read();
  auto loss = [&](const std::vector<double>& values) {
    NoGradGuard no_grad;
    RunningStatsGuard keep_stats;
    return cross_entropy(group.forward(Variable(Tensor::from_vector<double>(x.shape(), values))), labels).data().item();
  };
  CHECK(numbers.loss == doctest::Approx(loss(x.to_vector<double>())));
  const auto check = testing::check_gradient(loss, x.to_vector<double>(), r.dx.to_vector<double>());
  CHECK_MESSAGE(check.ok, check.worst);
  CHECK_THROWS_AS(group.inverse(x), ValueError);
  CHECK_THROWS_AS(StageGroup({std::make_shared<HeadStage>(4, 3, init),
                              std::make_shared<ReversibleStage>(ResidualFunction::basic(2, 2, 1, init), 2, "basic")},
                             0),
                  ValueError);
}
