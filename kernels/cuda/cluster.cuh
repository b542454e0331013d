// kernels/cuda/cluster.cuh: thread-block clusters inside a kernel (internal, not installed).
//
// Since sm_90 the blocks of a grid can be launched in clusters (launch.cuh's launch_clusters):
// the blocks of a cluster run at the same time on neighbouring multiprocessors, may wait for each
// other at a barrier, and may read each other's shared memory ("distributed shared memory"). That
// lets a few blocks share one piece of work too large for one block's shared memory, without a
// round trip through global memory and a second kernel: batch norm's one-pass kernels
// (batchnorm.cu) keep a channel's values in the shared memory of a cluster's blocks.
//
//   cluster_rank()          the calling block's rank in its cluster, 0 .. cluster size - 1
//   cluster_barrier()       every thread of every block of the cluster waits here for all the
//                           others; what they wrote to shared memory before is then visible to
//                           the whole cluster
//   cluster_peer(p, rank)   the address, in block `rank`'s shared memory, of what `p` points at in
//                           the calling block's (p in its dynamic shared memory)
//
// A block must not leave the kernel while another may still read its shared memory: a kernel
// that reads a peer's ends with a cluster_barrier after the last such read.
//
// On sm_90 these are cooperative_groups' this_cluster() calls. Below sm_90 (the sm_80 build of the
// same kernels, also what a newer GPU runs from a build without sm_90 code) only clusters of one
// block are launched (the host code asks the device and the kernel's ptxVersion), and then the
// rank is 0, the barrier is the block's, and a peer is the block itself; asking for another rank
// there traps instead of summing one block's values as the cluster's. Under the emulation
// (tests/emulation/cuda_emulation.hpp) a cluster's blocks run together and the barrier and the
// mapping are checked there.
#pragma once

#include "petra/kernels/cuda/launch.cuh"

#if defined(__CUDACC__)
#include <cooperative_groups.h>
#endif

namespace petra::cuda_detail {

__device__ inline unsigned cluster_rank() {
#if defined(PETRA_CUDA_EMULATION)
  return ::petra::cuda_emulation::cluster_block_rank();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().block_rank();
#else
  return 0;
#endif
}

#if defined(PETRA_CUDA_EMULATION)
// The emulation's twins take the caller's line, for their messages.
inline void cluster_barrier(std::source_location where = std::source_location::current()) {
  ::petra::cuda_emulation::cluster_sync(where);
}
template <class T>
T* cluster_peer(T* p, unsigned rank, std::source_location where = std::source_location::current()) {
  return ::petra::cuda_emulation::cluster_map_shared(p, rank, where);
}
#else
__device__ inline void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#else
  __syncthreads();
#endif
}

template <class T>
__device__ inline T* cluster_peer(T* p, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().map_shared_rank(p, rank);
#else
  if (rank != 0) __trap();  // a cluster launched for code without clusters: stop, never a wrong sum
  return p;
#endif
}
#endif

}  // namespace petra::cuda_detail
