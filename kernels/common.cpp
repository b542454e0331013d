// kernels/common.cpp: HeapWorkspace and the thread-count helper of kernels/common.hpp.
#include "petra/kernels/common.hpp"

#include <cstdlib>
#include <new>

#include "petra/error.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace petra::kernels {

void HeapWorkspace::FreeDeleter::operator()(void* p) const { std::free(p); }

void* HeapWorkspace::reserve(std::size_t bytes) {
  if (bytes > capacity_) {
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) throw OutOfMemoryError(detail::concat("HeapWorkspace: cannot allocate ", rounded, " bytes"));
    buffer_.reset(p);
    capacity_ = rounded;
  }
  return buffer_.get();
}

void* StreamHandle::scratch(std::size_t bytes) const {
  PETRA_CHECK(workspace != nullptr, ValueError, "kernel needs ", bytes, " bytes of scratch but the stream has no workspace");
  return workspace->reserve(bytes);
}

void use_threads(const StreamHandle& s) {
#ifdef _OPENMP
  const int n = s.num_threads < 1 ? 1 : s.num_threads;
  if (omp_get_max_threads() != n) omp_set_num_threads(n);
#else
  (void)s;
#endif
}

}  // namespace petra::kernels
