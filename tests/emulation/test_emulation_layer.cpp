// tests/emulation/test_emulation_layer.cpp: the CUDA emulation itself (cuda_emulation.hpp), on
// small kernels written here the way petra's kernels are: block reductions in __shared__ memory,
// warp shuffles, grid-stride loops, and the mistakes a GPU would hang on or refuse.
#include "tests/emulation/cuda_emulation.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "petra/kernels/cuda/cluster.cuh"
#include "petra/kernels/cuda/launch.cuh"

namespace emu = petra::cuda_emulation;
using emu::KernelError;

namespace {

// ---- kernels

// One partial sum per block: a grid-stride loop, then a tree in static shared memory.
template <int kThreads>
__global__ void block_sum(std::int64_t n, const float* x, float* partial) {
  __shared__ float cache[kThreads];
  float v = 0.0f;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    v += x[i];
  cache[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (int(threadIdx.x) < stride) cache[threadIdx.x] += cache[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = cache[0];
}

__device__ float warp_sum(float v) {
  for (int offset = warpSize / 2; offset > 0; offset /= 2)
    v += __shfl_down_sync(0xffffffffu, v, unsigned(offset));
  return v;
}

// The whole sum in *total: warp shuffles, one value per warp in dynamic shared memory, the first
// warp sums those, one atomicAdd per block.
__global__ void shuffle_sum(std::int64_t n, const float* x, float* total) {
  PETRA_DYNAMIC_SHARED(float, warp_sums);
  float v = 0.0f;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    v += x[i];
  v = warp_sum(v);
  const unsigned lane = threadIdx.x % warpSize, warp = threadIdx.x / warpSize;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < blockDim.x / warpSize ? warp_sums[lane] : 0.0f;
    v = warp_sum(v);
    if (lane == 0) atomicAdd(total, v);
  }
}

// Every lane of every warp gets its warp's sum (butterfly).
__global__ void xor_sum(const int* x, int* y) {
  int v = x[threadIdx.x];
  for (int mask = 16; mask > 0; mask /= 2) v += __shfl_xor_sync(0xffffffffu, v, mask);
  y[threadIdx.x] = v;
}

// Inclusive prefix sums within segments of `width` lanes, and each segment's first value broadcast.
__global__ void segment_scan(int width, const int* x, int* scan, int* first) {
  int v = x[threadIdx.x];
  for (int delta = 1; delta < width; delta *= 2) {
    const int up = __shfl_up_sync(0xffffffffu, v, unsigned(delta), width);
    if (int(threadIdx.x % unsigned(width)) >= delta) v += up;
  }
  scan[threadIdx.x] = v;
  first[threadIdx.x] = __shfl_sync(0xffffffffu, x[threadIdx.x], 0, width);
}

__global__ void votes(const int* x, unsigned* ballot, int* any, int* all) {
  const int positive = x[threadIdx.x] > 0;
  ballot[threadIdx.x] = __ballot_sync(0xffffffffu, positive);
  any[threadIdx.x] = __any_sync(0xffffffffu, positive);
  all[threadIdx.x] = __all_sync(0xffffffffu, positive);
}

// Counts, for each item, the threads that visited it, and records the last block that did.
__global__ void visit(std::int64_t n, int* visits, int* block_of) {
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    visits[i] += 1;
    block_of[i] = int(blockIdx.x);
  }
}

// Writes its global linear index at that index, in 3-D grids of 3-D blocks.
__global__ void coordinates(int* out) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned index = block * (blockDim.x * blockDim.y * blockDim.z) + thread;
  out[index] = int(index);
}

__global__ void nothing(int*) {}

__constant__ float coefficients[4];

__global__ void polynomial(const float* x, float* y) {
  const float v = x[threadIdx.x];
  y[threadIdx.x] = ((coefficients[3] * v + coefficients[2]) * v + coefficients[1]) * v +
                   coefficients[0];
}

// Writes the dynamic shared memory's first float (uninitialised: NaN), then 2.
__global__ void read_dynamic_shared(float* before, float* after) {
  PETRA_DYNAMIC_SHARED(float, scratch);
  if (threadIdx.x == 0) *before = scratch[0];
  __syncthreads();
  if (threadIdx.x == 0) scratch[0] = 2.0f;
  __syncthreads();
  if (threadIdx.x == 1) *after = scratch[0];
}

// ---- kernels with the mistakes a GPU hangs on or leaves undefined

__global__ void return_then_barrier(float* y) {
  if (threadIdx.x >= 16) return;
  __syncthreads();
  y[threadIdx.x] = 1.0f;
}

__global__ void barrier_in_both_branches(float* y) {
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
    y[threadIdx.x] = 1.0f;
  } else {
    __syncthreads();
    y[threadIdx.x] = 2.0f;
  }
}

__global__ void barrier_in_a_loop(int trips) {
  for (int i = 0; i < trips + int(threadIdx.x == 3); ++i) __syncthreads();
}

// Lane 0 waits at __syncthreads, lanes 1..31 at a shuffle that waits for lane 0.
__global__ void barrier_against_shuffle(float* y) {
  float v = float(threadIdx.x);
  if (threadIdx.x == 0) __syncthreads();
  else v = __shfl_sync(0xffffffffu, v, 0);
  y[threadIdx.x] = v;
}

__global__ void mask_without_self(float* y) {
  y[threadIdx.x] = __shfl_sync(0x1u, 1.0f, 0);
}

__global__ void bad_width(float* y) {
  y[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1.0f, 1, 12);
}

__global__ void different_intrinsics(float* y) {
  if (threadIdx.x < 16) y[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  else y[threadIdx.x] = float(__ballot_sync(0xffffffffu, 1));
}

// Half the lanes return; the others shuffle among themselves: fine, returned lanes are not waited
// for. Lane 15 also reads lane 16, which returned: undefined, the emulation gives NaN.
__global__ void half_warp_returns(float* y) {
  if (threadIdx.x >= 16) return;
  float v = float(threadIdx.x);
  y[threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 1);
  y[16 + threadIdx.x] = __shfl_down_sync(0xffffffffu, v, 1);
}

// A block of 48 threads: the second warp has 16 lanes, and reading beyond them gives NaN.
__global__ void partial_warp(float* y) {
  const float v = float(threadIdx.x);
  __syncwarp();
  y[threadIdx.x] = __shfl_down_sync(0xffffffffu, v, 8);
}

__global__ void throws(float*) {
  if (threadIdx.x == 5) throw std::runtime_error("kernel failure");
}

__global__ void big_shared(float* y) {
  PETRA_DYNAMIC_SHARED(float, tile);
  tile[threadIdx.x] = 1.0f;
  __syncthreads();
  y[threadIdx.x] = tile[(threadIdx.x + 1) % blockDim.x];
}

// ---- thread-block clusters (kernels/cuda/cluster.cuh)

// Each block puts its index in its shared memory; after the cluster's barrier every thread reads
// the next rank's, then the barrier again so that no block leaves while another reads its memory.
__global__ void cluster_neighbour(float* y) {
  using namespace petra::cuda_detail;
  PETRA_DYNAMIC_SHARED(float, own);
  const unsigned rank = cluster_rank(), size = ::petra::cuda_emulation::cluster_block_count();
  if (threadIdx.x == 0) own[0] = float(blockIdx.x);
  cluster_barrier();
  const float next = *cluster_peer(own, (rank + 1) % size);
  cluster_barrier();
  y[blockIdx.x * blockDim.x + threadIdx.x] = next + 1000.0f * float(rank);
}

// Block 1 of each cluster returns before the barrier the others wait at.
__global__ void cluster_rank_one_returns(float* y) {
  if (petra::cuda_detail::cluster_rank() == 1) return;
  petra::cuda_detail::cluster_barrier();
  y[threadIdx.x] = 1.0f;
}

__global__ void cluster_barriers_differ(float* y) {
  if (petra::cuda_detail::cluster_rank() == 0) petra::cuda_detail::cluster_barrier();
  else petra::cuda_detail::cluster_barrier();
  y[threadIdx.x] = 1.0f;
}

// Reads the next rank's shared memory with no barrier before leaving: a block may have exited.
__global__ void cluster_peer_without_final_barrier(float* y) {
  using namespace petra::cuda_detail;
  PETRA_DYNAMIC_SHARED(float, own);
  own[threadIdx.x] = 1.0f;
  cluster_barrier();
  y[blockIdx.x * blockDim.x + threadIdx.x] = cluster_peer(own, (cluster_rank() + 1) % 2)[threadIdx.x];
}

__global__ void cluster_peer_out_of_range(float* y) {
  PETRA_DYNAMIC_SHARED(float, own);
  y[threadIdx.x] = *petra::cuda_detail::cluster_peer(own, 2);
}

__global__ void cluster_peer_of_static(float* y) {
  __shared__ float cache[32];
  y[threadIdx.x] = *petra::cuda_detail::cluster_peer(cache, 0);
}

// Half of block 0 waits at __syncthreads, the other half at the cluster barrier: a GPU hangs.
__global__ void cluster_against_block_barrier(float* y) {
  if (petra::cuda_detail::cluster_rank() == 0 && threadIdx.x < 16) __syncthreads();
  else petra::cuda_detail::cluster_barrier();
  y[threadIdx.x] = 1.0f;
}

// Small integers: every partial sum is exact in float, in any order.
std::vector<float> integers(std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = float(int(i % 17) - 8);
  return x;
}

double exact_sum(const std::vector<float>& x) { return std::accumulate(x.begin(), x.end(), 0.0); }

}  // namespace

TEST_CASE("emulation: a block reduction in __shared__ memory with __syncthreads") {
  for (std::int64_t n : {1, 255, 256, 257, 10000}) {
    const std::vector<float> x = integers(std::size_t(n));
    const unsigned blocks = 7;
    std::vector<float> partial(blocks, -1.0f);
    PETRA_LAUNCH(block_sum<256>, blocks, 256, 0, nullptr)(n, x.data(), partial.data());
    INFO("n = ", n);
    CHECK(exact_sum(partial) == exact_sum(x));
  }
}

TEST_CASE("emulation: a warp-shuffle reduction with dynamic shared memory and atomicAdd") {
  for (unsigned threads : {32u, 64u, 256u, 1024u}) {
    const std::vector<float> x = integers(5000);
    float total = 0.0f;
    PETRA_LAUNCH(shuffle_sum, 3, threads, threads / 32 * sizeof(float), nullptr)(
        std::int64_t(x.size()), x.data(), &total);
    INFO("threads = ", threads);
    CHECK(total == exact_sum(x));
  }
}

TEST_CASE("emulation: butterfly, scan, broadcast and votes follow CUDA's lane rules") {
  std::vector<int> x(64);
  for (int i = 0; i < 64; ++i) x[std::size_t(i)] = i * (i % 3 == 0 ? -1 : 1);

  std::vector<int> sums(64);
  PETRA_LAUNCH(xor_sum, 1, 64, 0, nullptr)(x.data(), sums.data());
  for (int w = 0; w < 2; ++w) {
    const int expected = std::accumulate(x.begin() + 32 * w, x.begin() + 32 * (w + 1), 0);
    for (int lane = 0; lane < 32; ++lane) CHECK(sums[std::size_t(32 * w + lane)] == expected);
  }

  for (int width : {1, 2, 8, 16, 32}) {
    std::vector<int> scan(64), first(64);
    PETRA_LAUNCH(segment_scan, 1, 64, 0, nullptr)(width, x.data(), scan.data(), first.data());
    for (int i = 0; i < 64; ++i) {
      const int start = i / width * width;
      INFO("width ", width, " lane ", i);
      CHECK(scan[std::size_t(i)] == std::accumulate(x.begin() + start, x.begin() + i + 1, 0));
      CHECK(first[std::size_t(i)] == x[std::size_t(start)]);
    }
  }

  std::vector<unsigned> ballot(64);
  std::vector<int> any(64), all(64);
  std::vector<int> signs(64, 1);
  signs[40] = 0;  // warp 1 has one non-positive lane, warp 0 none
  PETRA_LAUNCH(votes, 1, 64, 0, nullptr)(signs.data(), ballot.data(), any.data(), all.data());
  CHECK(ballot[0] == 0xffffffffu);
  CHECK(ballot[33] == ~(1u << 8));
  CHECK(all[0] == 1);
  CHECK(all[63] == 0);
  CHECK(any[63] == 1);
}

TEST_CASE("emulation: grid-stride loops with a capped grid visit every item once") {
  for (std::size_t cap : {1, 2, 3, 8192}) {
    const emu::GridStrideCap capped(cap);
    for (std::int64_t n : {1, 255, 256, 257, 5000}) {
      std::vector<int> visits(std::size_t(n), 0), block_of(std::size_t(n), -1);
      petra::kernels::StreamHandle s;
      petra::cuda_detail::launch_grid_stride("visit", s, n, visit, n, visits.data(),
                                             block_of.data());
      const unsigned blocks = petra::cuda_detail::grid_stride_blocks(std::size_t(n));
      INFO("cap ", cap, " n ", n);
      CHECK(blocks == std::min<std::size_t>(cap, std::size_t(n + 255) / 256));
      CHECK(emu::last_launch().grid.x == blocks);
      CHECK(emu::last_launch().kernel == "visit");
      CHECK(std::all_of(visits.begin(), visits.end(), [](int v) { return v == 1; }));
      CHECK(*std::max_element(block_of.begin(), block_of.end()) == int(blocks) - 1);
    }
  }
  // No items: nothing is launched (an empty grid would be an error).
  const std::size_t before = emu::launches();
  petra::cuda_detail::launch_grid_stride("visit", petra::kernels::StreamHandle{}, 0, visit,
                                         std::int64_t(0), nullptr, nullptr);
  CHECK(emu::launches() == before);
}

TEST_CASE("emulation: threadIdx, blockIdx, blockDim and gridDim in three dimensions") {
  const dim3 grid(3, 2, 2), block(4, 2, 3);
  std::vector<int> out(3 * 2 * 2 * 4 * 2 * 3, -1);
  PETRA_LAUNCH(coordinates, grid, block, 0, nullptr)(out.data());
  for (std::size_t i = 0; i < out.size(); ++i) CHECK(out[i] == int(i));
}

TEST_CASE("emulation: dynamic shared memory starts as NaN and is shared by the block") {
  float before = 0.0f, after = 0.0f;
  PETRA_LAUNCH(read_dynamic_shared, 2, 64, 64 * sizeof(float), nullptr)(&before, &after);
  CHECK(std::isnan(before));
  CHECK(after == 2.0f);
}

TEST_CASE("emulation: launch configurations a GPU refuses are errors, and nothing runs") {
  int x = 0;
  const std::size_t before = emu::launches();
  CHECK_THROWS_WITH_AS(PETRA_LAUNCH(nothing, 1, 1025, 0, nullptr)(&x),
                       doctest::Contains("1025 threads"), KernelError);
  CHECK_THROWS_WITH_AS(PETRA_LAUNCH(nothing, 1, dim3(32, 32, 2), 0, nullptr)(&x),
                       doctest::Contains("at most 1024"), KernelError);
  CHECK_THROWS_WITH_AS(PETRA_LAUNCH(nothing, 1, dim3(1, 1, 65), 0, nullptr)(&x),
                       doctest::Contains("z <= 64"), KernelError);
  CHECK_THROWS_WITH_AS(PETRA_LAUNCH(nothing, 0, 32, 0, nullptr)(&x),
                       doctest::Contains("zero dimension"), KernelError);
  CHECK_THROWS_WITH_AS(PETRA_LAUNCH(nothing, dim3(1, 65536), 32, 0, nullptr)(&x),
                       doctest::Contains("too large"), KernelError);
  CHECK_THROWS_WITH_AS(PETRA_LAUNCH(nothing, 1, 0, 0, nullptr)(&x),
                       doctest::Contains("zero dimension"), KernelError);
  CHECK(emu::launches() == before);

  // Dynamic shared memory: 48 KB without opt-in, up to the opt-in with it.
  std::vector<float> y(32);
  CHECK_NOTHROW(PETRA_LAUNCH(big_shared, 1, 32, 48 * 1024, nullptr)(y.data()));
  CHECK_THROWS_WITH_AS(PETRA_LAUNCH(big_shared, 1, 32, 48 * 1024 + 4, nullptr)(y.data()),
                       doctest::Contains("cudaFuncAttributeMaxDynamicSharedMemorySize"),
                       KernelError);
  CHECK(cudaFuncSetAttribute(big_shared, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             300 * 1024) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaFuncSetAttribute(big_shared, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               96 * 1024) == cudaSuccess);
  CHECK_NOTHROW(PETRA_LAUNCH(big_shared, 1, 32, 96 * 1024, nullptr)(y.data()));
  CHECK(y[0] == 1.0f);
  CHECK_THROWS_WITH_AS(PETRA_LAUNCH(big_shared, 1, 32, 96 * 1024 + 4, nullptr)(y.data()),
                       doctest::Contains("opt-in of 98304"), KernelError);
}

TEST_CASE("emulation: __syncthreads that not every thread reaches fails instead of hanging") {
  std::vector<float> y(64);
  CHECK_THROWS_WITH_AS(PETRA_LAUNCH(return_then_barrier, 2, 64, 0, nullptr)(y.data()),
                       doctest::Contains("every thread of a block must reach every __syncthreads"),
                       KernelError);
  CHECK_THROWS_WITH_AS(PETRA_LAUNCH(barrier_in_both_branches, 1, 64, 0, nullptr)(y.data()),
                       doctest::Contains("different __syncthreads"), KernelError);
  CHECK_THROWS_WITH_AS(PETRA_LAUNCH(barrier_in_a_loop, 1, 64, 0, nullptr)(2),
                       doctest::Contains("__syncthreads"), KernelError);
  // The message names the kernel, the block and the source line.
  try {
    PETRA_LAUNCH(return_then_barrier, 2, 64, 0, nullptr)(y.data());
    FAIL("no error");
  } catch (const KernelError& e) {
    const std::string message = e.what();
    CHECK(message.find("return_then_barrier") != std::string::npos);
    CHECK(message.find("block (0,0,0)") != std::string::npos);
    CHECK(message.find("test_emulation_layer.cpp:") != std::string::npos);
  }
  // The emulator is usable after a failed launch.
  std::vector<float> partial(1);
  const std::vector<float> x = integers(100);
  PETRA_LAUNCH(block_sum<64>, 1, 64, 0, nullptr)(std::int64_t(100), x.data(), partial.data());
  CHECK(partial[0] == exact_sum(x));
}

TEST_CASE("emulation: a deadlock between __syncthreads and a shuffle is reported") {
  std::vector<float> y(32);
  CHECK_THROWS_WITH_AS(PETRA_LAUNCH(barrier_against_shuffle, 1, 32, 0, nullptr)(y.data()),
                       doctest::Contains("deadlock"), KernelError);
}

TEST_CASE("emulation: misused warp intrinsics are errors; lanes that left read as NaN") {
  std::vector<float> y(64, 0.0f);
  CHECK_THROWS_WITH_AS(PETRA_LAUNCH(mask_without_self, 1, 32, 0, nullptr)(y.data()),
                       doctest::Contains("leaves the lane itself out"), KernelError);
  CHECK_THROWS_WITH_AS(PETRA_LAUNCH(bad_width, 1, 32, 0, nullptr)(y.data()),
                       doctest::Contains("width 12"), KernelError);
  CHECK_THROWS_WITH_AS(PETRA_LAUNCH(different_intrinsics, 1, 32, 0, nullptr)(y.data()),
                       doctest::Contains("different intrinsics"), KernelError);
  CHECK_THROWS_WITH_AS(PETRA_LAUNCH(throws, 1, 32, 0, nullptr)(y.data()),
                       doctest::Contains("thread (5,0,0) threw: kernel failure"), KernelError);

  PETRA_LAUNCH(half_warp_returns, 1, 32, 0, nullptr)(y.data());
  for (int lane = 0; lane < 16; ++lane) CHECK(y[std::size_t(lane)] == float(lane ^ 1));
  for (int lane = 0; lane < 15; ++lane) CHECK(y[std::size_t(16 + lane)] == float(lane + 1));
  CHECK(std::isnan(y[31]));  // lane 15 read lane 16, which had returned

  PETRA_LAUNCH(partial_warp, 1, 48, 0, nullptr)(y.data());
  for (int t = 0; t < 24; ++t) CHECK(y[std::size_t(t)] == float(t + 8));
  for (int t = 24; t < 32; ++t) CHECK(y[std::size_t(t)] == float(t));  // past lane 31: its own
  for (int t = 32; t < 40; ++t) CHECK(y[std::size_t(t)] == float(t + 8));
  for (int t = 40; t < 48; ++t) CHECK(std::isnan(y[std::size_t(t)]));  // lanes 16.. do not exist
}

TEST_CASE("emulation: the runtime calls of a .cu file") {
  int device = -1;
  CHECK(cudaGetDevice(&device) == cudaSuccess);
  CHECK(device == 0);
  CHECK(cudaSetDevice(1) == cudaErrorInvalidDevice);
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaSuccess);
  std::vector<float> a = {1, 2, 3}, b(3);
  CHECK(cudaMemcpyAsync(b.data(), a.data(), 3 * sizeof(float), cudaMemcpyDeviceToDevice, nullptr) ==
        cudaSuccess);
  CHECK(b == a);
  CHECK(cudaMemsetAsync(b.data(), 0, 3 * sizeof(float), nullptr) == cudaSuccess);
  CHECK(b == std::vector<float>(3, 0.0f));
  // __constant__ memory, written with cudaMemcpyToSymbol.
  const float c[4] = {1, 2, 0, -1};
  REQUIRE(cudaMemcpyToSymbol(coefficients, c, sizeof c) == cudaSuccess);
  CHECK(cudaMemcpyToSymbol(coefficients, c, sizeof c, 4) == cudaErrorInvalidValue);  // too long
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  PETRA_LAUNCH(polynomial, 1, 3, 0, nullptr)(a.data(), b.data());
  CHECK(b == std::vector<float>{2, -3, -20});  // 1 + 2x - x^3 at 1, 2, 3
  // A device the emulated machine does not have is the DeviceError of a real machine.
  petra::kernels::StreamHandle s;
  s.device_index = 1;
  CHECK_THROWS_AS(petra::cuda_detail::DeviceGuard(s.device_index), petra::DeviceError);
  CHECK(cudaGetLastError() == cudaSuccess);
  // Outside a launch the intrinsics say so.
  CHECK_THROWS_WITH_AS(__syncthreads(), doctest::Contains("outside a kernel"), KernelError);
}

TEST_CASE("emulation: the blocks of a cluster run together, wait at its barrier and read each other's shared memory") {
  for (const bool cooperative : {false, true}) {
    CAPTURE(cooperative);
    const bool saved = emu::settings().cooperative;
    emu::settings().cooperative = cooperative;
    for (const unsigned cluster : {1u, 2u, 4u}) {
      CAPTURE(cluster);
      const unsigned blocks = 8, threads = 48;
      std::vector<float> y(blocks * threads, -1.0f);
      emu::launch("cluster_neighbour", cluster_neighbour, blocks, threads, 64, nullptr, cluster)(y.data());
      CHECK(emu::last_launch().cluster == cluster);
      for (unsigned b = 0; b < blocks; ++b) {
        const unsigned rank = b % cluster, next = b - rank + (rank + 1) % cluster;
        for (unsigned t = 0; t < threads; ++t) CHECK(y[b * threads + t] == float(next) + 1000.0f * float(rank));
      }
    }
    emu::settings().cooperative = saved;
  }
}

TEST_CASE("emulation: misused clusters are errors: a barrier not every block reaches, bad ranks, bad shapes") {
  std::vector<float> y(64);
  struct Misuse {
    const char* name;
    void (*kernel)(float*);
    unsigned blocks, cluster;
    const char* error;
  };
  for (const Misuse& m :
       {Misuse{"cluster_rank_one_returns", cluster_rank_one_returns, 4, 2,
               "every thread of a cluster must reach every cluster_sync"},
        Misuse{"cluster_barriers_differ", cluster_barriers_differ, 2, 2, "different cluster_sync"},
        Misuse{"cluster_peer_out_of_range", cluster_peer_out_of_range, 2, 2, "rank 2 in a cluster of 2"},
        Misuse{"cluster_peer_of_static", cluster_peer_of_static, 2, 2, "not in its block's dynamic shared memory"},
        Misuse{"cluster_against_block_barrier", cluster_against_block_barrier, 2, 2, "deadlock"},
        Misuse{"cluster_neighbour", cluster_neighbour, 6, 4, "divides grid.x"},
        Misuse{"cluster_neighbour", cluster_neighbour, 16, 16, "1 to 8 blocks"}}) {
    CAPTURE(m.name);
    CHECK_THROWS_WITH_AS(emu::launch(m.name, m.kernel, m.blocks, 32, 16, nullptr, m.cluster)(y.data()),
                         doctest::Contains(m.error), KernelError);
  }
  if (emu::cooperative_available()) {  // (found when the other block has finished first: the fibers' order)
    const bool saved = emu::settings().cooperative;
    emu::settings().cooperative = true;
    CHECK_THROWS_WITH_AS(emu::launch("cluster_peer_without_final_barrier", cluster_peer_without_final_barrier, 2, 32,
                                     128, nullptr, 2)(y.data()),
                         doctest::Contains("whose threads have all returned"), KernelError);
    emu::settings().cooperative = saved;
  }
  // The emulator is usable after the failures.
  std::vector<float> z(2 * 32);
  emu::launch("cluster_neighbour", cluster_neighbour, 2, 32, 16, nullptr, 2)(z.data());
  CHECK(z[0] == 1.0f);
  CHECK(z[32] == 1000.0f);
}
