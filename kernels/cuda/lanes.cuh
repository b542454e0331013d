// kernels/cuda/lanes.cuh: element-wise kernels on float or float4 values, written once (internal,
// not installed). A kernel that moves one float per access in its general path moves a float4
// (16 bytes) per access where every pointer is 16-byte aligned: a quarter of the load and store
// instructions for the same bytes. It is written for V = float or float4, loads and stores V, and
// applies its per-value arithmetic with lanes(op, ...), the op applied to each lane in turn (the
// same arithmetic per value either way, so the same bits). A reduction reads V too and feeds each
// lane in turn to its per-value step with for_lanes (the order of its additions then depends on V).
#pragma once
#include <cstdint>

namespace petra::cuda_detail {

// Floats per V.
template <class V>
inline constexpr std::int64_t kWidth = sizeof(V) / sizeof(float);

// op applied to each lane: float, or the four floats of a float4.
template <class Op>
__device__ inline float lanes(Op op, float a) {
  return op(a);
}
template <class Op>
__device__ inline float lanes(Op op, float a, float b) {
  return op(a, b);
}
template <class Op>
__device__ inline float4 lanes(Op op, float4 a) {
  return make_float4(op(a.x), op(a.y), op(a.z), op(a.w));
}
template <class Op>
__device__ inline float4 lanes(Op op, float4 a, float4 b) {
  return make_float4(op(a.x, b.x), op(a.y, b.y), op(a.z, b.z), op(a.w, b.w));
}

// f(a_i) or f(a_i, b_i) for each lane i in order: a reduction's per-value step.
template <class F>
__device__ inline void for_lanes(F f, float a) {
  f(a);
}
template <class F>
__device__ inline void for_lanes(F f, float4 a) {
  f(a.x), f(a.y), f(a.z), f(a.w);
}
template <class F>
__device__ inline void for_lanes(F f, float a, float b) {
  f(a, b);
}
template <class F>
__device__ inline void for_lanes(F f, float4 a, float4 b) {
  f(a.x, b.x), f(a.y, b.y), f(a.z, b.z), f(a.w, b.w);
}

}  // namespace petra::cuda_detail
