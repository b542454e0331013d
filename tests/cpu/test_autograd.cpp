// tests/cpu/test_autograd.cpp: the backward engine: hand-derived gradients, freed graphs, vjp,
// the no-grad guard.
#include <doctest/doctest.h>

#include <cmath>

#include "petra/functions.hpp"
#include "tests/support/gradcheck.hpp"
#include "tests/support/testing.hpp"

using namespace petra;

namespace {
Variable param(const std::vector<double>& v, int owner = kNoOwner) {
  MemoryScope scope(MemoryTag::parameters, owner);
  return Variable(Tensor::from_vector<double>({static_cast<std::int64_t>(v.size())}, v), true);
}
Tensor ones_like(const Variable& v) { return Tensor::full(v.shape(), 1.0, v.data().dtype()); }

// y = relu(a * b + c) * a, elementwise.
Variable chain(const Variable& a, const Variable& b, const Variable& c) { return mul(relu(add(mul(a, b), c)), a); }
}  // namespace

TEST_CASE("a chain of ops gives the hand-derived gradient") {
  const std::vector<double> av{0.5, -1.0, 2.0, 1.5}, bv{2.0, 3.0, -0.25, 1.0}, cv{0.1, 0.2, 0.3, -2.0};
  const Variable a = param(av), b = param(bv), c = param(cv);
  const Variable y = chain(a, b, c);
  y.backward(ones_like(y));
  // z = a b + c; y = relu(z) a; dy/da = [z>0] (b a + z), dy/db = [z>0] a^2, dy/dc = [z>0] a.
  for (std::size_t i = 0; i < av.size(); ++i) {
    const double z = av[i] * bv[i] + cv[i];
    const double on = z > 0 ? 1.0 : 0.0;
    CHECK(a.grad().to_vector<double>()[i] == doctest::Approx(on * (bv[i] * av[i] + z)));
    CHECK(b.grad().to_vector<double>()[i] == doctest::Approx(on * av[i] * av[i]));
    CHECK(c.grad().to_vector<double>()[i] == doctest::Approx(on * av[i]));
  }
}

TEST_CASE("the engine's gradient matches finite differences (float64)") {
  const auto av = testing::random_values<double>(6, 11), bv = testing::random_values<double>(6, 12),
             cv = testing::random_values<double>(6, 13), gv = testing::random_values<double>(6, 14);
  const Variable a = param(av), b = param(bv), c = param(cv);
  const Variable y = chain(a, b, c);
  y.backward(Tensor::from_vector<double>({6}, gv));
  // L(a) = <g, chain(a, b, c)> with b and c fixed.
  const auto loss_in_a = testing::vjp_loss([](const auto& v) { return chain(v[0], v[1], v[2]); },
                                           {a.data(), b.data(), c.data()}, 0, Tensor::from_vector<double>({6}, gv));
  const auto r = testing::check_gradient(loss_in_a, av, a.grad().to_vector<double>());
  CHECK_MESSAGE(r.ok, r.worst);
}

TEST_CASE("fan-out accumulates, and leaf gradients add up over passes") {
  const Variable a = param({1.0, 2.0});
  Variable y = add(a, a);  // dy/da = 2
  y.backward(ones_like(y));
  CHECK(a.grad().to_vector<double>() == std::vector<double>{2.0, 2.0});
  y = mul(a, a);  // dy/da = 2a, added to the 2 already there
  y.backward(ones_like(y));
  CHECK(a.grad().to_vector<double>() == std::vector<double>{4.0, 6.0});
  CHECK(a.grad().storage()->tag() == MemoryTag::gradients);
  a.zero_grad();
  CHECK_FALSE(a.grad().defined());
}

TEST_CASE("backward frees the graph and what it saved: activations return to baseline") {
  const Variable a = param(testing::random_values<double>(1000, 1), 3);
  const Variable b = param(testing::random_values<double>(1000, 2), 3);
  const Device cpu = Device::cpu();
  const auto activations_before = Allocator::instance().stats(cpu, MemoryTag::activations).current;
  Variable y;
  {
    MemoryScope scope(MemoryTag::activations, 3);
    y = chain(a, b, a);  // saves a, b, the relu output ...
    CHECK(Allocator::instance().stats(cpu, MemoryTag::activations).current - activations_before > 2 * 8000);
    y.backward(ones_like(y));
  }
  // Only y's own data is still held: every saved tensor and every intermediate gradient is gone.
  CHECK(Allocator::instance().stats(cpu, MemoryTag::activations).current - activations_before == 8000);
  CHECK(y.grad_fn()->released());
  CHECK_THROWS_AS(y.backward(ones_like(y)), Error);  // a second pass needs retain_graph
  y = Variable();
  CHECK(Allocator::instance().stats(cpu, MemoryTag::activations).current == activations_before);
  CHECK(Allocator::instance().stats(cpu, MemoryTag::gradients, 3).current == 2 * 8000);
}

TEST_CASE("retain_graph keeps the nodes for a second pass") {
  const Variable a = param({3.0});
  const Variable y = mul(a, a);
  const Variable outputs[] = {y};
  const Tensor seeds[] = {ones_like(y)};
  backward(outputs, seeds, {}, /*retain_graph=*/true);
  backward(outputs, seeds);
  CHECK(a.grad().to_vector<double>()[0] == 12.0);
}

TEST_CASE("vjp returns gradients for leaves and intermediates without touching .grad") {
  const Variable a = param({1.0, -2.0}), b = param({3.0, 4.0});
  const Variable h = mul(a, b);
  const Variable y = scale(h, 5.0);
  const Variable outputs[] = {y};
  const Tensor seeds[] = {Tensor::from_vector<double>({2}, {1.0, 10.0})};
  const Variable wrt[] = {a, h};
  const auto grads = vjp(outputs, seeds, wrt);
  REQUIRE(grads.size() == 2);
  CHECK(grads[0].to_vector<double>() == std::vector<double>{15.0, 200.0});  // 5 * b * seed
  CHECK(grads[1].to_vector<double>() == std::vector<double>{5.0, 50.0});    // 5 * seed
  CHECK_FALSE(a.grad().defined());
  CHECK_FALSE(b.grad().defined());
}

TEST_CASE("the no-grad guard records nothing") {
  const Variable a = param({1.0, 2.0});
  Variable y;
  {
    NoGradGuard guard;
    CHECK_FALSE(grad_enabled());
    y = chain(a, a, a);
  }
  CHECK(grad_enabled());
  CHECK(y.grad_fn() == nullptr);
  CHECK_FALSE(y.requires_grad());
  const Variable z = chain(a, a, a);
  CHECK(z.grad_fn() != nullptr);
}

TEST_CASE("bad gradients are refused with the shapes in the message") {
  const Variable a = param({1.0, 2.0});
  const Variable y = scale(a, 2.0);
  CHECK_THROWS_AS(y.backward(Tensor::zeros({3}, DType::f64)), ShapeError);
  CHECK_THROWS_AS(y.backward(), ShapeError);  // non-scalar needs a seed
  CHECK_THROWS_AS(Variable(Tensor::zeros({2}, DType::i64), true), ValueError);
}

TEST_CASE("backward with a capture list returns the captured gradients and stores the others") {
  const Variable x = param({1.0, 2.0}), w = param({3.0, 4.0});
  const Variable y = mul(x, w);
  const Variable outputs[] = {y};
  const Tensor seeds[] = {ones_like(y)};
  const Variable capture[] = {x};
  const auto got = backward(outputs, seeds, capture);
  CHECK(got[0].to_vector<double>() == std::vector<double>{3.0, 4.0});
  CHECK_FALSE(x.grad().defined());  // returned, not also stored: no copy of an input-sized gradient
  CHECK(w.grad().to_vector<double>() == std::vector<double>{1.0, 2.0});
}

TEST_CASE("Variable operators: values and hand-derived gradients") {
  const std::vector<double> av{0.5, -1.0, 2.0}, bv{3.0, 0.25, -2.0};
  const Variable a = param(av), b = param(bv);
  // y = 2a * b - a + 1 + (1 - b) - 0.5 + (-a) * 3  =>  dy/da = 2b - 1 - 3, dy/db = 2a - 1.
  const Variable y = 2.0 * a * b - a + 1.0 + (1.0 - b) - 0.5 + (-a) * 3.0;
  y.backward(ones_like(y));
  for (std::size_t i = 0; i < av.size(); ++i) {
    CAPTURE(i);
    CHECK(y.data().to_vector<double>()[i] == doctest::Approx(2 * av[i] * bv[i] - av[i] + 1 + (1 - bv[i]) - 0.5 - 3 * av[i]));
    CHECK(a.grad().to_vector<double>()[i] == doctest::Approx(2 * bv[i] - 4));
    CHECK(b.grad().to_vector<double>()[i] == doctest::Approx(2 * av[i] - 1));
  }
  // Each operator is its named function: same values, bit for bit.
  NoGradGuard no_grad;
  const auto values = [](const Variable& v) { return v.data().to_vector<double>(); };
  CHECK(values(a + b) == values(add(a, b)));
  CHECK(values(a - b) == values(sub(a, b)));
  CHECK(values(a * b) == values(mul(a, b)));
  CHECK(values(-a) == values(scale(a, -1.0)));
  CHECK(values(a * 2.0) == values(scale(a, 2.0)));
  CHECK(values(2.0 * a) == values(scale(a, 2.0)));
  CHECK(values(1.0 + a) == std::vector<double>{1.5, 0.0, 3.0});
  CHECK(values(a + 1.0) == std::vector<double>{1.5, 0.0, 3.0});
  CHECK(values(a - 1.0) == std::vector<double>{-0.5, -2.0, 1.0});
  CHECK(values(1.0 - a) == std::vector<double>{0.5, 2.0, -1.0});
}

TEST_CASE("Variable operators broadcast, keep the operand's shape and dtype, and pass finite differences") {
  // A squared error with a bias row: L = sum(((x * w + bias) - t)^2) for x [4, 3], w and bias [3].
  const auto xv = testing::random_values<double>(12, 21), tv = testing::random_values<double>(12, 22);
  const auto wv = testing::random_values<double>(3, 23), bv = testing::random_values<double>(3, 24);
  const Variable x(Tensor::from_vector<double>({4, 3}, xv)), t(Tensor::from_vector<double>({4, 3}, tv));
  const Variable w = param(wv), bias = param(bv);
  const auto loss = [&](const Variable& weight, const Variable& b) {
    const Variable e = x * weight + b - t;
    return sum(e * e);
  };
  const Variable l = loss(w, bias);
  CHECK(l.shape() == Shape{1, 1});
  l.backward();
  CHECK(w.grad().shape() == Shape{3});
  CHECK(bias.grad().shape() == Shape{3});
  const auto numeric_loss = [&](bool in_w) {
    return [&, in_w](const std::vector<double>& v) {
      NoGradGuard no_grad;
      const Variable probe(Tensor::from_vector<double>({3}, v));
      return loss(in_w ? probe : w.detach(), in_w ? bias.detach() : probe).data().item();
    };
  };
  const auto rw = testing::check_gradient(numeric_loss(true), wv, w.grad().to_vector<double>());
  CHECK_MESSAGE(rw.ok, rw.worst);
  const auto rb = testing::check_gradient(numeric_loss(false), bv, bias.grad().to_vector<double>());
  CHECK_MESSAGE(rb.ok, rb.worst);

  // A double added to a float32 variable keeps its dtype and shape.
  const Variable f(Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4}));
  const Variable shifted = 1.0 - f + 0.5;
  CHECK(shifted.data().dtype() == DType::f32);
  CHECK(shifted.shape() == Shape{2, 2});
  CHECK(shifted.data().to_vector<float>() == std::vector<float>{0.5f, -0.5f, -1.5f, -2.5f});
}

// ---- channel pieces: slice_channels' gradient is added into its input's gradient in place
namespace {
Variable leaf4(const Shape& shape, std::uint64_t seed) {
  MemoryScope scope(MemoryTag::parameters, kNoOwner);
  return Variable(Tensor::from_vector<double>(shape, testing::random_values<double>(shape.numel(), seed)), true);
}
Tensor values4(const Shape& shape, std::uint64_t seed) {
  return Tensor::from_vector<double>(shape, testing::random_values<double>(shape.numel(), seed));
}
// 2 * (3 gq + gp placed at channels [1, 3)): the gradient of x for q = 3 u, p = u[:, 1:3], u = 2 x.
std::vector<double> expected_piece_gradient(const Shape& shape, const Tensor& gq, const Tensor& gp) {
  const auto q = gq.to_vector<double>(), p = gp.to_vector<double>();
  const std::int64_t plane = shape[2] * shape[3];
  std::vector<double> dx(q.size());
  for (std::int64_t n = 0; n < shape[0]; ++n)
    for (std::int64_t c = 0; c < shape[1]; ++c)
      for (std::int64_t i = 0; i < plane; ++i) {
        const std::int64_t k = (n * shape[1] + c) * plane + i;
        const double piece = c >= 1 && c < 3 ? p[((n * 2) + c - 1) * plane + i] : 0.0;
        dx[k] = 2 * (3 * q[k] + piece);
      }
  return dx;
}
}  // namespace

TEST_CASE("a channel slice's gradient lands in its channels, added in place or not, with the same bits") {
  const Shape shape{2, 4, 3, 2};
  const Tensor gq = values4(shape, 21), gp = values4(shape.with(1, 2), 22);
  const std::vector<double> expected = expected_piece_gradient(shape, gq, gp);
  std::vector<std::vector<double>> grads;
  for (const bool q_first : {true, false}) {  // q's node first: the piece is added in place into
    CAPTURE(q_first);                          // u's fresh gradient; p's first: it is expanded
    const Variable x = leaf4(shape, 20);
    const Variable u = scale(x, 2.0);
    const Variable q = scale(u, 3.0), p = slice_channels(u, 1, 2);
    REQUIRE(p.grad_fn()->channel_piece(0) == 1);
    // The engine walks the roots' nodes last root first.
    const Variable outputs_p_q[] = {p, q}, outputs_q_p[] = {q, p};
    const Tensor seeds_p_q[] = {gp, gq}, seeds_q_p[] = {gq, gp};
    if (q_first)
      petra::backward(outputs_p_q, seeds_p_q);
    else
      petra::backward(outputs_q_p, seeds_q_p);
    const auto dx = x.grad().to_vector<double>();
    for (std::size_t k = 0; k < dx.size(); ++k) CHECK(dx[k] == doctest::Approx(expected[k]).epsilon(1e-14));
    grads.push_back(dx);
  }
  CHECK(grads[0] == grads[1]);
}

TEST_CASE("channel pieces that cover a gradient are copied in; gaps read zero, overlaps add up") {
  // u = 2 x with 6 channels; pieces of u's gradient from slices of channels [0, 2), [2, 5), [5, 6)
  // (together all of them: each copied into the new sum, no zeros written), and [1, 3) (overlapping
  // the first two: added to what they wrote). Without [2, 5) channels 2-4 must read zero.
  const Shape shape{2, 6, 3, 2};
  const std::int64_t plane = shape[2] * shape[3];
  struct Piece {
    std::int64_t first, count;
  };
  const Piece all[] = {{0, 2}, {2, 3}, {5, 1}, {1, 2}};
  const auto run = [&](std::initializer_list<int> used) {
    const Variable x = leaf4(shape, 70);
    const Variable u = scale(x, 2.0);
    std::vector<Variable> roots;
    std::vector<Tensor> seeds;
    std::vector<double> expected(static_cast<std::size_t>(shape.numel()), 0.0);
    for (int i : used) {
      roots.push_back(slice_channels(u, all[i].first, all[i].count));
      seeds.push_back(values4(shape.with(1, all[i].count), 71 + i));
      const auto g = seeds.back().to_vector<double>();
      for (std::int64_t n = 0; n < shape[0]; ++n)
        for (std::int64_t c = 0; c < all[i].count; ++c)
          for (std::int64_t k = 0; k < plane; ++k)
            expected[((n * shape[1] + all[i].first + c) * plane + k)] += g[(n * all[i].count + c) * plane + k];
    }
    petra::backward(roots, seeds);
    const auto dx = x.grad().to_vector<double>();
    REQUIRE(dx.size() == expected.size());
    for (std::size_t k = 0; k < dx.size(); ++k) CHECK(dx[k] == 2 * expected[k]);
  };
  SUBCASE("covering pieces") { run({0, 1, 2}); }
  SUBCASE("a gap") { run({0, 2}); }
  SUBCASE("an overlap") { run({0, 3}); }
  SUBCASE("covering pieces and an overlap") { run({2, 1, 0, 3}); }
}

TEST_CASE("a leaf's first gradient is a node's result taken over, or a copy of the caller's seed") {
  const Shape shape{2, 3, 2, 2};
  const Tensor seed = values4(shape, 60);
  const std::vector<double> seed_values = seed.to_vector<double>();
  // x's gradient comes from scale's backward: a fresh tensor nobody else holds, taken as x.grad
  // (counted as a gradient), then added into in place by the second pass.
  const Variable x = leaf4(shape, 61);
  const Variable y = scale(x, 2.0), z = scale(x, 2.0);
  const Variable first[] = {y}, second[] = {z};
  const Tensor seeds[] = {seed};
  petra::backward(first, seeds);
  CHECK(x.grad().storage()->tag() == MemoryTag::gradients);
  petra::backward(second, seeds);
  const auto dx = x.grad().to_vector<double>();
  for (std::size_t k = 0; k < dx.size(); ++k) CHECK(dx[k] == 4 * seed_values[k]);
  CHECK(seed.to_vector<double>() == seed_values);
  // A leaf that is itself the root gets a copy of the seed, which later passes add into.
  const Variable leaf = leaf4(shape, 62);
  const Variable roots[] = {leaf};
  petra::backward(roots, seeds);
  petra::backward(roots, seeds);
  CHECK(leaf.grad().storage() != seed.storage());
  CHECK(seed.to_vector<double>() == seed_values);
  const auto dleaf = leaf.grad().to_vector<double>();
  for (std::size_t k = 0; k < dleaf.size(); ++k) CHECK(dleaf[k] == 2 * seed_values[k]);
}

TEST_CASE("channel_view: a convolution reads the view in place; values and gradients are slice_channels' bits") {
  // u = 2 x; a 3x3 convolution of channels [1, 3) of u, taken as a view and as a packed copy.
  const Shape shape{3, 5, 6, 7};
  const Tensor weight = values4({4, 2, 3, 3}, 51), seed = values4({3, 4, 6, 7}, 52);
  const Conv2dOptions options{.stride = 1, .padding = 1};
  std::vector<std::vector<double>> outputs, input_grads, weight_grads;
  for (const bool view : {true, false}) {
    CAPTURE(view);
    const Variable x = leaf4(shape, 50);
    const Variable w(weight.clone(), true);
    const Variable u = scale(x, 2.0);
    const Variable part = view ? channel_view(u, 1, 2) : slice_channels(u, 1, 2);
    CHECK(part.data().is_contiguous() == !view);
    REQUIRE(part.grad_fn()->channel_piece(0) == 1);
    const Variable y = conv2d(part, w, Variable(), options);  // no bias: an undefined input in the graph
    const Variable roots[] = {y};
    const Tensor seeds[] = {seed};
    petra::backward(roots, seeds);
    outputs.push_back(y.data().to_vector<double>());
    input_grads.push_back(x.grad().to_vector<double>());
    weight_grads.push_back(w.grad().to_vector<double>());
  }
  CHECK(outputs[0] == outputs[1]);
  CHECK(input_grads[0] == input_grads[1]);
  CHECK(weight_grads[0] == weight_grads[1]);
  // channels 0 and 3, 4 of x get no gradient from the piece
  const std::int64_t plane = shape[2] * shape[3];
  for (std::int64_t i = 0; i < plane; ++i) CHECK(input_grads[0][i] == 0.0);
  // Ops other than the convolution still require contiguous operands.
  const Variable x = leaf4(shape, 50);
  CHECK_THROWS_AS(add(channel_view(x, 1, 2), channel_view(x, 3, 2)), ShapeError);
  CHECK_THROWS_AS(channel_view(x, 4, 2), ShapeError);
}

TEST_CASE("a channel piece is never added into a gradient that another holder shares") {
  // s = u + w hands the caller's seed gs to u and to w unchanged; p's piece then arrives at u:
  // adding it in place would change the caller's seed (and w's gradient).
  const Shape shape{2, 4, 3, 2};
  const Variable x = leaf4(shape, 30), x2 = leaf4(shape, 31);
  const Variable u = scale(x, 2.0), w = scale(x2, 5.0);
  const Variable s = add(u, w), p = slice_channels(u, 1, 2);
  const Tensor gs = values4(shape, 32), gp = values4(shape.with(1, 2), 33);
  const std::vector<double> gs_before = gs.to_vector<double>();
  const Variable outputs[] = {p, s};
  const Tensor seeds[] = {gp, gs};
  petra::backward(outputs, seeds);
  CHECK(gs.to_vector<double>() == gs_before);
  const auto dx = x.grad().to_vector<double>(), dx2 = x2.grad().to_vector<double>();
  // dx = 2 (gs + gp at [1, 3)), dx2 = 5 gs: the q-free form of expected_piece_gradient with gq = gs / 3.
  const auto gsv = gs.to_vector<double>(), gpv = gp.to_vector<double>();
  const std::int64_t plane = shape[2] * shape[3];
  for (std::int64_t n = 0; n < shape[0]; ++n)
    for (std::int64_t c = 0; c < shape[1]; ++c)
      for (std::int64_t i = 0; i < plane; ++i) {
        const std::int64_t k = (n * shape[1] + c) * plane + i;
        const double piece = c >= 1 && c < 3 ? gpv[((n * 2) + c - 1) * plane + i] : 0.0;
        CHECK(dx[k] == doctest::Approx(2 * (gsv[k] + piece)).epsilon(1e-14));
        CHECK(dx2[k] == doctest::Approx(5 * gsv[k]).epsilon(1e-14));
      }
}

TEST_CASE("a gradient piece that does not fit its input is a clear error") {
  const Shape shape{2, 4, 3, 2};
  const Variable x = leaf4(shape, 40);
  // A node that declares a piece from channel 2 but returns 3 channels (2 + 3 > 4).
  const Variable y = record_one(values4(shape, 41), "bad_piece", {x},
                                [shape](std::span<const Tensor>) { return std::vector<Tensor>{values4(shape.with(1, 3), 42)}; });
  y.grad_fn()->set_channel_piece(0, 2);
  const Variable outputs[] = {y};
  const Tensor seeds[] = {values4(shape, 43)};
  CHECK_THROWS_AS(petra::backward(outputs, seeds), ShapeError);
  CHECK_THROWS_AS(y.grad_fn()->set_channel_piece(0, 4), ValueError);
}

TEST_CASE("a view returned as a gradient is packed before a node that does not read views") {
  // concat_channels' backward returns channel views of its gradient; a convolution's backward needs
  // a contiguous gradient (a ShapeError otherwise), so the engine must pack the view before it
  // (Node::accept_strided_gradients).
  // Two samples: a channel slice of one sample would be contiguous.
  const Variable a(Tensor::from_vector<float>({2, 1, 1, 2}, {1, -1, 0, 1}), true);
  const Variable w(Tensor::from_vector<float>({1, 1, 1, 1}, {2}), true);
  const Variable b(Tensor::from_vector<float>({2, 1, 1, 2}, {2, -2, 3, 4}), true);
  const Variable parts[] = {conv2d(a, w, Variable(), Conv2dOptions{}), relu(b)};
  const Variable y = concat_channels(parts);
  y.backward(Tensor::from_vector<float>({2, 2, 1, 2}, {10, 20, 30, 40, 50, 60, 70, 80}));
  CHECK(a.grad().to_vector<float>() == std::vector<float>{20, 40, 100, 120});
  CHECK(w.grad().to_vector<float>() == std::vector<float>{10 - 20 + 60});
  CHECK(b.grad().to_vector<float>() == std::vector<float>{30, 0, 70, 80});
}

// The head asks for the label check to be deferred (first_bad), which only a GPU needs: on the CPU
// the check is made at once, before any gradient is computed from a batch whose bad rows have no
// probabilities; the flag still comes back for the head's later read.
TEST_CASE("cross_entropy with first_bad checks a CPU batch's labels at once") {
  const Variable logits(Tensor::from_vector<float>({2, 3}, {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, -0.5f}), true);
  Tensor first_bad;
  CHECK_THROWS_WITH_AS(cross_entropy(logits, Tensor::from_vector<std::int64_t>({2}, {0, 3}), &first_bad),
                       "cross_entropy: label 3 of sample 1 is outside [0, 3)", ValueError);
  CHECK_FALSE(first_bad.defined());
  const Variable loss = cross_entropy(logits, Tensor::from_vector<std::int64_t>({2}, {0, 2}), &first_bad);
  CHECK(first_bad.to_vector<std::int64_t>() == std::vector<std::int64_t>{-1});
  CHECK(std::isfinite(loss.data().item()));
}
