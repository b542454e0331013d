// benchmarks/bench_scaling.cpp: bench-scaling, a model of PETRA's stages on J hosts or GPUs: where
// the link between neighbouring stages becomes the bottleneck.
//
// PETRA puts one stage per device and runs every stage at every step; each step, the link between
// stage j and j + 1 carries one forward message up (j's output and the labels) and one backward
// message down (the gradient of that output, and, where stage j rebuilds its input from its
// output, the output itself: a reversible stage below). With full-duplex links the two directions
// do not compete, and a message of step t overlaps the computation of step t + 1 (it is read one
// step later), so a step takes
//     T = max( max_j compute_j , max_j max(up_j, down_j) / bandwidth + latency )
// and the link is the bottleneck when its term is the larger. This program measures what the model
// needs and prints it:
//   - compute_j, the time of one stage's PETRA work for one mini-batch (forward, then the backward
//     with the input rebuilt: pipeline::measure_stage_costs, the best of 3) on this machine's CPU,
//     with --threads threads: "hosts like this one";
//   - for GPUs, compute_j from the stage's multiply-adds (its convolution and linear weights times
//     the output positions) at --gpu-tflops sustained, 4 forward-equivalents per mini-batch
//     (forward, rebuild or recompute, backward for data and weights), plus --gpu-overhead-us for
//     the kernel launches of a small stage: assumptions, said as such;
//   - up_j and down_j, the bytes of the messages (the runtime's own: activation + labels up;
//     gradient, plus the rebuilt input where stage j rebuilds, down), from one forward;
// and for each link (10 Gb/s, 100 Gb/s Ethernet or InfiniBand, NVLink-class 450 GB/s per direction)
// the step time, images/s and whether the link or the slowest stage bounds it, plus the
// "critical bandwidth" max_j max(up_j, down_j) / max_j compute_j below which the link bounds it.
//
//   build/bench-scaling                                   # RevNet18/34/50, width 64, 32x32x3, batch 128
//   build/bench-scaling --models revnet18 --width 16 --size 28 --channels 1 --batch 64
//   build/bench-scaling --json scaling.json
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "petra/files.hpp"
#include "petra/nn/models.hpp"
#include "petra/petra.hpp"
#include "petra/pipeline/placement.hpp"
#include "petra/pipeline/stage_runtime.hpp"

namespace {

using petra::Tensor;
using petra::pipeline::PipelineMethod;

struct Options {
  std::vector<std::string> models{"revnet18", "revnet34", "revnet50"};
  std::int64_t width = 64, batch = 128, size = 32, channels = 3;
  int threads = 2;
  double gpu_tflops = 100;  // sustained FP32/TF32 rate assumed for a GPU running one stage
  double gpu_overhead_us = 100;  // launches and synchronisation per stage and mini-batch, assumed
  double latency_us = 10;   // per message
  std::string json_path;
};

struct Link {
  const char* name;
  double bytes_per_second;  // per direction
};
const Link kLinks[] = {{"10 Gb/s", 10e9 / 8}, {"100 Gb/s", 100e9 / 8}, {"NVLink 450 GB/s", 450e9}};

struct Stage {
  std::string kind;
  double cpu_seconds = 0, gpu_seconds = 0;
  double forward_flops = 0;
  std::int64_t up_bytes = 0, down_bytes = 0;  // over the link to the stage above (0 for the head)
};

// Multiply-adds x 2 of one forward of `stage` whose output has `positions` spatial positions per
// image: each 4-d weight (a convolution) is applied at every output position (the convolutions of a
// stage all produce its output resolution), each 2-d weight (the linear head) once per image.
double forward_flops(petra::nn::Stage& stage, std::int64_t batch, std::int64_t positions) {
  double flops = 0;
  for (const auto& p : stage.parameters()) {
    const double n = static_cast<double>(p.data().numel());
    if (p.shape().ndim() == 4) flops += 2.0 * n * double(batch * positions);
    if (p.shape().ndim() == 2) flops += 2.0 * n * double(batch);
  }
  return flops;
}

std::vector<Stage> measure(const std::string& arch, const Options& o) {
  petra::nn::ModelConfig config;
  config.arch = arch;
  config.width = o.width;
  config.in_channels = o.channels;
  config.seed = 1;
  petra::nn::Model model(config);
  const Tensor images = Tensor::normal(petra::Shape{o.batch, o.channels, o.size, o.size}, 7);
  Tensor labels = Tensor::zeros(petra::Shape{o.batch}, petra::DType::i64);
  const std::vector<double> costs =
      petra::pipeline::measure_stage_costs(model, {images, labels}, o.threads);
  std::vector<Stage> stages(model.num_stages());
  const std::int64_t J = static_cast<std::int64_t>(model.num_stages());
  petra::NoGradGuard no_grad;
  Tensor x = images;
  for (std::int64_t j = 0; j < J; ++j) {
    petra::nn::Stage& stage = model.stage(static_cast<std::size_t>(j));
    Stage& s = stages[static_cast<std::size_t>(j)];
    s.cpu_seconds = costs[static_cast<std::size_t>(j)];
    if (stage.kind() == petra::nn::StageKind::head) {
      s.kind = "head";
      s.forward_flops = forward_flops(stage, o.batch, 1);
    } else {
      s.kind = stage.kind() == petra::nn::StageKind::reversible ? "reversible" : "buffered";
      const Tensor y = stage.forward(petra::Variable(x)).data();
      s.forward_flops = forward_flops(stage, o.batch, y.shape()[2] * y.shape()[3]);
      const std::int64_t activation = y.numel() * 4;
      s.up_bytes = activation + labels.numel() * 8;
      // Down to stage j: the gradient of its output, and the output itself where j rebuilds its input.
      s.down_bytes = activation + (petra::pipeline::rebuilds_input(PipelineMethod::petra, stage.kind()) ? activation : 0);
      x = y;
    }
    s.gpu_seconds = 4 * s.forward_flops / (o.gpu_tflops * 1e12) + o.gpu_overhead_us * 1e-6;
  }
  return stages;
}

// One row of the model: the step time on `link` given per-stage compute times.
struct Verdict {
  double step_seconds, images_per_second;
  bool link_bound;
};
Verdict model_step(const std::vector<Stage>& stages, bool gpu, const Link& link, const Options& o) {
  double compute = 0, transfer = 0;
  for (const Stage& s : stages) {
    compute = std::max(compute, gpu ? s.gpu_seconds : s.cpu_seconds);
    if (s.up_bytes > 0)
      transfer = std::max(transfer, double(std::max(s.up_bytes, s.down_bytes)) / link.bytes_per_second +
                                        o.latency_us * 1e-6);
  }
  const double step = std::max(compute, transfer);
  return {step, double(o.batch) / step, transfer > compute};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"bench-scaling: PETRA with one stage per host or GPU, the link between stages as a bottleneck (a "
               "model from measured stage costs and message sizes)"};
  app.add_option("--models", o.models, "architectures")->delimiter(',')->capture_default_str();
  app.add_option("--width", o.width, "model width")->capture_default_str();
  app.add_option("--batch", o.batch, "mini-batch size")->capture_default_str();
  app.add_option("--size", o.size, "image height and width")->capture_default_str();
  app.add_option("--channels", o.channels, "image channels")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads per stage (a host like this machine)")->capture_default_str();
  app.add_option("--gpu-tflops", o.gpu_tflops, "sustained TFLOP/s assumed for a GPU running one stage")
      ->capture_default_str();
  app.add_option("--gpu-overhead-us", o.gpu_overhead_us, "microseconds of launches per stage and mini-batch on a GPU")
      ->capture_default_str();
  app.add_option("--latency-us", o.latency_us, "per-message latency in microseconds")->capture_default_str();
  app.add_option("--json", o.json_path, "write every number as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    nlohmann::json out = {{"width", o.width}, {"batch", o.batch}, {"size", o.size}, {"channels", o.channels},
                          {"threads", o.threads}, {"gpu_tflops", o.gpu_tflops},
                          {"gpu_overhead_us", o.gpu_overhead_us}, {"latency_us", o.latency_us}};
    std::printf("bench-scaling: width %lld, %lldx%lldx%lld images, batch %lld; CPU hosts = this machine with %d "
                "thread(s) per stage (measured); GPUs at %.0f TFLOP/s sustained + %.0f us per stage (assumed)\n",
                static_cast<long long>(o.width), static_cast<long long>(o.size), static_cast<long long>(o.size),
                static_cast<long long>(o.channels), static_cast<long long>(o.batch), o.threads, o.gpu_tflops,
                o.gpu_overhead_us);
    for (const std::string& arch : o.models) {
      const std::vector<Stage> stages = measure(arch, o);
      double slowest_cpu = 0, slowest_gpu = 0;
      std::int64_t largest = 0;
      nlohmann::json rows = nlohmann::json::array();
      std::printf("\n%s, J = %zu stages\n  %-5s %-10s %12s %12s %12s %12s\n", arch.c_str(), stages.size(), "stage",
                  "kind", "cpu ms", "gpu ms", "up MB", "down MB");
      for (std::size_t j = 0; j < stages.size(); ++j) {
        const Stage& s = stages[j];
        slowest_cpu = std::max(slowest_cpu, s.cpu_seconds);
        slowest_gpu = std::max(slowest_gpu, s.gpu_seconds);
        largest = std::max({largest, s.up_bytes, s.down_bytes});
        std::printf("  %-5zu %-10s %12.2f %12.4f %12.3f %12.3f\n", j, s.kind.c_str(), 1e3 * s.cpu_seconds,
                    1e3 * s.gpu_seconds, s.up_bytes / 1e6, s.down_bytes / 1e6);
        rows.push_back({{"stage", j}, {"kind", s.kind}, {"cpu_seconds", s.cpu_seconds},
                        {"gpu_seconds", s.gpu_seconds}, {"forward_flops", s.forward_flops},
                        {"up_bytes", s.up_bytes}, {"down_bytes", s.down_bytes}});
      }
      nlohmann::json links = nlohmann::json::array();
      for (const bool gpu : {false, true}) {
        const double slowest = gpu ? slowest_gpu : slowest_cpu;
        std::printf("  %s: slowest stage %.3f ms, largest message %.3f MB, the link bounds the step below %.2f GB/s\n",
                    gpu ? "GPUs" : "CPU hosts", 1e3 * slowest, largest / 1e6, largest / slowest / 1e9);
        for (const Link& link : kLinks) {
          const Verdict v = model_step(stages, gpu, link, o);
          std::printf("    %-16s step %9.3f ms  %10.0f images/s  bound by the %s\n", link.name, 1e3 * v.step_seconds,
                      v.images_per_second, v.link_bound ? "LINK" : "slowest stage");
          links.push_back({{"devices", gpu ? "gpu" : "cpu"}, {"link", link.name},
                           {"step_seconds", v.step_seconds}, {"images_per_second", v.images_per_second},
                           {"link_bound", v.link_bound}});
        }
      }
      out["models"][arch] = {{"stages", rows}, {"critical_bytes_per_second_cpu", largest / slowest_cpu},
                             {"critical_bytes_per_second_gpu", largest / slowest_gpu}, {"links", links}};
    }
    if (!o.json_path.empty()) petra::write_file_atomically(o.json_path, out.dump(2) + "\n");
  } catch (const petra::Error& e) {
    std::fprintf(stderr, "bench-scaling: %s\n", e.what());
    return 1;
  }
  return 0;
}
