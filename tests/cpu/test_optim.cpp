// tests/cpu/test_optim.cpp: SGD, Adam and LARS updates: three steps of a 3-element example
// against values computed by hand from the formulas of kernels/optim.hpp, then cpu vs ref on
// random arrays.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "petra/kernels/optim.hpp"
#include "tests/support/testing.hpp"

namespace k = petra::kernels;
using petra::testing::max_abs_diff;
using petra::testing::random_values;
using petra::testing::relative_error;
using Values = std::vector<double>;

namespace {

// The example: p starts at kStart, and the gradients of steps 1, 2, 3 are kGrads[0..2].
const Values kStart = {1.0, -2.0, 0.5};
const std::vector<Values> kGrads = {{0.1, 0.2, -0.3}, {-0.2, 0.1, 0.4}, {0.3, -0.1, 0.0}};

template <class T>
std::vector<T> as(const Values& v) {
  return std::vector<T>(v.begin(), v.end());
}

// |got - expected| <= tolerance for every element
template <class T>
void check_close(const std::vector<T>& got, const Values& expected, double tolerance) {
  CHECK(max_abs_diff(got, expected) <= tolerance);
}

double tolerance_of(bool is_float) { return is_float ? 2e-6 : 1e-13; }

struct SgdExpectation {
  k::SgdOptions options;
  std::vector<Values> param, buffer;  // after steps 1, 2, 3
};

// Step 1 of "momentum", by hand: g = grad + 0.01 p = {0.11, 0.18, -0.295}; buf = g (first step);
// p -= 0.1 buf = {0.989, -2.018, 0.5295}. Later steps: buf = 0.9 buf + 0.9 g.
const std::vector<SgdExpectation> kSgd = {
    {{0.1, 0, 0, 0.01, false},  // plain: p -= 0.1 (grad + 0.01 p)
     {{0.989, -2.018, 0.5295}, {1.008011, -2.025982, 0.4889705}, {0.977002989, -2.013956018, 0.4884815295}},
     {}},
    {{0.1, 0.9, 0.1, 0.01, false},  // momentum with dampening
     {{0.989, -2.018, 0.5295}, {0.9962099, -2.0413838, 0.51957345}, {0.97480222109, -2.05159197458, 0.510171938895}},
     {{0.11, 0.18, -0.295}, {-0.072099, 0.233838, 0.0992655}, {0.2140767891, 0.1020817458, 0.09401511105}}},
    {{0.1, 0.9, 0, 0.01, true},  // Nesterov: p -= 0.1 (g + 0.9 buf)
     {{0.9791, -2.0342, 0.55605}, {1.00632971, -2.06391502, 0.502888505}, {0.954805612551, -2.060567879462, 0.4905881163405}},
     {{0.11, 0.18, -0.295}, {-0.091209, 0.241658, 0.1400605}, {0.2279751971, 0.0968530498, 0.13108333505}}},
};

template <class T>
void check_sgd_by_hand(bool fast) {
  for (const auto& e : kSgd) {
    CAPTURE(e.options.momentum);
    CAPTURE(e.options.nesterov);
    auto param = as<T>(kStart);
    // the first step must ignore whatever the buffer holds
    std::vector<T> buffer(3, std::numeric_limits<T>::max());
    for (int step = 0; step < 3; ++step) {
      CAPTURE(step);
      const auto grad = as<T>(kGrads[std::size_t(step)]);
      const bool first = step == 0;
      fast ? k::cpu::sgd_step(k::StreamHandle{}, 3, e.options, first, param.data(), grad.data(), buffer.data())
           : k::ref::sgd_step(k::StreamHandle{}, 3, e.options, first, param.data(), grad.data(), buffer.data());
      check_close(param, e.param[std::size_t(step)], tolerance_of(sizeof(T) == 4));
      if (!e.buffer.empty()) check_close(buffer, e.buffer[std::size_t(step)], tolerance_of(sizeof(T) == 4));
    }
  }
}

// Adam, lr 0.01, betas (0.9, 0.999), eps 1e-8, weight decay 0.05. Step 1 by hand:
// g = grad + 0.05 p = {0.15, 0.1, -0.275}; m = 0.1 g; v = 0.001 g^2; m_hat = g, v_hat = g^2;
// p -= 0.01 g / (|g| + 1e-8), i.e. by 0.01 sign(g) up to the eps term.
const k::AdamOptions kAdam{0.01, 0.9, 0.999, 1e-8, 0.05};
const std::vector<Values> kAdamParam = {{0.9900000006666666, -2.009999999, 0.5099999996363637},
                                        {0.9905429541504768, -2.0166632717702146, 0.5073851616972722},
                                        {0.9853011468789894, -2.0132376958902176, 0.50504672881387}};
const std::vector<Values> kAdamM = {{0.015, 0.01, -0.0275},
                                    {-0.0015499999966666657, 0.008950000004999998, 0.017799999998181822},
                                    {0.03355771477375238, -0.012028316354351072, 0.018556925806850002}};
const std::vector<Values> kAdamV = {{2.25e-05, 1e-05, 7.5625e-05},
                                    {4.512774998996672e-05, 9.990249999950011e-06, 0.0002565996249845275},
                                    {0.000167251849224534, 5.0314219346919615e-05, 0.00025698662461531944}};

template <class T>
void check_adam_by_hand(bool fast) {
  auto param = as<T>(kStart);
  std::vector<T> m(3, T(0)), v(3, T(0));
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    const auto grad = as<T>(kGrads[std::size_t(step)]);
    fast ? k::cpu::adam_step(k::StreamHandle{}, 3, kAdam, step + 1, param.data(), grad.data(), m.data(), v.data())
         : k::ref::adam_step(k::StreamHandle{}, 3, kAdam, step + 1, param.data(), grad.data(), m.data(), v.data());
    check_close(param, kAdamParam[std::size_t(step)], tolerance_of(sizeof(T) == 4));
    check_close(m, kAdamM[std::size_t(step)], tolerance_of(sizeof(T) == 4));
    check_close(v, kAdamV[std::size_t(step)], tolerance_of(sizeof(T) == 4) * 1e-3);
  }
}

// LARS, lr 0.1, momentum 0.9, weight decay 0.01, eta 0.02. Step 1 by hand: ||p|| = sqrt(5.25),
// ||grad|| = sqrt(0.14); trust = 0.02 sqrt(5.25) / (sqrt(0.14) + 0.01 sqrt(5.25)) = 0.11540726...;
// buf = 0.1 trust (grad + 0.01 p); p -= buf.
const k::LarsOptions kLars{0.1, 0.9, 0.01, 0.02};
const std::vector<Values> kLarsParam = {{0.9987305200918135, -2.0020773307588504, 0.5034045142992273},
                                        {0.9993991410048273, -2.004709270152452, 0.5026078953438922},
                                        {0.9958046302748615, -2.005452984238893, 0.5018229021844851}};
const std::vector<Values> kLarsBuffer = {{0.0012694799081864473, 0.00207733075885055, -0.00340451429922729},
                                         {-0.0006686209130137683, 0.0026319393936015062, 0.0007966189553351476},
                                         {0.003594510729965775, 0.0007437140864412219, 0.0007849931594070221}};

template <class T>
void check_lars_by_hand(bool fast) {
  auto param = as<T>(kStart);
  std::vector<T> buffer(3, T(0));
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    const auto grad = as<T>(kGrads[std::size_t(step)]);
    fast ? k::cpu::lars_step(k::StreamHandle{}, 3, kLars, param.data(), grad.data(), buffer.data())
         : k::ref::lars_step(k::StreamHandle{}, 3, kLars, param.data(), grad.data(), buffer.data());
    check_close(param, kLarsParam[std::size_t(step)], tolerance_of(sizeof(T) == 4));
    check_close(buffer, kLarsBuffer[std::size_t(step)], tolerance_of(sizeof(T) == 4) * 1e-2);
  }
}

// Three steps of one optimizer through ref:: and through cpu:: (1 and 2 threads) on random
// arrays of n elements; `step(fast, s, t, param, grad, state_a, state_b)` does step t (1-based).
template <class T, class Step>
void compare_cpu_to_ref(std::int64_t n, Step step, double tolerance, std::uint64_t seed) {
  CAPTURE(n);
  const std::size_t size = std::size_t(n);
  const auto start = random_values<T>(size, seed);
  const auto state = random_values<T>(size, seed + 1, 0.0, 0.01);  // v must be >= 0
  auto p_ref = start, a_ref = state, b_ref = state;
  auto p1 = start, a1 = state, b1 = state, p2 = start, a2 = state, b2 = state;
  k::StreamHandle one, two;
  two.num_threads = 2;
  for (int t = 1; t <= 3; ++t) {
    const auto grad = random_values<T>(size, seed + 10 + std::uint64_t(t));
    step(false, one, t, p_ref.data(), grad.data(), a_ref.data(), b_ref.data());
    step(true, one, t, p1.data(), grad.data(), a1.data(), b1.data());
    step(true, two, t, p2.data(), grad.data(), a2.data(), b2.data());
  }
  CHECK(relative_error(p1, p_ref) <= tolerance);
  CHECK(relative_error(a1, a_ref) <= tolerance);
  CHECK(relative_error(b1, b_ref) <= tolerance);
  CHECK(p1 == p2);  // the thread count does not change a bit
  CHECK(a1 == a2);
}

const std::vector<std::int64_t> kSizes = {1, 5, 1001, 100003};

}  // namespace

TEST_CASE("optim: SGD (plain, momentum with dampening, Nesterov) matches hand-computed steps") {
  for (bool fast : {false, true}) {
    CAPTURE(fast);
    check_sgd_by_hand<double>(fast);
    check_sgd_by_hand<float>(fast);
  }
}

TEST_CASE("optim: Adam with weight decay matches hand-computed steps") {
  for (bool fast : {false, true}) {
    CAPTURE(fast);
    check_adam_by_hand<double>(fast);
    check_adam_by_hand<float>(fast);
  }
}

TEST_CASE("optim: LARS matches hand-computed steps") {
  for (bool fast : {false, true}) {
    CAPTURE(fast);
    check_lars_by_hand<double>(fast);
    check_lars_by_hand<float>(fast);
  }
}

TEST_CASE("optim: LARS uses trust 1 when a norm is zero") {
  const k::LarsOptions o{0.5, 0.9, 0.1, 0.001};
  for (bool fast : {false, true}) {
    // zero gradient: buf = 0.9 * 1 + 0.5 * 1 * (0 + 0.1 * 2) = 1.0; p = 2 - 1 = 1
    std::vector<double> p = {2.0}, g = {0.0}, buf = {1.0};
    fast ? k::cpu::lars_step(k::StreamHandle{}, 1, o, p.data(), g.data(), buf.data())
         : k::ref::lars_step(k::StreamHandle{}, 1, o, p.data(), g.data(), buf.data());
    CHECK(buf[0] == doctest::Approx(1.0).epsilon(1e-15));
    CHECK(p[0] == doctest::Approx(1.0).epsilon(1e-15));
    // zero parameter: buf = 0 + 0.5 * 1 * (4 + 0) = 2; p = -2
    p = {0.0}, g = {4.0}, buf = {0.0};
    fast ? k::cpu::lars_step(k::StreamHandle{}, 1, o, p.data(), g.data(), buf.data())
         : k::ref::lars_step(k::StreamHandle{}, 1, o, p.data(), g.data(), buf.data());
    CHECK(buf[0] == 2.0);
    CHECK(p[0] == -2.0);
  }
}

TEST_CASE("optim: cpu matches ref on random arrays, 1 and 2 threads") {
  std::uint64_t seed = 900;
  for (std::int64_t n : kSizes) {
    for (const auto& o : {k::SgdOptions{0.1, 0, 0, 0, false}, k::SgdOptions{0.05, 0.9, 0.1, 1e-4, false},
                          k::SgdOptions{0.05, 0.9, 0, 5e-4, true}, k::SgdOptions{0.05, 0.9, 0, 5e-4, true, 3.0},
                          k::SgdOptions{0.05, 0.9, 0, 0, false, 2.5}}) {
      compare_cpu_to_ref<float>(
          n,
          [&](bool fast, const k::StreamHandle& s, int t, float* p, const float* g, float* buf, float*) {
            fast ? k::cpu::sgd_step(s, n, o, t == 1, p, g, buf) : k::ref::sgd_step(s, n, o, t == 1, p, g, buf);
          },
          1e-6, seed += 100);
    }
    const k::AdamOptions adam{1e-3, 0.9, 0.999, 1e-8, 1e-2};
    compare_cpu_to_ref<float>(
        n,
        [&](bool fast, const k::StreamHandle& s, int t, float* p, const float* g, float* m, float* v) {
          fast ? k::cpu::adam_step(s, n, adam, t, p, g, m, v) : k::ref::adam_step(s, n, adam, t, p, g, m, v);
        },
        1e-6, seed += 100);
    const k::LarsOptions lars{0.1, 0.9, 5e-4, 0.001};
    compare_cpu_to_ref<float>(
        n,
        [&](bool fast, const k::StreamHandle& s, int, float* p, const float* g, float* buf, float*) {
          fast ? k::cpu::lars_step(s, n, lars, p, g, buf) : k::ref::lars_step(s, n, lars, p, g, buf);
        },
        1e-6, seed += 100);
  }
}

// Spike compensation (SgdOptions::delay): one gradient g = 1 arrives D updates late, then only
// zero gradients follow. From its arrival on, the parameter must be where an undelayed run,
// which saw g at step 0, is at the same step: the D steps it missed are applied at once.
TEST_CASE("optim: SGD with delay compensation catches a late gradient up with the undelayed run") {
  for (bool nesterov : {false, true})
    for (double delay : {1.0, 3.0, 8.0})
      for (bool fast : {false, true}) {
        CAPTURE(nesterov);
        CAPTURE(delay);
        CAPTURE(fast);
        const k::SgdOptions plain{0.1, 0.9, 0, 0, nesterov, 0.0};
        k::SgdOptions compensated = plain;
        compensated.delay = delay;
        const auto step = [&](const k::SgdOptions& o, double& p, double g, double& buf) {
          fast ? k::cpu::sgd_step(k::StreamHandle{}, 1, o, false, &p, &g, &buf)
               : k::ref::sgd_step(k::StreamHandle{}, 1, o, false, &p, &g, &buf);
        };
        const int late = static_cast<int>(delay);
        double p_plain = 0, buf_plain = 0, p_late = 0, buf_late = 0;
        for (int t = 0; t < late + 20; ++t) {
          step(plain, p_plain, t == 0 ? 1.0 : 0.0, buf_plain);
          step(compensated, p_late, t == late ? 1.0 : 0.0, buf_late);
          if (t < late) CHECK(p_late == 0.0);  // nothing has arrived yet
          if (t >= late) CHECK(p_late == doctest::Approx(p_plain).epsilon(1e-12));
        }
        // near the whole displacement of one gradient, -lr / (1 - m) = -1 (0.9^20 of it is left)
        CHECK(p_late < -0.8);
      }
}
