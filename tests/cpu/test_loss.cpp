// tests/cpu/test_loss.cpp: softmax cross-entropy (hand values, stability, label checks, cpu vs
// ref, finite-difference gradient), argmax and accuracy.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "petra/kernels/loss.hpp"
#include "tests/support/testing.hpp"

namespace k = petra::kernels;
using petra::testing::random_values;
using petra::testing::relative_error;

namespace {

std::vector<std::int64_t> random_labels(std::int64_t batch, std::int64_t classes, std::uint64_t seed) {
  const auto u = random_values<double>(std::size_t(batch), seed, 0.0, double(classes));
  std::vector<std::int64_t> labels(u.size());
  for (std::size_t i = 0; i < u.size(); ++i) labels[i] = std::min<std::int64_t>(classes - 1, std::int64_t(u[i]));
  return labels;
}

// Forward and backward through cpu:: (fast) or ref::; returns the loss and fills probs and dlogits.
template <class T>
T forward_backward(bool fast, const k::StreamHandle& s, const k::CrossEntropyShape& shape, const std::vector<T>& logits,
                   const std::vector<std::int64_t>& labels, T dloss, std::vector<T>& probs, std::vector<T>& dlogits) {
  T loss = T(99);
  std::int64_t bad = 99;
  fast ? k::cpu::cross_entropy_forward(s, shape, logits.data(), labels.data(), &loss, probs.data(), &bad)
       : k::ref::cross_entropy_forward(s, shape, logits.data(), labels.data(), &loss, probs.data(), &bad);
  CHECK(bad == -1);
  fast ? k::cpu::cross_entropy_backward(s, shape, probs.data(), labels.data(), &dloss, dlogits.data())
       : k::ref::cross_entropy_backward(s, shape, probs.data(), labels.data(), &dloss, dlogits.data());
  return loss;
}

}  // namespace

TEST_CASE("loss: hand-computed cross-entropy of two rows, outputs assigned") {
  const k::CrossEntropyShape shape{2, 3};
  const std::vector<double> logits = {0, 0, 0, 1, 2, 3};
  const std::vector<std::int64_t> labels = {1, 2};
  // row 0: uniform, -log(1/3); row 1: -log(e^3 / (e + e^2 + e^3)) = log(1 + e^-1 + e^-2)
  const double z = 1 + std::exp(-1.0) + std::exp(-2.0);
  const double expected_loss = (std::log(3.0) + std::log(z)) / 2;
  const std::vector<double> expected_probs = {1. / 3, 1. / 3, 1. / 3, std::exp(-2.0) / z, std::exp(-1.0) / z, 1 / z};
  // dloss = 2 cancels the 1/batch: dlogits = probs - onehot
  std::vector<double> expected_dlogits = expected_probs;
  expected_dlogits[1] -= 1;
  expected_dlogits[5] -= 1;
  for (bool fast : {false, true}) {
    CAPTURE(fast);
    std::vector<double> probs(6, 99.0), dlogits(6, 99.0);
    const double loss = forward_backward(fast, {}, shape, logits, labels, 2.0, probs, dlogits);
    CHECK(loss == doctest::Approx(expected_loss).epsilon(1e-14));
    CHECK(petra::testing::max_abs_diff(probs, expected_probs) < 1e-15);
    CHECK(petra::testing::max_abs_diff(dlogits, expected_dlogits) < 1e-15);
  }
}

TEST_CASE("loss: huge logits do not overflow") {
  const k::CrossEntropyShape shape{2, 3};
  const std::vector<float> logits = {1000, 0, -1000, -500, 500, 499};
  const std::vector<std::int64_t> labels = {0, 2};
  for (bool fast : {false, true}) {
    std::vector<float> probs(6), dlogits(6);
    const float loss = forward_backward(fast, {}, shape, logits, labels, 1.0f, probs, dlogits);
    // row 0: ~0; row 1: log(1 + e^-1) + 1 (label 2 is one below the max)
    CHECK(loss == doctest::Approx((std::log(1 + std::exp(-1.0)) + 1) / 2).epsilon(1e-6));
    for (float p : probs) CHECK(std::isfinite(p));
    CHECK(probs[0] == 1.0f);
  }
}

TEST_CASE("loss: a label out of range is reported by index, without a crash") {
  const k::CrossEntropyShape shape{4, 3};
  const auto logits = random_values<float>(12, 3);
  std::vector<float> probs(12), dlogits(12);
  float loss = 0;
  const float dloss = 1;
  const std::vector<std::vector<std::int64_t>> label_sets = {{0, 3, -1, 2}, {0, 1, -1, 2}, {0, 1, 2, 1000000}};
  const std::vector<std::int64_t> first_bad = {1, 2, 3};
  for (std::size_t i = 0; i < label_sets.size(); ++i) {
    const auto& labels = label_sets[i];
    std::int64_t bad_ref = 99, bad_cpu = 99;
    k::ref::cross_entropy_forward(k::StreamHandle{}, shape, logits.data(), labels.data(), &loss, probs.data(), &bad_ref);
    k::cpu::cross_entropy_forward(k::StreamHandle{}, shape, logits.data(), labels.data(), &loss, probs.data(), &bad_cpu);
    CHECK(bad_ref == first_bad[i]);
    CHECK(bad_cpu == first_bad[i]);
    // the backward skips such rows' onehot term instead of writing out of bounds
    k::ref::cross_entropy_backward(k::StreamHandle{}, shape, probs.data(), labels.data(), &dloss, dlogits.data());
    k::cpu::cross_entropy_backward(k::StreamHandle{}, shape, probs.data(), labels.data(), &dloss, dlogits.data());
  }
}

TEST_CASE("loss: cpu matches ref on random logits, 1 and 2 threads") {
  const std::vector<k::CrossEntropyShape> shapes = {{1, 1}, {1, 10}, {7, 3}, {128, 10}, {33, 1000}, {129, 1001}};
  std::uint64_t seed = 40;
  for (const auto& shape : shapes) {
    for (int threads : {1, 2}) {
      CAPTURE(shape.batch);
      CAPTURE(shape.classes);
      CAPTURE(threads);
      k::StreamHandle s;
      s.num_threads = threads;
      const std::size_t n = std::size_t(shape.batch * shape.classes);
      const auto logits = random_values<float>(n, seed++, -8, 8);
      const auto labels = random_labels(shape.batch, shape.classes, seed++);
      std::vector<float> probs_ref(n), dlogits_ref(n), probs_cpu(n), dlogits_cpu(n, 5.f);
      const float loss_ref = forward_backward(false, s, shape, logits, labels, 0.75f, probs_ref, dlogits_ref);
      const float loss_cpu = forward_backward(true, s, shape, logits, labels, 0.75f, probs_cpu, dlogits_cpu);
      CHECK(loss_cpu == doctest::Approx(loss_ref).epsilon(1e-6));
      CHECK(relative_error(probs_cpu, probs_ref) <= 1e-6);
      CHECK(relative_error(dlogits_cpu, dlogits_ref) <= 1e-6);
      // in place: dlogits written over probs
      const float dloss_value = 0.75f;
      k::cpu::cross_entropy_backward(s, shape, probs_cpu.data(), labels.data(), &dloss_value, probs_cpu.data());
      CHECK(probs_cpu == dlogits_cpu);
    }
  }
}

TEST_CASE("loss: the backward is the gradient of dloss * mean loss (finite differences, double)") {
  const k::StreamHandle s;
  for (k::CrossEntropyShape shape : {k::CrossEntropyShape{1, 1}, k::CrossEntropyShape{1, 5}, k::CrossEntropyShape{6, 4}}) {
    CAPTURE(shape.batch);
    CAPTURE(shape.classes);
    const std::size_t n = std::size_t(shape.batch * shape.classes);
    const auto logits = random_values<double>(n, 50, -3, 3);
    const auto labels = random_labels(shape.batch, shape.classes, 51);
    const double dloss = 0.7;
    auto loss_fn = [&](const std::vector<double>& x) {
      std::vector<double> probs(n);
      double loss = 0;
      std::int64_t bad = 99;
      k::ref::cross_entropy_forward(s, shape, x.data(), labels.data(), &loss, probs.data(), &bad);
      CHECK(bad == -1);
      return dloss * loss;
    };
    std::vector<double> probs(n), dlogits(n);
    forward_backward(false, s, shape, logits, labels, dloss, probs, dlogits);
    const auto r = petra::testing::check_gradient(loss_fn, logits, dlogits);
    CHECK_MESSAGE(r.ok, r.worst);
  }
}

TEST_CASE("loss: argmax takes the first maximum, NaN wins; accuracy counts matches") {
  const float nan = std::nanf("");
  const k::CrossEntropyShape shape{4, 3};
  const std::vector<float> logits = {1, 3, 3, nan, 5, 1, 2, 1, nan, -1, -2, -3};
  const std::vector<std::int64_t> labels = {1, 0, 0, 0};
  for (bool fast : {false, true}) {
    CAPTURE(fast);
    std::vector<std::int64_t> predicted(4, 99);
    std::int64_t correct = 99;
    if (fast) {
      k::cpu::argmax(k::StreamHandle{}, shape, logits.data(), predicted.data());
      k::cpu::count_correct(k::StreamHandle{}, shape, logits.data(), labels.data(), &correct);
    } else {
      k::ref::argmax(k::StreamHandle{}, shape, logits.data(), predicted.data());
      k::ref::count_correct(k::StreamHandle{}, shape, logits.data(), labels.data(), &correct);
    }
    CHECK(predicted == std::vector<std::int64_t>{1, 0, 2, 0});
    CHECK(correct == 3);
  }
}

TEST_CASE("loss: cpu argmax and accuracy match ref on random logits") {
  const k::CrossEntropyShape shape{257, 13};
  const auto logits = random_values<float>(std::size_t(shape.batch * shape.classes), 60);
  const auto labels = random_labels(shape.batch, shape.classes, 61);
  std::vector<std::int64_t> p_ref(std::size_t(shape.batch)), p_cpu(std::size_t(shape.batch));
  std::int64_t c_ref = -1, c_cpu = -2;
  k::ref::argmax(k::StreamHandle{}, shape, logits.data(), p_ref.data());
  k::cpu::argmax(k::StreamHandle{}, shape, logits.data(), p_cpu.data());
  k::ref::count_correct(k::StreamHandle{}, shape, logits.data(), labels.data(), &c_ref);
  k::cpu::count_correct(k::StreamHandle{}, shape, logits.data(), labels.data(), &c_cpu);
  CHECK(p_cpu == p_ref);
  CHECK(c_cpu == c_ref);
  CHECK(c_ref > 0);  // about 1 in 13 rows match by chance
}
