// tests/emulation/cuda_emulation.hpp: a CUDA emulation for the host compiler, so that petra's .cu
// files build with g++ and their kernels run on the CPU in the cpu test suite, on machines without
// a GPU (this one, CI). docs/adding-an-op.md, "Checking a CUDA kernel without a GPU", is the
// recipe.
//
// Use: compile with -DPETRA_CUDA_EMULATION, include this header, then the .cu file
// (tests/emulation/emulated_<family>.cpp). Kernels launch through PETRA_LAUNCH
// (kernels/cuda/launch.cuh), which here calls cuda_emulation::launch.
//
// How a launch runs: the grid's blocks run one after another (the blocks of a thread-block
// cluster together); the threads of a block run concurrently, one std::thread each (a pool sized
// to the block, or the cluster, kept between launches). Launches
// are serialised (one at a time in the process). A launch is checked when it is made (its
// configuration, and its stream by settings().check_stream when set); its grid runs at once, or,
// when settings().submit is set (the emulated device of tests/emulation/emulated_backend.cpp), when
// the stream's queue gets to it.
//
// What a kernel may use (CUDA's names and signatures):
//   __global__ __device__ __host__ __forceinline__ __launch_bounds__(...) __restrict__ __constant__
//   __shared__ (static, see below), PETRA_DYNAMIC_SHARED (launch.cuh)
//   threadIdx blockIdx blockDim gridDim warpSize; dim3, uint3, float2/float4, make_float4, ...
//     (CUDA's own <vector_types.h> and <vector_functions.h>)
//   __syncthreads  __syncwarp  __shfl_sync __shfl_up_sync __shfl_down_sync __shfl_xor_sync
//   __ballot_sync __any_sync __all_sync  __threadfence __threadfence_block
//   atomicAdd atomicSub atomicMax atomicMin atomicExch atomicCAS (int, unsigned,
//     unsigned long long, and float/double where CUDA has them)
//   rsqrtf rsqrt __expf __logf __log2f __powf __sinf __cosf __tanf __fdividef __frcp_rn
//     __fsqrt_rn __frsqrt_rn __fadd_rn __fsub_rn __fmul_rn __fdiv_rn __fmaf_rn __saturatef
//     __float_as_int __int_as_float __float_as_uint __uint_as_float __popc __popcll __clz __ffs
//     __ldg min max (both arguments of one type), and <cmath> (fmaf, fmaxf, expf, sqrtf, ...)
//   runtime calls: cudaGetLastError cudaPeekAtLastError cudaGetDevice cudaSetDevice
//     cudaMemcpyAsync cudaMemsetAsync cudaMemcpyToSymbol(Async) cudaStreamSynchronize
//     cudaDeviceSynchronize cudaFuncSetAttribute (redirected here by macros; any other runtime
//     call reaches the real libcudart, which reports that there is no driver)
//
// What a GPU would report and the emulation turns into a KernelError (a test failure naming the
// kernel, the block, the thread and the source line):
//   - a launch configuration error: a block of more than 1024 threads (x, y <= 1024, z <= 64), a
//     grid or block with a zero dimension, grid.y or grid.z above 65535, more than 48 KB of dynamic
//     shared memory without cudaFuncSetAttribute(kernel,
//     cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), or more than the opt-in (at most
//     227 KB, an H100/H200). (A GPU counts static __shared__ arrays into the 48 KB too; the
//     emulation cannot see their size, nvcc refuses them alone above 48 KB.)
//   - __syncthreads that not every thread of the block reaches: a thread returned while others wait
//     at it or before others reach it, or threads wait at different __syncthreads (on a GPU: a hang
//     or a barrier that lets the block through unsynchronised);
//   - a deadlock: every running thread of the block waits (for example lane 0 at __syncthreads and
//     lane 1 at a __shfl_sync that names lane 0);
//   - in a thread-block cluster (launch.cuh's launch_clusters, kernels/cuda/cluster.cuh): a cluster_sync
//     that not every thread of the cluster reaches, or reaches at different sites; a cluster that
//     does not divide grid.x or has more than 8 blocks; a peer's shared memory asked for with a
//     pointer outside the block's dynamic shared memory, a rank outside the cluster, or after all
//     of that block's threads returned (on a GPU its shared memory is gone);
//   - a warp intrinsic whose mask leaves out the calling lane, a shuffle width that is not a power
//     of two up to 32, lanes meeting with the same mask in different intrinsics;
//   - an exception thrown by the kernel body.
// A block that does not finish within settings().block_timeout_seconds (a thread spinning
// forever) aborts the process with a message: a thread stuck in kernel code cannot be stopped.
// test-cuda-emulation also builds with UBSan's alignment check, which stops at a misaligned float4
// access (a fault on a GPU).
// A shuffle that reads a lane which is not taking part (outside the mask, returned, or beyond the
// block) gets the bytes 0xff (NaN for a float, -1 for an int), as the GPU's value is undefined.
// Dynamic shared memory is filled with 0xff before every block, so that reading it before writing
// it shows (NaN).
#pragma once

#define PETRA_CUDA_EMULATION_HPP 1

#ifndef PETRA_CUDA_EMULATION
#error "tests/emulation/cuda_emulation.hpp: compile with -DPETRA_CUDA_EMULATION"
#endif
#ifdef __CUDACC__
#error "tests/emulation/cuda_emulation.hpp is for the host compiler, not nvcc"
#endif

// CUDA's host headers compile with g++: the types (dim3, uint3, float4, cudaError_t, cudaStream_t)
// and make_float4 & co. are CUDA's own. Without __CUDACC__, <crt/host_defines.h> defines
// __global__, __device__, __host__, __shared__ and __constant__ as nothing and __forceinline__ as
// GCC's always_inline; __launch_bounds__ and __shared__ are set below.
#include <cuda_runtime_api.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <source_location>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

// `static` is a faithful __shared__ here because the blocks of a launch run one after another and
// launches one at a time: while a block runs, its threads are the only ones executing the kernel,
// so a function-local static is exactly one array shared by the threads of one block. (Unlike a
// GPU's, it keeps its contents from one block to the next instead of starting undefined, and it is
// zero before the first block.)
#undef __shared__
#define __shared__ static
#define __launch_bounds__(...)

namespace petra::cuda_emulation {

// What the emulation reports: a kernel or launch that would fail, hang or be undefined on a GPU.
class KernelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Settings {
  // grid_stride_blocks' cap (kernels/cuda/launch.cuh): lower it so that small arrays make every
  // thread of a grid-stride loop go round more than once.
  std::size_t grid_stride_block_cap = 8192;
  // A block still running after this long aborts the process (see the top of this file).
  double block_timeout_seconds = 120;  // below meson's timeout of the emulation tests
  // How a block's threads run. false (the default, what the kernel tests use): one std::thread
  // per CUDA thread, truly concurrent, so that a missing __syncthreads or a race may show. true:
  // cooperatively, as fibers on the launching thread, switching only where a thread waits
  // (__syncthreads, the warp intrinsics): the same checks of barriers, warps and deadlocks and the
  // same results for race-free kernels, 20-100 times faster (no kernel-mode context switch), but no
  // race can show, and a kernel that spins waiting for another thread hangs. The emulated device
  // (tests/emulation/emulated_backend.cpp), which runs whole training steps, turns it on. Ignored
  // (threads) under AddressSanitizer and off x86-64, where fibers are not implemented here.
  bool cooperative = false;
  // Devices cudaSetDevice accepts: [0, device_count). The emulated device of the tests
  // (tests/emulation/emulated_backend.cpp) raises it to its two GPUs.
  int device_count = 1;
  // Called with the stream of every launch (launch = true) and of every runtime call that takes one
  // (cudaMemcpyAsync, cudaMemsetAsync, cudaStreamSynchronize), and the name of the kernel or call;
  // it throws to refuse (the emulated device: a stream that is not live, or a launch on a stream of
  // another device than the calling thread's current one). nullptr: no check (the kernel tests
  // launch on the null stream).
  void (*check_stream)(cudaStream_t stream, bool launch, const char* what) = nullptr;
  // Called with every range of memory a runtime call reads or writes (cudaMemcpyAsync,
  // cudaMemsetAsync) and the call's name; it throws to refuse (the emulated device: freed device
  // memory, a range past the end of an allocation). nullptr: no check.
  void (*check_memory)(const void* p, std::size_t bytes, const char* what) = nullptr;
  // Where a launch's grid and a runtime copy or fill go once checked: nullptr (the default, what
  // the kernel tests use) runs them at once. The emulated device sets it: in its asynchronous mode
  // (emulated_device.hpp, set_asynchronous) it queues the work on the stream, to run when something
  // waits for that stream, as a GPU runs it some time after the launch.
  void (*submit)(cudaStream_t stream, std::function<void()> work) = nullptr;
  // cudaStreamSynchronize (a stream) and cudaDeviceSynchronize (nullptr): runs what submit queued.
  // nullptr: nothing is ever queued.
  void (*synchronize)(cudaStream_t stream) = nullptr;
  // The most shared memory a block may opt in to (cudaFuncAttributeMaxDynamicSharedMemorySize,
  // launch.cuh's dynamic_shared_fits): an H100's 227 KiB; lower it to play a GPU with less (99 KiB:
  // sm_86 / sm_89).
  std::size_t opt_in_shared_bytes = 227 * 1024;
};
Settings& settings();

// Whether Settings::cooperative takes effect here (x86-64, not under AddressSanitizer); elsewhere
// blocks always run on threads.
bool cooperative_available();

// Sets settings().grid_stride_block_cap for a scope.
class GridStrideCap {
 public:
  explicit GridStrideCap(std::size_t blocks) : saved_(settings().grid_stride_block_cap) {
    settings().grid_stride_block_cap = blocks;
  }
  ~GridStrideCap() { settings().grid_stride_block_cap = saved_; }
  GridStrideCap(const GridStrideCap&) = delete;
  GridStrideCap& operator=(const GridStrideCap&) = delete;

 private:
  std::size_t saved_;
};

// Names the launches made in its scope in the emulator's messages (launch_grid_stride's `name`).
class LaunchName {
 public:
  explicit LaunchName(const char* name);
  ~LaunchName();
  LaunchName(const LaunchName&) = delete;
  LaunchName& operator=(const LaunchName&) = delete;

 private:
  const char* saved_;
};

// How many kernel launches the emulator has run, and the last one's configuration: a test can
// check that a call launched at all, and which path it took (the float4 path of a grid-stride
// kernel launches a quarter of the blocks).
std::size_t launches();
struct LaunchRecord {
  std::string kernel;  // launch_grid_stride's name, else the PETRA_LAUNCH argument
  dim3 grid, block;
  std::size_t shared_bytes = 0;
  const void* function = nullptr;  // the kernel itself: two instantiations under one name differ here
  unsigned cluster = 1;            // blocks per thread-block cluster (launch.cuh's launch_clusters)
};
LaunchRecord last_launch();
// The last `count` launches (at most 16), oldest first: a call's launches when it made several.
std::vector<LaunchRecord> recent_launches(std::size_t count);

namespace detail {

struct LaunchConfig {
  const char* kernel_text;  // the PETRA_LAUNCH argument, as written
  const void* kernel;       // for the cudaFuncSetAttribute opt-in
  dim3 grid, block;
  std::size_t shared_bytes;
  cudaStream_t stream;      // checked by settings().check_stream, else ignored (synchronous)
  unsigned cluster = 1;     // blocks per cluster along x: a cluster's blocks run together
};

// Checks the configuration, then runs `body` once per thread of every block, at once or when
// Settings::submit's queue gets to it.
void run_grid(const LaunchConfig& config, std::function<void()> body);

void* dynamic_shared_memory();
void set_max_dynamic_shared(const void* kernel, int bytes);

// Thread-block clusters (sm_90): the calling block's rank in its cluster, the cluster's barrier,
// and the address of `p` (in the calling block's dynamic shared memory) in block `rank`'s.
unsigned cluster_block_rank();
unsigned cluster_block_count();
void cluster_sync(std::source_location where);
void* cluster_map_shared(void* p, unsigned rank, std::source_location where);

// Warp intrinsics: the calling lane offers `value` (8 bytes, padded) and waits for every lane of
// `mask` that has not returned; `values` receives what each lane offered and `present` which lanes
// took part.
enum class WarpOp { kSync, kShfl, kShflUp, kShflDown, kShflXor, kBallot, kAny, kAll };
struct WarpResult {
  std::uint64_t values[32];
  unsigned present;
  unsigned lane;
};
WarpResult warp_exchange(WarpOp op, unsigned mask, std::uint64_t value, std::source_location where);
void check_width(const char* intrinsic, int width, std::source_location where);

template <class T>
std::uint64_t to_bits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffles move up to 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}
template <class T>
T from_bits(std::uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}
// What a lane gets when it reads from `source`: that lane's value, or 0xff bytes when the lane is
// not taking part (the GPU's result is undefined).
template <class T>
T read_lane(const WarpResult& r, unsigned source) {
  if (source < 32 && (r.present >> source & 1u)) return from_bits<T>(r.values[source]);
  return from_bits<T>(~std::uint64_t(0));
}

}  // namespace detail

// PETRA_LAUNCH(kernel, grid, block, shared_bytes, stream)(args...) under the emulation. The
// arguments are converted to the kernel's parameter types once, at the launch, as on a GPU.
template <class... Params>
class Launch {
 public:
  Launch(const char* kernel_text, void (*kernel)(Params...), dim3 grid, dim3 block,
         std::size_t shared_bytes, cudaStream_t stream /*checked, then ignored: launches are synchronous*/,
         unsigned cluster = 1)
      : kernel_(kernel),
        config_{kernel_text, reinterpret_cast<const void*>(kernel), grid, block, shared_bytes, stream, cluster} {}

  template <class... Args>
  void operator()(Args&&... args) const {
    static_assert(sizeof...(Args) == sizeof...(Params), "wrong number of kernel arguments");
    // The arguments are owned by the launch: its grid may run after this call returns (Settings::submit).
    const auto parameters = std::make_shared<const std::tuple<std::decay_t<Params>...>>(std::forward<Args>(args)...);
    detail::run_grid(config_, [kernel = kernel_, parameters] { std::apply(kernel, *parameters); });
  }

 private:
  void (*kernel_)(Params...);
  detail::LaunchConfig config_;
};

template <class... Params>
Launch<Params...> launch(const char* kernel_text, void (*kernel)(Params...), dim3 grid, dim3 block,
                         std::size_t shared_bytes, cudaStream_t stream, unsigned cluster = 1) {
  return Launch<Params...>(kernel_text, kernel, grid, block, shared_bytes, stream, cluster);
}

// PETRA_DYNAMIC_SHARED under the emulation.
template <class T>
T* dynamic_shared() {
  return static_cast<T*>(detail::dynamic_shared_memory());
}

// Thread-block clusters under the emulation (kernels/cuda/cluster.cuh's twins): the blocks of a
// cluster run together, their threads all at once, and cluster_sync is a barrier over all of them.
// A cluster kernel keeps its shared data in dynamic shared memory: `static` __shared__ arrays (the
// emulation's __shared__) would be one array for every block of the cluster.
inline unsigned cluster_block_rank() { return detail::cluster_block_rank(); }
inline unsigned cluster_block_count() { return detail::cluster_block_count(); }
inline void cluster_sync(std::source_location where = std::source_location::current()) {
  detail::cluster_sync(where);
}
template <class T>
T* cluster_map_shared(T* p, unsigned rank, std::source_location where = std::source_location::current()) {
  return static_cast<T*>(detail::cluster_map_shared(const_cast<void*>(static_cast<const void*>(p)), rank, where));
}

// The runtime calls a .cu file makes, emulated (the macros after this namespace redirect them).
namespace runtime {
cudaError_t get_last_error();
cudaError_t peek_at_last_error();
cudaError_t get_device(int* device);
cudaError_t set_device(int device);
cudaError_t memcpy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                         cudaStream_t stream = nullptr);
cudaError_t memset_async(void* dst, int value, std::size_t bytes, cudaStream_t stream = nullptr);
cudaError_t stream_synchronize(cudaStream_t stream);
cudaError_t device_synchronize();
cudaError_t func_set_attribute(const void* kernel, cudaFuncAttribute attribute, int value);
template <class... Params>
cudaError_t func_set_attribute(void (*kernel)(Params...), cudaFuncAttribute attribute, int value) {
  return func_set_attribute(reinterpret_cast<const void*>(kernel), attribute, value);
}
cudaError_t copy_to_symbol(void* symbol, std::size_t symbol_bytes, const void* src,
                           std::size_t bytes, std::size_t offset);
// cudaMemcpyToSymbol(symbol, src, bytes, offset, kind): a __constant__ or __device__ variable is
// a host variable here.
template <class T>
cudaError_t memcpy_to_symbol(T& symbol, const void* src, std::size_t bytes, std::size_t offset = 0,
                             cudaMemcpyKind = cudaMemcpyHostToDevice) {
  return copy_to_symbol(&symbol, sizeof(T), src, bytes, offset);
}
template <class T>
cudaError_t memcpy_to_symbol_async(T& symbol, const void* src, std::size_t bytes,
                                   std::size_t offset = 0, cudaMemcpyKind = cudaMemcpyHostToDevice,
                                   cudaStream_t = nullptr) {
  return copy_to_symbol(&symbol, sizeof(T), src, bytes, offset);
}
}  // namespace runtime

}  // namespace petra::cuda_emulation

#define cudaGetLastError ::petra::cuda_emulation::runtime::get_last_error
#define cudaPeekAtLastError ::petra::cuda_emulation::runtime::peek_at_last_error
#define cudaGetDevice ::petra::cuda_emulation::runtime::get_device
#define cudaSetDevice ::petra::cuda_emulation::runtime::set_device
#define cudaMemcpyAsync ::petra::cuda_emulation::runtime::memcpy_async
#define cudaMemsetAsync ::petra::cuda_emulation::runtime::memset_async
#define cudaStreamSynchronize ::petra::cuda_emulation::runtime::stream_synchronize
#define cudaDeviceSynchronize ::petra::cuda_emulation::runtime::device_synchronize
#define cudaFuncSetAttribute ::petra::cuda_emulation::runtime::func_set_attribute
#define cudaMemcpyToSymbol ::petra::cuda_emulation::runtime::memcpy_to_symbol
#define cudaMemcpyToSymbolAsync ::petra::cuda_emulation::runtime::memcpy_to_symbol_async

// ---- the built-in variables: set by the launcher for each emulated thread.
inline thread_local uint3 threadIdx{};
inline thread_local uint3 blockIdx{};
inline thread_local dim3 blockDim{};
inline thread_local dim3 gridDim{};
inline constexpr int warpSize = 32;

// ---- synchronisation. The source location names the line in error messages.
void __syncthreads(std::source_location where = std::source_location::current());

inline void __syncwarp(unsigned mask = 0xffffffffu,
                       std::source_location where = std::source_location::current()) {
  (void)::petra::cuda_emulation::detail::warp_exchange(
      ::petra::cuda_emulation::detail::WarpOp::kSync, mask, 0, where);
}

template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize,
              std::source_location where = std::source_location::current()) {
  namespace d = ::petra::cuda_emulation::detail;
  d::check_width("__shfl_sync", width, where);
  const d::WarpResult r = d::warp_exchange(d::WarpOp::kShfl, mask, d::to_bits(var), where);
  const unsigned w = unsigned(width);
  return d::read_lane<T>(r, (r.lane & ~(w - 1)) + (unsigned(src_lane) & (w - 1)));
}

template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                 std::source_location where = std::source_location::current()) {
  namespace d = ::petra::cuda_emulation::detail;
  d::check_width("__shfl_up_sync", width, where);
  const d::WarpResult r = d::warp_exchange(d::WarpOp::kShflUp, mask, d::to_bits(var), where);
  const unsigned w = unsigned(width);
  if ((r.lane & (w - 1)) < delta) return var;  // below the segment: its own value
  return d::read_lane<T>(r, r.lane - delta);
}

template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                   std::source_location where = std::source_location::current()) {
  namespace d = ::petra::cuda_emulation::detail;
  d::check_width("__shfl_down_sync", width, where);
  const d::WarpResult r = d::warp_exchange(d::WarpOp::kShflDown, mask, d::to_bits(var), where);
  const unsigned w = unsigned(width);
  if ((r.lane & (w - 1)) + delta >= w) return var;  // past the segment: its own value
  return d::read_lane<T>(r, r.lane + delta);
}

template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize,
                  std::source_location where = std::source_location::current()) {
  namespace d = ::petra::cuda_emulation::detail;
  d::check_width("__shfl_xor_sync", width, where);
  const d::WarpResult r = d::warp_exchange(d::WarpOp::kShflXor, mask, d::to_bits(var), where);
  const unsigned w = unsigned(width);
  const unsigned source = r.lane ^ unsigned(lane_mask);
  if (source >= (r.lane & ~(w - 1)) + w) return var;  // a later segment: its own value
  return d::read_lane<T>(r, source);
}

inline unsigned __ballot_sync(unsigned mask, int predicate,
                              std::source_location where = std::source_location::current()) {
  namespace d = ::petra::cuda_emulation::detail;
  const d::WarpResult r = d::warp_exchange(d::WarpOp::kBallot, mask, predicate != 0, where);
  unsigned ballot = 0;
  for (unsigned lane = 0; lane < 32; ++lane)
    if ((r.present >> lane & 1u) && r.values[lane] != 0) ballot |= 1u << lane;
  return ballot;
}

inline int __any_sync(unsigned mask, int predicate,
                      std::source_location where = std::source_location::current()) {
  namespace d = ::petra::cuda_emulation::detail;
  const d::WarpResult r = d::warp_exchange(d::WarpOp::kAny, mask, predicate != 0, where);
  for (unsigned lane = 0; lane < 32; ++lane)
    if ((r.present >> lane & 1u) && r.values[lane] != 0) return 1;
  return 0;
}

inline int __all_sync(unsigned mask, int predicate,
                      std::source_location where = std::source_location::current()) {
  namespace d = ::petra::cuda_emulation::detail;
  const d::WarpResult r = d::warp_exchange(d::WarpOp::kAll, mask, predicate != 0, where);
  for (unsigned lane = 0; lane < 32; ++lane)
    if ((r.present >> lane & 1u) && r.values[lane] == 0) return 0;
  return 1;
}

inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// ---- atomics: std::atomic_ref on the host object; each returns the old value, as CUDA's do.
namespace petra::cuda_emulation::detail {
template <class T, class F>
T atomic_update(T* address, F f) {
  std::atomic_ref<T> ref(*address);
  T old = ref.load();
  while (!ref.compare_exchange_weak(old, f(old))) {
  }
  return old;
}
}  // namespace petra::cuda_emulation::detail

#define PETRA_EMULATED_ATOMIC_ADD(T) \
  inline T atomicAdd(T* address, T value) { return std::atomic_ref<T>(*address).fetch_add(value); }
PETRA_EMULATED_ATOMIC_ADD(int)
PETRA_EMULATED_ATOMIC_ADD(unsigned)
PETRA_EMULATED_ATOMIC_ADD(unsigned long long)
PETRA_EMULATED_ATOMIC_ADD(float)
PETRA_EMULATED_ATOMIC_ADD(double)
#undef PETRA_EMULATED_ATOMIC_ADD
inline int atomicSub(int* address, int value) {
  return std::atomic_ref<int>(*address).fetch_sub(value);
}
inline unsigned atomicSub(unsigned* address, unsigned value) {
  return std::atomic_ref<unsigned>(*address).fetch_sub(value);
}

#define PETRA_EMULATED_ATOMIC_INTEGER(T)                                              \
  inline T atomicMax(T* address, T value) {                                           \
    return ::petra::cuda_emulation::detail::atomic_update(                            \
        address, [&](T old) { return old < value ? value : old; });                   \
  }                                                                                   \
  inline T atomicMin(T* address, T value) {                                           \
    return ::petra::cuda_emulation::detail::atomic_update(                            \
        address, [&](T old) { return value < old ? value : old; });                   \
  }                                                                                   \
  inline T atomicExch(T* address, T value) {                                          \
    return std::atomic_ref<T>(*address).exchange(value);                              \
  }                                                                                   \
  inline T atomicCAS(T* address, T compare, T value) {                                \
    std::atomic_ref<T>(*address).compare_exchange_strong(compare, value);             \
    return compare;                                                                   \
  }
PETRA_EMULATED_ATOMIC_INTEGER(int)
PETRA_EMULATED_ATOMIC_INTEGER(unsigned)
PETRA_EMULATED_ATOMIC_INTEGER(unsigned long long)
#undef PETRA_EMULATED_ATOMIC_INTEGER
inline long long atomicMax(long long* address, long long value) {
  return ::petra::cuda_emulation::detail::atomic_update(
      address, [&](long long old) { return old < value ? value : old; });
}
inline long long atomicMin(long long* address, long long value) {
  return ::petra::cuda_emulation::detail::atomic_update(
      address, [&](long long old) { return value < old ? value : old; });
}
inline float atomicExch(float* address, float value) {
  return std::atomic_ref<float>(*address).exchange(value);
}

// ---- device math. The fast intrinsics (__expf, __fdividef, ...) are computed exactly here: their
// few-ulp error on a GPU is not reproduced, so compare with a tolerance that allows it.
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __frsqrt_rn(float x) { return 1.0f / std::sqrt(x); }
inline float __fadd_rn(float x, float y) { return x + y; }
inline float __fsub_rn(float x, float y) { return x - y; }
inline float __fmul_rn(float x, float y) { return x * y; }
inline float __fdiv_rn(float x, float y) { return x / y; }
inline float __fmaf_rn(float x, float y, float z) { return std::fma(x, y, z); }
inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }  // NaN -> 0
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
template <class T>
T __ldg(const T* p) {
  return *p;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a < b ? b : a; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a < b ? b : a; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a < b ? b : a; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a < b ? b : a; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a < b ? b : a; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
