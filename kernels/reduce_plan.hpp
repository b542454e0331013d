// kernels/reduce_plan.hpp: how kernels/cpu/reduce.cpp and kernels/cuda/reduce.cu see a reduction
// (internal to the kernels, not installed): its dims simplified to alternating groups.
//
// make_reduce_plan drops the size-1 dims and merges neighbours of the same kind (both kept or both
// reduced), so the groups left alternate kept / reduced; NCHW reduced per channel (mask 0b1101)
// becomes [N: reduced, C: kept, HW: reduced]. The innermost group is `inner` (contiguous in x);
// the outer ones go to two lists, `kept` and `reduced`, each in row-major order with its stride
// in x. Then
//     x offset = kept.offset_of(p) + reduced.offset_of(q) + i,    i < inner,
// where p numbers the output elements (inner reduced) or output rows of length inner (inner
// kept), and q the runs of x that fold into p. No dims left (a single element) gives inner = 1,
// kept.
//
// The structs are plain values (fixed arrays, no pointers), so a kernel takes a plan by value;
// their members are __host__ __device__ under nvcc (PETRA_HOST_DEVICE) and ordinary functions for
// the host compiler. make_reduce_plan runs on the host. tests/cpu/test_reduce_plan.cpp tests it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "petra/kernels/host_device.hpp"
#include "petra/kernels/reduce.hpp"

namespace petra::kernels {

// Groups of dims with the stride of each in x (row-major: the last is the fastest).
struct ReduceDims {
  int count = 0;
  std::int64_t size[kMaxReduceDims] = {};
  std::int64_t stride[kMaxReduceDims] = {};

  PETRA_HOST_DEVICE std::int64_t total() const {
    std::int64_t n = 1;
    for (int i = 0; i < count; ++i) n *= size[i];
    return n;
  }
  // The x offset of the flat (row-major) index `flat` over these groups.
  PETRA_HOST_DEVICE std::int64_t offset_of(std::int64_t flat) const {
    std::int64_t offset = 0;
    for (int i = count; i-- > 0;) {
      offset += flat % size[i] * stride[i];
      flat /= size[i];
    }
    return offset;
  }
};

// The simplified reduction (see the top of this file).
struct ReducePlan {
  ReduceDims kept;            // outer kept groups: output element (inner reduced) or row (inner kept)
  ReduceDims reduced;         // outer reduced groups: the q-th run of x that folds into p
  std::int64_t inner = 1;     // length of the innermost group, contiguous in x
  bool inner_reduced = false;

  // Output elements, and input elements folded into each.
  PETRA_HOST_DEVICE std::int64_t outputs() const { return kept.total() * (inner_reduced ? 1 : inner); }
  PETRA_HOST_DEVICE std::int64_t per_output() const { return reduced.total() * (inner_reduced ? inner : 1); }
};

inline ReducePlan make_reduce_plan(std::span<const std::int64_t> dims, std::uint32_t reduce_mask) {
  // Merge into alternating groups, innermost last.
  std::int64_t size[kMaxReduceDims] = {};
  bool reduced[kMaxReduceDims] = {};
  int groups = 0;
  for (std::size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] == 1) continue;
    const bool r = reduce_mask >> d & 1u;
    if (groups > 0 && reduced[groups - 1] == r) {
      size[groups - 1] *= dims[d];
    } else {
      size[groups] = dims[d];
      reduced[groups] = r;
      ++groups;
    }
  }
  ReducePlan plan;
  if (groups == 0) return plan;  // a single element: inner = 1, kept
  plan.inner = size[groups - 1];
  plan.inner_reduced = reduced[groups - 1];
  std::int64_t stride = plan.inner;
  // Walk outwards so the strides build up, then reverse to row-major order.
  for (int g = groups - 2; g >= 0; --g) {
    ReduceDims& list = reduced[g] ? plan.reduced : plan.kept;
    list.size[list.count] = size[g];
    list.stride[list.count] = stride;
    ++list.count;
    stride *= size[g];
  }
  for (ReduceDims* list : {&plan.kept, &plan.reduced}) {
    std::reverse(list->size, list->size + list->count);
    std::reverse(list->stride, list->stride + list->count);
  }
  return plan;
}

}  // namespace petra::kernels
