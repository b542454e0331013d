// benchmarks/bench_thread_split.cpp: how to split a memory-bound pass over threads on this CPU.
//
// A tensor of `rows` rows (samples) of `row` floats (channels x pixels), read or written once,
// split two ways over the threads:
//   interleaved  each thread takes its share of every row (a block of channels in each sample),
//   contiguous   each thread takes a contiguous share of the whole tensor (a run of samples).
// Both touch the same bytes. On this 2-core VM the interleaved *writes* ran slower on 2 threads
// than on 1 while the tensor sat in the caches (docs/results-cpu.md §1, "Batch norm's threads take
// samples"), which is why kernels/cpu/batchnorm.cpp splits by samples. This program is the
// measurement, without any of petra: rerun it on another machine before trusting the rule there.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

enum class Split { interleaved, contiguous };

// Median µs of `repeats` passes reading (sum) or writing (store 1) `rows` x `row` floats.
double time_pass(float* data, long rows, long row, int threads, Split split, bool write, int repeats) {
  std::vector<double> times;
  volatile float sink = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    {
      const long t = omp_get_thread_num(), n = omp_get_num_threads();
      float sum = 0;
      for (long k = 0; k < rows; ++k) {
        // interleaved: [begin, end) of row k; contiguous: as many floats, the k-th piece of
        // thread t's own run [rows * begin, rows * end) of the whole array
        const long begin = row * t / n, end = row * (t + 1) / n;
        float* run = split == Split::interleaved ? data + k * row + begin : data + rows * begin + k * (end - begin);
        if (write) {
#pragma omp simd
          for (long i = 0; i < end - begin; ++i) run[i] = 1.0f;
        } else {
#pragma omp simd reduction(+ : sum)
          for (long i = 0; i < end - begin; ++i) sum += run[i];
        }
      }
      if (sum < 0) sink = sum;
    }
    times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  (void)sink;
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench-thread-split: interleaved against contiguous per-thread shares of a memory-bound pass"};
  int threads = 2, repeats = 2001;
  long rows = 64;
  std::vector<long> row_floats = {6272, 8192, 32768, 131072};
  app.add_option("--threads", threads, "threads of the parallel runs (1 is always run beside them)")
      ->check(CLI::Range(2, 256));
  app.add_option("--rows", rows, "rows (samples)")->check(CLI::PositiveNumber);
  app.add_option("--row-floats", row_floats, "floats per row, one case each (6272: 32 channels x 14 x 14)");
  app.add_option("--repeats", repeats, "timed passes per case (the median is printed)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  std::printf("%10s %9s %6s %13s %13s %13s\n", "row floats", "MB", "pass", "1 thread µs",
              "interleaved", "contiguous");
  for (const long row : row_floats) {
    std::vector<float> data(std::size_t(rows * row), 0.5f);
    for (const bool write : {false, true}) {
      const double one = time_pass(data.data(), rows, row, 1, Split::contiguous, write, repeats);
      const double inter = time_pass(data.data(), rows, row, threads, Split::interleaved, write, repeats);
      const double cont = time_pass(data.data(), rows, row, threads, Split::contiguous, write, repeats);
      std::printf("%10ld %9.1f %6s %13.1f %13.1f %13.1f\n", row, double(rows * row) * 4 / 1e6,
                  write ? "write" : "read", one, inter, cont);
    }
  }
  std::printf("(%d threads in the last two columns; median of %d passes)\n", threads, repeats);
  return 0;
}
