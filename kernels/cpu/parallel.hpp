// kernels/cpu/parallel.hpp: the one loop-splitting helper of the CPU kernels (internal, not installed).
#pragma once

#include <cstdint>

namespace petra::kernels::cpu {

// Calls body(i) for i in [0, count), split statically over `threads` OpenMP threads (in order on
// the calling thread when threads is 1 or OpenMP is off). Static splitting keeps each thread's
// share, and so any per-thread partial sums, the same from run to run: results are deterministic
// for a given thread count.
template <class Body>
void parallel_for(int threads, std::int64_t count, Body body) {
#ifdef _OPENMP
  if (threads > 1) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (std::int64_t i = 0; i < count; ++i) body(i);
    return;
  }
#endif
  (void)threads;
  for (std::int64_t i = 0; i < count; ++i) body(i);
}

}  // namespace petra::kernels::cpu
