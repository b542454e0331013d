// tests/emulation/test_emulated_batchnorm.cpp: the kernels of kernels/cuda/batchnorm.cu (training
// forward, evaluation forward, backward), run on the CPU by the CUDA emulation
// (emulated_batchnorm.cpp), against kernels::ref, with the cpu suite's tolerances for cpu::
// (test_batchnorm.cpp).
//
// Shapes: n = N*H*W of 2 (the least training allows), 31, 33, 49, 1023, and 4092 and 6000 (two and
// three slices per channel in the first pass, and threads that loop in their slice); planes of 1,
// 31, 33 and 11x9; grid caps of 1 and 3 blocks make the element-wise passes loop. Inputs centred
// at 0 and at 1000 (|mean| >> std, where a naive sum of squares fails). Outputs are pre-filled,
// with guard elements after every array that must not change; dgamma and dbeta start non-zero
// (they accumulate). The training forward also gives the same bits twice. dx for n = 2, where its
// terms cancel to almost nothing, is compared with the size of those terms instead.
//
// The fused batch norm + ReLU (batchnorm_relu_*): the same kernels with the ReLU in their
// element-wise passes, against ref::'s fused oracle on odd shapes (1, 3 and 17 channels; planes
// 1x1, 7x7, 5x3; batch 1 with a plane) and the multi-slice ones, with the same grid caps. The
// backward takes one y (ref::'s) for both, so the masks agree by construction.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "petra/kernels/batchnorm.hpp"
#include "petra/kernels/common.hpp"
#include "tests/emulation/kernel_checks.hpp"

namespace {

using namespace petra::emulation_testing::vocabulary;
using petra::kernels::BatchNormShape;

constexpr double kEps = 1e-5, kMomentum = 0.1;

const std::vector<BatchNormShape> kShapes = {
    {2, 1, 1, 1},    // n = 2
    {1, 3, 1, 31},   // 31
    {3, 2, 1, 11},   // 33
    {1, 2, 7, 7},    // 49
    {33, 2, 1, 31},  // 1023
    {5, 2, 33, 55},  // 9075: 2 slices of 8192 (channel_slices)
    {5, 3, 9, 11},   // 495
    {3, 1, 80, 75},  // 18000: 3 slices
    {2, 3, 4, 6},    // 48: planes of 24, float4 groups over 3 channels
};
// (Tensors of 4 KiB and more take batch norm's second walk from the end under the emulation: the
// larger shapes above; the smaller ones from the start.)

// n floats from `seed` in [lo, hi), then kGuard guard values.
std::vector<float> values(std::int64_t n, std::uint64_t seed, double lo = -1, double hi = 1) {
  return random_values(std::size_t(n) + kGuard, seed, lo, hi);
}
std::vector<float> head(const std::vector<float>& v, std::int64_t n) {
  return std::vector<float>(v.begin(), v.begin() + n);
}
bool guards_kept(const std::vector<float>& got, const std::vector<float>& before, std::int64_t n) {
  for (std::size_t i = std::size_t(n); i < got.size(); ++i)
    if (got[i] != before[i]) return false;
  return true;
}

// The element-wise pass's work items: groups of 4 values when the plane is a multiple of 4 (the
// buffers here are 16-byte aligned), else single values (kernels/cuda/batchnorm.cu, Group).
std::int64_t elementwise_groups(const BatchNormShape& sh) { return sh.plane() % 4 == 0 ? sh.size() / 4 : sh.size(); }

std::string describe(const BatchNormShape& sh) {
  return "N=" + std::to_string(sh.batch) + " C=" + std::to_string(sh.channels) +
         " H=" + std::to_string(sh.height) + " W=" + std::to_string(sh.width);
}

// A training forward's outputs, their starting values, or ref::'s.
struct Forward {
  std::vector<float> y, mean, invstd, running_mean, running_var;
};

// A training forward's outputs against ref::'s, and the guard elements after each kept.
void check_forward(const BatchNormShape& sh, const Forward& got, const Forward& start, const Forward& expected) {
  const std::int64_t size = sh.size(), C = sh.channels;
  CHECK(relative_error(head(got.y, size), head(expected.y, size)) < 1e-5);
  CHECK(relative_error(head(got.mean, C), head(expected.mean, C)) < 1e-6);
  CHECK(relative_error(head(got.invstd, C), head(expected.invstd, C)) < 1e-5);
  CHECK(relative_error(head(got.running_mean, C), head(expected.running_mean, C)) < 1e-6);
  CHECK(relative_error(head(got.running_var, C), head(expected.running_var, C)) < 1e-5);
  CHECK(guards_kept(got.y, start.y, size));
  CHECK(guards_kept(got.mean, start.mean, C));
  CHECK(guards_kept(got.invstd, start.invstd, C));
  CHECK(guards_kept(got.running_mean, start.running_mean, C));
  CHECK(guards_kept(got.running_var, start.running_var, C));
}

// A backward's outputs, their starting values, or ref::'s (dgamma and dbeta as increments).
struct Gradients {
  std::vector<float> dx, dgamma, dbeta;
};

// A backward's outputs against ref::'s: dx (for n = 2, where xhat = +-1 up to eps and dx's terms
// cancel to almost nothing, dx ~ eps / var, against the terms' size gamma * invstd * |dy|), dgamma
// and dbeta accumulated onto their starting values, and the guard elements after each kept.
void check_backward(const BatchNormShape& sh, const float* gamma, const std::vector<float>& invstd, const float* dy,
                    const Gradients& got, const Gradients& start, const Gradients& expected) {
  const std::int64_t size = sh.size(), C = sh.channels;
  if (sh.values_per_channel() > 2) {
    CHECK(relative_error(head(got.dx, size), head(expected.dx, size)) < 1e-5);
  } else {
    double scale = 0;
    for (std::int64_t k = 0; k < size; ++k) {
      const std::size_t c = std::size_t((k / sh.plane()) % C);
      scale = std::max(scale, std::abs(double(gamma[c]) * invstd[c] * dy[k]));
    }
    CHECK(max_abs_diff(head(got.dx, size), head(expected.dx, size)) <= 1e-5 * scale);
  }
  for (std::size_t c = 0; c < std::size_t(C); ++c) {
    CHECK(got.dgamma[c] - start.dgamma[c] == doctest::Approx(expected.dgamma[c]).epsilon(1e-4).scale(1));
    CHECK(got.dbeta[c] - start.dbeta[c] == doctest::Approx(expected.dbeta[c]).epsilon(1e-4).scale(1));
  }
  CHECK(guards_kept(got.dx, start.dx, size));
  CHECK(guards_kept(got.dgamma, start.dgamma, C));
  CHECK(guards_kept(got.dbeta, start.dbeta, C));
}

}  // namespace

TEST_CASE("emulated batchnorm: training forward matches ref, running statistics updated") {
  HeapWorkspace workspace;
  StreamHandle s;
  s.workspace = &workspace;
  std::uint64_t seed = 10;
  for (const std::size_t cap : kGridCaps) {
    const emu::GridStrideCap capped(cap);
    for (const BatchNormShape& sh : kShapes)
      for (const double offset : {0.0, 1000.0}) {
        seed += 10;
        const std::int64_t size = sh.size(), C = sh.channels;
        const AlignedFloats x(values(size, seed, offset - 1, offset + 1));
        const AlignedFloats gamma(values(C, seed + 1, 0.5, 1.5)), beta(values(C, seed + 2));
        const std::vector<float> y0 = values(size, seed + 3, 5, 6),
                                 mean0 = values(C, seed + 4, 5, 6),
                                 invstd0 = values(C, seed + 5, 5, 6), rm0 = values(C, seed + 6),
                                 rv0 = values(C, seed + 7, 0.5, 2);
        std::vector<float> y_ref = y0, mean_ref = mean0, invstd_ref = invstd0, rm_ref = rm0,
                           rv_ref = rv0;
        ref::batchnorm_forward_train<float>(s, sh, kEps, kMomentum, x.data(), gamma.data(),
                                            beta.data(), y_ref.data(), mean_ref.data(),
                                            invstd_ref.data(), rm_ref.data(), rv_ref.data());
        const AlignedFloats y(y0), mean(mean0), invstd(invstd0), rm(rm0), rv(rv0);
        cu::batchnorm_forward_train(s, sh, kEps, kMomentum, x.data(), gamma.data(), beta.data(),
                                    y.data(), mean.data(), invstd.data(), rm.data(), rv.data());
        INFO(describe(sh), " offset=", offset, " grid cap=", cap);
        CHECK(emu::last_launch().kernel == std::string("batchnorm_forward_train"));
        CHECK(emu::last_launch().grid.x == expected_blocks(elementwise_groups(sh)));
        check_forward(sh, {y.values(), mean.values(), invstd.values(), rm.values(), rv.values()},
                      {y0, mean0, invstd0, rm0, rv0}, {y_ref, mean_ref, invstd_ref, rm_ref, rv_ref});

        // Without running statistics (nullptr), and twice: the same bits.
        const AlignedFloats y2(y0), mean2(mean0), invstd2(invstd0);
        cu::batchnorm_forward_train(s, sh, kEps, kMomentum, x.data(), gamma.data(), beta.data(),
                                    y2.data(), mean2.data(), invstd2.data(), nullptr, nullptr);
        CHECK(y2.values() == y.values());
        CHECK(mean2.values() == mean.values());
        CHECK(invstd2.values() == invstd.values());
      }
  }
}

TEST_CASE("emulated batchnorm: evaluation forward matches ref") {
  StreamHandle s;  // no workspace: the evaluation needs none
  std::uint64_t seed = 500;
  for (const std::size_t cap : kGridCaps) {
    const emu::GridStrideCap capped(cap);
    for (const BatchNormShape& sh : kShapes) {
      seed += 10;
      const std::int64_t size = sh.size(), C = sh.channels;
      const AlignedFloats x(values(size, seed)), gamma(values(C, seed + 1, 0.5, 1.5)),
          beta(values(C, seed + 2)), rm(values(C, seed + 3)), rv(values(C, seed + 4, 0.5, 2));
      const std::vector<float> y0 = values(size, seed + 5, 5, 6);
      std::vector<float> y_ref = y0;
      ref::batchnorm_forward_eval<float>(s, sh, kEps, x.data(), gamma.data(), beta.data(),
                                         rm.data(), rv.data(), y_ref.data());
      const AlignedFloats y(y0);
      cu::batchnorm_forward_eval(s, sh, kEps, x.data(), gamma.data(), beta.data(), rm.data(),
                                 rv.data(), y.data());
      INFO(describe(sh), " grid cap=", cap);
      CHECK(emu::last_launch().grid.x == expected_blocks(elementwise_groups(sh)));
      CHECK(relative_error(head(y.values(), size), head(y_ref, size)) < 1e-6);
      CHECK(guards_kept(y.values(), y0, size));
    }
  }
}

TEST_CASE("emulated batchnorm: backward matches ref, dx assigned, dgamma and dbeta accumulated") {
  HeapWorkspace workspace;
  StreamHandle s;
  s.workspace = &workspace;
  std::uint64_t seed = 900;
  for (const std::size_t cap : kGridCaps) {
    const emu::GridStrideCap capped(cap);
    for (const BatchNormShape& sh : kShapes)
      for (const double offset : {0.0, 1000.0}) {
        seed += 10;
        const std::int64_t size = sh.size(), C = sh.channels;
        const AlignedFloats x(values(size, seed, offset - 1, offset + 1));
        const AlignedFloats gamma(values(C, seed + 1, 0.5, 1.5)), dy(values(size, seed + 2));
        std::vector<float> beta = values(C, seed + 3);
        std::vector<float> y(static_cast<std::size_t>(size)), mean_v(static_cast<std::size_t>(C)),
            invstd_v(static_cast<std::size_t>(C));
        ref::batchnorm_forward_train<float>(s, sh, kEps, kMomentum, x.data(), gamma.data(),
                                            beta.data(), y.data(), mean_v.data(), invstd_v.data(),
                                            nullptr, nullptr);
        const AlignedFloats mean(mean_v), invstd(invstd_v);
        const std::vector<float> dx0 = values(size, seed + 4, 5, 6);
        const std::vector<float> dgamma0 = values(C, seed + 5), dbeta0 = values(C, seed + 6);
        std::vector<float> dx_ref = dx0, dgamma_ref(static_cast<std::size_t>(C), 0.f),
                           dbeta_ref(static_cast<std::size_t>(C), 0.f);
        ref::batchnorm_backward<float>(s, sh, x.data(), dy.data(), gamma.data(), mean.data(),
                                       invstd.data(), dx_ref.data(), dgamma_ref.data(),
                                       dbeta_ref.data());
        const AlignedFloats dx(dx0), dgamma(dgamma0), dbeta(dbeta0);
        cu::batchnorm_backward(s, sh, x.data(), dy.data(), gamma.data(), mean.data(),
                               invstd.data(), dx.data(), dgamma.data(), dbeta.data());
        INFO(describe(sh), " offset=", offset, " grid cap=", cap);
        CHECK(emu::last_launch().kernel == std::string("batchnorm_backward"));
        CHECK(emu::last_launch().grid.x == expected_blocks(elementwise_groups(sh)));
        check_backward(sh, gamma.data(), invstd_v, dy.data(), {dx.values(), dgamma.values(), dbeta.values()},
                       {dx0, dgamma0, dbeta0}, {dx_ref, dgamma_ref, dbeta_ref});
      }
  }
}

namespace {

const std::vector<BatchNormShape> kReluShapes = {
    {2, 1, 1, 1},  {5, 3, 1, 1}, {1, 17, 7, 7}, {3, 3, 7, 7}, {1, 1, 5, 3},
    {4, 17, 5, 3}, {7, 3, 5, 3}, {5, 2, 33, 55},  // 9075: 2 slices
    {3, 1, 80, 75}};                              // 18000: 3 slices

std::int64_t zeros_in(const std::vector<float>& v, std::int64_t n) {
  return std::count(v.begin(), v.begin() + n, 0.f);
}

}  // namespace

TEST_CASE("emulated batchnorm_relu: training and eval forwards match ref, running statistics updated") {
  HeapWorkspace workspace;
  StreamHandle s;
  s.workspace = &workspace;
  std::uint64_t seed = 2000;
  for (const std::size_t cap : kGridCaps) {
    const emu::GridStrideCap capped(cap);
    for (const BatchNormShape& sh : kReluShapes)
      for (const double offset : {0.0, 1000.0}) {
        seed += 10;
        const std::int64_t size = sh.size(), C = sh.channels;
        const AlignedFloats x(values(size, seed, offset - 1, offset + 1));
        const AlignedFloats gamma(values(C, seed + 1, 0.5, 1.5)), beta(values(C, seed + 2));
        const std::vector<float> y0 = values(size, seed + 3, 5, 6), mean0 = values(C, seed + 4, 5, 6),
                                 invstd0 = values(C, seed + 5, 5, 6), rm0 = values(C, seed + 6),
                                 rv0 = values(C, seed + 7, 0.5, 2);
        std::vector<float> y_ref = y0, mean_ref = mean0, invstd_ref = invstd0, rm_ref = rm0, rv_ref = rv0;
        ref::batchnorm_relu_forward_train<float>(s, sh, kEps, kMomentum, x.data(), gamma.data(), beta.data(),
                                                 y_ref.data(), mean_ref.data(), invstd_ref.data(), rm_ref.data(),
                                                 rv_ref.data());
        const AlignedFloats y(y0), mean(mean0), invstd(invstd0), rm(rm0), rv(rv0);
        cu::batchnorm_relu_forward_train(s, sh, kEps, kMomentum, x.data(), gamma.data(), beta.data(), y.data(),
                                         mean.data(), invstd.data(), rm.data(), rv.data());
        INFO(describe(sh), " offset=", offset, " grid cap=", cap);
        CHECK(emu::last_launch().kernel == std::string("batchnorm_relu_forward_train"));
        CHECK(emu::last_launch().grid.x == expected_blocks(elementwise_groups(sh)));
        check_forward(sh, {y.values(), mean.values(), invstd.values(), rm.values(), rv.values()},
                      {y0, mean0, invstd0, rm0, rv0}, {y_ref, mean_ref, invstd_ref, rm_ref, rv_ref});
        if (size >= 100) {  // both sides of the mask are exercised, and zeros are exact zeros
          CHECK(zeros_in(y.values(), size) > size / 10);
          CHECK(zeros_in(y.values(), size) == zeros_in(y_ref, size));
        }

        // The plain kernels then the element-wise relu give the same bits (same expressions).
        const AlignedFloats y_plain(y0), mean_plain(mean0), invstd_plain(invstd0);
        cu::batchnorm_forward_train(s, sh, kEps, kMomentum, x.data(), gamma.data(), beta.data(), y_plain.data(),
                                    mean_plain.data(), invstd_plain.data(), nullptr, nullptr);
        std::vector<float> relu_of_plain = y_plain.values();
        for (std::int64_t k = 0; k < size; ++k) relu_of_plain[std::size_t(k)] = petra::kernels::relu_of(relu_of_plain[std::size_t(k)]);
        CHECK(relu_of_plain == y.values());

        // Evaluation with the (updated) running statistics.
        std::vector<float> y_eval_ref = y0;
        ref::batchnorm_relu_forward_eval<float>(s, sh, kEps, x.data(), gamma.data(), beta.data(), rm.data(),
                                                rv.data(), y_eval_ref.data());
        const AlignedFloats y_eval(y0);
        cu::batchnorm_relu_forward_eval(s, sh, kEps, x.data(), gamma.data(), beta.data(), rm.data(), rv.data(),
                                        y_eval.data());
        CHECK(emu::last_launch().kernel == std::string("batchnorm_relu_forward_eval"));
        if (offset == 0) CHECK(relative_error(head(y_eval.values(), size), head(y_eval_ref, size)) < 1e-6);
        CHECK(guards_kept(y_eval.values(), y0, size));
      }
  }
}

TEST_CASE("emulated batchnorm_relu: backward matches ref, dx assigned, dgamma and dbeta accumulated") {
  HeapWorkspace workspace;
  StreamHandle s;
  s.workspace = &workspace;
  std::uint64_t seed = 3000;
  for (const std::size_t cap : kGridCaps) {
    const emu::GridStrideCap capped(cap);
    for (const BatchNormShape& sh : kReluShapes)
      for (const double offset : {0.0, 1000.0}) {
        seed += 10;
        const std::int64_t size = sh.size(), C = sh.channels;
        const AlignedFloats x(values(size, seed, offset - 1, offset + 1));
        const AlignedFloats gamma(values(C, seed + 1, 0.5, 1.5)), dy(values(size, seed + 2));
        std::vector<float> beta = values(C, seed + 3);
        std::vector<float> y_v(static_cast<std::size_t>(size)), mean_v(static_cast<std::size_t>(C)),
            invstd_v(static_cast<std::size_t>(C));
        ref::batchnorm_relu_forward_train<float>(s, sh, kEps, kMomentum, x.data(), gamma.data(), beta.data(),
                                                 y_v.data(), mean_v.data(), invstd_v.data(), nullptr, nullptr);
        const AlignedFloats y(y_v), mean(mean_v), invstd(invstd_v);
        const std::vector<float> dx0 = values(size, seed + 4, 5, 6);
        const std::vector<float> dgamma0 = values(C, seed + 5), dbeta0 = values(C, seed + 6);
        std::vector<float> dx_ref = dx0, dgamma_ref(static_cast<std::size_t>(C), 0.f),
                           dbeta_ref(static_cast<std::size_t>(C), 0.f);
        ref::batchnorm_relu_backward<float>(s, sh, x.data(), y.data(), dy.data(), gamma.data(), mean.data(),
                                            invstd.data(), dx_ref.data(), dgamma_ref.data(), dbeta_ref.data());
        const AlignedFloats dx(dx0), dgamma(dgamma0), dbeta(dbeta0);
        cu::batchnorm_relu_backward(s, sh, x.data(), y.data(), dy.data(), gamma.data(), mean.data(), invstd.data(),
                                    dx.data(), dgamma.data(), dbeta.data());
        INFO(describe(sh), " offset=", offset, " grid cap=", cap);
        CHECK(emu::last_launch().kernel == std::string("batchnorm_relu_backward"));
        CHECK(emu::last_launch().grid.x == expected_blocks(elementwise_groups(sh)));
        const std::vector<float> dgamma_got = dgamma.values(), dbeta_got = dbeta.values();
        check_backward(sh, gamma.data(), invstd_v, dy.data(), {dx.values(), dgamma_got, dbeta_got},
                       {dx0, dgamma0, dbeta0}, {dx_ref, dgamma_ref, dbeta_ref});

        // The element-wise mask then the plain backward give the same bits.
        std::vector<float> dy_masked(static_cast<std::size_t>(size));
        for (std::int64_t k = 0; k < size; ++k)
          dy_masked[std::size_t(k)] = petra::kernels::relu_masked(y.data()[k], dy.data()[k]);
        const AlignedFloats dy_masked_dev(dy_masked), dx_plain(dx0), dgamma_plain(dgamma0), dbeta_plain(dbeta0);
        cu::batchnorm_backward(s, sh, x.data(), dy_masked_dev.data(), gamma.data(), mean.data(), invstd.data(),
                               dx_plain.data(), dgamma_plain.data(), dbeta_plain.data());
        CHECK(dx_plain.values() == dx.values());
        CHECK(dgamma_plain.values() == dgamma_got);
        CHECK(dbeta_plain.values() == dbeta_got);
      }
  }
}

// The coupling fused with batch norm + ReLU (batchnorm_relu_coupling_*): the same bits as the
// emulated batchnorm_relu forward followed by the emulated coupling kernel, both directions,
// training (with the running statistics) and evaluation, with the grid caps; guards after `out`.
TEST_CASE("emulated batchnorm_relu_coupling: equals batch norm + relu then the coupling, bit for bit") {
  HeapWorkspace workspace;
  StreamHandle s;
  s.workspace = &workspace;
  std::uint64_t seed = 5000;
  for (const std::size_t cap : kGridCaps) {
    const emu::GridStrideCap capped(cap);
    for (const BatchNormShape& sh : kReluShapes)
      for (const auto direction : {petra::kernels::CouplingDirection::forward, petra::kernels::CouplingDirection::inverse}) {
        seed += 10;
        const bool forward = direction == petra::kernels::CouplingDirection::forward;
        const std::int64_t size = sh.size(), C = sh.channels;
        const petra::kernels::CouplingShape coupling{sh.batch, sh.channels, sh.height, sh.width};
        const AlignedFloats z(values(size, seed)), a(values(2 * size, seed + 1));
        const AlignedFloats gamma(values(C, seed + 2, 0.5, 1.5)), beta(values(C, seed + 3));
        const std::vector<float> out0 = values(2 * size, seed + 4, 5, 6), rm0 = values(C, seed + 5),
                                 rv0 = values(C, seed + 6, 0.5, 2);
        INFO(describe(sh), forward ? " forward" : " inverse", " grid cap=", cap);

        const AlignedFloats out(out0), mean(values(C, 1)), invstd(values(C, 2)), rm(rm0), rv(rv0);
        cu::batchnorm_relu_coupling_train(s, sh, kEps, kMomentum, direction, z.data(), gamma.data(), beta.data(),
                                          a.data(), out.data(), mean.data(), invstd.data(), rm.data(), rv.data());
        CHECK(emu::last_launch().kernel == std::string("batchnorm_relu_coupling_train"));
        CHECK(guards_kept(out.values(), out0, 2 * size));

        const AlignedFloats f(values(size, 3)), expected(out0), mean_u(values(C, 1)), invstd_u(values(C, 2)),
            rm_u(rm0), rv_u(rv0);
        cu::batchnorm_relu_forward_train(s, sh, kEps, kMomentum, z.data(), gamma.data(), beta.data(), f.data(),
                                         mean_u.data(), invstd_u.data(), rm_u.data(), rv_u.data());
        if (forward) cu::coupling_forward(s, coupling, a.data(), f.data(), expected.data());
        else cu::coupling_inverse(s, coupling, a.data(), f.data(), expected.data());
        CHECK(out.values() == expected.values());
        CHECK(rm.values() == rm_u.values());
        CHECK(rv.values() == rv_u.values());

        std::vector<float> out_ref = out0, mean_ref(static_cast<std::size_t>(C)), invstd_ref(static_cast<std::size_t>(C)), rm_ref = rm0,
                           rv_ref = rv0;
        ref::batchnorm_relu_coupling_train<float>(s, sh, kEps, kMomentum, direction, z.data(), gamma.data(),
                                                  beta.data(), a.data(), out_ref.data(), mean_ref.data(),
                                                  invstd_ref.data(), rm_ref.data(), rv_ref.data());
        CHECK(relative_error(head(out.values(), 2 * size), head(out_ref, 2 * size)) < 1e-5);

        // Evaluation with the updated running statistics.
        const AlignedFloats out_eval(out0), f_eval(values(size, 4)), expected_eval(out0);
        cu::batchnorm_relu_coupling_eval(s, sh, kEps, direction, z.data(), gamma.data(), beta.data(), rm.data(),
                                         rv.data(), a.data(), out_eval.data());
        CHECK(emu::last_launch().kernel == std::string("batchnorm_relu_coupling_eval"));
        cu::batchnorm_relu_forward_eval(s, sh, kEps, z.data(), gamma.data(), beta.data(), rm.data(), rv.data(),
                                        f_eval.data());
        if (forward) cu::coupling_forward(s, coupling, a.data(), f_eval.data(), expected_eval.data());
        else cu::coupling_inverse(s, coupling, a.data(), f_eval.data(), expected_eval.data());
        CHECK(out_eval.values() == expected_eval.values());
        CHECK(guards_kept(out_eval.values(), out0, 2 * size));
      }
  }
}

TEST_CASE("emulated batchnorm: float4 groups and the one-value fallback (a misaligned pointer) give the same bits") {
  // Planes of 24 values: the element-wise passes move float4s when every pointer is 16-byte
  // aligned, else one float at a time. The arithmetic per value is the same: the same bits.
  HeapWorkspace workspace;
  StreamHandle s;
  s.workspace = &workspace;
  const BatchNormShape sh{3, 5, 4, 6};
  const std::int64_t size = sh.size(), C = sh.channels;
  const auto groups = unsigned(elementwise_groups(sh)), singles = unsigned(size);
  // Each array twice: at a 16-byte boundary, and one float past it.
  struct Pair {
    AlignedFloats storage;
    explicit Pair(const std::vector<float>& v) : storage([&] {
      std::vector<float> w(v.size() + 1, 0.0f);
      std::copy(v.begin(), v.end(), w.begin() + 1);
      return w;
    }()) {}
    float* shifted() const { return storage.data() + 1; }
  };
  const std::vector<float> x0 = values(size, 71), dy0 = values(size, 72), gamma0 = values(C, 73, 0.5, 1.5),
                           beta0 = values(C, 74), a0 = values(2 * size, 75);
  const AlignedFloats x(x0), dy(dy0), gamma(gamma0), beta(beta0), a(a0);
  const Pair x1(x0), dy1(dy0), a1(a0);

  const auto forward = [&](const float* xp, bool relu, unsigned expect) {
    const AlignedFloats y(values(size, 76)), mean(values(C, 77)), invstd(values(C, 78));
    if (relu)
      cu::batchnorm_relu_forward_train(s, sh, kEps, kMomentum, xp, gamma.data(), beta.data(), y.data(), mean.data(),
                                       invstd.data(), nullptr, nullptr);
    else
      cu::batchnorm_forward_train(s, sh, kEps, kMomentum, xp, gamma.data(), beta.data(), y.data(), mean.data(),
                                  invstd.data(), nullptr, nullptr);
    CHECK(emu::last_launch().grid.x == expected_blocks(expect));
    return std::vector<std::vector<float>>{head(y.values(), size), head(mean.values(), C), head(invstd.values(), C)};
  };
  for (const bool relu : {false, true}) {
    CAPTURE(relu);
    const auto aligned = forward(x.data(), relu, groups), shifted = forward(x1.shifted(), relu, singles);
    CHECK(aligned == shifted);
    // Backward from the aligned forward's statistics (and y, the ReLU's mask).
    const auto backward = [&](const float* xp, const float* dyp, unsigned expect) {
      const AlignedFloats y(aligned[0]), mean(aligned[1]), invstd(aligned[2]), dx(values(size, 79)),
          dgamma(values(C, 80)), dbeta(values(C, 81));
      if (relu)
        cu::batchnorm_relu_backward(s, sh, xp, y.data(), dyp, gamma.data(), mean.data(), invstd.data(), dx.data(),
                                    dgamma.data(), dbeta.data());
      else
        cu::batchnorm_backward(s, sh, xp, dyp, gamma.data(), mean.data(), invstd.data(), dx.data(), dgamma.data(),
                               dbeta.data());
      CHECK(emu::last_launch().grid.x == expected_blocks(expect));
      return std::vector<std::vector<float>>{head(dx.values(), size), head(dgamma.values(), C), head(dbeta.values(), C)};
    };
    CHECK(backward(x.data(), dy.data(), groups) == backward(x1.shifted(), dy1.shifted(), singles));
  }
  // The coupling fused with batch norm + ReLU: a misaligned stream array takes the fallback too.
  for (const auto direction : {petra::kernels::CouplingDirection::forward, petra::kernels::CouplingDirection::inverse}) {
    const auto coupled = [&](const float* ap, unsigned expect) {
      const AlignedFloats out(values(2 * size, 82)), mean(values(C, 83)), invstd(values(C, 84));
      cu::batchnorm_relu_coupling_train(s, sh, kEps, kMomentum, direction, x.data(), gamma.data(), beta.data(), ap,
                                        out.data(), mean.data(), invstd.data(), nullptr, nullptr);
      CHECK(emu::last_launch().grid.x == expected_blocks(expect));
      return head(out.values(), 2 * size);
    };
    CHECK(coupled(a.data(), groups) == coupled(a1.shifted(), singles));
  }
}

TEST_CASE("emulated cuda::batchnorm_relu_backward_summed: dx as the plain backward, dx_sum += its channel sums") {
  HeapWorkspace workspace;
  StreamHandle s;
  s.workspace = &workspace;
  std::uint64_t seed = 7000;
  for (const BatchNormShape& sh : kShapes) {
    seed += 10;
    const std::int64_t size = sh.size(), C = sh.channels;
    const AlignedFloats x(values(size, seed)), gamma(values(C, seed + 1, 0.5, 1.5)), dy(values(size, seed + 2));
    std::vector<float> beta = values(C, seed + 3), y_v(static_cast<std::size_t>(size)),
                       mean_v(static_cast<std::size_t>(C)), invstd_v(static_cast<std::size_t>(C));
    ref::batchnorm_relu_forward_train<float>(s, sh, kEps, kMomentum, x.data(), gamma.data(), beta.data(), y_v.data(),
                                             mean_v.data(), invstd_v.data(), nullptr, nullptr);
    // A shifted mean: with the batch's own, dx sums to zero per channel and an unchanged dx_sum would pass.
    for (float& m : mean_v) m += 0.25f;
    const AlignedFloats y(y_v), mean(mean_v), invstd(invstd_v);
    const std::vector<float> zeros(static_cast<std::size_t>(C) + kGuard, 0.f), prior = values(C, seed + 4);
    const AlignedFloats dx(values(size, seed + 5)), dg(zeros), db(zeros), dx2(values(size, seed + 6)), dg2(zeros),
        db2(zeros), sums(prior);
    cu::batchnorm_relu_backward(s, sh, x.data(), y.data(), dy.data(), gamma.data(), mean.data(), invstd.data(),
                                dx.data(), dg.data(), db.data());
    cu::batchnorm_relu_backward_summed(s, sh, x.data(), y.data(), dy.data(), gamma.data(), mean.data(), invstd.data(),
                                       dx2.data(), dg2.data(), db2.data(), sums.data());
    INFO(describe(sh));
    const std::vector<float> plain = dx.values(), summed = dx2.values(), got = sums.values();
    CHECK(head(summed, size) == head(plain, size));
    for (std::int64_t c = 0; c < C; ++c) {
      double total = 0, magnitude = 0;
      for (std::int64_t n = 0; n < sh.batch; ++n)
        for (std::int64_t i = 0; i < sh.plane(); ++i) {
          const float v = plain[std::size_t((n * C + c) * sh.plane() + i)];
          total += v;
          magnitude += std::abs(v);
        }
      REQUIRE((magnitude == 0 || std::abs(total) > 1e-4 * magnitude));
      CHECK(std::abs((got[std::size_t(c)] - prior[std::size_t(c)]) - total) <= 1e-6 * (magnitude + 1));
    }
  }
}

namespace {

// The one pass (kernels/cuda/batchnorm.cu, "One pass"), turned on for a scope.
struct OnePass {
  OnePass() { cu::set_batchnorm_one_pass(true); }
  ~OnePass() { cu::set_batchnorm_one_pass(false); }
  OnePass(const OnePass&) = delete;
  OnePass& operator=(const OnePass&) = delete;
};

// Shapes and the clusters the one pass gives them under the emulation's bounds (a block holds at
// most 256 bytes of a channel where a smaller cluster allows, at most 2048 in a cluster of 8; while
// the grid has fewer blocks than the emulated device's 4 multiprocessors the cluster doubles if
// each block keeps 8 values): the forward keeps x, the backward x and dy (twice the bytes); 0 is
// the two passes.
struct OnePassCase {
  BatchNormShape shape;
  unsigned forward_cluster, backward_cluster;
};
const std::vector<OnePassCase> kOnePassCases = {
    {{2, 1, 1, 1}, 1, 1},     // n = 2
    {{2, 3, 4, 6}, 1, 2},     // n = 48, float4s
    {{3, 2, 1, 33}, 2, 4},    // n = 99, single values, shares of 50 and 49
    {{5, 3, 7, 7}, 4, 8},     // n = 245: shares of 62, the last 59
    {{4, 2, 8, 16}, 8, 8},    // n = 512 float4s: 16 per block (32 in the backward)
    {{5, 2, 33, 17}, 8, 0},   // n = 2805: 351 per block in the forward; the backward's 2 x 1404 bytes: two passes
    {{1, 3, 1, 7}, 1, 1},     // n = 7 < the 256 threads of a block
    {{2, 1, 4, 8}, 2, 2},     // n = 16 float4s, one channel: the forward's 1 block doubled to 2, not to 4 (4 values)
    {{3, 1, 80, 75}, 0, 0}};  // n = 18000: the two passes

std::string describe(const OnePassCase& c) {
  return describe(c.shape) + " forward cluster " + std::to_string(c.forward_cluster) + " backward cluster " +
         std::to_string(c.backward_cluster);
}

// The launch a one-pass call made: its name and cluster, or the two passes' last launch.
void check_path(const char* one_pass, const char* two_pass, unsigned cluster, std::int64_t channels) {
  const emu::LaunchRecord last = emu::last_launch();
  if (cluster == 0) {
    CHECK(last.kernel == std::string(two_pass));
    return;
  }
  CHECK(last.kernel == std::string(one_pass));
  CHECK(last.cluster == cluster);
  CHECK(last.grid.x == unsigned(channels) * cluster);
}

// The one pass's training forwards (plain, ReLU, into the coupling) and backwards (plain, ReLU) on
// `one`'s shape, inputs centred at `offset`, against ref:: and the paths' launches.
void check_one_pass(const StreamHandle& s, const OnePassCase& one, double offset, std::uint64_t seed) {
  const BatchNormShape& sh = one.shape;
  const std::int64_t size = sh.size(), C = sh.channels;
  INFO(describe(one), " offset=", offset, " cooperative=", emu::settings().cooperative);
  const AlignedFloats x(values(size, seed, offset - 1, offset + 1));
  const AlignedFloats gamma(values(C, seed + 1, 0.5, 1.5)), beta(values(C, seed + 2));
  const std::vector<float> y0 = values(size, seed + 3, 5, 6), stat0 = values(C, seed + 4, 5, 6),
                           rm0 = values(C, seed + 6), rv0 = values(C, seed + 7, 0.5, 2);

  for (const bool relu : {false, true}) {
    CAPTURE(relu);
    std::vector<float> y_ref = y0, mean_ref = stat0, invstd_ref = stat0, rm_ref = rm0, rv_ref = rv0;
    const AlignedFloats y(y0), mean(stat0), invstd(stat0), rm(rm0), rv(rv0);
    if (relu) {
      ref::batchnorm_relu_forward_train<float>(s, sh, kEps, kMomentum, x.data(), gamma.data(), beta.data(),
                                               y_ref.data(), mean_ref.data(), invstd_ref.data(), rm_ref.data(),
                                               rv_ref.data());
      cu::batchnorm_relu_forward_train(s, sh, kEps, kMomentum, x.data(), gamma.data(), beta.data(), y.data(),
                                       mean.data(), invstd.data(), rm.data(), rv.data());
      check_path("batchnorm_relu_forward_train_one_pass", "batchnorm_relu_forward_train", one.forward_cluster, C);
    } else {
      ref::batchnorm_forward_train<float>(s, sh, kEps, kMomentum, x.data(), gamma.data(), beta.data(),
                                          y_ref.data(), mean_ref.data(), invstd_ref.data(), rm_ref.data(),
                                          rv_ref.data());
      cu::batchnorm_forward_train(s, sh, kEps, kMomentum, x.data(), gamma.data(), beta.data(), y.data(),
                                  mean.data(), invstd.data(), rm.data(), rv.data());
      check_path("batchnorm_forward_train_one_pass", "batchnorm_forward_train", one.forward_cluster, C);
    }
    check_forward(sh, {y.values(), mean.values(), invstd.values(), rm.values(), rv.values()},
                  {y0, stat0, stat0, rm0, rv0}, {y_ref, mean_ref, invstd_ref, rm_ref, rv_ref});

    // Twice, without running statistics: the same bits.
    const AlignedFloats y2(y0), mean2(stat0), invstd2(stat0);
    if (relu)
      cu::batchnorm_relu_forward_train(s, sh, kEps, kMomentum, x.data(), gamma.data(), beta.data(), y2.data(),
                                       mean2.data(), invstd2.data(), nullptr, nullptr);
    else
      cu::batchnorm_forward_train(s, sh, kEps, kMomentum, x.data(), gamma.data(), beta.data(), y2.data(),
                                  mean2.data(), invstd2.data(), nullptr, nullptr);
    CHECK(y2.values() == y.values());
    CHECK(mean2.values() == mean.values());
    CHECK(invstd2.values() == invstd.values());

    // The backward, from ref's statistics and (with relu) its y as the mask.
    const AlignedFloats dy(values(size, seed + 8)), y_mask(y_ref), mean_r(mean_ref), invstd_r(invstd_ref);
    const std::vector<float> dx0 = values(size, seed + 9, 5, 6), dgamma0 = values(C, seed + 10),
                             dbeta0 = values(C, seed + 11);
    std::vector<float> dx_ref = dx0, dgamma_ref(std::size_t(C), 0.f), dbeta_ref(std::size_t(C), 0.f);
    const AlignedFloats dx(dx0), dgamma(dgamma0), dbeta(dbeta0);
    if (relu) {
      ref::batchnorm_relu_backward<float>(s, sh, x.data(), y_mask.data(), dy.data(), gamma.data(), mean_r.data(),
                                          invstd_r.data(), dx_ref.data(), dgamma_ref.data(), dbeta_ref.data());
      cu::batchnorm_relu_backward(s, sh, x.data(), y_mask.data(), dy.data(), gamma.data(), mean_r.data(),
                                  invstd_r.data(), dx.data(), dgamma.data(), dbeta.data());
      check_path("batchnorm_relu_backward_one_pass", "batchnorm_relu_backward", one.backward_cluster, C);
    } else {
      ref::batchnorm_backward<float>(s, sh, x.data(), dy.data(), gamma.data(), mean_r.data(), invstd_r.data(),
                                     dx_ref.data(), dgamma_ref.data(), dbeta_ref.data());
      cu::batchnorm_backward(s, sh, x.data(), dy.data(), gamma.data(), mean_r.data(), invstd_r.data(), dx.data(),
                             dgamma.data(), dbeta.data());
      check_path("batchnorm_backward_one_pass", "batchnorm_backward", one.backward_cluster, C);
    }
    check_backward(sh, gamma.data(), invstd_ref, dy.data(), {dx.values(), dgamma.values(), dbeta.values()},
                   {dx0, dgamma0, dbeta0}, {dx_ref, dgamma_ref, dbeta_ref});
  }

  // Fused into the coupling: the one-pass relu forward's f, coupled, bit for bit.
  for (const auto direction : {petra::kernels::CouplingDirection::forward, petra::kernels::CouplingDirection::inverse}) {
    const petra::kernels::CouplingShape coupling{sh.batch, sh.channels, sh.height, sh.width};
    const AlignedFloats a(values(2 * size, seed + 12));
    const std::vector<float> out0 = values(2 * size, seed + 13, 5, 6);
    const AlignedFloats out(out0), mean(stat0), invstd(stat0), rm(rm0), rv(rv0);
    cu::batchnorm_relu_coupling_train(s, sh, kEps, kMomentum, direction, x.data(), gamma.data(), beta.data(),
                                      a.data(), out.data(), mean.data(), invstd.data(), rm.data(), rv.data());
    check_path("batchnorm_relu_coupling_train_one_pass", "batchnorm_relu_coupling_train", one.forward_cluster, C);
    const AlignedFloats f(y0), expected(out0), mean_u(stat0), invstd_u(stat0), rm_u(rm0), rv_u(rv0);
    cu::batchnorm_relu_forward_train(s, sh, kEps, kMomentum, x.data(), gamma.data(), beta.data(), f.data(),
                                     mean_u.data(), invstd_u.data(), rm_u.data(), rv_u.data());
    if (direction == petra::kernels::CouplingDirection::forward)
      cu::coupling_forward(s, coupling, a.data(), f.data(), expected.data());
    else
      cu::coupling_inverse(s, coupling, a.data(), f.data(), expected.data());
    CHECK(out.values() == expected.values());
    CHECK(rm.values() == rm_u.values());
    CHECK(rv.values() == rv_u.values());
  }
}

}  // namespace

// Every case as fibers (Settings::cooperative: clusters of 8 blocks are 2048 threads, which as
// std::threads take minutes on two cores), where a block whose peers read its shared memory after
// it returned is caught; then the cases of clusters of 2 and 4 blocks as threads, truly concurrent,
// where a missing barrier may also show as a race.
TEST_CASE("emulated batchnorm one pass: a channel in a cluster's shared memory; training forwards and backwards match ref") {
  HeapWorkspace workspace;
  StreamHandle s;
  s.workspace = &workspace;
  for (const OnePassCase& one : kOnePassCases) {  // the clusters the query says (test-cuda relies on it)
    INFO(describe(one));
    CHECK(cu::batchnorm_one_pass_cluster(s, one.shape, false) == 0);  // the setting is off
    const OnePass on;
    CHECK(cu::batchnorm_one_pass_cluster(s, one.shape, false) == int(one.forward_cluster));
    CHECK(cu::batchnorm_one_pass_cluster(s, one.shape, true) == int(one.backward_cluster));
  }
  const OnePass on;
  const bool saved = emu::settings().cooperative;
  emu::settings().cooperative = true;
  std::uint64_t seed = 7000;
  for (const OnePassCase& one : kOnePassCases)
    for (const double offset : {0.0, 1000.0}) check_one_pass(s, one, offset, seed += 20);
  emu::settings().cooperative = false;
  for (const OnePassCase& one : kOnePassCases)
    if (one.forward_cluster == 2 || one.forward_cluster == 4) check_one_pass(s, one, 1000.0, seed += 20);
  emu::settings().cooperative = saved;
}
