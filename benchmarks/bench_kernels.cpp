// benchmarks/bench_kernels.cpp: bench-kernels, the speed of every CPU kernel, checked first.
//
// For every case it (1) runs kernels::cpu and kernels::ref on a small version of the shape (batch 2)
// and refuses to time a kernel whose relative error exceeds 1e-4, then (2) times kernels::cpu at
// the full shape: warm-up, then the median of --repeats runs. Compute-bound kernels (convolution,
// linear) are reported in GFLOP/s and as a fraction of Eigen's large SGEMM (2048^3) measured in
// the same run with the same threads; memory-bound kernels (batch norm, coupling, element-wise)
// in GB/s of minimal traffic and as a fraction of a STREAM triad measured in the same run.
//
// Shapes: the ResNet-18 CIFAR layers at batch 64 (3x3 convolutions with 64/128/256/512 channels
// at 32/16/8/4 pixels, the stride-2 3x3 and 1x1 downsampling convolutions), as in the paper's
// CIFAR-10 experiments.
//
//   build/bench-kernels                     # table, 2 threads
//   build/bench-kernels --threads 1 --json  # JSON array of {"name", "gflops", "gbytes_per_s", ...}
//   build/bench-kernels --filter conv3x3    # only the cases whose name contains "conv3x3"
//   build/bench-kernels --cold              # caches flushed before every run, as in a training step
#include <CLI/CLI.hpp>
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "petra/kernels/batchnorm.hpp"
#include "petra/kernels/conv2d.hpp"
#include "petra/kernels/conv_batchnorm.hpp"
#include "petra/kernels/coupling.hpp"
#include "petra/kernels/elementwise.hpp"
#include "petra/kernels/linear.hpp"
#include "petra/kernels/pool.hpp"
#include "tests/support/testing.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace k = petra::kernels;

namespace {

using Clock = std::chrono::steady_clock;
using Buffer = std::vector<float>;

// Reproducible inputs and the error measure of the tests (tests/support/testing.hpp).
Buffer random_buffer(std::size_t n, unsigned seed) { return petra::testing::random_values<float>(n, seed); }
using petra::testing::relative_error;

// --cold: before every timed run, 256 MB are written and read, which evicts the case's buffers
// from every cache level. A training step works on ~100 MB of activations, so a kernel in a step
// finds its inputs in DRAM or at best L3, not in the L2 that back-to-back runs leave them in.
bool flush_caches = false;

void evict_caches() {
  static Buffer sweep(std::size_t(64) << 20);
  float sum = 0;
  for (float& v : sweep) v += 1.0f;
  for (std::size_t i = 0; i < sweep.size(); i += 16) sum += sweep[i];
  if (sum == -1.0f) std::puts("");  // keeps the reads
}

// Median wall time of `repeats` runs after two warm-up runs, in seconds.
double median_seconds(const std::function<void()>& run, int repeats) {
  run();
  run();
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    if (flush_caches) evict_caches();
    const auto t0 = Clock::now();
    run();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Eigen's large SGEMM rate with the calling thread's OpenMP thread count: the ceiling against
// which the convolutions are judged.
double measure_gemm_gflops(int repeats) {
  const int n = 2048;
  Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n), b = Eigen::MatrixXf::Random(n, n), c(n, n);
  const double seconds = median_seconds([&] { c.noalias() = a * b; }, repeats);
  return 2.0 * n * n * double(n) / seconds / 1e9;
}

// STREAM triad a = b + s c over three 64 MiB arrays, counted as 3 x 64 MiB (no write-allocate).
double measure_triad_gbytes(int threads, int repeats) {
  const std::int64_t n = std::int64_t{16} << 20;
  Buffer a(n, 0.0f), b(n, 1.0f), c(n, 2.0f);
  const double seconds = median_seconds(
      [&] {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (std::int64_t i = 0; i < n; ++i) a[i] = b[i] + 3.0f * c[i];
      },
      repeats);
  return 3.0 * 4.0 * double(n) / seconds / 1e9;
}

struct Case {
  std::string name;
  std::string kind;  // "compute" (judged against GEMM) or "memory" (judged against the triad)
  double flops = 0;  // per run, compute cases
  double bytes = 0;  // per run, minimal traffic, memory cases
  std::function<double()> validate;  // cpu vs ref on a small shape: relative error
  std::function<void()> run;         // cpu on the full shape
};

// One convolution layer: forward, backward-data, backward-weight as three cases.
void add_conv_cases(std::vector<Case>& cases, const k::StreamHandle& s, const std::string& label,
                    std::int64_t batch, std::int64_t cin, std::int64_t cout, std::int64_t pixels,
                    std::int64_t kernel, std::int64_t stride) {
  const std::int64_t pad = kernel / 2;
  const auto full = k::conv2d_shape(batch, cin, pixels, pixels, cout, kernel, stride, pad);
  const auto small = k::conv2d_shape(2, cin, pixels, pixels, cout, kernel, stride, pad);
  struct Buffers {
    Buffer x, w, b, y, dy, dx, dw;
  };
  auto make = [](const k::Conv2dShape& sh) {
    auto buf = std::make_shared<Buffers>();
    buf->x = random_buffer(sh.input_size(), 1);
    buf->w = random_buffer(sh.weight_size(), 2);
    buf->b = random_buffer(sh.out_channels, 3);
    buf->dy = random_buffer(sh.output_size(), 4);
    buf->y.resize(sh.output_size());
    buf->dx.resize(sh.input_size());
    buf->dw.assign(sh.weight_size(), 0.0f);
    return buf;
  };
  auto big = make(full);
  const double flops = double(full.flops());
  const std::string shape = label + " c" + std::to_string(cin) + "->" + std::to_string(cout) + " @" +
                            std::to_string(pixels) + " s" + std::to_string(stride);
  cases.push_back({"conv" + std::to_string(kernel) + "x" + std::to_string(kernel) + " fwd " + shape, "compute", flops,
                   0,
                   [=, &s] {
                     auto a = make(small), r = make(small);
                     k::cpu::conv2d_forward(s, small, a->x.data(), a->w.data(), a->b.data(), a->y.data());
                     k::ref::conv2d_forward<float>(s, small, r->x.data(), r->w.data(), r->b.data(), r->y.data());
                     return relative_error(a->y, r->y);
                   },
                   [=, &s] { k::cpu::conv2d_forward(s, full, big->x.data(), big->w.data(), big->b.data(), big->y.data()); }});
  cases.push_back({"conv" + std::to_string(kernel) + "x" + std::to_string(kernel) + " bwd-data " + shape, "compute",
                   flops, 0,
                   [=, &s] {
                     auto a = make(small), r = make(small);
                     k::cpu::conv2d_backward_data(s, small, a->dy.data(), a->w.data(), a->dx.data());
                     k::ref::conv2d_backward_data<float>(s, small, r->dy.data(), r->w.data(), r->dx.data());
                     return relative_error(a->dx, r->dx);
                   },
                   [=, &s] { k::cpu::conv2d_backward_data(s, full, big->dy.data(), big->w.data(), big->dx.data()); }});
  cases.push_back({"conv" + std::to_string(kernel) + "x" + std::to_string(kernel) + " bwd-weight " + shape, "compute",
                   flops, 0,
                   [=, &s] {
                     auto a = make(small), r = make(small);
                     k::cpu::conv2d_backward_weight(s, small, a->x.data(), a->dy.data(), a->dw.data());
                     k::ref::conv2d_backward_weight<float>(s, small, r->x.data(), r->dy.data(), r->dw.data());
                     return relative_error(a->dw, r->dw);
                   },
                   [=, &s] { k::cpu::conv2d_backward_weight(s, full, big->x.data(), big->dy.data(), big->dw.data()); }});
}

void add_batchnorm_cases(std::vector<Case>& cases, const k::StreamHandle& s, std::int64_t batch,
                         std::int64_t channels, std::int64_t pixels) {
  const k::BatchNormShape full{batch, channels, pixels, pixels}, small{2, channels, pixels, pixels};
  struct Buffers {
    Buffer x, y, dy, dx, gamma, beta, mean, invstd, rmean, rvar, dgamma, dbeta;
  };
  auto make = [](const k::BatchNormShape& sh) {
    auto b = std::make_shared<Buffers>();
    b->x = random_buffer(sh.size(), 1);
    b->dy = random_buffer(sh.size(), 2);
    b->y.resize(sh.size());
    b->dx.resize(sh.size());
    b->gamma = random_buffer(sh.channels, 3);
    b->beta = random_buffer(sh.channels, 4);
    for (Buffer* v : {&b->mean, &b->invstd, &b->rmean, &b->dgamma, &b->dbeta}) v->assign(sh.channels, 0.0f);
    b->rvar.assign(sh.channels, 1.0f);
    return b;
  };
  auto big = make(full);
  const double n = double(full.size()) * 4.0;
  const std::string shape = "c" + std::to_string(channels) + " @" + std::to_string(pixels);
  auto forward = [&s](const k::BatchNormShape& sh, Buffers& b, bool reference) {
    (reference ? k::ref::batchnorm_forward_train<float> : k::cpu::batchnorm_forward_train)(
        s, sh, 1e-5, 0.1, b.x.data(), b.gamma.data(), b.beta.data(), b.y.data(), b.mean.data(), b.invstd.data(),
        b.rmean.data(), b.rvar.data());
  };
  auto backward = [&s](const k::BatchNormShape& sh, Buffers& b, bool reference) {
    (reference ? k::ref::batchnorm_backward<float> : k::cpu::batchnorm_backward)(
        s, sh, b.x.data(), b.dy.data(), b.gamma.data(), b.mean.data(), b.invstd.data(), b.dx.data(),
        b.dgamma.data(), b.dbeta.data());
  };
  // forward: read x, write y (the statistics pass re-reads x from cache, channel by channel)
  cases.push_back({"batchnorm fwd " + shape, "memory", 0, 2 * n,
                   [=] {
                     auto a = make(small), r = make(small);
                     forward(small, *a, false);
                     forward(small, *r, true);
                     return relative_error(a->y, r->y);
                   },
                   [=] { forward(full, *big, false); }});
  // backward: read x and dy, write dx
  cases.push_back({"batchnorm bwd " + shape, "memory", 0, 3 * n,
                   [=] {
                     auto a = make(small), r = make(small);
                     forward(small, *a, false);
                     forward(small, *r, true);
                     backward(small, *a, false);
                     backward(small, *r, true);
                     return relative_error(a->dx, r->dx);
                   },
                   [=] { backward(full, *big, false); }});

  // Batch norm + ReLU, fused (one op) and unfused (batch norm, then relu / relu_backward then
  // batch norm's backward, as nn/blocks.cpp ran before the fusion). Both count the fused op's
  // minimal traffic (forward: x, y; backward: x, y, dy, dx), so their GB/s compare as speeds; the
  // unfused pair really moves 4 and 6 arrays.
  auto relu_forward = [&s](const k::BatchNormShape& sh, Buffers& b, bool reference) {
    (reference ? k::ref::batchnorm_relu_forward_train<float> : k::cpu::batchnorm_relu_forward_train)(
        s, sh, 1e-5, 0.1, b.x.data(), b.gamma.data(), b.beta.data(), b.y.data(), b.mean.data(), b.invstd.data(),
        b.rmean.data(), b.rvar.data());
  };
  auto relu_backward = [&s](const k::BatchNormShape& sh, Buffers& b, bool reference) {
    (reference ? k::ref::batchnorm_relu_backward<float> : k::cpu::batchnorm_relu_backward)(
        s, sh, b.x.data(), b.y.data(), b.dy.data(), b.gamma.data(), b.mean.data(), b.invstd.data(), b.dx.data(),
        b.dgamma.data(), b.dbeta.data());
  };
  // The unfused pair writes relu's output (and the masked dy) to a tensor of its own, as the ops did.
  auto scratch = std::make_shared<Buffer>(full.size());
  cases.push_back({"bn+relu fused fwd " + shape, "memory", 0, 2 * n,
                   [=] {
                     auto a = make(small), r = make(small);
                     relu_forward(small, *a, false);
                     relu_forward(small, *r, true);
                     return relative_error(a->y, r->y);
                   },
                   [=] { relu_forward(full, *big, false); }});
  cases.push_back({"bn+relu unfused fwd " + shape, "memory", 0, 2 * n,
                   [=] {
                     auto a = make(small), r = make(small);
                     forward(small, *a, false);
                     k::cpu::relu(s, small.size(), a->y.data(), a->dx.data());
                     relu_forward(small, *r, true);
                     return relative_error(a->dx, r->y);
                   },
                   [=] {
                     forward(full, *big, false);
                     k::cpu::relu(s, full.size(), big->y.data(), scratch->data());
                   }});
  cases.push_back({"bn+relu fused bwd " + shape, "memory", 0, 4 * n,
                   [=] {
                     auto a = make(small), r = make(small);
                     relu_forward(small, *r, true);
                     a->y = r->y;  // one mask for both
                     a->mean = r->mean;
                     a->invstd = r->invstd;
                     relu_backward(small, *a, false);
                     relu_backward(small, *r, true);
                     return relative_error(a->dx, r->dx);
                   },
                   [=] { relu_backward(full, *big, false); }});
  // The same backward also summing dx per channel (a convolution's bias gradient, nn's
  // conv_batch_norm), against it followed by the convolution's own bias pass over dx.
  auto channel_sums = std::make_shared<Buffer>(full.channels);
  cases.push_back({"bn+relu fused bwd summed " + shape, "memory", 0, 4 * n,
                   [=] {
                     auto a = make(small), r = make(small);
                     relu_forward(small, *r, true);
                     a->y = r->y;
                     a->mean = r->mean;
                     a->invstd = r->invstd;
                     Buffer sums(small.channels, 0.f);
                     k::cpu::batchnorm_relu_backward_summed(s, small, a->x.data(), a->y.data(), a->dy.data(),
                                                            a->gamma.data(), a->mean.data(), a->invstd.data(),
                                                            a->dx.data(), a->dgamma.data(), a->dbeta.data(), sums.data());
                     relu_backward(small, *r, true);
                     return relative_error(a->dx, r->dx);
                   },
                   [=] {
                     k::cpu::batchnorm_relu_backward_summed(s, full, big->x.data(), big->y.data(), big->dy.data(),
                                                            big->gamma.data(), big->mean.data(), big->invstd.data(),
                                                            big->dx.data(), big->dgamma.data(), big->dbeta.data(),
                                                            channel_sums->data());
                   }});
  // The same summed backward with the mask from x and the forward's map (petra's default on the CPU):
  // y is not read. Validated against the fused backward with y, whose bits it must have.
  auto affine = std::make_shared<Buffer>(3 * full.channels);
  k::cpu::batchnorm_relu_forward_train_mapped(s, full, 1e-5, 0.1, big->x.data(), big->gamma.data(), big->beta.data(),
                                              big->y.data(), big->mean.data(), big->invstd.data(), nullptr, nullptr,
                                              affine->data());
  cases.push_back({"bn+relu mapped bwd summed " + shape, "memory", 0, 3 * n,
                   [=] {
                     auto a = make(small);
                     Buffer map(3 * small.channels), sums(small.channels, 0.f), sums_y(small.channels, 0.f);
                     k::cpu::batchnorm_relu_forward_train_mapped(s, small, 1e-5, 0.1, a->x.data(), a->gamma.data(),
                                                                 a->beta.data(), a->y.data(), a->mean.data(),
                                                                 a->invstd.data(), nullptr, nullptr, map.data());
                     auto r = std::make_shared<Buffers>(*a);
                     k::cpu::batchnorm_relu_backward_mapped(s, small, a->x.data(), map.data(), a->dy.data(),
                                                            a->gamma.data(), a->mean.data(), a->invstd.data(),
                                                            a->dx.data(), a->dgamma.data(), a->dbeta.data(), sums.data());
                     k::cpu::batchnorm_relu_backward_summed(s, small, r->x.data(), r->y.data(), r->dy.data(),
                                                            r->gamma.data(), r->mean.data(), r->invstd.data(),
                                                            r->dx.data(), r->dgamma.data(), r->dbeta.data(),
                                                            sums_y.data());
                     return a->dx == r->dx ? 0.0 : 1.0;
                   },
                   [=] {
                     k::cpu::batchnorm_relu_backward_mapped(s, full, big->x.data(), affine->data(), big->dy.data(),
                                                            big->gamma.data(), big->mean.data(), big->invstd.data(),
                                                            big->dx.data(), big->dgamma.data(), big->dbeta.data(),
                                                            channel_sums->data());
                   }});
  cases.push_back({"bn+relu fused bwd, then bias pass " + shape, "memory", 0, 4 * n,
                   [=] { return 0.0; },
                   [=] {
                     relu_backward(full, *big, false);
                     const k::Conv2dShape bias_shape{full.batch, 1, full.height, full.width, full.channels, 1, 1};
                     k::cpu::conv2d_backward_bias(s, bias_shape, big->dx.data(), channel_sums->data());
                   }});
  cases.push_back({"bn+relu unfused bwd " + shape, "memory", 0, 4 * n,
                   [=] {
                     auto a = make(small), r = make(small);
                     relu_forward(small, *r, true);
                     a->y = r->y;
                     a->mean = r->mean;
                     a->invstd = r->invstd;
                     Buffer masked(small.size());
                     k::cpu::relu_backward(s, small.size(), a->y.data(), a->dy.data(), masked.data());
                     k::cpu::batchnorm_backward(s, small, a->x.data(), masked.data(), a->gamma.data(), a->mean.data(),
                                                a->invstd.data(), a->dx.data(), a->dgamma.data(), a->dbeta.data());
                     relu_backward(small, *r, true);
                     return relative_error(a->dx, r->dx);
                   },
                   [=] {
                     k::cpu::relu_backward(s, full.size(), big->y.data(), big->dy.data(), scratch->data());
                     k::cpu::batchnorm_backward(s, full, big->x.data(), scratch->data(), big->gamma.data(),
                                                big->mean.data(), big->invstd.data(), big->dx.data(),
                                                big->dgamma.data(), big->dbeta.data());
                   }});

  // Batch norm + ReLU fused into the coupling (F's last layer in a pipelined forward), against
  // batch norm + ReLU then the coupling kernel. Both count the fused op's traffic (z, both streams
  // of a and of out: 5 arrays of z's size); the unfused pair also writes and reads f.
  const k::CouplingShape coupling_full{full.batch, full.channels, full.height, full.width};
  auto two_streams = std::make_shared<Buffer>(random_buffer(std::size_t(2 * full.size()), 5));
  auto coupled = std::make_shared<Buffer>(std::size_t(2 * full.size()));
  auto coupling_forward = [&s](const k::BatchNormShape& sh, Buffers& b, const Buffer& a, Buffer& out, bool reference) {
    (reference ? k::ref::batchnorm_relu_coupling_train<float> : k::cpu::batchnorm_relu_coupling_train)(
        s, sh, 1e-5, 0.1, k::CouplingDirection::forward, b.x.data(), b.gamma.data(), b.beta.data(), a.data(),
        out.data(), b.mean.data(), b.invstd.data(), b.rmean.data(), b.rvar.data());
  };
  cases.push_back({"bn+relu+coupling fused fwd " + shape, "memory", 0, 5 * n,
                   [=] {
                     auto a = make(small), r = make(small);
                     const Buffer streams = random_buffer(std::size_t(2 * small.size()), 5);
                     Buffer out_a(streams.size()), out_r(streams.size());
                     coupling_forward(small, *a, streams, out_a, false);
                     coupling_forward(small, *r, streams, out_r, true);
                     return relative_error(out_a, out_r);
                   },
                   [=] { coupling_forward(full, *big, *two_streams, *coupled, false); }});
  cases.push_back({"bn+relu then coupling fwd " + shape, "memory", 0, 5 * n,
                   [=] {
                     auto a = make(small), r = make(small);
                     const Buffer streams = random_buffer(std::size_t(2 * small.size()), 5);
                     Buffer out_a(streams.size()), out_r(streams.size());
                     relu_forward(small, *a, false);
                     k::cpu::coupling_forward(s, {small.batch, small.channels, small.height, small.width},
                                              streams.data(), a->y.data(), out_a.data());
                     coupling_forward(small, *r, streams, out_r, true);
                     return relative_error(out_a, out_r);
                   },
                   [=] {
                     relu_forward(full, *big, false);
                     k::cpu::coupling_forward(s, coupling_full, two_streams->data(), big->y.data(), coupled->data());
                   }});
}

void add_coupling_cases(std::vector<Case>& cases, const k::StreamHandle& s, std::int64_t batch,
                        std::int64_t channels, std::int64_t pixels) {
  const k::CouplingShape full{batch, channels, pixels, pixels}, small{2, channels, pixels, pixels};
  struct Buffers {
    Buffer x, f, y;
  };
  auto make = [](const k::CouplingShape& sh) {
    auto b = std::make_shared<Buffers>();
    b->x = random_buffer(2 * sh.half_size(), 1);
    b->f = random_buffer(sh.half_size(), 2);
    b->y.resize(2 * sh.half_size());
    return b;
  };
  auto big = make(full);
  // read x (two streams) and f, write y (two streams): 5 stream-sized tensors
  const double bytes = 5.0 * double(full.half_size()) * 4.0;
  const std::string shape = "c" + std::to_string(channels) + "x2 @" + std::to_string(pixels);
  cases.push_back({"coupling fwd " + shape, "memory", 0, bytes,
                   [=, &s] {
                     auto a = make(small), r = make(small);
                     k::cpu::coupling_forward(s, small, a->x.data(), a->f.data(), a->y.data());
                     k::ref::coupling_forward<float>(s, small, r->x.data(), r->f.data(), r->y.data());
                     return relative_error(a->y, r->y);
                   },
                   [=, &s] { k::cpu::coupling_forward(s, full, big->x.data(), big->f.data(), big->y.data()); }});
  cases.push_back({"coupling inverse " + shape, "memory", 0, bytes,
                   [=, &s] {
                     auto a = make(small), r = make(small);
                     k::cpu::coupling_inverse(s, small, a->x.data(), a->f.data(), a->y.data());
                     k::ref::coupling_inverse<float>(s, small, r->x.data(), r->f.data(), r->y.data());
                     return relative_error(a->y, r->y);
                   },
                   [=, &s] { k::cpu::coupling_inverse(s, full, big->x.data(), big->f.data(), big->y.data()); }});
}

void add_elementwise_cases(std::vector<Case>& cases, const k::StreamHandle& s) {
  const std::int64_t n = std::int64_t{16} << 20, small = 1000003;
  auto x = std::make_shared<Buffer>(random_buffer(n, 1)), y = std::make_shared<Buffer>(random_buffer(n, 2)),
       z = std::make_shared<Buffer>(n);
  auto check = [&s, small](auto cpu_fn, auto ref_fn) {
    Buffer a = random_buffer(small, 5), b = random_buffer(small, 6), c1(small), c2(small);
    cpu_fn(s, small, a.data(), b.data(), c1.data());
    ref_fn(s, small, a.data(), b.data(), c2.data());
    return relative_error(c1, c2);
  };
  cases.push_back({"add 16M", "memory", 0, 3.0 * 4 * n,
                   [=] { return check(k::cpu::add<float>, k::ref::add<float>); },
                   [=, &s] { k::cpu::add(s, n, x->data(), y->data(), z->data()); }});
  cases.push_back({"relu_backward 16M", "memory", 0, 3.0 * 4 * n,
                   [=] { return check(k::cpu::relu_backward<float>, k::ref::relu_backward<float>); },
                   [=, &s] { k::cpu::relu_backward(s, n, x->data(), y->data(), z->data()); }});
}

void add_linear_cases(std::vector<Case>& cases, const k::StreamHandle& s) {
  // The classifier of a ResNet-18 on ImageNet-sized features: 512 -> 1000 at batch 64 (for scale).
  const k::LinearShape full{64, 512, 1000}, small{2, 512, 1000};
  auto make = [](const k::LinearShape& sh) {
    struct B {
      Buffer x, w, b, y;
    };
    auto b = std::make_shared<B>();
    b->x = random_buffer(sh.batch * sh.in_features, 1);
    b->w = random_buffer(sh.in_features * sh.out_features, 2);
    b->b = random_buffer(sh.out_features, 3);
    b->y.resize(sh.batch * sh.out_features);
    return b;
  };
  auto big = make(full);
  cases.push_back({"linear fwd 512->1000 b64", "compute", double(full.flops()), 0,
                   [=, &s] {
                     auto a = make(small), r = make(small);
                     k::cpu::linear_forward(s, small, a->x.data(), a->w.data(), a->b.data(), a->y.data());
                     k::ref::linear_forward<float>(s, small, r->x.data(), r->w.data(), r->b.data(), r->y.data());
                     return relative_error(a->y, r->y);
                   },
                   [=, &s] { k::cpu::linear_forward(s, full, big->x.data(), big->w.data(), big->b.data(), big->y.data()); }});
}

// The stem of the benchmark network (3x3, 1 -> `channels` @pixels): the op that recomputes its
// convolution (kernels/conv_batchnorm.hpp) against the unfused pair petra runs elsewhere (conv2d,
// then the mapped batch norm + ReLU; backward: its backward with the bias sum, then the weight
// gradient). GB/s count the fused op's traffic for both (forward: y; backward: dy twice), so they
// compare as speeds. Only where the fused op is compiled in (AVX-512).
void add_stem_cases(std::vector<Case>& cases, const k::StreamHandle& s, std::int64_t batch, std::int64_t channels,
                    std::int64_t pixels) {
  const auto full = k::conv2d_shape(batch, 1, pixels, pixels, channels, 3, 1, 1);
  const auto small = k::conv2d_shape(2, 1, pixels, pixels, channels, 3, 1, 1);
  if (!k::cpu::conv_batchnorm_relu_fits(full)) return;
  struct Buffers {
    Buffer x, w, bias, gamma, beta, z, y, dy, dz, mean, invstd, affine, rmean, rvar, dw, dbias, dgamma, dbeta;
  };
  auto make = [](const k::Conv2dShape& sh) {
    auto b = std::make_shared<Buffers>();
    b->x = random_buffer(sh.input_size(), 1);
    b->w = random_buffer(sh.weight_size(), 2);
    b->bias = random_buffer(sh.out_channels, 3);
    b->gamma = random_buffer(sh.out_channels, 4);
    b->beta = random_buffer(sh.out_channels, 5);
    b->dy = random_buffer(sh.output_size(), 6);
    for (Buffer* v : {&b->z, &b->y, &b->dz}) v->resize(sh.output_size());
    for (Buffer* v : {&b->mean, &b->invstd, &b->rmean, &b->dbias, &b->dgamma, &b->dbeta}) v->assign(sh.out_channels, 0);
    b->rvar.assign(sh.out_channels, 1.0f);
    b->affine.resize(3 * sh.out_channels);
    b->dw.assign(sh.weight_size(), 0.0f);
    return b;
  };
  auto bn = [](const k::Conv2dShape& sh) { return k::BatchNormShape{sh.batch, sh.out_channels, sh.in_h, sh.in_w}; };
  auto fused_forward = [&s](const k::Conv2dShape& sh, Buffers& b) {
    k::cpu::conv_batchnorm_relu_forward_train(s, sh, 1e-5, 0.1, b.x.data(), b.w.data(), b.bias.data(), b.gamma.data(),
                                              b.beta.data(), b.y.data(), b.mean.data(), b.invstd.data(),
                                              b.rmean.data(), b.rvar.data(), b.affine.data());
  };
  auto fused_backward = [&s](const k::Conv2dShape& sh, Buffers& b) {
    k::cpu::conv_batchnorm_relu_backward(s, sh, b.x.data(), b.w.data(), b.bias.data(), b.affine.data(), b.dy.data(),
                                         b.gamma.data(), b.mean.data(), b.invstd.data(), b.dw.data(), b.dbias.data(),
                                         b.dgamma.data(), b.dbeta.data());
  };
  auto unfused_forward = [&s, bn](const k::Conv2dShape& sh, Buffers& b) {
    k::cpu::conv2d_forward(s, sh, b.x.data(), b.w.data(), b.bias.data(), b.z.data());
    k::cpu::batchnorm_relu_forward_train_mapped(s, bn(sh), 1e-5, 0.1, b.z.data(), b.gamma.data(), b.beta.data(),
                                                b.y.data(), b.mean.data(), b.invstd.data(), b.rmean.data(),
                                                b.rvar.data(), b.affine.data());
  };
  auto unfused_backward = [&s, bn](const k::Conv2dShape& sh, Buffers& b) {
    k::cpu::batchnorm_relu_backward_mapped(s, bn(sh), b.z.data(), b.affine.data(), b.dy.data(), b.gamma.data(),
                                           b.mean.data(), b.invstd.data(), b.dz.data(), b.dgamma.data(),
                                           b.dbeta.data(), b.dbias.data());
    k::cpu::conv2d_backward_weight(s, sh, b.x.data(), b.dz.data(), b.dw.data());
  };
  // The reference: ref::conv2d, then ref:: batch norm + ReLU, and their backwards.
  auto reference = [&s, bn](const k::Conv2dShape& sh, Buffers& b) {
    k::ref::conv2d_forward<float>(s, sh, b.x.data(), b.w.data(), b.bias.data(), b.z.data());
    k::ref::batchnorm_relu_forward_train<float>(s, bn(sh), 1e-5, 0.1, b.z.data(), b.gamma.data(), b.beta.data(),
                                                b.y.data(), b.mean.data(), b.invstd.data(), b.rmean.data(),
                                                b.rvar.data());
    k::ref::batchnorm_relu_backward<float>(s, bn(sh), b.z.data(), b.y.data(), b.dy.data(), b.gamma.data(),
                                           b.mean.data(), b.invstd.data(), b.dz.data(), b.dgamma.data(),
                                           b.dbeta.data());
    k::ref::conv2d_backward_weight<float>(s, sh, b.x.data(), b.dz.data(), b.dw.data());
  };
  auto big = make(full);
  fused_forward(full, *big);  // the backward cases read the forward's statistics and map
  const double n = double(full.output_size()) * 4.0;
  const std::string shape = "c1->" + std::to_string(channels) + " @" + std::to_string(pixels);
  auto validate = [=](bool unfused, bool backward_pass) {
    return [=] {
      auto a = make(small), r = make(small);
      reference(small, *r);
      if (unfused) unfused_forward(small, *a); else fused_forward(small, *a);
      if (!backward_pass) return relative_error(a->y, r->y);
      if (unfused) unfused_backward(small, *a); else fused_backward(small, *a);
      return relative_error(a->dw, r->dw);
    };
  };
  cases.push_back({"stem fused fwd " + shape, "memory", 0, n, validate(false, false),
                   [=] { fused_forward(full, *big); }});
  cases.push_back({"stem unfused fwd " + shape, "memory", 0, n, validate(true, false),
                   [=] { unfused_forward(full, *big); }});
  cases.push_back({"stem fused bwd " + shape, "memory", 0, 2 * n, validate(false, true),
                   [=] { fused_backward(full, *big); }});
  cases.push_back({"stem unfused bwd " + shape, "memory", 0, 2 * n, validate(true, true),
                   [=] { unfused_backward(full, *big); }});
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench-kernels: validate every CPU kernel against the reference, then time it"};
  int threads = 2, repeats = 7;
  bool json = false;
  std::string filter;
  app.add_option("--threads", threads, "threads per kernel (the stream's thread count)")->check(CLI::Range(1, 256));
  app.add_option("--repeats", repeats, "timed runs per case (the median is reported)")->check(CLI::Range(1, 1000));
  app.add_option("--filter", filter, "only the cases whose name contains this text");
  app.add_flag("--json", json, "print a JSON array instead of a table");
  app.add_flag("--cold", flush_caches, "evict the caches before every timed run (as a training step leaves them)");
  CLI11_PARSE(app, argc, argv);

#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
  k::HeapWorkspace workspace;
  k::StreamHandle stream;
  stream.num_threads = threads;
  stream.workspace = &workspace;

  std::vector<Case> cases;
  const std::int64_t batch = 64;
  add_conv_cases(cases, stream, "stem", batch, 3, 64, 32, 3, 1);
  for (auto [c, p] : {std::pair{64, 32}, {128, 16}, {256, 8}, {512, 4}})
    add_conv_cases(cases, stream, "block", batch, c, c, p, 3, 1);
  for (auto [c, p] : {std::pair{64, 32}, {128, 16}, {256, 8}}) {
    add_conv_cases(cases, stream, "down", batch, c, 2 * c, p, 3, 2);
    add_conv_cases(cases, stream, "proj", batch, c, 2 * c, p, 1, 2);
  }
  for (auto [c, p] : {std::pair{64, 32}, {128, 16}, {256, 8}, {512, 4}}) {
    add_batchnorm_cases(cases, stream, batch, c, p);
    add_coupling_cases(cases, stream, batch, c, p);
  }
  // The batch norms of the benchmark network (RevNet18 width 16 on Fashion-MNIST's 28x28 images,
  // issue 15), whose rows petra-train --profile prints with the same shapes.
  for (auto [c, p] : {std::pair{16, 28}, {32, 14}, {64, 7}, {128, 4}}) add_batchnorm_cases(cases, stream, batch, c, p);
  add_stem_cases(cases, stream, batch, 32, 28);  // its stem
  add_elementwise_cases(cases, stream);
  add_linear_cases(cases, stream);

  // The ceilings are measured before the cases and again after them, and the higher value is
  // used: on a shared machine a ceiling measured during a quiet moment keeps fractions honest.
  double gemm = measure_gemm_gflops(5);
  double triad = measure_triad_gbytes(threads, 5);
  if (!json) {
    std::printf("bench-kernels: %d thread(s); Eigen SGEMM 2048^3: %.1f GFLOP/s; STREAM triad: %.1f GB/s\n", threads,
                gemm, triad);
    std::printf("%-40s %9s %9s %9s %8s %9s\n", "case", "ms", "GFLOP/s", "GB/s", "fraction", "rel.err");
  }
  nlohmann::json rows = nlohmann::json::array();
  int failures = 0;
  for (const Case& c : cases) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    const double error = c.validate();
    if (!(error <= 1e-4)) {
      std::fprintf(stderr, "bench-kernels: %s disagrees with the reference (relative error %.3g); not timed\n",
                   c.name.c_str(), error);
      ++failures;
      continue;
    }
    const double seconds = median_seconds(c.run, repeats);
    const double gflops = c.flops / seconds / 1e9, gbytes = c.bytes / seconds / 1e9;
    const bool compute = c.kind == "compute";
    const double fraction = compute ? gflops / gemm : gbytes / triad;
    rows.push_back({{"name", c.name},
                    {"kind", c.kind},
                    {"ms", seconds * 1e3},
                    {"gflops", gflops},
                    {"gbytes_per_s", gbytes},
                    {"fraction_of_gemm", compute ? fraction : gflops / gemm},
                    {"fraction_of_bandwidth", compute ? gbytes / triad : fraction},
                    {"relative_error", error},
                    {"threads", threads}});
    if (!json)
      std::printf("%-40s %9.3f %9.1f %9.1f %7.0f%% %9.1e\n", c.name.c_str(), seconds * 1e3, gflops, gbytes,
                  100 * fraction, error);
  }
  const double gemm_after = measure_gemm_gflops(5), triad_after = measure_triad_gbytes(threads, 5);
  if (gemm_after > gemm || triad_after > triad) {
    const double gemm_scale = gemm / std::max(gemm, gemm_after), triad_scale = triad / std::max(triad, triad_after);
    gemm = std::max(gemm, gemm_after);
    triad = std::max(triad, triad_after);
    for (auto& row : rows) {
      row["fraction_of_gemm"] = double(row["fraction_of_gemm"]) * gemm_scale;
      row["fraction_of_bandwidth"] = double(row["fraction_of_bandwidth"]) * triad_scale;
    }
    if (!json)
      std::printf("ceilings measured again after the cases: SGEMM %.1f GFLOP/s, triad %.1f GB/s (used for the JSON fractions)\n",
                  gemm, triad);
  }
  if (json) {
    std::printf("%s\n", rows.dump(1).c_str());
  } else {
    std::printf("fraction: of the SGEMM rate for convolution and linear, of the triad bandwidth for the rest\n");
  }
  return failures == 0 ? 0 : 1;
}
