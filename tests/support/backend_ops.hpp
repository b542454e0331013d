// tests/support/backend_ops.hpp: the backend-ops test matrix, in the spirit of ggml's
// test-backend-ops: one table of cases, each an op of petra::ops (the Tensor-level API) on given
// shapes, run on every backend that is built and compared with the ref:: oracle.
//
// A backend is a (device, dtype) pair, which petra/ops.cpp dispatches to one kernel namespace:
//   reference  cpu:0, float64  -> kernels::ref   (the oracle)
//   cpu        cpu:0, float32  -> kernels::cpu
//   cuda:N     cuda:N, float32 -> kernels::cuda
// A Case builds its inputs from its seed for a backend (every value is drawn in double and rounded
// to float32 first, so every backend sees the same numbers), runs the op through ops:: and returns
// its named outputs. compare() runs the case on the reference backend and on the backend under
// test and measures ||got - ref|| / ||ref|| per output (ops::relative_error; integer outputs such
// as argmax indices must match exactly) against the case's tolerance for that backend.
//
// Outputs that a kernel accumulates into (+= in the kernel contracts: parameter gradients,
// add_into, axpy_into, optimizer state) start from a non-zero destination in their cases, so an
// "=" where "+=" is due shows up as a mismatch.
//
// Adding an op, or a shape of an op, to the matrix is one Case in registry() (backend_ops.cpp).
// tests/cpu/test_backend_ops.cpp runs the table on the cpu backend (and checks that every function
// declared in petra/ops.hpp's ops:: namespace has a case); tests/cuda/test_backend_ops_cuda.cpp
// runs it on cuda:0 and reports a case whose op raises "no CUDA kernel yet" as skipped, not passed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "petra/ops.hpp"
#include "petra/optimizer_steps.hpp"
#include "petra/tensor.hpp"

namespace petra::testing::backend_ops {

struct Backend {
  enum class Kind { reference, cpu, cuda };
  Kind kind;
  Device device;
  DType dtype;
  int cpu_threads = 0;       // cpu: the cases run on a CPU stream with this many threads (0: the default stream)
  std::string name() const;  // "ref (cpu:0 float64)", "cpu (cpu:0 float32, 3 threads)", "cuda:0 (float32)"
};
Backend reference_backend();               // float64 on the CPU: kernels::ref
Backend cpu_backend(int threads = 0);      // float32 on the CPU: kernels::cpu
Backend cuda_backend(int index = 0);       // float32 on a GPU: kernels::cuda

// Largest accepted relative error of each output, per backend under test.
struct Tolerance {
  double cpu;
  double cuda;
  Tolerance(double both) : cpu(both), cuda(both) {}  // NOLINT: a plain number means both
  Tolerance(double cpu_, double cuda_) : cpu(cpu_), cuda(cuda_) {}
  double of(const Backend& b) const { return b.kind == Backend::Kind::cuda ? cuda : cpu; }
};

// Builds a case's inputs for one backend. Draw k of a case uses the generator seeded with
// (seed, k), so the same case gives every backend the same values (rounded to float32), in the
// backend's dtype, on its device.
class InputMaker {
 public:
  InputMaker(std::uint64_t seed, Backend backend) : seed_(seed), backend_(backend) {}
  const Backend& backend() const { return backend_; }

  // Uniform in [lo, hi).
  Tensor uniform(const Shape& shape, double lo = -1, double hi = 1);
  // Distinct values spread over [-1, 1), shuffled: max pooling has no ties.
  Tensor distinct(const Shape& shape);
  // The given values (rounded to float32), in the backend's dtype and on its device.
  Tensor values(const Shape& shape, const std::vector<double>& values);
  // Uniform in [lo, hi), as the batch slice [lead, lead + shape[0]) of a tensor with `lead` more
  // rows: a contiguous view at an offset (not 16-byte aligned when a row has an odd size).
  Tensor uniform_view(const Shape& shape, std::int64_t lead, double lo = -1, double hi = 1);
  // int64 labels in [0, classes).
  Tensor labels(std::int64_t batch, std::int64_t classes);
  // Uniform draws in double, rounded to float32 (the values behind uniform()).
  std::vector<double> draw(std::int64_t n, double lo = -1, double hi = 1);

 private:
  Tensor place(const Shape& shape, const std::vector<double>& values) const;
  std::uint64_t seed_;
  std::uint64_t draws_ = 0;
  Backend backend_;
};

struct Output {
  std::string name;  // "y", "dw", "running_var", ...
  Tensor value;
};
using Outputs = std::vector<Output>;

struct Case {
  std::string op;    // the ops:: function under test: "conv2d_backward_weight"
  std::string name;  // op and parameters, unique in the table: "conv2d_backward_weight x[2, 3, 7, 9] w[...] s2 p1"
  std::function<std::vector<Tensor>(InputMaker&)> inputs;
  // Runs the op on the inputs (in-place ops may modify them) and returns what it produced.
  std::function<Outputs(const std::vector<Tensor>&)> run;
  Tolerance tolerance;
};

// The table: every op family of petra/ops.hpp's ops:: namespace.
const std::vector<Case>& registry();

struct OutputComparison {
  std::string name;
  double error = 0;  // relative error, or the number of differing elements for integer outputs
  bool ok = false;
  std::string problem;  // why not ok, with the numbers
};

struct CaseResult {
  bool no_kernel = false;    // the backend raised "no CUDA kernel yet" (DeviceError) for the op
  std::string error;         // any other exception: its message
  std::vector<OutputComparison> outputs;
  bool ok() const;           // no exception, and every output within tolerance
};

// Runs `c` on the reference backend and on `backend` and compares the outputs. Never throws for
// the case's own failures: a DeviceError saying "no CUDA kernel yet" sets no_kernel, any other
// exception is recorded in `error`.
CaseResult compare(const Case& c, const Backend& backend);

// Runs every case of `cases` on `backend` with doctest checks, one failure per mismatching output
// naming the case. Ops that have no kernel on the backend are reported with MESSAGE ("no CUDA
// kernel yet for <op>", once per op) and counted as skipped, never as passed; on the CPU backends
// a missing kernel is a failure. Ends with a one-line MESSAGE summary (with
// PETRA_BACKEND_OPS_LIST set in the environment, also the cases per op and each op's worst
// error / tolerance). Returns the number of cases compared.
std::size_t check_backend(const Backend& backend, const std::vector<Case>& cases = registry());

}  // namespace petra::testing::backend_ops
