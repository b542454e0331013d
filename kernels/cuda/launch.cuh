// kernels/cuda/launch.cuh: the one way petra's CUDA code launches a kernel (internal, not
// installed).
//
//   PETRA_LAUNCH(kernel, grid, block, shared_bytes, stream)(args...)
//       nvcc:      kernel<<<grid, block, shared_bytes, stream>>>(args...)
//       emulation: runs the kernel on the CPU, synchronously (tests/emulation/cuda_emulation.hpp)
//       A kernel named with template arguments that hold a comma goes in parentheses, because the
//       preprocessor would split it: PETRA_LAUNCH((reduce<float, 256>), grid, 256, 0, stream)(...).
//   PETRA_DYNAMIC_SHARED(type, name)
//       inside a kernel: `type* const name` points at the block's dynamic shared memory (the
//       launch's shared_bytes). One per kernel; carve several arrays out of it by offsets.
//   stream_of(s)                      the cudaStream_t of a StreamHandle
//   thread_index(), grid_threads()    inside a kernel: this thread's index in a 1-d grid, and the
//                                     grid's thread count (the start and step of a grid-stride loop)
//   warp_index(), grid_warps()        the same in warps, for a kernel with one warp per item
//   grid_stride_blocks(n)             launch size of a grid-stride kernel over n items
//   block_stride_blocks(n)            launch size of a kernel with a block per item (blocks loop)
//   launch_blocks(name, s, blocks, threads, kernel, args...)   launch + check, explicit grid
//   launch_grid_stride(name, s, n, kernel, args...)            launch + check of a grid-stride kernel
//   launch_clusters(name, s, blocks, threads, cluster, shared_bytes, kernel, args...)
//                                     launch + check in thread-block clusters of `cluster` blocks
//                                     along x (sm_90; 1: an ordinary launch, any GPU), with
//                                     shared_bytes of dynamic shared memory per block (the kernel
//                                     opted in above 48 KB); kernels/cuda/cluster.cuh has the
//                                     cluster's rank, barrier and shared memory inside the kernel
//
// Every kernel file (kernels/cuda/*.cu) launches through these and writes no <<< itself: that is
// what lets the same file compile with the host compiler, with PETRA_CUDA_EMULATION defined and
// tests/emulation/cuda_emulation.hpp included first, and run on the CPU in the cpu test suite
// (docs/adding-an-op.md, "Checking a CUDA kernel without a GPU"). Under nvcc the macros are exactly
// the triple-chevron launch and an `extern __shared__` array, so the kernels are unchanged.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "petra/kernels/common.hpp"
#include "petra/kernels/cuda/check.cuh"

#if defined(__CUDACC__)

#define PETRA_LAUNCH(kernel, grid, block, shared_bytes, stream) \
  kernel<<<(grid), (block), (shared_bytes), (stream)>>>

// An unsigned char array, not `extern __shared__ type name[]`: nvcc rejects two extern shared
// arrays of different types in one file, which two instantiations of a templated kernel would be.
#define PETRA_DYNAMIC_SHARED(type, name)                                        \
  extern __shared__ __align__(16) unsigned char petra_dynamic_shared_bytes_[]; \
  type* const name = reinterpret_cast<type*>(petra_dynamic_shared_bytes_)

#elif defined(PETRA_CUDA_EMULATION)

#ifndef PETRA_CUDA_EMULATION_HPP
#error "kernels/cuda/launch.cuh: include tests/emulation/cuda_emulation.hpp before any .cu file"
#endif

#define PETRA_LAUNCH(kernel, grid, block, shared_bytes, stream) \
  ::petra::cuda_emulation::launch(#kernel, kernel, (grid), (block), (shared_bytes), (stream))

#define PETRA_DYNAMIC_SHARED(type, name) \
  type* const name = ::petra::cuda_emulation::dynamic_shared<type>()

#else
#error "kernels/cuda/launch.cuh: compile with nvcc, or with g++ and -DPETRA_CUDA_EMULATION"
#endif

namespace petra::cuda_detail {

inline cudaStream_t stream_of(const kernels::StreamHandle& s) {
  return static_cast<cudaStream_t>(s.cuda_stream);
}

// Threads per block of the elementwise kernels: a multiple of the warp size that lets many blocks
// share a multiprocessor.
inline constexpr int kBlockThreads = 256;

// The most blocks a grid-stride launch uses. 8192 blocks of 256 threads are several waves even on
// the largest GPUs (an H200 holds 132 x 8 such blocks at once), so the cap never starves a device,
// and it keeps the grid size far below the 2^31 - 1 limit. The emulation lets a test lower it, so
// that small arrays make every thread go round the loop.
inline std::size_t grid_stride_block_cap() {
#ifdef PETRA_CUDA_EMULATION
  return ::petra::cuda_emulation::settings().grid_stride_block_cap;
#else
  return 8192;
#endif
}

// Blocks for a grid-stride loop over n items: one thread per item up to the cap; past the cap
// each thread loops.
inline unsigned grid_stride_blocks(std::size_t n) {
  const std::size_t wanted = (n + kBlockThreads - 1) / kBlockThreads;
  return static_cast<unsigned>(std::clamp<std::size_t>(wanted, 1, grid_stride_block_cap()));
}

// Blocks for a kernel where a block owns one item at a time (a row, a plane, a partial sum) and
// the blocks stride over the items: one per item, at most grid_stride_block_cap() (8192, plenty
// of waves; the emulation lowers it so that the blocks go round their loop).
inline unsigned block_stride_blocks(std::int64_t items) {
  return static_cast<unsigned>(
      std::clamp<std::int64_t>(items, 1, static_cast<std::int64_t>(grid_stride_block_cap())));
}

// The calling thread's index in a 1-d grid and the number of threads of the grid: a grid-stride
// loop is for (i = thread_index(); i < n; i += grid_threads()).
__device__ inline std::int64_t thread_index() {
  return std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::int64_t grid_threads() { return std::int64_t(gridDim.x) * blockDim.x; }
// The same for a kernel with one warp per item (launched over items * 32 threads): this thread's
// warp and the grid's warp count; the loop's bound is then the same for the 32 lanes of a warp,
// which may shuffle together inside it.
__device__ inline std::int64_t warp_index() { return thread_index() / 32; }
__device__ inline std::int64_t grid_warps() { return grid_threads() / 32; }

// Launches `kernel` as `blocks` blocks of `threads` threads (1-d, no dynamic shared memory) on
// s's stream, with s's device current, and checks the launch. `name` is the one the emulator's
// messages and last_launch() use.
template <class... Params, class... Args>
void launch_blocks(const char* name, const kernels::StreamHandle& s, unsigned blocks,
                   unsigned threads, void (*kernel)(Params...), Args... args) {
  DeviceGuard guard(s.device_index);
#ifdef PETRA_CUDA_EMULATION
  const ::petra::cuda_emulation::LaunchName launch_name(name);  // for the emulator's messages
#endif
  PETRA_LAUNCH(kernel, blocks, threads, 0, stream_of(s))(static_cast<Params>(args)...);
  check_launch(name, __FILE__, __LINE__);
}

// Whether `kernel` with `bytes` of dynamic shared memory fits a block of `device` (the current
// one): its static shared memory plus `bytes` within the device's opt-in limit (227 KiB on an
// H100, 163 KiB on an A100, 99 KiB on sm_86 / sm_89 GPUs). Asked once per kernel, device and size.
// Under the emulation, against its setting (which static arrays do not count into).
inline bool dynamic_shared_fits(const void* kernel, int device, std::size_t bytes) {
#ifdef PETRA_CUDA_EMULATION
  (void)kernel, (void)device;
  return bytes <= ::petra::cuda_emulation::settings().opt_in_shared_bytes;
#else
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, std::size_t>, bool> known;
  const std::lock_guard lock(mutex);
  if (auto it = known.find({kernel, device, bytes}); it != known.end()) return it->second;
  int optin = 0;
  PETRA_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attributes{};
  PETRA_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  const bool fits = attributes.sharedSizeBytes + bytes <= std::size_t(optin);
  known.emplace(std::tuple{kernel, device, bytes}, fits);
  return fits;
#endif
}

// Raises `kernel`'s limit of dynamic shared memory on `device` (the current one) to at least `bytes`
// (cudaFuncAttributeMaxDynamicSharedMemorySize), once per kernel, device and size: the runtime
// call is not made again on every launch of a hot kernel.
inline void allow_dynamic_shared(const void* kernel, int device, std::size_t bytes) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, std::size_t> allowed;
  const std::lock_guard lock(mutex);
  std::size_t& limit = allowed[{kernel, device}];
  if (limit >= bytes) return;
  PETRA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  limit = bytes;
}

#ifndef PETRA_CUDA_EMULATION
// The launch of `blocks` blocks of `threads` threads in clusters of `cluster` blocks along x, with
// `shared_bytes` of dynamic shared memory per block, as cudaLaunchKernelEx and
// cudaOccupancyMaxActiveClusters take it; its cluster attribute is `attribute` (which must outlive
// it), none for a cluster of 1.
inline cudaLaunchConfig_t cluster_launch_config(unsigned blocks, unsigned threads, unsigned cluster,
                                                std::size_t shared_bytes, cudaStream_t stream,
                                                cudaLaunchAttribute& attribute) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  attribute = {};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = cluster;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = cluster > 1 ? &attribute : nullptr;
  config.numAttrs = cluster > 1 ? 1 : 0;
  return config;
}
#endif

// Launches `kernel` as `blocks` blocks of `threads` threads in clusters of `cluster` blocks along
// x (`blocks` a multiple of it), with `shared_bytes` of dynamic shared memory per block, raising the
// kernel's limit first (the default is 48 KiB less the kernel's static shared memory). A cluster
// of 1 is an ordinary launch (a GPU without clusters, below sm_90, runs it); a larger one needs
// sm_90.
template <class... Params, class... Args>
void launch_clusters(const char* name, const kernels::StreamHandle& s, unsigned blocks, unsigned threads,
                     unsigned cluster, std::size_t shared_bytes, void (*kernel)(Params...), Args... args) {
  DeviceGuard guard(s.device_index);
  if (shared_bytes > 0) allow_dynamic_shared(reinterpret_cast<const void*>(kernel), s.device_index, shared_bytes);
#ifdef PETRA_CUDA_EMULATION
  const ::petra::cuda_emulation::LaunchName launch_name(name);
  ::petra::cuda_emulation::launch(name, kernel, dim3(blocks), dim3(threads), shared_bytes, stream_of(s),
                                  cluster)(static_cast<Params>(args)...);
#else
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config =
      cluster_launch_config(blocks, threads, cluster, shared_bytes, stream_of(s), attribute);
  PETRA_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...));
#endif
  check_launch(name, __FILE__, __LINE__);
}

// Launches `kernel` (a grid-stride loop over `items` items) in blocks of kBlockThreads. Does
// nothing when there are no items: an empty grid is an error.
template <class... Params, class... Args>
void launch_grid_stride(const char* name, const kernels::StreamHandle& s, std::int64_t items,
                        void (*kernel)(Params...), Args... args) {
  if (items <= 0) return;
  launch_blocks(name, s, grid_stride_blocks(static_cast<std::size_t>(items)), kBlockThreads,
                kernel, args...);
}

}  // namespace petra::cuda_detail
