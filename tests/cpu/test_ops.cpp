// tests/cpu/test_ops.cpp: the op layer: differentiable ops checked end to end through autograd by
// finite differences (float64 dispatches to the ref kernels), float32 (cpu kernels) against
// float64, and bad operands refused with petra::Error.
#include <doctest/doctest.h>

#include <functional>

#include "petra/functions.hpp"
#include "petra/optimizer_steps.hpp"
#include "tests/support/fixtures.hpp"
#include "tests/support/gradcheck.hpp"
#include "tests/support/testing.hpp"

using namespace petra;
using testing::check_op_gradients;
using testing::OpFn;
using testing::random_tensor;

namespace {

// float32 (cpu kernels) against float64 (ref kernels) on the same values.
void check_float32_matches_float64(const OpFn& f, const std::vector<Tensor>& inputs, double tolerance = 1e-5) {
  std::vector<Variable> v32, v64;
  for (const Tensor& t : inputs) {
    v32.emplace_back(t.to(DType::f32));
    v64.emplace_back(t.to(DType::f64));
  }
  NoGradGuard no_grad;
  const auto y32 = f(v32).data().to_vector<float>();
  const auto y64 = f(v64).data().to_vector<double>();
  CHECK(testing::relative_error(y32, y64) < tolerance);
}

const int kSpatial[] = {0, 2, 3};

}  // namespace

TEST_CASE("elementwise ops and reductions: gradients by finite differences") {
  const Shape s{2, 3, 4};
  check_op_gradients([](const auto& v) { return mul(sub(v[0], v[1]), add(v[0], scale(v[1], 0.5))); },
                     {random_tensor(s, 1), random_tensor(s, 2)});
  check_op_gradients([](const auto& v) { return sum(relu(v[0]), std::vector<int>{0, 2}); }, {random_tensor(s, 3)});
  check_op_gradients([](const auto& v) { return mean(v[0], std::vector<int>{1}); }, {random_tensor(s, 4)});
  check_op_gradients([](const auto& v) { return reshape(mul(v[0], v[0]), {6, 4}); }, {random_tensor(s, 5)});
}

namespace {
// ops::add/sub/mul on a and b given as values, in float32 (cpu kernels) and float64 (ref kernels),
// against the expected shape and values.
template <class Op>
void check_broadcast(Op op, const Shape& a_shape, const std::vector<double>& a, const Shape& b_shape,
                     const std::vector<double>& b, const Shape& expected_shape, const std::vector<double>& expected) {
  CAPTURE(a_shape.str());
  CAPTURE(b_shape.str());
  for (DType dtype : {DType::f32, DType::f64}) {
    CAPTURE(name_of(dtype));
    const Tensor z = op(Tensor::from_vector<double>(a_shape, a).to(dtype), Tensor::from_vector<double>(b_shape, b).to(dtype));
    CHECK(z.shape() == expected_shape);
    CHECK(z.dtype() == dtype);
    CHECK(z.to(DType::f64).to_vector<double>() == expected);
  }
}
}  // namespace

TEST_CASE("broadcasting add, sub, mul: hand-computed values") {
  // [2, 3] + [3]: the row is added to every row; either order.
  check_broadcast(ops::add, {2, 3}, {1, 2, 3, 4, 5, 6}, {3}, {10, 20, 30}, {2, 3}, {11, 22, 33, 14, 25, 36});
  check_broadcast(ops::add, {3}, {10, 20, 30}, {2, 3}, {1, 2, 3, 4, 5, 6}, {2, 3}, {11, 22, 33, 14, 25, 36});
  // [2, 1, 4] * [3, 1] -> [2, 3, 4]: z[i, j, k] = a[i, 0, k] * b[j, 0].
  check_broadcast(ops::mul, {2, 1, 4}, {1, 2, 3, 4, 5, 6, 7, 8}, {3, 1}, {1, 10, 100}, {2, 3, 4},
                  {1, 2, 3, 4, 10, 20, 30, 40, 100, 200, 300, 400,
                   5, 6, 7, 8, 50, 60, 70, 80, 500, 600, 700, 800});
  // [1] + [2, 2]: a one-element tensor stretches over both dims.
  check_broadcast(ops::add, {1}, {5}, {2, 2}, {1, 2, 3, 4}, {2, 2}, {6, 7, 8, 9});
  // [2, 1] - [3]: both operands stretch (a column against a row).
  check_broadcast(ops::sub, {2, 1}, {1, 2}, {3}, {10, 20, 30}, {2, 3}, {-9, -19, -29, -8, -18, -28});
  // Scalar-like cases: [1] against [3], [1] against [1] (equal shapes), [1, 1] against [3], and a
  // zero-dim tensor.
  check_broadcast(ops::sub, {1}, {10}, {3}, {1, 2, 3}, {3}, {9, 8, 7});
  check_broadcast(ops::sub, {3}, {1, 2, 3}, {1}, {10}, {3}, {-9, -8, -7});
  check_broadcast(ops::mul, {1}, {3}, {1}, {4}, {1}, {12});
  check_broadcast(ops::mul, {1, 1}, {2}, {3}, {1, 2, 3}, {1, 3}, {2, 4, 6});
  check_broadcast(ops::add, Shape(), {0.5}, {2}, {1, 2}, {2}, {1.5, 2.5});
}

TEST_CASE("broadcasting: incompatible shapes raise ShapeError naming the op and both shapes") {
  const Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({3, 2}), c = Tensor::zeros({2});
  for (const char* op : {"add", "sub", "mul"}) {
    CAPTURE(op);
    const std::string name = op;
    const auto run = [&](const Tensor& x, const Tensor& y) {
      return name == "add" ? ops::add(x, y) : name == "sub" ? ops::sub(x, y) : ops::mul(x, y);
    };
    CHECK_THROWS_AS(run(a, b), ShapeError);
    CHECK_THROWS_AS(run(a, c), ShapeError);  // trailing 3 against 2
    try {
      run(a, b);
    } catch (const ShapeError& e) {
      const std::string message = e.what();
      CAPTURE(message);
      CHECK(message.rfind(name + ": ", 0) == 0);
      CHECK(message.find("[2, 3]") != std::string::npos);
      CHECK(message.find("[3, 2]") != std::string::npos);
    }
  }
  // The Variable ops raise the same error.
  CHECK_THROWS_WITH_AS(mul(Variable(a, true), Variable(c)), doctest::Contains("mul: shapes [2, 3] and [2]"), ShapeError);
  // Still refused before any broadcasting: another dtype, a strided operand.
  CHECK_THROWS_AS(ops::add(a, Tensor::zeros({3}, DType::f64)), ShapeError);
  CHECK_THROWS_AS(ops::mul(Tensor::zeros({2, 4}).slice(1, 0, 2), Tensor::zeros({2})), ShapeError);
  CHECK(ops::broadcast_shape({2, 1, 4}, {3, 1}) == Shape{2, 3, 4});
  CHECK_THROWS_AS(ops::broadcast_shape({4}, {3}), ShapeError);
}

TEST_CASE("broadcast_to repeats size-1 and missing leading dims; sum_to is its backward") {
  const Tensor row = Tensor::from_vector<double>({3}, {1, 2, 3});
  CHECK(ops::broadcast_to(row, {2, 3}).to_vector<double>() == std::vector<double>{1, 2, 3, 1, 2, 3});
  const Tensor column = Tensor::from_vector<float>({2, 1}, {1, 2});
  CHECK(ops::broadcast_to(column, {2, 2, 3}).to_vector<float>() ==
        std::vector<float>{1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2});
  CHECK_THROWS_AS(ops::broadcast_to(row, {3, 2}), ShapeError);
  CHECK_THROWS_AS(ops::broadcast_to(Tensor::zeros({2, 3}), {3}), ShapeError);  // more dims than the target

  const Tensor x = Tensor::from_vector<double>({2, 3}, {1, 2, 3, 4, 5, 6});
  CHECK(ops::sum_to(x, {3}).shape() == Shape{3});
  CHECK(ops::sum_to(x, {3}).to_vector<double>() == std::vector<double>{5, 7, 9});
  CHECK(ops::sum_to(x, {2, 1}).to_vector<double>() == std::vector<double>{6, 15});
  CHECK(ops::sum_to(x, {1}).to_vector<double>() == std::vector<double>{21});
  CHECK(ops::sum_to(x, Shape()).item() == 21);
  CHECK(ops::sum_to(x, {1, 3}).to_vector<double>() == std::vector<double>{5, 7, 9});
  CHECK(ops::sum_to(x, {1, 3}).shape() == Shape{1, 3});
  CHECK_THROWS_AS(ops::sum_to(x, {1, 2, 3}), ShapeError);  // [1, 2, 3] does not broadcast to [2, 3]
  CHECK(ops::sum_to(x, {2, 3}).storage() == x.storage());       // equal shapes: x itself
  CHECK_THROWS_AS(ops::sum_to(x, {2}), ShapeError);
}

TEST_CASE("broadcasting add, sub, mul: gradients reduce over the stretched dims (finite differences)") {
  const std::vector<std::pair<Shape, Shape>> pairs{
      {{2, 3}, {3}}, {{3}, {2, 3}}, {{2, 1, 4}, {3, 1}}, {{1}, {2, 2}}, {{2, 1}, {1, 3}}, {{1}, {3}}, {{2, 3}, {1, 1}}};
  std::uint64_t seed = 20;
  for (const auto& [a, b] : pairs) {
    CAPTURE(a.str());
    CAPTURE(b.str());
    const std::vector<Tensor> inputs{random_tensor(a, ++seed), random_tensor(b, ++seed)};
    check_op_gradients([](const auto& v) { return add(v[0], v[1]); }, inputs);
    check_op_gradients([](const auto& v) { return sub(v[0], v[1]); }, inputs);
    check_op_gradients([](const auto& v) { return mul(v[0], v[1]); }, inputs);
    // Both operands used twice, through broadcasting ops of both kinds.
    check_op_gradients([](const auto& v) { return mul(sub(v[0], v[1]), add(v[1], mul(v[0], v[1]))); }, inputs);
  }
  // The gradient of a stretched operand is the sum over the stretched dims, by hand: d(sum(a + b))/db
  // for a [2, 3] and b [3] is 2 per element; d(sum(a * b))/db is the column sums of a.
  const Variable a(Tensor::from_vector<double>({2, 3}, {1, 2, 3, 4, 5, 6}), true);
  const Variable b(Tensor::from_vector<double>({3}, {1, 1, 1}), true);
  sum(add(a, b)).backward();
  CHECK(b.grad().shape() == Shape{3});
  CHECK(b.grad().to_vector<double>() == std::vector<double>{2, 2, 2});
  b.zero_grad();
  sum(mul(a, b)).backward();
  CHECK(b.grad().to_vector<double>() == std::vector<double>{5, 7, 9});
}

TEST_CASE("broadcasting in float32 matches float64") {
  const OpFn f = [](const auto& v) { return mul(add(v[0], v[1]), sub(v[1], v[0])); };
  check_float32_matches_float64(f, {random_tensor({4, 1, 5}, 1), random_tensor({3, 5}, 2)});
}

TEST_CASE("conv2d: gradients for x, w and bias; float32 matches float64") {
  const Conv2dOptions o{2, 1};
  const OpFn f = [o](const auto& v) { return conv2d(v[0], v[1], v[2], o); };
  const std::vector<Tensor> inputs{random_tensor({2, 3, 5, 6}, 1), random_tensor({4, 3, 3, 3}, 2),
                                   random_tensor({4}, 3)};
  check_op_gradients(f, inputs);
  check_float32_matches_float64(f, inputs);
}

TEST_CASE("batch_norm (training): gradients for x, gamma, beta; running statistics move") {
  const OpFn f = [](const auto& v) { return batch_norm(v[0], v[1], v[2], Tensor(), Tensor(), {}); };
  const std::vector<Tensor> inputs{random_tensor({3, 2, 3, 2}, 1), random_tensor({2}, 2), random_tensor({2}, 3)};
  check_op_gradients(f, inputs);
  check_float32_matches_float64(f, inputs);

  const Tensor running_mean = Tensor::zeros({2}, DType::f64), running_var = Tensor::full({2}, 1.0, DType::f64);
  const Variable x(inputs[0]);
  const Variable gamma(inputs[1]), beta(inputs[2]);
  batch_norm(x, gamma, beta, running_mean, running_var, {});
  const Tensor batch_mean = ops::mean(inputs[0], kSpatial);
  CHECK(running_mean.to_vector<double>()[1] == doctest::Approx(0.1 * batch_mean.to_vector<double>()[1]));
}

TEST_CASE("batch_norm_relu (training): gradients by finite differences; equals relu(batch_norm) and its statistics") {
  const OpFn f = [](const auto& v) { return batch_norm_relu(v[0], v[1], v[2], Tensor(), Tensor(), {}); };
  // beta in [-1, 1) and gamma in [-1, 1): some outputs under the ReLU, none at its kink (seeded).
  const std::vector<Tensor> inputs{random_tensor({3, 2, 3, 2}, 11), random_tensor({2}, 12), random_tensor({2}, 13)};
  check_op_gradients(f, inputs);
  check_float32_matches_float64(f, inputs);

  // Against the unfused pair in float32 (the trained dtype): same y, same gradients, same running
  // statistics, bit for bit.
  const Tensor x32 = inputs[0].to(DType::f32), g32 = inputs[1].to(DType::f32), b32 = inputs[2].to(DType::f32);
  const Tensor seed = random_tensor({3, 2, 3, 2}, 14).to(DType::f32);
  std::vector<std::vector<float>> results[2];
  for (int fused = 0; fused < 2; ++fused) {
    const Tensor running_mean = Tensor::zeros({2}), running_var = Tensor::full({2}, 1.0);
    const Variable x(x32.clone(), true), gamma(g32.clone(), true), beta(b32.clone(), true);
    const Variable y = fused ? batch_norm_relu(x, gamma, beta, running_mean, running_var, {})
                             : relu(batch_norm(x, gamma, beta, running_mean, running_var, {}));
    const Variable outputs[] = {y};
    const Tensor seeds[] = {seed};
    petra::backward(outputs, seeds);
    results[fused] = {y.data().to_vector<float>(), x.grad().to_vector<float>(), gamma.grad().to_vector<float>(),
                      beta.grad().to_vector<float>(), running_mean.to_vector<float>(), running_var.to_vector<float>()};
  }
  CHECK(results[1] == results[0]);
  const auto& y = results[1][0];
  CHECK(std::count(y.begin(), y.end(), 0.f) > 0);  // the mask is exercised
}

TEST_CASE("batch_norm_relu's backward writes dx over dy where it may, with the same bits") {
  const Tensor x32 = random_tensor({3, 2, 5, 4}, 21).to(DType::f32), g32 = random_tensor({2}, 22).to(DType::f32),
               b32 = random_tensor({2}, 23).to(DType::f32), seed = random_tensor({3, 2, 5, 4}, 24).to(DType::f32);
  // Through autograd: behind `scale`, batch norm's upstream gradient is the engine's alone, so the
  // fused backward takes its storage for dx; the unfused pair gives the bits to expect.
  std::vector<float> grads[2];
  for (int fused = 0; fused < 2; ++fused) {
    const Variable x(x32.clone(), true), gamma(g32.clone(), true), beta(b32.clone(), true);
    const Variable y = fused ? batch_norm_relu(x, gamma, beta, Tensor(), Tensor(), {})
                             : relu(batch_norm(x, gamma, beta, Tensor(), Tensor(), {}));
    const Variable outputs[] = {scale(y, 3.0)};
    const Tensor seeds[] = {seed};
    petra::backward(outputs, seeds);
    grads[fused] = x.grad().to_vector<float>();
  }
  CHECK(grads[1] == grads[0]);

  // In ops: dx is written over dy when the caller gives dy up and dy is contiguous, else into a
  // tensor of its own.
  ops::BatchNormSaved saved;
  ops::batchnorm_relu_forward(x32, g32, b32, Tensor(), Tensor(), {}, &saved);
  REQUIRE(saved.affine.defined());
  const Tensor zeros = Tensor::zeros({2}, DType::f32);
  const Tensor apart = ops::batchnorm_relu_backward(x32, Tensor(), seed, g32, saved, zeros.clone(), zeros.clone());
  const Tensor dy = seed.clone();
  const Tensor over = ops::batchnorm_relu_backward(x32, Tensor(), dy, g32, saved, zeros.clone(), zeros.clone(), {}, true);
  CHECK(over.raw_data() == dy.raw_data());
  CHECK(over.to_vector<float>() == apart.to_vector<float>());
  const Tensor wide = Tensor::zeros({3, 4, 5, 4}, DType::f32);
  ops::channel_accumulate_into(wide, seed, 1);  // the seed as channels 1-2 of a wider tensor: a strided view
  const Tensor strided = wide.slice(1, 1, 3);
  const Tensor elsewhere =
      ops::batchnorm_relu_backward(x32, Tensor(), strided, g32, saved, zeros.clone(), zeros.clone(), {}, true);
  CHECK(elsewhere.raw_data() != strided.raw_data());
  CHECK(elsewhere.to_vector<float>() == apart.to_vector<float>());
  CHECK(strided.contiguous().to_vector<float>() == seed.to_vector<float>());  // not written over
}

TEST_CASE("cross_entropy: gradient by finite differences, value by hand") {
  const Tensor labels = Tensor::from_vector<std::int64_t>({3}, {2, 0, 1});
  check_op_gradients([&](const auto& v) { return cross_entropy(v[0], labels); }, {random_tensor({3, 4}, 7)});
  // Uniform logits: the loss is log(classes).
  const Variable uniform(Tensor::zeros({3, 4}, DType::f64));
  CHECK(cross_entropy(uniform, labels).data().item() == doctest::Approx(std::log(4.0)));
  const Tensor logits = Tensor::from_vector<float>({3, 4}, {0, 0, 9, 0, 9, 0, 0, 0, 0, 0, 0, 9});
  CHECK(ops::count_correct(logits, labels) == 2);
  CHECK(ops::argmax(logits).to_vector<std::int64_t>() == std::vector<std::int64_t>{2, 0, 3});
}

TEST_CASE("bad operands raise petra::Error naming the op") {
  const Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({3, 2});
  CHECK_THROWS_AS(ops::add(a, b), ShapeError);
  CHECK_THROWS_AS(ops::add(a, Tensor::zeros({2, 3}, DType::f64)), ShapeError);
  CHECK_THROWS_AS(ops::relu(Tensor::zeros({2}, DType::i64)), ShapeError);
  CHECK_THROWS_AS(ops::add(a.slice(1, 0, 2).slice(0, 0, 2), a.slice(1, 0, 2)), ShapeError);  // strided
  const std::vector<int> bad_dim{5};
  CHECK_THROWS_AS(ops::sum(a, bad_dim), ShapeError);

  const Tensor x = Tensor::zeros({2, 3, 8, 8}), w = Tensor::zeros({4, 3, 3, 3});
  CHECK_THROWS_AS(ops::conv2d_forward(x, Tensor::zeros({4, 2, 3, 3}), Tensor(), {}), ShapeError);  // channels
  CHECK_THROWS_AS(ops::conv2d_forward(x, w, Tensor::zeros({3}), {}), ShapeError);                // bias size
  CHECK_THROWS_AS(ops::conv2d_forward(x.reshape({6, 8, 8}), w, Tensor(), {}), ShapeError);       // rank
  CHECK_THROWS_AS(ops::conv2d_forward(x, Tensor::zeros({4, 3, 11, 11}), Tensor(), {}), ShapeError);  // too big
  CHECK_THROWS_AS(ops::conv2d_forward(x, w, Tensor(), {0, 1}), ValueError);                       // stride 0
  try {
    ops::conv2d_forward(x, Tensor::zeros({4, 2, 3, 3}), Tensor(), {});
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("[2, 3, 8, 8]") != std::string::npos);
  }

  ops::BatchNormSaved saved;
  const Tensor g = Tensor::zeros({3});
  CHECK_THROWS_AS(ops::batchnorm_forward(x, Tensor::zeros({4}), g, Tensor(), Tensor(), {}, &saved), ShapeError);
  CHECK_THROWS_AS(ops::batchnorm_forward(Tensor::zeros({1, 3, 1, 1}), g, g, Tensor(), Tensor(), {}, &saved),
                  ShapeError);  // one value per channel cannot be normalised
  CHECK_THROWS_AS(ops::batchnorm_forward(x, g, g, Tensor(), Tensor(), {false}, &saved), ValueError);
  CHECK_THROWS_AS(ops::batchnorm_relu_forward(x, Tensor::zeros({4}), g, Tensor(), Tensor(), {}, &saved), ShapeError);
  CHECK_THROWS_AS(ops::batchnorm_relu_forward(x, g, g, Tensor(), Tensor(), {false}, &saved), ValueError);
  {
    const Tensor y = ops::batchnorm_relu_forward(x, g, g, Tensor(), Tensor(), {}, &saved);
    ops::BatchNormSaved without_map = saved;
    without_map.affine = Tensor();
    CHECK_THROWS_AS(ops::batchnorm_relu_backward(x, Tensor(), x, g, without_map, g, g), ValueError);  // no mask
    // The CPU forward saved its map: the mask comes from x, and y may be left out.
    REQUIRE(saved.affine.defined());
    // (test_batchnorm.cpp checks that both masks give the same bits.)
    CHECK(ops::batchnorm_relu_backward(x, Tensor(), x, g, saved, Tensor::zeros({3}), Tensor::zeros({3})).shape() ==
          x.shape());
    CHECK_THROWS_AS(ops::batchnorm_relu_backward(x, y.reshape({2, 3, 64}), x, g, saved, g, g), ShapeError);
  }

  ops::CrossEntropySaved ce;
  const Tensor logits = Tensor::zeros({2, 5});
  CHECK_THROWS_AS(ops::cross_entropy_forward(logits, Tensor::from_vector<std::int64_t>({2}, {1, 5}), &ce), ValueError);
  CHECK_THROWS_AS(ops::cross_entropy_forward(logits, Tensor::from_vector<std::int64_t>({2}, {1, -1}), &ce), ValueError);
  CHECK_THROWS_AS(ops::cross_entropy_forward(logits, Tensor::from_vector<float>({2}, {1, 0}), &ce), ShapeError);
  CHECK_THROWS_AS(ops::cross_entropy_forward(logits, Tensor::from_vector<std::int64_t>({3}, {1, 0, 0}), &ce), ShapeError);
  // Deferred: the forward returns, and check_labels raises the same error later.
  const Tensor bad_labels = Tensor::from_vector<std::int64_t>({2}, {1, 7});
  ops::cross_entropy_forward(logits, bad_labels, &ce, ops::LabelCheck::deferred);
  CHECK(ce.first_bad.to_vector<std::int64_t>() == std::vector<std::int64_t>{1});
  CHECK_THROWS_WITH_AS(ops::check_labels(ce.first_bad, bad_labels, 5),
                       "cross_entropy: label 7 of sample 1 is outside [0, 5)", ValueError);
  ops::cross_entropy_forward(logits, Tensor::from_vector<std::int64_t>({2}, {1, 4}), &ce, ops::LabelCheck::deferred);
  CHECK(ce.first_bad.to_vector<std::int64_t>() == std::vector<std::int64_t>{-1});
  CHECK_THROWS_AS(ops::check_labels(Tensor::zeros({1}), bad_labels, 5), ShapeError);  // not int64

  const Tensor p = Tensor::zeros({4});
  SgdOptions nesterov_with_dampening;
  nesterov_with_dampening.momentum = 0.9;
  nesterov_with_dampening.dampening = 0.1;
  nesterov_with_dampening.nesterov = true;
  CHECK_THROWS_AS(ops::sgd_step(p, p.clone(), p.clone(), nesterov_with_dampening, true), ValueError);
  CHECK_THROWS_AS(ops::adam_step(p, Tensor::zeros({5}), p.clone(), p.clone(), {}, 1), ShapeError);
  CHECK_THROWS_AS(ops::adam_step(p, p.clone(), p.clone(), p.clone(), {}, 0), ValueError);
}

TEST_CASE("an SGD step through the op layer matches PyTorch's formula") {
  const Tensor p = Tensor::from_vector<float>({2}, {1.0f, -2.0f});
  const Tensor g = Tensor::from_vector<float>({2}, {0.5f, 0.25f});
  const Tensor buf = Tensor::zeros({2});
  SgdOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.weight_decay = 0.01;
  ops::sgd_step(p, g, buf, o, /*first_step=*/true);  // buf = g + wd p; p -= lr buf
  CHECK(p.to_vector<float>()[0] == doctest::Approx(1.0 - 0.1 * (0.5 + 0.01 * 1.0)));
  ops::sgd_step(p, g, buf, o, false);  // buf = 0.9 buf + (g + wd p)
  const double p1 = 1.0 - 0.1 * 0.51, b1 = 0.51;
  CHECK(p.to_vector<float>()[0] == doctest::Approx(p1 - 0.1 * (0.9 * b1 + 0.5 + 0.01 * p1)));
}

TEST_CASE("linear: gradients for x, w and bias; float32 matches float64") {
  const OpFn f = [](const auto& v) { return linear(v[0], v[1], v[2]); };
  const std::vector<Tensor> inputs{random_tensor({3, 5}, 1), random_tensor({4, 5}, 2), random_tensor({4}, 3)};
  check_op_gradients(f, inputs);
  check_float32_matches_float64(f, inputs);
  CHECK_THROWS_AS(ops::linear_forward(Tensor::zeros({3, 5}), Tensor::zeros({4, 6}), Tensor()), ShapeError);
}

TEST_CASE("pooling: max, average and global average") {
  // Distinct values, so the max is never tied and finite differences do not cross a kink.
  std::vector<double> distinct(2 * 3 * 5 * 5);
  for (std::size_t i = 0; i < distinct.size(); ++i) distinct[i] = static_cast<double>((i * 37) % distinct.size()) / 10.0;
  const Tensor x = Tensor::from_vector<double>({2, 3, 5, 5}, distinct);
  const Pool2dOptions max_opts{3, 2, 1}, avg_opts{2, 2, 0};
  check_op_gradients([&](const auto& v) { return max_pool2d(v[0], max_opts); }, {x});
  check_op_gradients([&](const auto& v) { return avg_pool2d(v[0], avg_opts); }, {random_tensor({2, 3, 5, 4}, 1)});
  check_op_gradients([](const auto& v) { return global_avg_pool(v[0]); }, {random_tensor({2, 3, 3, 2}, 2)});
  check_float32_matches_float64([&](const auto& v) { return max_pool2d(v[0], max_opts); }, {x});
  CHECK_THROWS_AS(ops::max_pool2d_forward(Tensor::zeros({1, 1, 4, 4}), {2, 2, 2}, nullptr), ValueError);
  CHECK_THROWS_AS(ops::avg_pool2d_forward(Tensor::zeros({1, 1, 2, 2}), {3, 1, 0}), ShapeError);
}

TEST_CASE("split and concat channels are each other's inverse, with gradients") {
  const std::vector<std::int64_t> sizes{1, 3, 2};
  const Tensor x = random_tensor({2, 6, 2, 3}, 4);
  check_op_gradients([&](const auto& v) { return split_channels(v[0], sizes)[1]; }, {x});  // others get no gradient
  check_op_gradients([](const auto& v) { return concat_channels(std::vector<Variable>{v[0], v[1]}); },
                     {random_tensor({2, 2, 3, 1}, 5), random_tensor({2, 3, 3, 1}, 6)});
  NoGradGuard no_grad;
  const auto parts = split_channels(Variable(x), sizes);
  CHECK(concat_channels(parts).data().to_vector<double>() == x.to_vector<double>());
  CHECK_THROWS_AS(split_channels(Variable(x), std::vector<std::int64_t>{1, 2}), ShapeError);
}

TEST_CASE("coupling: the inverse restores the input; gradients flow to both streams and f") {
  const Tensor x = random_tensor({2, 6, 3, 3}, 8, DType::f32), f = random_tensor({2, 3, 3, 3}, 9, DType::f32);
  const Tensor y = ops::coupling_forward(x, f);
  const Tensor back = ops::coupling_inverse(y, f);
  const auto xv = x.to_vector<float>(), bv = back.to_vector<float>();
  const Tensor first_stream_x = ops::channel_slice(x, 0, 3), first_stream_back = ops::channel_slice(back, 0, 3);
  CHECK(first_stream_back.to_vector<float>() == first_stream_x.to_vector<float>());  // bit for bit
  CHECK(testing::relative_error(bv, xv) < 1e-6);
  // A full reversible stage: y = coupling(x, F(x1)) with F = relu(x1 * w); the gradient reaches x
  // through both the swap and F.
  const Tensor w = random_tensor({2, 3, 3, 3}, 10);
  check_op_gradients(
      [&](const auto& v) {
        const auto streams = split_channels(v[0], std::vector<std::int64_t>{3, 3});
        return coupling(v[0], relu(mul(streams[0], Variable(w))));
      },
      {random_tensor({2, 6, 3, 3}, 11)});
  CHECK_THROWS_AS(ops::coupling_forward(Tensor::zeros({2, 5, 3, 3}), Tensor::zeros({2, 2, 3, 3})), ShapeError);
}

TEST_CASE("ops::relative_error: ||a - e|| / ||e|| in double, for float and double tensors") {
  const Tensor exact = Tensor::from_vector<float>({2, 2}, {3, 0, 0, 4});     // norm 5
  const Tensor approx = Tensor::from_vector<float>({2, 2}, {3, 1, 0, 4});    // difference norm 1
  CHECK(ops::relative_error(approx, exact) == doctest::Approx(0.2).epsilon(1e-12));
  CHECK(ops::relative_error(exact, exact) == 0.0);
  const Tensor exact64 = Tensor::from_vector<double>({2}, {1e-100, 0});
  CHECK(ops::relative_error(Tensor::from_vector<double>({2}, {2e-100, 0}), exact64) == doctest::Approx(1.0));
  CHECK_THROWS_AS(ops::relative_error(approx, Tensor::zeros({4})), ShapeError);
}
