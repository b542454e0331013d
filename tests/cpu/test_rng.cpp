// tests/cpu/test_rng.cpp: Philox 4x32-10 against Random123's known answers, reproducibility,
// the statistics of uniforms, normals, integers and permutations, skip-ahead, and the random
// tensors Tensor::uniform / Tensor::normal.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <vector>

#include "petra/error.hpp"
#include "petra/rng.hpp"
#include "petra/tensor.hpp"

using petra::Philox;
using petra::PhiloxCounter;
using petra::PhiloxKey;

namespace {

bool same_words(const PhiloxCounter& a, const PhiloxCounter& b) {
  return std::equal(std::begin(a.word), std::end(a.word), std::begin(b.word));
}

// Random123 kat_vectors, lines "philox 4 32 10 <counter x4> <key x2> <expected x4>".
constexpr PhiloxCounter kat(PhiloxCounter counter, PhiloxKey key) { return petra::philox4x32_10(counter, key); }
static_assert(kat({{0, 0, 0, 0}}, {{0, 0}}).word[0] == 0x6627e8d5u, "philox4x32_10 is usable at compile time");

struct Moments {
  double mean = 0, variance = 0, skewness = 0, kurtosis = 0;
};

Moments moments_of(const std::vector<float>& v) {
  Moments m;
  for (float x : v) m.mean += x;
  m.mean /= double(v.size());
  double m2 = 0, m3 = 0, m4 = 0;
  for (float x : v) {
    const double d = x - m.mean;
    m2 += d * d;
    m3 += d * d * d;
    m4 += d * d * d * d;
  }
  m2 /= double(v.size());
  m3 /= double(v.size());
  m4 /= double(v.size());
  m.variance = m2;
  m.skewness = m3 / std::pow(m2, 1.5);
  m.kurtosis = m4 / (m2 * m2);
  return m;
}

// Pearson's chi-square statistic of observed counts against equal expected counts.
double chi_square_uniform(const std::vector<std::int64_t>& counts) {
  const double total = std::accumulate(counts.begin(), counts.end(), 0.0);
  const double expected = total / double(counts.size());
  double chi2 = 0;
  for (auto c : counts) chi2 += (double(c) - expected) * (double(c) - expected) / expected;
  return chi2;
}

}  // namespace

TEST_CASE("philox4x32_10 reproduces Random123's known-answer vectors") {
  CHECK(same_words(kat({{0, 0, 0, 0}}, {{0, 0}}), {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}));
  CHECK(same_words(kat({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, {{0xffffffffu, 0xffffffffu}}),
                   {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}));
  CHECK(same_words(kat({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, {{0xa4093822u, 0x299f31d0u}}),
                   {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}));
}

TEST_CASE("Philox maps seed to the key and (block, stream) to the counter") {
  const std::uint64_t seed = 0x0123456789abcdefULL, stream = 0xfedcba9876543210ULL, block = 0x100000002ULL;
  const PhiloxKey key = petra::philox_key(seed);
  CHECK(key.word[0] == 0x89abcdefu);
  CHECK(key.word[1] == 0x01234567u);
  const PhiloxCounter counter = petra::philox_counter(block, stream);
  CHECK(counter.word[0] == 2u);
  CHECK(counter.word[1] == 1u);
  CHECK(counter.word[2] == 0x76543210u);
  CHECK(counter.word[3] == 0xfedcba98u);
  CHECK(same_words(Philox(seed, stream).block(block), petra::philox4x32_10(counter, key)));
  // Seed 0, stream 0 is Random123's zero vector: the first four words of the stream.
  Philox zero(0);
  CHECK(zero.next_u32() == 0x6627e8d5u);
  CHECK(zero.next_u32() == 0xe169c58du);
  CHECK(zero.next_u32() == 0xbc57ac4cu);
  CHECK(zero.next_u32() == 0x9b00dbd8u);
  CHECK(zero.offset() == 4);
}

TEST_CASE("Philox: the same seed and stream give the same numbers; others differ") {
  auto draw = [](std::uint64_t seed, std::uint64_t stream) {
    Philox g(seed, stream);
    std::vector<std::uint32_t> v(64);
    for (auto& x : v) x = g.next_u32();
    return v;
  };
  CHECK(draw(42, 0) == draw(42, 0));
  CHECK(draw(42, 3) == draw(42, 3));
  // Compare element by element: unrelated streams agree on a word with probability 2^-32.
  auto count_equal = [](const std::vector<std::uint32_t>& a, const std::vector<std::uint32_t>& b) {
    int equal = 0;
    for (std::size_t i = 0; i < a.size(); ++i) equal += a[i] == b[i];
    return equal;
  };
  CHECK(count_equal(draw(42, 0), draw(43, 0)) == 0);
  CHECK(count_equal(draw(42, 0), draw(42, 1)) == 0);
  CHECK(count_equal(draw(42, 0), draw(42ULL << 32, 0)) == 0);

  std::vector<float> a(1000), b(1000), c(1000);
  Philox(7).fill_normal(a.data(), a.size());
  Philox(7).fill_normal(b.data(), b.size());
  Philox(8).fill_normal(c.data(), c.size());
  CHECK(a == b);
  CHECK(a != c);
}

TEST_CASE("Philox::fill_uniform: 1e6 draws have the moments of U[lo, hi)") {
  std::vector<float> v(1'000'000);
  Philox g(2024);
  g.fill_uniform(v.data(), v.size());
  CHECK(*std::min_element(v.begin(), v.end()) >= 0.0f);
  CHECK(*std::max_element(v.begin(), v.end()) < 1.0f);
  const Moments m = moments_of(v);
  // Standard errors for n = 1e6: mean 2.9e-4, variance 7.5e-5; the bounds are about 5 of them.
  CHECK(std::abs(m.mean - 0.5) < 1.5e-3);
  CHECK(std::abs(m.variance - 1.0 / 12.0) < 4e-4);
  CHECK(std::abs(m.skewness) < 0.01);

  // Ten equal bins: chi-square with 9 degrees of freedom is below 27.9 with probability 0.999.
  std::vector<std::int64_t> bins(10, 0);
  for (float x : v) ++bins[static_cast<std::size_t>(x * 10)];
  CHECK(chi_square_uniform(bins) < 27.9);

  g.fill_uniform(v.data(), v.size(), -3.0f, 5.0f);
  CHECK(*std::min_element(v.begin(), v.end()) >= -3.0f);
  CHECK(*std::max_element(v.begin(), v.end()) < 5.0f);
  CHECK(std::abs(moments_of(v).mean - 1.0) < 1.5e-2);
  CHECK(std::abs(moments_of(v).variance - 64.0 / 12.0) < 3e-2);
}

TEST_CASE("Philox::uniform(lo, hi) never returns hi, even when rounding would land on it") {
  Philox g(5);
  // Near 1e4 the float spacing is ~1e-3, so lo + (hi - lo) * u rounds up to hi for u close to 1.
  const float lo = 10000.0f, hi = std::nextafter(std::nextafter(lo, 2 * lo), 2 * lo);
  int at_lo = 0, above_lo = 0, out_of_range = 0;
  for (int i = 0; i < 10000; ++i) {
    const float x = g.uniform(lo, hi);
    out_of_range += !(x >= lo && x < hi);
    at_lo += x == lo;
    above_lo += x > lo;
  }
  CHECK(out_of_range == 0);
  CHECK(at_lo > 0);
  CHECK(above_lo > 0);
  CHECK_THROWS_AS(g.uniform(1.0f, 1.0f), petra::ValueError);
  CHECK_THROWS_AS(g.uniform(2.0f, 1.0f), petra::ValueError);
  std::vector<float> v(4);
  CHECK_THROWS_AS(g.fill_uniform(v.data(), v.size(), 0.0f, INFINITY), petra::ValueError);
  CHECK_THROWS_AS(g.fill_normal(v.data(), v.size(), 0.0f, -1.0f), petra::ValueError);
}

TEST_CASE("Philox::fill_normal: 1e6 draws have the moments of N(mean, std)") {
  std::vector<float> v(1'000'000);
  Philox g(99, 1);
  g.fill_normal(v.data(), v.size());
  Moments m = moments_of(v);
  // Standard errors: mean 1e-3, variance 1.4e-3, skewness 2.4e-3, kurtosis 4.9e-3.
  CHECK(std::abs(m.mean) < 5e-3);
  CHECK(std::abs(m.variance - 1.0) < 7e-3);
  CHECK(std::abs(m.skewness) < 0.015);
  CHECK(std::abs(m.kurtosis - 3.0) < 0.03);
  // The fraction within one sigma is erf(1/sqrt 2) = 0.6827 (standard error 4.7e-4).
  const auto within = std::count_if(v.begin(), v.end(), [](float x) { return std::abs(x) < 1.0f; });
  CHECK(std::abs(double(within) / double(v.size()) - 0.682689) < 2.5e-3);

  g.fill_normal(v.data(), v.size(), 3.0f, 0.5f);
  m = moments_of(v);
  CHECK(std::abs(m.mean - 3.0) < 2.5e-3);
  CHECK(std::abs(std::sqrt(m.variance) - 0.5) < 2.5e-3);

  // The scalar draw follows the same law (1e5 draws: standard error of the mean 3.2e-3).
  std::vector<float> w(100'000);
  for (auto& x : w) x = g.normal();
  m = moments_of(w);
  CHECK(std::abs(m.mean) < 0.016);
  CHECK(std::abs(m.variance - 1.0) < 0.025);
}

TEST_CASE("Philox::randint is uniform on [0, n) without modulo bias") {
  Philox g(11);
  CHECK_THROWS_AS(g.randint(0), petra::ValueError);
  CHECK_THROWS_AS(g.randint(-5), petra::ValueError);
  int nonzero = 0;
  for (int i = 0; i < 100; ++i) nonzero += g.randint(1) != 0;
  CHECK(nonzero == 0);

  // n = 3 * 2^30: a plain u32 % n would make [0, 2^30) twice as likely as the rest.
  const std::int64_t n = 3LL << 30;
  std::vector<std::int64_t> thirds(3, 0);
  int out_of_range = 0;
  for (int i = 0; i < 300'000; ++i) {
    const std::int64_t x = g.randint(n);
    if (x < 0 || x >= n) ++out_of_range;
    else ++thirds[static_cast<std::size_t>(x >> 30)];
  }
  CHECK(out_of_range == 0);
  CHECK(chi_square_uniform(thirds) < 13.8);  // 2 degrees of freedom, p = 0.001

  std::vector<std::int64_t> sevens(7, 0);
  for (int i = 0; i < 70'000; ++i) ++sevens[static_cast<std::size_t>(g.randint(7))];
  CHECK(chi_square_uniform(sevens) < 22.5);  // 6 degrees of freedom, p = 0.001

  // Beyond 32 bits: both halves of the range are reached.
  const std::int64_t big = (1LL << 40) + 3;
  int upper_half = 0;
  for (int i = 0; i < 1000; ++i) {
    const std::int64_t x = g.randint(big);
    out_of_range += x < 0 || x >= big;
    upper_half += x >= big / 2;
  }
  CHECK(out_of_range == 0);
  CHECK(upper_half > 400);
  CHECK(upper_half < 600);
}

TEST_CASE("Philox::permutation is a reproducible, uniformly random permutation") {
  std::vector<std::int64_t> p = Philox(3).permutation(1000);
  CHECK(p == Philox(3).permutation(1000));
  CHECK(p != Philox(4).permutation(1000));
  std::vector<std::int64_t> sorted = p, identity(1000);
  std::sort(sorted.begin(), sorted.end());
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(sorted == identity);
  CHECK(p != identity);
  CHECK(Philox(3).permutation(0).empty());
  CHECK(Philox(3).permutation(1) == std::vector<std::int64_t>{0});
  CHECK_THROWS_AS(Philox(3).permutation(-1), petra::ValueError);

  // All 24 orders of 4 elements are equally likely.
  Philox g(17);
  std::map<std::vector<std::int64_t>, std::int64_t> seen;
  for (int i = 0; i < 48'000; ++i) ++seen[g.permutation(4)];
  REQUIRE(seen.size() == 24);
  std::vector<std::int64_t> counts;
  for (const auto& [order, count] : seen) counts.push_back(count);
  CHECK(chi_square_uniform(counts) < 49.7);  // 23 degrees of freedom, p = 0.001
}

TEST_CASE("Philox skip-ahead: any word of a stream can be computed on its own") {
  Philox sequential(123, 9);
  std::vector<std::uint32_t> words(103);
  for (auto& w : words) w = sequential.next_u32();
  CHECK(sequential.offset() == words.size());

  const Philox stateless(123, 9);
  for (std::size_t i = 0; i < words.size(); ++i) CHECK(stateless.block(i / 4).word[i % 4] == words[i]);

  for (std::uint64_t start : {0u, 1u, 4u, 37u, 100u}) {
    Philox jumped(123, 9);
    jumped.set_offset(start);
    CHECK(jumped.next_u32() == words[start]);
    Philox skipped(123, 9);
    skipped.skip(start);
    CHECK(skipped.next_u32() == words[start]);
  }
  Philox g(123, 9);
  g.next_u32();
  CHECK(g.next_u64() == (words[1] | (std::uint64_t{words[2]} << 32)));
}

TEST_CASE("Philox fills: element i uses block b0 + i/4, word i%4, with b0 rounded up from the offset") {
  const float lo = -2.0f, hi = 3.0f;
  Philox g(77, 2);
  g.set_offset(5);  // mid-block: the fill starts at block 2
  CHECK(g.block_for_fill() == 2);
  std::vector<float> u(11);
  g.fill_uniform(u.data(), u.size(), lo, hi);
  CHECK(g.offset() == 4 * (2 + 3));
  const petra::UniformFloat to_range(lo, hi);
  for (std::size_t i = 0; i < u.size(); ++i) CHECK(u[i] == to_range(g.block(2 + i / 4).word[i % 4]));
  CHECK(to_range(0) == lo);
  CHECK(to_range(0xffffffffu) == std::fma(hi - lo, 0.99999994f, lo));

  // Consecutive fills do not overlap: the next one starts at block 5.
  std::vector<float> z(7);
  g.fill_normal(z.data(), z.size(), 1.0f, 2.0f);
  CHECK(g.offset() == 4 * (5 + 2));
  for (std::size_t i = 0; i < z.size(); ++i) {
    const PhiloxCounter w = g.block(5 + i / 4);
    float pair[2];
    const std::size_t first = i % 4 < 2 ? 0 : 2;
    petra::box_muller(w.word[first], w.word[first + 1], pair[0], pair[1]);
    CHECK(z[i] == std::fma(2.0f, pair[i % 2], 1.0f));
  }

  // One fill of n equals fills of the same blocks computed piecewise, at any block-aligned split.
  std::vector<float> whole(64), parts(64);
  Philox(8).fill_uniform(whole.data(), whole.size());
  Philox split(8);
  split.fill_uniform(parts.data(), 20);
  split.fill_uniform(parts.data() + 20, 44);
  CHECK(whole == parts);
}

// ---------------------------------------------------------------- Tensor::uniform, Tensor::normal

TEST_CASE("Tensor::uniform and Tensor::normal: the same seed gives the same values, another seed others") {
  using petra::Tensor;
  const Tensor u = Tensor::uniform({10, 100}, 7), n = Tensor::normal({10, 100}, 7);
  CHECK(u.shape() == petra::Shape{10, 100});
  CHECK(u.dtype() == petra::DType::f32);
  CHECK(u.device() == petra::Device::cpu());
  CHECK(u.to_vector<float>() == Tensor::uniform({10, 100}, 7).to_vector<float>());
  CHECK(n.to_vector<float>() == Tensor::normal({10, 100}, 7).to_vector<float>());
  // Element i is element i of the generator's fill, from offset 0 of stream 0.
  std::vector<float> expected(1000);
  Philox(7).fill_uniform(expected.data(), expected.size(), -1.0f, 2.0f);
  CHECK(Tensor::uniform({1000}, 7, -1.0, 2.0).to_vector<float>() == expected);
  Philox(7).fill_normal(expected.data(), expected.size(), 0.5f, 3.0f);
  CHECK(Tensor::normal({1000}, 7, 0.5, 3.0).to_vector<float>() == expected);
  // Another seed: unrelated values (two floats with 24 random bits agree with probability 2^-24).
  auto count_equal = [](const Tensor& a, const Tensor& b) {
    const auto x = a.to_vector<float>(), y = b.to_vector<float>();
    int equal = 0;
    for (std::size_t i = 0; i < x.size(); ++i) equal += x[i] == y[i];
    return equal;
  };
  CHECK(count_equal(u, Tensor::uniform({10, 100}, 8)) <= 1);
  CHECK(count_equal(n, Tensor::normal({10, 100}, 8)) <= 1);
}

TEST_CASE("Tensor::uniform: 1e5 draws lie in [lo, hi) with the mean and variance of U[lo, hi)") {
  const double lo = -2.0, hi = 3.0;
  const auto v = petra::Tensor::uniform({100, 1000}, 2025, lo, hi).to_vector<float>();
  CHECK(*std::min_element(v.begin(), v.end()) >= lo);
  CHECK(*std::max_element(v.begin(), v.end()) < hi);
  const Moments m = moments_of(v);
  // n = 1e5, width 5: standard errors 4.6e-3 for the mean (sqrt(25/12/n)) and 5.9e-3 for the
  // variance (sqrt((mu4 - sigma^4)/n), mu4 = 5^4/80); the bounds are 5 of them.
  CHECK(std::abs(m.mean - 0.5) < 0.023);
  CHECK(std::abs(m.variance - 25.0 / 12.0) < 0.03);
}

TEST_CASE("Tensor::normal: 1e5 draws have the mean and variance of N(mean, std^2)") {
  const auto v = petra::Tensor::normal({100000}, 31, 1.5, 2.0).to_vector<float>();
  const Moments m = moments_of(v);
  // Standard errors for n = 1e5: mean 2/sqrt(n) = 6.3e-3, variance 4 sqrt(2/n) = 1.8e-2; 5 of them.
  CHECK(std::abs(m.mean - 1.5) < 0.032);
  CHECK(std::abs(m.variance - 4.0) < 0.09);
}

TEST_CASE("Tensor::uniform and Tensor::normal in float64: the float32 draws, widened") {
  using petra::DType;
  using petra::Tensor;
  const Tensor u = Tensor::uniform({3, 333}, 5, 0.0, 1.0, DType::f64);
  const Tensor n = Tensor::normal({3, 333}, 5, 0.0, 1.0, DType::f64);
  CHECK(u.dtype() == DType::f64);
  CHECK(n.dtype() == DType::f64);
  CHECK(u.to_vector<double>() == Tensor::uniform({3, 333}, 5).to(DType::f64).to_vector<double>());
  CHECK(n.to_vector<double>() == Tensor::normal({3, 333}, 5).to(DType::f64).to_vector<double>());
  const auto big = Tensor::normal({100000}, 6, 0.0, 1.0, DType::f64).to_vector<double>();
  const Moments m = moments_of(std::vector<float>(big.begin(), big.end()));
  CHECK(std::abs(m.mean) < 0.016);
  CHECK(std::abs(m.variance - 1.0) < 0.023);
}

TEST_CASE("Tensor::uniform and Tensor::normal refuse integer dtypes and bad ranges") {
  using petra::Tensor;
  CHECK_THROWS_AS(Tensor::uniform({4}, 1, 0.0, 1.0, petra::DType::i64), petra::ValueError);
  CHECK_THROWS_AS(Tensor::normal({4}, 1, 0.0, 1.0, petra::DType::i32), petra::ValueError);
  CHECK_THROWS_AS(Tensor::uniform({4}, 1, 1.0, 1.0), petra::ValueError);
  CHECK_THROWS_AS(Tensor::normal({4}, 1, 0.0, -1.0), petra::ValueError);
}
