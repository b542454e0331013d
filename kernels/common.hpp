// kernels/common.hpp: what every kernel receives besides its pointers and shapes.
//
// kernels/ is the ground floor of petra: plain functions on raw pointers. They know nothing of
// tensors or graphs. Each call takes a StreamHandle, which says
//   - how many threads a CPU kernel may use (each CPU stream has its own count, so two pipeline
//     workers on one machine can each run single-threaded kernels side by side),
//   - which cudaStream_t a CUDA kernel is launched on,
//   - where scratch memory comes from (a Workspace owned by the stream: a stream runs its work
//     in order, so one scratch buffer per stream is never used by two kernels at once).
//
// Conventions of every kernel header:
//   - outputs documented "=" are assigned, outputs documented "+=" are accumulated;
//   - ref:: is the oracle (plain loops, double accumulation), templated on float and double;
//   - cpu:: is the fast version (Eigen, vectorised, OpenMP) with the same signature;
//   - cuda:: has the same signature and exists when petra is built with CUDA;
//   - kernels trust their arguments: shapes are validated one floor up, in petra/ops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace petra::kernels {

// Scratch memory for kernels. reserve(bytes) returns a buffer of at least `bytes`, aligned to 64
// bytes, valid until the next reserve() on the same workspace. The petra/ layer implements this
// with the caching allocator (tag "workspace"); HeapWorkspace is a standalone version for tests.
class Workspace {
 public:
  virtual ~Workspace() = default;
  virtual void* reserve(std::size_t bytes) = 0;
};

// A grow-only host buffer: reallocates only when a larger request arrives.
class HeapWorkspace final : public Workspace {
 public:
  HeapWorkspace() = default;
  HeapWorkspace(const HeapWorkspace&) = delete;
  HeapWorkspace& operator=(const HeapWorkspace&) = delete;
  void* reserve(std::size_t bytes) override;
  std::size_t capacity() const { return capacity_; }

 private:
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, FreeDeleter> buffer_;
  std::size_t capacity_ = 0;
};

struct StreamHandle {
  int num_threads = 1;             // CPU kernels: OpenMP threads to use (>= 1)
  void* cuda_stream = nullptr;     // CUDA kernels: the cudaStream_t (nullptr = legacy default)
  Workspace* workspace = nullptr;  // scratch; kernels that need it require it to be non-null
  int device_index = 0;            // CUDA device the stream belongs to

  // Scratch of at least `bytes`, from this stream's workspace.
  void* scratch(std::size_t bytes) const;
};

// Sets the OpenMP thread count of the calling thread to s.num_threads for a CPU kernel. (OpenMP's
// nthreads-var is per thread, so workers that run different streams do not disturb each other;
// Eigen's parallel GEMM reads the same value.)
void use_threads(const StreamHandle& s);

}  // namespace petra::kernels
