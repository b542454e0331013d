// tests/cpu/test_reduce_plan.cpp: make_reduce_plan (kernels/reduce_plan.hpp), the simplification of
// a reduction's dims that kernels/cpu/reduce.cpp and kernels/cuda/reduce.cu share: hand-worked
// plans, then, for every mask of several shapes, that (p, q, i) -> kept.offset_of(p) +
// reduced.offset_of(q) + i visits every element of x once and sends it to the output element the
// plain definition says (the reduced coordinates dropped, the kept ones row-major).
#include <doctest/doctest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "petra/kernels/reduce_plan.hpp"

namespace k = petra::kernels;
using Dims = std::vector<std::int64_t>;

namespace {

// Output element of x's flat index `flat` by the definition: the kept coordinates, row-major.
std::int64_t output_of(const Dims& dims, std::uint32_t mask, std::int64_t flat) {
  std::vector<std::int64_t> coordinate(dims.size());
  for (std::size_t d = dims.size(); d-- > 0;) {
    coordinate[d] = flat % dims[d];
    flat /= dims[d];
  }
  std::int64_t out = 0;
  for (std::size_t d = 0; d < dims.size(); ++d)
    if (!(mask >> d & 1u)) out = out * dims[d] + coordinate[d];
  return out;
}

// Every x element reached exactly once, and from the right output.
void check_covers(const Dims& dims, std::uint32_t mask) {
  const k::ReducePlan plan = k::make_reduce_plan(dims, mask);
  std::int64_t n = 1;
  for (auto d : dims) n *= d;
  INFO("dims rank ", dims.size(), " mask ", mask);
  CHECK(plan.kept.total() * plan.reduced.total() * plan.inner == n);
  CHECK(plan.outputs() * plan.per_output() == n);
  std::vector<int> seen(std::size_t(n), 0);
  for (std::int64_t p = 0; p < plan.kept.total(); ++p)
    for (std::int64_t q = 0; q < plan.reduced.total(); ++q)
      for (std::int64_t i = 0; i < plan.inner; ++i) {
        const std::int64_t x = plan.kept.offset_of(p) + plan.reduced.offset_of(q) + i;
        REQUIRE(x >= 0);
        REQUIRE(x < n);
        ++seen[std::size_t(x)];
        const std::int64_t out = plan.inner_reduced ? p : p * plan.inner + i;
        CHECK(output_of(dims, mask, x) == out);
      }
  for (const int count : seen) CHECK(count == 1);
}

}  // namespace

namespace {

// A plan worked out by hand: its inner group and its two lists as (size, stride) pairs.
using Groups = std::vector<std::pair<std::int64_t, std::int64_t>>;
struct Expected {
  const char* what;
  Dims dims;
  std::uint32_t mask;
  std::int64_t inner;
  bool inner_reduced;
  Groups kept, reduced;
};

Groups groups_of(const k::ReduceDims& list) {
  Groups groups;
  for (int i = 0; i < list.count; ++i) groups.emplace_back(list.size[i], list.stride[i]);
  return groups;
}

}  // namespace

TEST_CASE("make_reduce_plan: size-1 dims dropped, neighbours of one kind merged, high mask bits ignored") {
  const std::vector<Expected> table = {
      {"NCHW per channel: [N reduced, C kept, HW reduced]", {2, 3, 4, 5}, 0b1101, 20, true, {{3, 20}}, {{2, 60}}},
      {"no dims: one element, kept", {}, 0b111, 1, false, {}, {}},
      {"only size-1 dims: one element, kept", {1, 1, 1}, 0b101, 1, false, {}, {}},
      {"everything reduced around a size-1 dim: one group", {4, 1, 5}, 0b101, 20, true, {}, {}},
      {"the bias gradient of [batch, features]: inner kept", {3, 4}, 0b01, 4, false, {}, {{3, 4}}},
      {"bits 2 and 3 beyond the rank ignored", {4, 5}, 0b1110, 5, true, {{4, 5}}, {}},
      {"reduced dims separated by size-1 dims merge", {2, 1, 3, 1, 2}, 0b10101, 12, true, {}, {}},
      {"alternating groups, outermost kept", {2, 3, 4, 5}, 0b1010, 5, true, {{2, 60}, {4, 5}}, {{3, 20}}},
  };
  for (const Expected& e : table) {
    INFO(e.what);
    const k::ReducePlan plan = k::make_reduce_plan(e.dims, e.mask);
    CHECK(plan.inner == e.inner);
    CHECK(plan.inner_reduced == e.inner_reduced);
    CHECK(groups_of(plan.kept) == e.kept);
    CHECK(groups_of(plan.reduced) == e.reduced);
  }
  const k::ReducePlan nchw = k::make_reduce_plan(Dims{2, 3, 4, 5}, 0b1101);
  CHECK(nchw.outputs() == 3);
  CHECK(nchw.per_output() == 40);
  CHECK(nchw.kept.offset_of(2) == 40);
  CHECK(nchw.reduced.offset_of(1) == 60);
}

TEST_CASE("make_reduce_plan: every mask of several shapes covers x once, each element to its output") {
  for (const Dims& dims : {Dims{7}, Dims{3, 4}, Dims{2, 3, 4, 5}, Dims{2, 1, 3, 1, 2}, Dims{3, 1, 1, 2, 2, 3}})
    for (std::uint32_t mask = 0; mask < (1u << dims.size()); ++mask) check_covers(dims, mask);
}
