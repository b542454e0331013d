// tests/support/backend_ops.cpp: the backend-ops runner and its table of cases (see
// backend_ops.hpp). The table is grouped by op family, in the order of petra/ops.hpp.
#include "tests/support/backend_ops.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>

#include "petra/kernels/elementwise.hpp"
#include "petra/error.hpp"
#include "petra/stream.hpp"

namespace petra::testing::backend_ops {

// ---------------------------------------------------------------- backends

std::string Backend::name() const {
  switch (kind) {
    case Kind::reference: return "ref (" + device.str() + " float64)";
    case Kind::cpu:
      return "cpu (" + device.str() + " float32" +
             (cpu_threads > 0 ? ", " + std::to_string(cpu_threads) + " thread" + (cpu_threads > 1 ? "s" : "") : "") + ")";
    case Kind::cuda: return device.str() + " (float32)";
  }
  return "?";
}

Backend reference_backend() { return {Backend::Kind::reference, Device::cpu(), DType::f64, 0}; }
Backend cpu_backend(int threads) { return {Backend::Kind::cpu, Device::cpu(), DType::f32, threads}; }
Backend cuda_backend(int index) { return {Backend::Kind::cuda, Device::cuda(index), DType::f32, 0}; }

// ---------------------------------------------------------------- inputs

std::vector<double> InputMaker::draw(std::int64_t n, double lo, double hi) {
  std::mt19937_64 gen(seed_ * 0x9E3779B97F4A7C15ull + draws_++);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = static_cast<double>(static_cast<float>(dist(gen)));
  return v;
}

Tensor InputMaker::place(const Shape& shape, const std::vector<double>& values) const {
  std::vector<double> rounded(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) rounded[i] = static_cast<double>(static_cast<float>(values[i]));
  return Tensor::from_vector<double>(shape, rounded).to(backend_.dtype).to(backend_.device);
}

Tensor InputMaker::uniform(const Shape& shape, double lo, double hi) { return place(shape, draw(shape.numel(), lo, hi)); }

Tensor InputMaker::distinct(const Shape& shape) {
  const std::int64_t n = shape.numel();
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = 2.0 * double(i) / double(n) - 1.0;
  std::shuffle(v.begin(), v.end(), std::mt19937_64(seed_ * 0x9E3779B97F4A7C15ull + draws_++));
  return place(shape, v);
}

Tensor InputMaker::values(const Shape& shape, const std::vector<double>& values) { return place(shape, values); }

Tensor InputMaker::uniform_view(const Shape& shape, std::int64_t lead, double lo, double hi) {
  const Shape bigger = shape.with(0, shape[0] + lead);
  return uniform(bigger, lo, hi).slice(0, lead, lead + shape[0]);
}

Tensor InputMaker::labels(std::int64_t batch, std::int64_t classes) {
  const auto u = draw(batch, 0.0, double(classes));
  std::vector<std::int64_t> labels(u.size());
  for (std::size_t i = 0; i < u.size(); ++i) labels[i] = std::min<std::int64_t>(classes - 1, std::int64_t(u[i]));
  return Tensor::from_vector<std::int64_t>({batch}, labels, backend_.device);
}

// ---------------------------------------------------------------- comparison

namespace {

// FNV-1a of the case name: a case keeps its seed when the table is reordered.
std::uint64_t seed_of(const std::string& name) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Runs the case on a stream of its own: a CPU stream with the backend's thread count, or a stream
// on the GPU, which is synchronised before the outputs are read back. (Without a StreamGuard an
// op on a GPU tensor runs on the thread's default stream of that device, while Tensor::to(cpu)
// copies on the current stream's, which does not wait for it.)
Outputs run_on(const Case& c, const Backend& backend) {
  InputMaker maker(seed_of(c.name), backend);
  std::unique_ptr<Stream> stream;
  std::optional<StreamGuard> guard;
  if (backend.kind == Backend::Kind::cpu && backend.cpu_threads > 0)
    stream = std::make_unique<Stream>(Device::cpu(), backend.cpu_threads);
  else if (backend.kind == Backend::Kind::cuda)
    stream = std::make_unique<Stream>(backend.device);
  if (stream) guard.emplace(*stream);
  const std::vector<Tensor> inputs = c.inputs(maker);
  Outputs outputs = c.run(inputs);
  if (stream) stream->synchronize();
  return outputs;
}

bool is_integer(DType t) { return !is_floating(t); }

std::vector<std::int64_t> as_integers(const Tensor& t) {
  if (t.dtype() == DType::i64) return t.to_vector<std::int64_t>();
  if (t.dtype() == DType::i32) {
    const auto v = t.to_vector<std::int32_t>();
    return {v.begin(), v.end()};
  }
  const auto v = t.to_vector<std::uint8_t>();
  return {v.begin(), v.end()};
}

OutputComparison compare_output(const Output& got, const Output& expected, const Backend& backend, double tolerance) {
  OutputComparison r;
  r.name = expected.name;
  std::ostringstream problem;
  if (got.name != expected.name) {
    problem << "output named " << got.name << ", the reference's is " << expected.name;
  } else if (!got.value.defined() || !expected.value.defined()) {
    problem << expected.name << ": undefined tensor";
  } else if (got.value.shape() != expected.value.shape()) {
    problem << expected.name << ": shape " << got.value.shape().str() << ", the reference's is "
            << expected.value.shape().str();
  } else if (got.value.device() != backend.device) {
    problem << expected.name << ": on " << got.value.device().str() << ", expected " << backend.device.str();
  } else if (is_integer(expected.value.dtype())) {
    if (got.value.dtype() != expected.value.dtype()) {
      problem << expected.name << ": " << name_of(got.value.dtype()) << ", the reference's is "
              << name_of(expected.value.dtype());
    } else {
      const auto a = as_integers(got.value), b = as_integers(expected.value);
      std::size_t differ = 0, first = a.size();
      for (std::size_t i = 0; i < a.size(); ++i)
        if (a[i] != b[i]) {
          if (differ++ == 0) first = i;
        }
      r.error = double(differ);
      if (differ > 0)
        problem << expected.name << ": " << differ << " of " << a.size() << " integers differ, the first at [" << first
                << "]: " << a[first] << " instead of " << b[first];
    }
  } else if (got.value.dtype() != backend.dtype) {
    problem << expected.name << ": " << name_of(got.value.dtype()) << ", the backend's dtype is " << name_of(backend.dtype);
  } else {
    r.error = ops::relative_error(got.value, expected.value);
    if (!(r.error <= tolerance))
      problem << expected.name << ": relative error " << r.error << " > tolerance " << tolerance;
  }
  r.problem = problem.str();
  r.ok = r.problem.empty();
  return r;
}

}  // namespace

bool CaseResult::ok() const {
  if (no_kernel || !error.empty() || outputs.empty()) return false;
  return std::all_of(outputs.begin(), outputs.end(), [](const OutputComparison& o) { return o.ok; });
}

CaseResult compare(const Case& c, const Backend& backend) {
  CaseResult r;
  Outputs expected, got;
  try {
    expected = run_on(c, reference_backend());
  } catch (const std::exception& e) {
    r.error = std::string("on the reference backend: ") + e.what();
    return r;
  }
  try {
    got = run_on(c, backend);
  } catch (const DeviceError& e) {
    const std::string what = e.what();
    if (backend.kind == Backend::Kind::cuda && what.find("no CUDA kernel yet") != std::string::npos)
      r.no_kernel = true;
    r.error = what;
    return r;
  } catch (const std::exception& e) {
    r.error = e.what();
    return r;
  }
  if (got.size() != expected.size()) {
    r.error = "returned " + std::to_string(got.size()) + " outputs, the reference " + std::to_string(expected.size());
    return r;
  }
  const double tolerance = c.tolerance.of(backend);
  for (std::size_t i = 0; i < got.size(); ++i) {
    try {
      r.outputs.push_back(compare_output(got[i], expected[i], backend, tolerance));
    } catch (const std::exception& e) {
      r.outputs.push_back({expected[i].name, 0, false, expected[i].name + ": " + e.what()});
    }
  }
  return r;
}

std::size_t check_backend(const Backend& backend, const std::vector<Case>& cases) {
  std::map<std::string, int> compared, skipped;
  std::map<std::string, double> worst_of_op;  // error / tolerance
  std::size_t total = 0;
  double worst = 0;
  std::string worst_where;
  for (const Case& c : cases) {
    const CaseResult r = compare(c, backend);
    if (r.no_kernel) {
      if (skipped[c.op]++ == 0) MESSAGE("no CUDA kernel yet for ", c.op, " (", r.error, "): its cases are skipped");
      continue;
    }
    INFO(backend.name(), ": ", c.name);
    if (!r.error.empty()) {
      FAIL_CHECK(c.name, ": ", r.error);
      continue;
    }
    const double tolerance = c.tolerance.of(backend);
    for (const OutputComparison& o : r.outputs) {
      CHECK_MESSAGE(o.ok, c.name << ": " << o.problem);
      const double ratio = tolerance > 0 ? o.error / tolerance : (o.error > 0 ? INFINITY : 0);
      worst_of_op[c.op] = std::max(worst_of_op[c.op], ratio);
      if (ratio > worst) {
        worst = ratio;
        std::ostringstream where;
        where << c.name << ", " << o.name << ": " << o.error << " against " << tolerance;
        worst_where = where.str();
      }
    }
    ++compared[c.op];
    ++total;
  }
  std::size_t skipped_total = 0;
  for (const auto& [op, n] : skipped) skipped_total += static_cast<std::size_t>(n);
  std::ostringstream summary;
  summary << backend.name() << ": " << total << " cases of " << compared.size() << " ops compared with ref";
  if (total > 0) summary << "; worst error / tolerance " << worst << (worst_where.empty() ? "" : " (" + worst_where + ")");
  summary << "; " << skipped_total << " cases of " << skipped.size() << " ops skipped (no kernel)";
  MESSAGE(summary.str());
  if (std::getenv("PETRA_BACKEND_OPS_LIST") != nullptr) {
    std::ostringstream table;
    table << "cases per op on " << backend.name() << " (worst error / tolerance):\n";
    for (const auto& [op, n] : compared) table << "  " << op << " " << n << " (" << worst_of_op[op] << ")\n";
    for (const auto& [op, n] : skipped) table << "  " << op << " " << n << " skipped\n";
    MESSAGE(table.str());
  }
  return total;
}

// ---------------------------------------------------------------- the table

namespace {

using Inputs = std::vector<Tensor>;

std::string str(std::int64_t v) { return std::to_string(v); }

// Tolerances against ref:: (relative error over all elements of an output). Copies and
// replications are exact; element-wise ops and the optimizer steps round once or a few times per
// element; reductions, GEMM-based ops and normalisations accumulate in float32.
constexpr double kExact = 0;
constexpr double kRounding = 1e-6;
constexpr double kAccumulated = 1e-5;

// ---- element-wise
void add_elementwise(std::vector<Case>& t) {
  struct Size {
    Shape shape;
    std::int64_t lead;  // > 0: every input is a batch slice at this many rows' offset
  };
  // n = 1, odd sizes, sizes that are no multiple of a vector (4, 8 or 16 floats), one above the
  // threading threshold, an empty tensor, and unaligned views.
  const std::vector<Size> sizes = {{{1}, 0},    {{2}, 0},    {{7}, 0},
                                   {{17}, 0},   {{3, 5, 7}, 0},
                                   {{1001}, 0}, {{kernels::kElementwiseParallelThreshold + 3}, 0},
                                   {{0}, 0},    {{33}, 1},   {{5, 7}, 1}};
  for (const Size& size : sizes) {
    const Shape shape = size.shape;
    const std::int64_t lead = size.lead;
    const std::string where = shape.str() + (lead > 0 ? " view at an offset of " + str(lead) + " row" : "");
    const auto in = [shape, lead](InputMaker& m, double lo = -1, double hi = 1) {
      return lead > 0 ? m.uniform_view(shape, lead, lo, hi) : m.uniform(shape, lo, hi);
    };
    const auto two = [in](InputMaker& m) { return Inputs{in(m), in(m)}; };
    const auto one = [in](InputMaker& m) { return Inputs{in(m)}; };
    // add_into and axpy_into accumulate: the destination starts in [2, 3).
    const auto into = [in](InputMaker& m) { return Inputs{in(m, 2, 3), in(m)}; };
    t.push_back({"add", "add " + where, two, [](const Inputs& x) { return Outputs{{"z", ops::add(x[0], x[1])}}; }, kRounding});
    t.push_back({"sub", "sub " + where, two, [](const Inputs& x) { return Outputs{{"z", ops::sub(x[0], x[1])}}; }, kRounding});
    t.push_back({"mul", "mul " + where, two, [](const Inputs& x) { return Outputs{{"z", ops::mul(x[0], x[1])}}; }, kRounding});
    t.push_back({"scale", "scale -0.3 " + where, one,
                 [](const Inputs& x) { return Outputs{{"y", ops::scale(x[0], -0.3)}}; }, kRounding});
    t.push_back({"add_into", "add_into " + where, into, [](const Inputs& x) {
                   ops::add_into(x[0], x[1]);
                   return Outputs{{"dst", x[0]}};
                 }, kRounding});
    t.push_back({"axpy_into", "axpy_into -1.7 " + where, into, [](const Inputs& x) {
                   ops::axpy_into(x[0], -1.7, x[1]);
                   return Outputs{{"dst", x[0]}};
                 }, kRounding});
    t.push_back({"relu", "relu " + where, one, [](const Inputs& x) { return Outputs{{"y", ops::relu(x[0])}}; }, kExact});
    // y in [-1, 1): the mask y > 0 takes both branches.
    t.push_back({"relu_backward", "relu_backward " + where, two,
                 [](const Inputs& x) { return Outputs{{"dx", ops::relu_backward(x[0], x[1])}}; }, kExact});
  }
}

// ---- reductions
void add_reductions(std::vector<Case>& t) {
  struct Reduction {
    Shape shape;
    std::vector<int> dims;
  };
  const std::vector<Reduction> reductions = {
      {{7}, {0}},          {{3, 5}, {0}},    {{3, 5}, {1}},       {{3, 5}, {0, 1}},
      {{3, 5}, {}},        {{1, 4, 1}, {0, 2}}, {{2, 3, 4, 5}, {0, 2, 3}}, {{2, 3, 4, 5}, {-1}},
      {{3, 1, 2, 5, 1, 3}, {0, 2, 4}}, {{2, 3, 2, 3, 2, 3}, {1, 3, 5}}, {{64, 17, 9, 9}, {0, 2, 3}},
      {{300, 1031}, {0}},  {{7, 30001}, {1}}, {{0, 3}, {1}}};
  for (const Reduction& r : reductions) {
    const Shape shape = r.shape;
    const std::vector<int> dims = r.dims;
    std::string d = "{";
    for (std::size_t i = 0; i < dims.size(); ++i) d += (i ? ", " : "") + std::to_string(dims[i]);
    d += "}";
    const auto in = [shape](InputMaker& m) { return Inputs{m.uniform(shape)}; };
    t.push_back({"sum", "sum " + shape.str() + " over " + d, in,
                 [dims](const Inputs& x) { return Outputs{{"y", ops::sum(x[0], dims)}}; }, kRounding});
    t.push_back({"mean", "mean " + shape.str() + " over " + d, in,
                 [dims](const Inputs& x) { return Outputs{{"y", ops::mean(x[0], dims)}}; }, kRounding});
  }
  struct Broadcast {
    Shape small, big;
  };
  const std::vector<Broadcast> broadcasts = {{{1, 3, 1, 1}, {4, 3, 5, 5}}, {{1}, {17}},        {{2, 1}, {2, 1001}},
                                             {{1, 1, 1}, {3, 1, 7}},       {{5, 1}, {5, 1}},   {{1, 4}, {0, 4}}};
  for (const Broadcast& b : broadcasts) {
    const Shape small = b.small, big = b.big;
    t.push_back({"broadcast_to", "broadcast_to " + small.str() + " -> " + big.str(),
                 [small](InputMaker& m) { return Inputs{m.uniform(small)}; },
                 [big](const Inputs& x) { return Outputs{{"y", ops::broadcast_to(x[0], big)}}; }, kExact});
    t.push_back({"sum_to", "sum_to " + big.str() + " -> " + small.str(),
                 [big](InputMaker& m) { return Inputs{m.uniform(big)}; },
                 [small](const Inputs& x) { return Outputs{{"y", ops::sum_to(x[0], small)}}; }, kRounding});
  }
  // NumPy broadcasting in the binary element-wise ops (shapes aligned on the right).
  const std::vector<std::pair<Shape, Shape>> pairs = {{{2, 3}, {3}}, {{2, 1, 4}, {3, 1}}, {{1}, {5, 7}},
                                                      {{4, 3, 5, 5}, {1, 3, 1, 1}}, {{0, 4}, {1, 4}}};
  for (const auto& [a, b] : pairs) {
    const auto two = [a, b](InputMaker& m) { return Inputs{m.uniform(a), m.uniform(b)}; };
    const std::string where = a.str() + " with " + b.str() + " (broadcast)";
    t.push_back({"add", "add " + where, two, [](const Inputs& x) { return Outputs{{"z", ops::add(x[0], x[1])}}; }, kRounding});
    t.push_back({"sub", "sub " + where, two, [](const Inputs& x) { return Outputs{{"z", ops::sub(x[0], x[1])}}; }, kRounding});
    t.push_back({"mul", "mul " + where, two, [](const Inputs& x) { return Outputs{{"z", ops::mul(x[0], x[1])}}; }, kRounding});
  }
}

// ---- linear
void add_linear(std::vector<Case>& t) {
  struct Dims {
    std::int64_t batch, in, out;
  };
  const std::vector<Dims> shapes = {{1, 1, 1},     {1, 7, 3},  {5, 13, 17},   {33, 257, 65},
                                    {2, 512, 1},   {61, 200, 130}, {0, 5, 3}};
  for (const Dims& s : shapes) {
    const Shape x{s.batch, s.in}, w{s.out, s.in}, b{s.out}, y{s.batch, s.out};
    const std::string where = "x" + x.str() + " w" + w.str();
    t.push_back({"linear_forward", "linear_forward " + where + " with bias",
                 [=](InputMaker& m) { return Inputs{m.uniform(x), m.uniform(w), m.uniform(b)}; },
                 [](const Inputs& v) { return Outputs{{"y", ops::linear_forward(v[0], v[1], v[2])}}; }, kAccumulated});
    t.push_back({"linear_forward", "linear_forward " + where + " without bias",
                 [=](InputMaker& m) { return Inputs{m.uniform(x), m.uniform(w)}; },
                 [](const Inputs& v) { return Outputs{{"y", ops::linear_forward(v[0], v[1], Tensor())}}; },
                 kAccumulated});
    t.push_back({"linear_backward_data", "linear_backward_data " + where,
                 [=](InputMaker& m) { return Inputs{m.uniform(y), m.uniform(w)}; },
                 [](const Inputs& v) { return Outputs{{"dx", ops::linear_backward_data(v[0], v[1])}}; }, kAccumulated});
    // dw and db accumulate: they start non-zero.
    t.push_back({"linear_backward_weight", "linear_backward_weight " + where,
                 [=](InputMaker& m) { return Inputs{m.uniform(x), m.uniform(y), m.uniform(w)}; },
                 [](const Inputs& v) {
                   ops::linear_backward_weight(v[0], v[1], v[2]);
                   return Outputs{{"dw", v[2]}};
                 },
                 kAccumulated});
    t.push_back({"linear_backward_bias", "linear_backward_bias " + where,
                 [=](InputMaker& m) { return Inputs{m.uniform(y), m.uniform(b)}; },
                 [](const Inputs& v) {
                   ops::linear_backward_bias(v[0], v[1]);
                   return Outputs{{"db", v[1]}};
                 },
                 kAccumulated});
  }
}

// ---- conv2d
void add_conv2d(std::vector<Case>& t) {
  struct Conv {
    std::int64_t batch, in_channels, height, width, out_channels, kernel, stride, padding;
  };
  // Kernels 1, 3 and 7; strides 1 and 2; padding 0 and 1; odd and even spatial sizes; a 1x1
  // output; batch 1 and many small images; in_channels >= 16 and an out_channels of 17; all ones;
  // an empty batch.
  const std::vector<Conv> convs = {
      {1, 3, 7, 9, 5, 3, 1, 1},   {2, 4, 11, 8, 6, 1, 1, 0},  {1, 3, 6, 7, 2, 1, 2, 0},   {1, 3, 5, 5, 2, 1, 2, 1},
      {2, 5, 10, 10, 4, 3, 2, 1}, {3, 2, 9, 7, 4, 3, 2, 0},   {1, 2, 9, 11, 3, 7, 2, 0},  {2, 2, 13, 9, 4, 7, 1, 1},
      {2, 3, 7, 7, 3, 7, 1, 0},   {37, 3, 4, 4, 4, 3, 1, 1},  {3, 16, 7, 9, 5, 3, 1, 1},  {2, 16, 15, 15, 17, 3, 2, 1},
      {1, 1, 1, 1, 1, 1, 1, 0},   {0, 3, 5, 5, 4, 3, 1, 1}};
  for (const Conv& c : convs) {
    const Conv2dOptions o{c.stride, c.padding};
    const Shape x{c.batch, c.in_channels, c.height, c.width}, w{c.out_channels, c.in_channels, c.kernel, c.kernel},
        b{c.out_channels};
    const std::int64_t out_h = (c.height + 2 * c.padding - c.kernel) / c.stride + 1,
                       out_w = (c.width + 2 * c.padding - c.kernel) / c.stride + 1;
    const Shape y{c.batch, c.out_channels, out_h, out_w};
    const std::string where = "x" + x.str() + " w" + w.str() + " stride " + str(c.stride) + " padding " + str(c.padding);
    t.push_back({"conv2d_forward", "conv2d_forward " + where + " with bias",
                 [=](InputMaker& m) { return Inputs{m.uniform(x), m.uniform(w), m.uniform(b)}; },
                 [o](const Inputs& v) { return Outputs{{"y", ops::conv2d_forward(v[0], v[1], v[2], o)}}; },
                 kAccumulated});
    t.push_back({"conv2d_forward", "conv2d_forward " + where + " without bias",
                 [=](InputMaker& m) { return Inputs{m.uniform(x), m.uniform(w)}; },
                 [o](const Inputs& v) { return Outputs{{"y", ops::conv2d_forward(v[0], v[1], Tensor(), o)}}; },
                 kAccumulated});
    t.push_back({"conv2d_backward_data", "conv2d_backward_data " + where,
                 [=](InputMaker& m) { return Inputs{m.uniform(y), m.uniform(w)}; },
                 [o, x](const Inputs& v) { return Outputs{{"dx", ops::conv2d_backward_data(v[0], v[1], x, o)}}; },
                 kAccumulated});
    // dw and db accumulate: they start non-zero.
    t.push_back({"conv2d_backward_weight", "conv2d_backward_weight " + where,
                 [=](InputMaker& m) { return Inputs{m.uniform(x), m.uniform(y), m.uniform(w)}; },
                 [o](const Inputs& v) {
                   ops::conv2d_backward_weight(v[0], v[1], v[2], o);
                   return Outputs{{"dw", v[2]}};
                 },
                 kAccumulated});
    t.push_back({"conv2d_backward_bias", "conv2d_backward_bias " + where,
                 [=](InputMaker& m) { return Inputs{m.uniform(y), m.uniform(b)}; },
                 [](const Inputs& v) {
                   ops::conv2d_backward_bias(v[0], v[1]);
                   return Outputs{{"db", v[1]}};
                 },
                 kAccumulated});
  }
  // x as a channel slice (channels [1, 1 + in_channels) of a wider tensor): read in place on the
  // CPU (Conv2dShape::in_image_stride), packed first on a GPU.
  for (const Conv& c : {Conv{3, 16, 7, 9, 5, 3, 1, 1}, Conv{2, 16, 15, 15, 17, 3, 2, 1}, Conv{2, 4, 11, 8, 6, 1, 1, 0}}) {
    const Conv2dOptions o{c.stride, c.padding};
    const Shape wide{c.batch, c.in_channels + 3, c.height, c.width}, w{c.out_channels, c.in_channels, c.kernel, c.kernel};
    const std::int64_t out_h = (c.height + 2 * c.padding - c.kernel) / c.stride + 1,
                       out_w = (c.width + 2 * c.padding - c.kernel) / c.stride + 1;
    const Shape y{c.batch, c.out_channels, out_h, out_w};
    const std::int64_t channels = c.in_channels;
    const std::string where = "x channels [1, " + str(1 + channels) + ") of " + wide.str() + " w" + w.str() +
                              " stride " + str(c.stride) + " padding " + str(c.padding);
    t.push_back({"conv2d_forward", "conv2d_forward " + where,
                 [=](InputMaker& m) { return Inputs{m.uniform(wide), m.uniform(w)}; },
                 [o, channels](const Inputs& v) {
                   return Outputs{{"y", ops::conv2d_forward(v[0].slice(1, 1, 1 + channels), v[1], Tensor(), o)}};
                 },
                 kAccumulated});
    t.push_back({"conv2d_backward_weight", "conv2d_backward_weight " + where,
                 [=](InputMaker& m) { return Inputs{m.uniform(wide), m.uniform(y), m.uniform(w)}; },
                 [o, channels](const Inputs& v) {
                   ops::conv2d_backward_weight(v[0].slice(1, 1, 1 + channels), v[1], v[2], o);
                   return Outputs{{"dw", v[2]}};
                 },
                 kAccumulated});
  }
}

// ---- batch norm
void add_batchnorm(std::vector<Case>& t) {
  struct Bn {
    Shape x;
    double offset;  // x in [offset - 1, offset + 1): |mean| >> std defeats a naive sum of squares
  };
  // Odd sizes, batch 1, one pixel, 17 channels, shapes big enough for the threaded path, an
  // offset input. Not 2 values per channel: there y is +-1 whatever x is and dx is noise.
  const std::vector<Bn> shapes = {{{1, 3, 5, 7}, 0},     {{7, 5, 1, 1}, 0},   {{3, 8, 4, 4}, 0},   {{2, 17, 3, 5}, 0},
                                  {{8, 32, 16, 16}, 0},  {{5, 3, 33, 31}, 0}, {{3, 8, 4, 4}, 1000}};
  for (const Bn& bn : shapes) {
    const Shape x = bn.x, c{bn.x[1]};
    const double offset = bn.offset;
    const std::string where = "x" + x.str() + (offset != 0 ? " around " + std::to_string(int(offset)) : "");
    // x, gamma, beta, running_mean, running_var
    const auto in = [=](InputMaker& m) {
      return Inputs{m.uniform(x, offset - 1, offset + 1), m.uniform(c, 0.5, 1.5), m.uniform(c), m.uniform(c),
                    m.uniform(c, 0.5, 2)};
    };
    t.push_back({"batchnorm_forward", "batchnorm_forward training " + where, in, [](const Inputs& v) {
                   ops::BatchNormSaved saved;
                   const Tensor y = ops::batchnorm_forward(v[0], v[1], v[2], v[3], v[4], {true, 0.1, 1e-5}, &saved);
                   return Outputs{{"y", y}, {"mean", saved.mean}, {"invstd", saved.invstd}, {"running_mean", v[3]},
                                  {"running_var", v[4]}};
                 },
                 kAccumulated});
    t.push_back({"batchnorm_forward", "batchnorm_forward training without running statistics " + where, in,
                 [](const Inputs& v) {
                   ops::BatchNormSaved saved;
                   const Tensor y = ops::batchnorm_forward(v[0], v[1], v[2], Tensor(), Tensor(), {true, 0.1, 1e-5}, &saved);
                   return Outputs{{"y", y}, {"mean", saved.mean}, {"invstd", saved.invstd}};
                 },
                 kAccumulated});
    t.push_back({"batchnorm_forward", "batchnorm_forward eval " + where, in, [](const Inputs& v) {
                   return Outputs{{"y", ops::batchnorm_forward(v[0], v[1], v[2], v[3], v[4], {false, 0.1, 1e-5}, nullptr)}};
                 },
                 kAccumulated});
    // The backward of a training forward; dgamma and dbeta accumulate: they start non-zero. Around
    // 1000, x holds only ~17 bits below its mean: float32 xhat, hence dgamma, is good to ~1e-4
    // (the tolerance of tests/cpu/test_batchnorm.cpp's offset backward).
    t.push_back({"batchnorm_backward", "batchnorm_backward " + where,
                 [=](InputMaker& m) {
                   return Inputs{m.uniform(x, offset - 1, offset + 1), m.uniform(c, 0.5, 1.5), m.uniform(c), m.uniform(x),
                                 m.uniform(c), m.uniform(c)};
                 },
                 [](const Inputs& v) {
                   ops::BatchNormSaved saved;
                   ops::batchnorm_forward(v[0], v[1], v[2], Tensor(), Tensor(), {true, 0.1, 1e-5}, &saved);
                   const Tensor dx = ops::batchnorm_backward(v[0], v[3], v[1], saved, v[4], v[5]);
                   return Outputs{{"dx", dx}, {"dgamma", v[4]}, {"dbeta", v[5]}};
                 },
                 offset != 0 ? 1e-4 : kAccumulated});
    // The fused batch norm + ReLU (ops::batchnorm_relu_*): the same cases; beta around 0 puts about
    // half of the outputs under the ReLU, so both sides of the mask are compared.
    t.push_back({"batchnorm_relu_forward", "batchnorm_relu_forward training " + where, in, [](const Inputs& v) {
                   ops::BatchNormSaved saved;
                   const Tensor y =
                       ops::batchnorm_relu_forward(v[0], v[1], v[2], v[3], v[4], {true, 0.1, 1e-5}, &saved);
                   return Outputs{{"y", y}, {"mean", saved.mean}, {"invstd", saved.invstd}, {"running_mean", v[3]},
                                  {"running_var", v[4]}};
                 },
                 kAccumulated});
    t.push_back({"batchnorm_relu_forward", "batchnorm_relu_forward eval " + where, in, [](const Inputs& v) {
                   return Outputs{
                       {"y", ops::batchnorm_relu_forward(v[0], v[1], v[2], v[3], v[4], {false, 0.1, 1e-5}, nullptr)}};
                 },
                 kAccumulated});
    t.push_back({"batchnorm_relu_backward", "batchnorm_relu_backward " + where,
                 [=](InputMaker& m) {
                   return Inputs{m.uniform(x, offset - 1, offset + 1), m.uniform(c, 0.5, 1.5), m.uniform(c), m.uniform(x),
                                 m.uniform(c), m.uniform(c)};
                 },
                 [](const Inputs& v) {
                   ops::BatchNormSaved saved;
                   const Tensor y =
                       ops::batchnorm_relu_forward(v[0], v[1], v[2], Tensor(), Tensor(), {true, 0.1, 1e-5}, &saved);
                   const Tensor dx = ops::batchnorm_relu_backward(v[0], y, v[3], v[1], saved, v[4], v[5]);
                   return Outputs{{"dx", dx}, {"dgamma", v[4]}, {"dbeta", v[5]}};
                 },
                 offset != 0 ? 1e-4 : kAccumulated});
    // The coupling fused with batch norm + ReLU (ops::batchnorm_relu_coupling_*): z as x above, then
    // the coupling's 2C-channel input a.
    const Shape two_streams = x.with(1, 2 * x[1]);
    const auto coupled = [=](InputMaker& m) {
      Inputs v = in(m);
      v.push_back(m.uniform(two_streams));
      return v;
    };
    for (const bool training : {true, false}) {
      const std::string mode = training ? " training " : " eval ";
      t.push_back({"batchnorm_relu_coupling_forward", "batchnorm_relu_coupling_forward" + mode + where, coupled,
                   [training](const Inputs& v) {
                     const Tensor y = ops::batchnorm_relu_coupling_forward(v[5], v[0], v[1], v[2], v[3], v[4],
                                                                           {training, 0.1, 1e-5});
                     return Outputs{{"y", y}, {"running_mean", v[3]}, {"running_var", v[4]}};
                   },
                   kAccumulated});
      t.push_back({"batchnorm_relu_coupling_inverse", "batchnorm_relu_coupling_inverse" + mode + where, coupled,
                   [training](const Inputs& v) {
                     const Tensor x = ops::batchnorm_relu_coupling_inverse(v[5], v[0], v[1], v[2], v[3], v[4],
                                                                           {training, 0.1, 1e-5});
                     return Outputs{{"x", x}, {"running_mean", v[3]}, {"running_var", v[4]}};
                   },
                   kAccumulated});
    }
  }
  // Evaluation mode normalises each value alone: an empty batch is fine.
  const Shape empty{0, 3, 2, 2}, c3{3};
  t.push_back({"batchnorm_forward", "batchnorm_forward eval x" + empty.str(),
               [=](InputMaker& m) {
                 return Inputs{m.uniform(empty), m.uniform(c3, 0.5, 1.5), m.uniform(c3), m.uniform(c3), m.uniform(c3, 0.5, 2)};
               },
               [](const Inputs& v) {
                 return Outputs{{"y", ops::batchnorm_forward(v[0], v[1], v[2], v[3], v[4], {false, 0.1, 1e-5}, nullptr)}};
               },
               kAccumulated});
}

// ---- pooling
void add_pooling(std::vector<Case>& t) {
  struct Pool {
    Shape x;
    Pool2dOptions o;
  };
  // Odd sizes, batch 1, overlapping and non-overlapping windows, padding up to kernel / 2, a
  // window as large as the padded image, one pixel, a threaded size, an empty batch.
  const std::vector<Pool> pools = {{{1, 3, 7, 5}, {3, 2, 1}},  {{2, 4, 8, 8}, {2, 2, 0}},   {{3, 5, 9, 11}, {3, 1, 1}},
                                   {{1, 1, 5, 5}, {5, 1, 2}},  {{2, 3, 6, 7}, {4, 3, 2}},   {{4, 16, 32, 32}, {3, 2, 1}},
                                   {{1, 2, 1, 1}, {1, 1, 0}},  {{0, 2, 4, 4}, {2, 2, 0}}};
  for (const Pool& p : pools) {
    const Shape x = p.x;
    const Pool2dOptions o = p.o;
    const std::int64_t out_h = (x[2] + 2 * o.padding - o.kernel) / o.stride + 1,
                       out_w = (x[3] + 2 * o.padding - o.kernel) / o.stride + 1;
    const Shape y{x[0], x[1], out_h, out_w};
    const std::string where =
        "x" + x.str() + " kernel " + str(o.kernel) + " stride " + str(o.stride) + " padding " + str(o.padding);
    // Distinct values: no ties, so every backend picks the same maximum.
    t.push_back({"max_pool2d_forward", "max_pool2d_forward " + where, [x](InputMaker& m) { return Inputs{m.distinct(x)}; },
                 [o](const Inputs& v) {
                   Tensor argmax;
                   const Tensor y = ops::max_pool2d_forward(v[0], o, &argmax);
                   return Outputs{{"y", y}, {"argmax", argmax}};
                 },
                 kExact});
    t.push_back({"max_pool2d_forward", "max_pool2d_forward " + where + " without indices",
                 [x](InputMaker& m) { return Inputs{m.distinct(x)}; },
                 [o](const Inputs& v) { return Outputs{{"y", ops::max_pool2d_forward(v[0], o, nullptr)}}; }, kExact});
    t.push_back({"max_pool2d_backward", "max_pool2d_backward " + where,
                 [x, y](InputMaker& m) { return Inputs{m.distinct(x), m.uniform(y)}; },
                 [o, x](const Inputs& v) {
                   Tensor argmax;
                   ops::max_pool2d_forward(v[0], o, &argmax);
                   return Outputs{{"dx", ops::max_pool2d_backward(v[1], argmax, x, o)}};
                 },
                 kRounding});
    t.push_back({"avg_pool2d_forward", "avg_pool2d_forward " + where, [x](InputMaker& m) { return Inputs{m.uniform(x)}; },
                 [o](const Inputs& v) { return Outputs{{"y", ops::avg_pool2d_forward(v[0], o)}}; }, kRounding});
    t.push_back({"avg_pool2d_backward", "avg_pool2d_backward " + where, [y](InputMaker& m) { return Inputs{m.uniform(y)}; },
                 [o, x](const Inputs& v) { return Outputs{{"dx", ops::avg_pool2d_backward(v[0], x, o)}}; }, kRounding});
  }
  for (const Shape x : {Shape{1, 1, 1, 1}, Shape{2, 3, 5, 7}, Shape{4, 64, 8, 8}, Shape{3, 17, 1, 1}, Shape{0, 3, 2, 2}}) {
    const Shape y{x[0], x[1]};
    t.push_back({"global_avg_pool_forward", "global_avg_pool_forward x" + x.str(),
                 [x](InputMaker& m) { return Inputs{m.uniform(x)}; },
                 [](const Inputs& v) { return Outputs{{"y", ops::global_avg_pool_forward(v[0])}}; }, kRounding});
    t.push_back({"global_avg_pool_backward", "global_avg_pool_backward x" + x.str(),
                 [y](InputMaker& m) { return Inputs{m.uniform(y)}; },
                 [x](const Inputs& v) { return Outputs{{"dx", ops::global_avg_pool_backward(v[0], x)}}; }, kRounding});
  }
}

// ---- channels
void add_channels(std::vector<Case>& t) {
  struct Slice {
    Shape x;
    std::int64_t first, count;
  };
  // Ranks 2, 3, 4 and 5; whole, one-channel and empty ranges; a threaded size; an empty batch.
  const std::vector<Slice> slices = {{{1, 3, 5, 7}, 1, 2},     {{2, 1, 1, 1}, 0, 1},  {{3, 6, 4, 4}, 3, 3},
                                     {{5, 7, 3, 9}, 2, 4},     {{4, 64, 16, 16}, 32, 32}, {{3, 6, 4, 4}, 0, 6},
                                     {{5, 9}, 2, 5},           {{2, 6, 5}, 0, 0},     {{2, 4, 3, 2, 3}, 1, 2},
                                     {{0, 6, 2, 2}, 1, 3}};
  for (const Slice& s : slices) {
    const Shape x = s.x;
    const std::int64_t first = s.first, count = s.count;
    t.push_back({"channel_slice", "channel_slice x" + x.str() + " channels [" + str(first) + ", " + str(first + count) + ")",
                 [x](InputMaker& m) { return Inputs{m.uniform(x)}; },
                 [first, count](const Inputs& v) { return Outputs{{"part", ops::channel_slice(v[0], first, count)}}; },
                 kExact});
  }
  // Accumulate: the part added into a range of a full tensor, the other channels untouched.
  for (const Slice& s : slices) {
    const Shape x = s.x;
    const std::int64_t first = s.first, count = s.count;
    t.push_back({"channel_accumulate_into",
                 "channel_accumulate_into x" + x.str() + " channels [" + str(first) + ", " + str(first + count) + ")",
                 [x, count](InputMaker& m) { return Inputs{m.uniform(x), m.uniform(x.with(1, count))}; },
                 [first](const Inputs& v) {
                   ops::channel_accumulate_into(v[0], v[1], first);
                   return Outputs{{"full", v[0]}};
                 },
                 kRounding});
    t.push_back({"channel_copy_into",
                 "channel_copy_into x" + x.str() + " channels [" + str(first) + ", " + str(first + count) + ")",
                 [x, count](InputMaker& m) { return Inputs{m.uniform(x), m.uniform(x.with(1, count))}; },
                 [first](const Inputs& v) {
                   ops::channel_copy_into(v[0], v[1], first);
                   return Outputs{{"full", v[0]}};
                 },
                 kExact});
  }
  const std::vector<std::vector<Shape>> concats = {{{2, 1, 3, 5}, {2, 3, 3, 5}, {2, 2, 3, 5}},
                                                   {{1, 5, 1, 1}},
                                                   {{3, 4}, {3, 1}},
                                                   {{4, 32, 8, 8}, {4, 32, 8, 8}},
                                                   {{2, 0, 3, 3}, {2, 4, 3, 3}},
                                                   {{0, 2, 2, 2}, {0, 3, 2, 2}}};
  for (const auto& parts : concats) {
    std::string where;
    for (const Shape& p : parts) where += (where.empty() ? "" : " + ") + p.str();
    t.push_back({"channel_concat", "channel_concat " + where,
                 [parts](InputMaker& m) {
                   Inputs v;
                   for (const Shape& p : parts) v.push_back(m.uniform(p));
                   return v;
                 },
                 [](const Inputs& v) { return Outputs{{"full", ops::channel_concat(v)}}; }, kExact});
  }
}

// ---- loss
void add_loss(std::vector<Case>& t) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{1, 1},    {1, 10},    {7, 3},
                                                                     {128, 10}, {33, 1000}, {129, 1001}};
  for (const auto& [batch_, classes_] : shapes) {
    const std::int64_t batch = batch_, classes = classes_;
    const Shape logits{batch, classes};
    const std::string where = "logits" + logits.str();
    const auto in = [=](InputMaker& m) { return Inputs{m.uniform(logits, -8, 8), m.labels(batch, classes)}; };
    t.push_back({"cross_entropy_forward", "cross_entropy_forward " + where, in, [](const Inputs& v) {
                   ops::CrossEntropySaved saved;
                   const Tensor loss = ops::cross_entropy_forward(v[0], v[1], &saved);
                   return Outputs{{"loss", loss}, {"probs", saved.probs}};
                 },
                 kRounding});
    t.push_back({"cross_entropy_backward", "cross_entropy_backward " + where + " dloss 0.75",
                 [=](InputMaker& m) { return Inputs{m.uniform(logits, -8, 8), m.labels(batch, classes), m.values({1}, {0.75})}; },
                 [](const Inputs& v) {
                   ops::CrossEntropySaved saved;
                   ops::cross_entropy_forward(v[0], v[1], &saved);
                   return Outputs{{"dlogits", ops::cross_entropy_backward(saved, v[1], v[2])}};
                 },
                 kRounding});
    t.push_back({"argmax", "argmax " + where, in,
                 [](const Inputs& v) { return Outputs{{"predicted", ops::argmax(v[0])}}; }, kExact});
    // The deferred label check: the forward leaves first_bad on the device (-1 here), check_labels
    // reads it and passes. (Bad labels: test_ops.cpp and test_emulated_device_ops.cpp.)
    t.push_back({"check_labels", "check_labels " + where, in, [](const Inputs& v) {
                   ops::CrossEntropySaved saved;
                   ops::cross_entropy_forward(v[0], v[1], &saved, ops::LabelCheck::deferred);
                   ops::check_labels(saved.first_bad, v[1], v[0].size(1));
                   return Outputs{{"first_bad", saved.first_bad}};
                 },
                 kExact});
    t.push_back({"correct_predictions", "correct_predictions " + where, in,
                 [](const Inputs& v) { return Outputs{{"correct", ops::correct_predictions(v[0], v[1])}}; }, kExact});
    t.push_back({"count_correct", "count_correct " + where, in, [](const Inputs& v) {
                   const std::int64_t correct = ops::count_correct(v[0], v[1]);
                   return Outputs{{"correct", Tensor::from_vector<std::int64_t>({1}, {correct}, v[0].device())}};
                 },
                 kExact});
  }
  const Shape empty{0, 5};
  t.push_back({"argmax", "argmax logits" + empty.str(), [empty](InputMaker& m) { return Inputs{m.uniform(empty)}; },
               [](const Inputs& v) { return Outputs{{"predicted", ops::argmax(v[0])}}; }, kExact});
}

// ---- optimizer steps
void add_optimizers(std::vector<Case>& t) {
  struct Sgd {
    const char* what;
    SgdOptions o;
    bool first_step;
  };
  const std::vector<Sgd> sgds = {
      {"plain, weight decay", {0.1, 0, 0, 0.01, false, 0}, true},
      {"momentum and dampening, first step", {0.05, 0.9, 0.1, 1e-4, false, 0}, true},
      {"momentum and dampening", {0.05, 0.9, 0.1, 1e-4, false, 0}, false},
      {"Nesterov", {0.05, 0.9, 0, 5e-4, true, 0}, false},
      {"delay compensation 2.5", {0.05, 0.9, 0, 0, false, 2.5}, false},
      {"Nesterov, delay compensation 3", {0.05, 0.9, 0, 5e-4, true, 3.0}, false}};
  // A single element, odd sizes, one above the threading threshold.
  for (const std::int64_t n : {std::int64_t(1), std::int64_t(17), std::int64_t(1001),
                               kernels::kElementwiseParallelThreshold + 3}) {
    const Shape p{n};
    for (const Sgd& s : sgds) {
      const SgdOptions o = s.o;
      const bool first = s.first_step;
      if (o.momentum == 0) {
        t.push_back({"sgd_step", "sgd_step " + std::string(s.what) + " " + p.str(),
                     [p](InputMaker& m) { return Inputs{m.uniform(p), m.uniform(p)}; },
                     [o, first](const Inputs& v) {
                       ops::sgd_step(v[0], v[1], Tensor(), o, first);
                       return Outputs{{"param", v[0]}};
                     },
                     kRounding});
      } else {
        // The momentum buffer starts non-zero (a first step overwrites it).
        t.push_back({"sgd_step", "sgd_step " + std::string(s.what) + " " + p.str(),
                     [p](InputMaker& m) { return Inputs{m.uniform(p), m.uniform(p), m.uniform(p)}; },
                     [o, first](const Inputs& v) {
                       ops::sgd_step(v[0], v[1], v[2], o, first);
                       return Outputs{{"param", v[0]}, {"momentum_buffer", v[2]}};
                     },
                     kRounding});
      }
    }
    const AdamOptions adam{1e-3, 0.9, 0.999, 1e-8, 1e-2};
    t.push_back({"adam_step", "adam_step first step " + p.str(),
                 [p](InputMaker& m) { return Inputs{m.uniform(p), m.uniform(p), m.values(p, std::vector<double>(p.numel(), 0.0)),
                                                    m.values(p, std::vector<double>(p.numel(), 0.0))}; },
                 [adam](const Inputs& v) {
                   ops::adam_step(v[0], v[1], v[2], v[3], adam, 1);
                   return Outputs{{"param", v[0]}, {"exp_avg", v[2]}, {"exp_avg_sq", v[3]}};
                 },
                 kRounding});
    t.push_back({"adam_step", "adam_step step 7 " + p.str(),
                 [p](InputMaker& m) { return Inputs{m.uniform(p), m.uniform(p), m.uniform(p, -0.1, 0.1), m.uniform(p, 0, 0.01)}; },
                 [adam](const Inputs& v) {
                   ops::adam_step(v[0], v[1], v[2], v[3], adam, 7);
                   return Outputs{{"param", v[0]}, {"exp_avg", v[2]}, {"exp_avg_sq", v[3]}};
                 },
                 kRounding});
    const LarsOptions lars{0.1, 0.9, 5e-4, 0.001};
    t.push_back({"lars_step", "lars_step " + p.str(),
                 [p](InputMaker& m) { return Inputs{m.uniform(p), m.uniform(p), m.uniform(p, -0.01, 0.01)}; },
                 [lars](const Inputs& v) {
                   ops::lars_step(v[0], v[1], v[2], lars);
                   return Outputs{{"param", v[0]}, {"momentum_buffer", v[2]}};
                 },
                 kRounding});
  }
}

// ---- coupling
void add_coupling(std::vector<Case>& t) {
  struct Coupling {
    Shape x;            // 2C channels
    std::int64_t lead;  // > 0: the inputs are batch slices at this many samples' offset
  };
  const std::vector<Coupling> shapes = {{{1, 6, 5, 7}, 0},    {{2, 2, 1, 1}, 0},  {{3, 10, 4, 4}, 0}, {{5, 14, 3, 9}, 0},
                                        {{4, 32, 16, 16}, 0}, {{1, 128, 32, 32}, 0}, {{0, 4, 3, 3}, 0}, {{3, 10, 3, 3}, 1}};
  for (const Coupling& c : shapes) {
    const Shape x = c.x, f = c.x.with(1, c.x[1] / 2);
    const std::int64_t lead = c.lead;
    const std::string where = "x" + x.str() + (lead > 0 ? " views at an offset of " + str(lead) + " sample" : "");
    const auto in = [x, f, lead](InputMaker& m) {
      return lead > 0 ? Inputs{m.uniform_view(x, lead), m.uniform_view(f, lead)} : Inputs{m.uniform(x), m.uniform(f)};
    };
    t.push_back({"coupling_forward", "coupling_forward " + where, in,
                 [](const Inputs& v) { return Outputs{{"y", ops::coupling_forward(v[0], v[1])}}; }, kRounding});
    t.push_back({"coupling_inverse", "coupling_inverse " + where, in,
                 [](const Inputs& v) { return Outputs{{"x", ops::coupling_inverse(v[0], v[1])}}; }, kRounding});
    t.push_back({"coupling_backward", "coupling_backward " + where, in,
                 [](const Inputs& v) { return Outputs{{"dx", ops::coupling_backward(v[0], v[1])}}; }, kRounding});
    t.push_back({"swap_streams", "swap_streams " + where, in,
                 [](const Inputs& v) { return Outputs{{"dx", ops::swap_streams(v[0])}}; }, kRounding});
  }
}

}  // namespace

const std::vector<Case>& registry() {
  static const std::vector<Case> table = [] {
    std::vector<Case> t;
    add_elementwise(t);
    add_reductions(t);
    add_linear(t);
    add_conv2d(t);
    add_batchnorm(t);
    add_pooling(t);
    add_channels(t);
    add_loss(t);
    add_optimizers(t);
    add_coupling(t);
    return t;
  }();
  return table;
}

}  // namespace petra::testing::backend_ops
