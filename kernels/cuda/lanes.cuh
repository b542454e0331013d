// kernels/cuda/lanes.cuh: element-wise kernels on float or float4 values, written once (internal,
// not installed). A kernel that moves one float per access in its general path moves a float4
// (16 bytes) per access where every pointer is 16-byte aligned: a quarter of the load and store
// instructions for the same bytes. It is written for V = float or float4, loads and stores V, and
// applies its per-value arithmetic with lanes(op, ...), the op applied to each lane in turn (the
// same arithmetic per value either way, so the same bits). A reduction reads V too and adds its
// lanes in turn with lane(v, i) (the order of its additions then depends on V).
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

// Lane i of a float (i = 0) or a float4 (0..3): a reduction reads V and adds its lanes in order,
// for (i = 0; i < kWidth<V>; ++i) ... lane(v, i) (with i known at compile time once unrolled).
__device__ inline float lane(float v, int) { return v; }
__device__ inline float lane(const float4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// G = 1, 2 or 4 consecutive floats at p as one access (a float, float2 or float4): p must be
// aligned to 4 G bytes (aligned_to<G>).
template <int G>
__device__ inline bool aligned_to(const float* p) {
  static_assert(G == 1 || G == 2 || G == 4);
  return reinterpret_cast<std::uintptr_t>(p) % (4 * G) == 0;
}
template <int G>
__device__ inline void store_floats(float* p, const float (&v)[G]) {
  if constexpr (G == 4)
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  else if constexpr (G == 2)
    *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
  else
    *p = v[0];
}
template <int G>
__device__ inline void load_floats(const float* p, float (&v)[G]) {
  if constexpr (G == 4) {
    const float4 w = *reinterpret_cast<const float4*>(p);
    v[0] = w.x, v[1] = w.y, v[2] = w.z, v[3] = w.w;
  } else if constexpr (G == 2) {
    const float2 w = *reinterpret_cast<const float2*>(p);
    v[0] = w.x, v[1] = w.y;
  } else {
    v[0] = *p;
  }
}

}  // namespace petra::cuda_detail
