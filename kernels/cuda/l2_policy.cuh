// kernels/cuda/l2_policy.cuh: L2 eviction priorities for a kernel pair that reads a tensor twice
// (internal, not installed).
//
// Batch norm's training passes read x (and dy) once for the per-channel sums, then once more for
// the element-wise pass: three tensor-sized transfers where a copy moves two, so a two-pass batch
// norm that goes to memory twice tops out at 67% of the copy bandwidth (the backward at 60%).
// What lifts that ceiling is for the second read to hit the L2 cache (50 MB on an H200, against
// 33.5 MB for x at (128, 64, 32, 32)). Left alone, the first pass's lines are evicted by its own
// later reads and by the second pass's writes. Since sm_80 a load can carry an eviction priority
// for L2 (PTX `createpolicy` + `ld.global.L2::cache_hint`):
//   - the first read marks its lines evict_last (kept until normal lines are gone): l2_keep,
//     on a fraction of the lines when the tensors re-read exceed what L2 can keep (the rest
//     evict_first, so they do not push the kept ones out);
//   - the second read marks them evict_first (l2_drop): it is their last use, and lines left
//     evict_last would crowd the L2 for the kernels that follow.
// A hint changes only where the bytes live, never the values, so results are the same bits with
// or without it. Under the CPU emulation (and for the host pass of nvcc) the loads are plain.
#pragma once
#include <cstdint>

namespace petra::cuda_detail {

// createpolicy's opaque 64-bit cache policy.
struct L2Policy {
  std::uint64_t bits = 0;
};

// The L2 priority a kernel asks for on its loads, chosen on the host (a kernel argument).
struct L2Hint {
  enum Kind : int { normal, keep, drop } kind = normal;
  float fraction = 1;  // keep: the share of the lines marked evict_last, in (0, 1]
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define PETRA_L2_HINTS 1
#endif

// The policy of `hint`, made once per thread before its loads.
__device__ inline L2Policy l2_policy(L2Hint hint) {
  L2Policy policy;
#ifdef PETRA_L2_HINTS
  if (hint.kind == L2Hint::keep)
    asm("createpolicy.fractional.L2::evict_last.L2::evict_first.b64 %0, %1;"
        : "=l"(policy.bits)
        : "f"(hint.fraction));
  else if (hint.kind == L2Hint::drop)
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy.bits));
  else
    asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy.bits));
#else
  (void)hint;
#endif
  return policy;
}

// *p, read with `policy`: one ld.global.L2::cache_hint (a float4 in one 128-bit load).
__device__ inline float load_hinted(const float* p, L2Policy policy) {
#ifdef PETRA_L2_HINTS
  float v;
  asm("ld.global.L2::cache_hint.f32 %0, [%1], %2;" : "=f"(v) : "l"(p), "l"(policy.bits));
  return v;
#else
  (void)policy;
  return *p;
#endif
}
__device__ inline float4 load_hinted(const float4* p, L2Policy policy) {
#ifdef PETRA_L2_HINTS
  float4 v;
  asm("ld.global.L2::cache_hint.v4.f32 {%0, %1, %2, %3}, [%4], %5;"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
      : "l"(p), "l"(policy.bits));
  return v;
#else
  (void)policy;
  return *p;
#endif
}

}  // namespace petra::cuda_detail
