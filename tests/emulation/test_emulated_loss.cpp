// tests/emulation/test_emulated_loss.cpp: the kernels of kernels/cuda/loss.cu (softmax
// cross-entropy forward and backward, argmax, count_correct), run on the CPU by the CUDA emulation
// (emulated_loss.cpp), against kernels::ref.
//
// Shapes: batch 1 and 5 (and 0, and 300: more rows than a block has threads in the final sum),
// classes 1, 10, 33 and 1000 (blocks of 32, 64 and 256 threads; rows shorter and longer than the
// block); with 5 and 300 rows, grid caps of 1 and 3 blocks make the blocks go round the rows.
// Logits uniform in [-8, 8), and around 1000 (the max must be subtracted before exp); pointers
// one float off for the 33 classes (loss.cu has no vector loads; that is enough to show it), and
// outputs pre-filled with guard elements after them. (A block of real threads per row makes the
// emulation slow: the shapes are chosen to keep this file to a few seconds.)
//   - forward: the return value equals ref's (-1, or the first bad label when some are out of
//     range); probs within two float roundings of ref's (the row's double sum is added in another
//     order) and the loss within a rounding of the sum of |terms|; the same bits on every run and
//     whatever the grid;
//   - backward: ref's bits (same double arithmetic), also in place (dlogits == probs) and with a
//     label out of range (no onehot term);
//   - argmax and count_correct: exactly ref's, on rows full of ties (values from {0, 1, 2}), with
//     NaNs (the first NaN wins), all -inf, and single classes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "petra/kernels/common.hpp"
#include "petra/kernels/loss.hpp"
#include "tests/emulation/kernel_checks.hpp"

namespace {

using namespace petra::emulation_testing::vocabulary;
using petra::kernels::CrossEntropyShape;

const std::vector<CrossEntropyShape> kShapes = {{1, 1},  {5, 1},  {1, 10},   {5, 10},
                                                {1, 33}, {5, 33}, {1, 1000}, {5, 1000}};
// And more rows than the final sum's block has threads.
const std::vector<CrossEntropyShape> kShapesAndLongBatch = [] {
  std::vector<CrossEntropyShape> shapes = kShapes;
  shapes.push_back({300, 3});
  return shapes;
}();

std::string describe(const CrossEntropyShape& s) {
  return "batch " + std::to_string(s.batch) + " classes " + std::to_string(s.classes);
}

// The grid caps worth running for a block per row: with one row any cap gives one block; with
// 5 rows caps of 1 and 3 blocks make the blocks go round; with 300 rows a cap of 3 does.
std::vector<std::size_t> caps_for(const CrossEntropyShape& s) {
  if (s.batch <= 1) return {kGridCaps.front()};
  if (s.batch > 32) return {3};
  return kGridCaps;
}

// Labels in [0, classes), reproducible.
std::vector<std::int64_t> labels_for(const CrossEntropyShape& s, std::uint64_t seed) {
  std::vector<std::int64_t> labels(std::size_t(s.batch) + kGuard);
  const std::vector<float> u = random_values(labels.size(), seed, 0, 1);
  for (std::size_t b = 0; b < labels.size(); ++b)
    labels[b] = std::min<std::int64_t>(std::int64_t(double(u[b]) * double(s.classes)), s.classes - 1);
  return labels;
}

// The sum over rows of |log(sum_exp)| + |logit[label] - max|, / batch: the size of the loss's terms.
double loss_terms(const CrossEntropyShape& s, const float* logits, const std::vector<std::int64_t>& labels) {
  double total = 0;
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const float* row = logits + b * s.classes;
    double max = row[0];
    for (std::int64_t c = 1; c < s.classes; ++c) max = std::max(max, double(row[c]));
    double sum = 0;
    for (std::int64_t c = 0; c < s.classes; ++c) sum += std::exp(double(row[c]) - max);
    total += std::abs(std::log(sum)) + std::abs(double(row[labels[std::size_t(b)]]) - max);
  }
  return total / double(s.batch);
}

// Runs the emulated forward: (returned index, loss and probs arrays with offset and guards).
struct Forward {
  std::int64_t bad;
  std::vector<float> loss, probs;
};
Forward emulated_forward(const StreamHandle& s, const CrossEntropyShape& shape, const float* logits,
                         const std::int64_t* labels, std::size_t offset, const std::vector<float>& loss0,
                         const std::vector<float>& probs0) {
  const AlignedFloats loss(loss0), probs(probs0);
  std::int64_t bad = 99;
  cu::cross_entropy_forward(s, shape, logits, labels, loss.data() + offset, probs.data() + offset, &bad);
  return {bad, loss.values(), probs.values()};
}

}  // namespace

TEST_CASE("emulated loss: cross-entropy forward within a rounding of ref, deterministic") {
  const ScratchStream stream;
  const StreamHandle& s = stream.s;
  std::uint64_t seed = 100;
  int compared = 0;
  for (const CrossEntropyShape& shape : kShapesAndLongBatch)
    for (const double centre : {0.0, 1000.0}) {
      // No vector loads in loss.cu: one misaligned case is enough to show it does not care.
      const std::size_t offset = shape.classes == 33 ? 1 : 0;
      seed += 10;
      const auto n = std::size_t(shape.batch * shape.classes);
      const AlignedFloats logits(random_values(n + offset + kGuard, seed, centre - 8, centre + 8));
      const std::vector<std::int64_t> labels = labels_for(shape, seed + 1);
      const std::vector<float> loss0 = random_values(1 + offset + kGuard, seed + 2, 5, 6);
      const std::vector<float> probs0 = random_values(n + offset + kGuard, seed + 3, 5, 6);
      std::vector<float> loss_ref = loss0, probs_ref = probs0;
      std::int64_t bad_ref = 99;
      ref::cross_entropy_forward<float>(s, shape, logits.data() + offset, labels.data(), loss_ref.data() + offset,
                                        probs_ref.data() + offset, &bad_ref);
      REQUIRE(bad_ref == -1);
      const double terms = loss_terms(shape, logits.data() + offset, labels);
      std::vector<float> first_probs, first_loss;
      // Every cap, and a second run, for the logits around 0; the first cap for those around 1000.
      std::vector<std::size_t> caps = caps_for(shape);
      if (centre != 0) caps.resize(1);
      for (const std::size_t cap : caps) {
        const emu::GridStrideCap capped(cap);
        for (int run = 0; run < (cap == caps.front() && centre == 0 ? 2 : 1); ++run) {
          INFO(describe(shape), " centre ", centre, " offset ", offset, " grid cap ", cap, " run ", run);
          const Forward got = emulated_forward(s, shape, logits.data() + offset, labels.data(), offset, loss0, probs0);
          CHECK(got.bad == -1);
          CHECK(emu::last_launch().kernel == std::string("cross_entropy_loss"));
          for (std::size_t i = 0; i < n; ++i) {
            const double want = probs_ref[offset + i];
            CHECK(std::abs(double(got.probs[offset + i]) - want) <= 2.4e-7 * want);
          }
          CHECK(std::abs(double(got.loss[offset]) - double(loss_ref[offset])) <= 1.2e-7 * terms + 1e-30);
          for (std::size_t i = 0; i < got.probs.size(); ++i)
            if (i < offset || i >= offset + n) CHECK(got.probs[i] == probs0[i]);
          for (std::size_t i = 0; i < got.loss.size(); ++i)
            if (i != offset) CHECK(got.loss[i] == loss0[i]);
          if (first_probs.empty()) {
            first_probs = got.probs;
            first_loss = got.loss;
          } else {
            CHECK_MESSAGE(bit_differences(got.probs, first_probs).empty(), bit_differences(got.probs, first_probs));
            CHECK_MESSAGE(bit_differences(got.loss, first_loss).empty(), bit_differences(got.loss, first_loss));
          }
          ++compared;
        }
      }
    }
  MESSAGE("cross-entropy forward: ", compared, " comparisons");
}

TEST_CASE("emulated loss: the forward returns the first label out of range, as ref; batch 0 gives NaN") {
  const ScratchStream stream;
  const StreamHandle& s = stream.s;
  const CrossEntropyShape shape{5, 10};
  const AlignedFloats logits(random_values(50, 7));
  std::vector<float> loss(1), probs(50), loss_ref(1), probs_ref(50);
  for (const std::vector<std::int64_t>& labels :
       {std::vector<std::int64_t>{1, 2, 3, 4, 10}, std::vector<std::int64_t>{1, -1, 3, 10, 0},
        std::vector<std::int64_t>{-5, 0, 0, 0, 0}}) {
    std::int64_t want = 99, got = 99;
    ref::cross_entropy_forward<float>(s, shape, logits.data(), labels.data(), loss_ref.data(), probs_ref.data(), &want);
    cu::cross_entropy_forward(s, shape, logits.data(), labels.data(), loss.data(), probs.data(), &got);
    CHECK(want >= 0);
    CHECK(got == want);
  }
  // No rows: the mean of nothing, 0 / 0.
  const CrossEntropyShape empty{0, 10};
  std::int64_t bad_ref = 99, bad = 99;
  ref::cross_entropy_forward<float>(s, empty, logits.data(), nullptr, loss_ref.data(), probs_ref.data(), &bad_ref);
  cu::cross_entropy_forward(s, empty, logits.data(), nullptr, loss.data(), probs.data(), &bad);
  CHECK(bad_ref == -1);
  CHECK(bad == -1);
  CHECK(std::isnan(loss_ref[0]));
  CHECK(std::isnan(loss[0]));
}

TEST_CASE("emulated loss: cross-entropy backward equals ref bit for bit, also in place") {
  const StreamHandle s;
  std::uint64_t seed = 3000;
  for (const CrossEntropyShape& shape : kShapes)
    for (const std::size_t offset : kOffsets) {
      seed += 10;
      const auto n = std::size_t(shape.batch * shape.classes);
      // probs need not sum to one for the kernel: any values in [0, 1).
      const AlignedFloats probs(random_values(n + offset + kGuard, seed, 0, 1));
      std::vector<std::int64_t> labels = labels_for(shape, seed + 1);
      if (shape.batch > 1) labels[1] = shape.classes;  // out of range: no onehot term
      const AlignedFloats dloss(std::vector<float>{0.75f});
      const std::vector<float> dlogits0 = random_values(n + offset + kGuard, seed + 2, 5, 6);
      std::vector<float> want = dlogits0;
      ref::cross_entropy_backward<float>(s, shape, probs.data() + offset, labels.data(), dloss.data(),
                                         want.data() + offset);
      for (const std::size_t cap : kGridCaps) {
        const emu::GridStrideCap capped(cap);
        INFO(describe(shape), " offset ", offset, " grid cap ", cap);
        const AlignedFloats dlogits(dlogits0);
        cu::cross_entropy_backward(s, shape, probs.data() + offset, labels.data(), dloss.data(), dlogits.data() + offset);
        CHECK(emu::last_launch().grid.x == expected_blocks(shape.batch * shape.classes));
        CHECK_MESSAGE(bit_differences(dlogits.values(), want).empty(), bit_differences(dlogits.values(), want));
        // In place: dlogits is probs.
        std::vector<float> in_place = probs.values();
        const AlignedFloats shared(in_place);
        cu::cross_entropy_backward(s, shape, shared.data() + offset, labels.data(), dloss.data(), shared.data() + offset);
        for (std::size_t i = 0; i < n; ++i) in_place[offset + i] = want[offset + i];
        CHECK_MESSAGE(bit_differences(shared.values(), in_place).empty(), bit_differences(shared.values(), in_place));
      }
    }
}

TEST_CASE("emulated loss: argmax and count_correct equal ref, ties, NaN and -inf included") {
  const ScratchStream stream;
  const StreamHandle& s = stream.s;
  std::uint64_t seed = 6000;
  int compared = 0;
  for (const CrossEntropyShape& shape : kShapesAndLongBatch)
    for (int fill = 0; fill < 3; ++fill) {
      const std::size_t offset = shape.classes == 33 ? 1 : 0;
      seed += 10;
      const auto n = std::size_t(shape.batch * shape.classes), batch = std::size_t(shape.batch);
      std::vector<float> v = random_values(n + offset + kGuard, seed, 0, 3);
      for (std::size_t i = 0; i < n; ++i) {
        float& x = v[offset + i];
        const std::size_t row = i / std::size_t(shape.classes), c = i % std::size_t(shape.classes);
        if (fill == 0) x = std::floor(x);  // ties: the first of the largest wins
        if (fill == 1 && row % 2 == 1 && c % 3 == 1) x = std::numeric_limits<float>::quiet_NaN();
        if (fill == 2 && row % 2 == 0) x = -INFINITY;  // whole rows of -inf: index 0
      }
      const AlignedFloats logits(v);
      std::vector<std::int64_t> want(batch + kGuard, -3);
      ref::argmax<float>(s, shape, logits.data() + offset, want.data());
      // Labels: the prediction for even rows, something else for odd ones.
      std::vector<std::int64_t> labels(batch);
      for (std::size_t b = 0; b < batch; ++b)
        labels[b] = b % 2 == 0 ? want[b] : (want[b] + 1) % shape.classes;
      std::int64_t correct_ref = -1;
      ref::count_correct<float>(s, shape, logits.data() + offset, labels.data(), &correct_ref);
      // Every cap for the ties, the first one for NaN and -inf; count_correct once.
      std::vector<std::size_t> caps = caps_for(shape);
      if (fill != 0) caps.resize(1);
      for (const std::size_t cap : caps) {
        const emu::GridStrideCap capped(cap);
        INFO(describe(shape), " fill ", fill, " offset ", offset, " grid cap ", cap);
        std::vector<std::int64_t> got(batch + kGuard, -3);
        cu::argmax(s, shape, logits.data() + offset, got.data());
        CHECK(got == want);
        if (cap == caps.front()) {
          std::int64_t correct = -1;
          cu::count_correct(s, shape, logits.data() + offset, labels.data(), &correct);
          CHECK(correct == correct_ref);
        }
        ++compared;
      }
    }
  // No rows: argmax launches nothing, count_correct counts 0.
  const std::size_t launches = emu::launches();
  cu::argmax(s, CrossEntropyShape{0, 5}, nullptr, nullptr);
  CHECK(emu::launches() == launches);
  std::int64_t correct = -1;
  cu::count_correct(s, CrossEntropyShape{0, 5}, nullptr, nullptr, &correct);
  CHECK(correct == 0);
  MESSAGE("argmax and count_correct: ", compared, " comparisons");
}
