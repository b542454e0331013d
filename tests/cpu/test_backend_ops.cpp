// tests/cpu/test_backend_ops.cpp: the backend-ops matrix (tests/support/backend_ops.hpp) on the
// cpu backend: every registered case, float32 through kernels::cpu, against float64 through
// kernels::ref, with 1 and 3 threads. Also: every function of petra/ops.hpp's ops:: namespace has
// cases, case names (which seed the inputs) are unique, and the comparison does catch a wrong
// value, an "=" where "+=" is due and a wrong index.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>

#include "tests/support/backend_ops.hpp"

using namespace petra;
namespace bo = petra::testing::backend_ops;

TEST_CASE("backend ops: every registered case on the cpu backend matches ref, 1 thread") {
  CHECK(bo::check_backend(bo::cpu_backend(1)) == bo::registry().size());
}

TEST_CASE("backend ops: every registered case on the cpu backend matches ref, 3 threads") {
  CHECK(bo::check_backend(bo::cpu_backend(3)) == bo::registry().size());
}

TEST_CASE("backend ops: the reference backend matches itself exactly") {
  // Deterministic inputs and kernels: a second run of each case gives the same bits.
  for (const bo::Case& c : bo::registry()) {
    CAPTURE(c.name);
    const bo::CaseResult r = bo::compare(c, bo::reference_backend());
    CHECK_MESSAGE(r.error.empty(), r.error);
    for (const auto& o : r.outputs) CHECK_MESSAGE(o.error == 0, o.name, ": ", o.problem);
  }
}

TEST_CASE("backend ops: case names are unique and every case names an op") {
  std::set<std::string> names;
  for (const bo::Case& c : bo::registry()) {
    CAPTURE(c.name);
    CHECK(names.insert(c.name).second);
    CHECK(c.name.rfind(c.op + " ", 0) == 0);  // the name starts with the op
    CHECK(c.inputs);
    CHECK(c.run);
  }
}

namespace {
// petra/<name>, found from the path the compiler was given for this file (meson gives it
// relative to the build directory, where the tests run) or from the source root.
std::filesystem::path petra_header(const std::string& name) {
  const std::filesystem::path candidates[] = {
      std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "petra" / name,
      "petra/" + name, "../petra/" + name};
  for (const auto& p : candidates)
    if (std::filesystem::exists(p)) return p;
  return {};
}
}  // namespace

TEST_CASE("backend ops: every function declared in ops:: (petra/ops.hpp, petra/optimizer_steps.hpp) has cases") {
  std::set<std::string> declared;
  for (const std::string name : {"ops.hpp", "optimizer_steps.hpp"}) {
    const std::filesystem::path header = petra_header(name);
    REQUIRE_MESSAGE(!header.empty(), "petra/", name, " not found from ", std::filesystem::current_path());
    std::ifstream in(header);
    std::string line;
    bool inside = false;
    // A declaration starts at column 0 inside the namespace: "Tensor add(", "void add_into(".
    const std::regex declaration(R"(^[A-Za-z_][\w:]*\s+(\w+)\()");
    while (std::getline(in, line)) {
      if (line.rfind("namespace ops {", 0) == 0) inside = true;
      if (line.rfind("}  // namespace ops", 0) == 0) inside = false;
      std::smatch m;
      if (inside && std::regex_search(line, m, declaration)) declared.insert(m[1]);
    }
  }
  // relative_error is the comparison itself (a host-side diagnostic, no kernel); broadcast_shape
  // computes a Shape, no tensor.
  declared.erase("relative_error");
  declared.erase("broadcast_shape");
  // batchnorm_relu_coupling_keeps_map answers where the forward can keep its map for a graph (a CPU
  // float variant: tests/cpu/test_nn.cpp checks it against the unfused ops bit for bit); no tensor.
  declared.erase("batchnorm_relu_coupling_keeps_map");
  // The recomputing stem exists only as a CPU float kernel (no ref:: or CUDA twin to compare in
  // this matrix): tests/cpu/test_conv_batchnorm.cpp checks it against the ref:: composition.
  for (const char* op : {"conv_batchnorm_relu_fits", "conv_batchnorm_relu_forward", "conv_batchnorm_relu_backward"})
    declared.erase(op);
  CHECK(declared.size() >= 30);  // the parse found the namespace
  std::set<std::string> covered;
  for (const bo::Case& c : bo::registry()) covered.insert(c.op);
  for (const std::string& op : declared) {
    CAPTURE(op);
    CHECK_MESSAGE(covered.count(op) == 1, "ops::", op, " has no case in tests/support/backend_ops.cpp");
  }
  for (const std::string& op : covered) {
    CAPTURE(op);
    CHECK_MESSAGE(declared.count(op) == 1, "case op ", op, " is not declared in ops:: (petra/ops.hpp, petra/optimizer_steps.hpp)");
  }
}

TEST_CASE("backend ops: the comparison catches a wrong value, a missed accumulation and a wrong index") {
  const auto is_f32 = [](const Tensor& t) { return t.dtype() == DType::f32; };
  SUBCASE("one element off by 1e-4 of the norm") {
    const bo::Case c{"add", "add, one element off",
                     [](bo::InputMaker& m) { return std::vector<Tensor>{m.uniform({1001}), m.uniform({1001})}; },
                     [&](const std::vector<Tensor>& x) {
                       Tensor z = ops::add(x[0], x[1]);
                       if (is_f32(z)) {
                         auto v = z.to_vector<float>();
                         v[500] += 2e-3f;  // ~1e-4 of the output's norm (~26)
                         z = Tensor::from_vector<float>(z.shape(), v);
                       }
                       return bo::Outputs{{"z", z}};
                     },
                     1e-6};
    const auto r = bo::compare(c, bo::cpu_backend());
    REQUIRE(r.outputs.size() == 1);
    CHECK_FALSE(r.ok());
    CHECK(r.outputs[0].error > 1e-5);
    CHECK(r.outputs[0].problem.find("relative error") != std::string::npos);
  }
  SUBCASE("an assignment where the contract accumulates") {
    const bo::Case c{"linear_backward_bias", "linear_backward_bias assigning",
                     [](bo::InputMaker& m) { return std::vector<Tensor>{m.uniform({5, 3}), m.uniform({3})}; },
                     [&](const std::vector<Tensor>& x) {
                       if (is_f32(x[1])) {
                         const Tensor fresh = Tensor::zeros(x[1].shape(), x[1].dtype());
                         ops::linear_backward_bias(x[0], fresh);
                         x[1].copy_from(fresh);  // db = ..., not db += ...
                       } else {
                         ops::linear_backward_bias(x[0], x[1]);
                       }
                       return bo::Outputs{{"db", x[1]}};
                     },
                     1e-5};
    const auto r = bo::compare(c, bo::cpu_backend());
    CHECK_FALSE(r.ok());
  }
  SUBCASE("an argmax off by one in one row") {
    const bo::Case c{"argmax", "argmax off by one",
                     [](bo::InputMaker& m) { return std::vector<Tensor>{m.uniform({7, 3})}; },
                     [&](const std::vector<Tensor>& x) {
                       Tensor p = ops::argmax(x[0]);
                       if (is_f32(x[0])) {
                         auto v = p.to_vector<std::int64_t>();
                         v[3] = (v[3] + 1) % 3;
                         p = Tensor::from_vector<std::int64_t>(p.shape(), v);
                       }
                       return bo::Outputs{{"predicted", p}};
                     },
                     0.0};
    const auto r = bo::compare(c, bo::cpu_backend());
    REQUIRE(r.outputs.size() == 1);
    CHECK_FALSE(r.ok());
    CHECK(r.outputs[0].error == 1);
  }
  SUBCASE("a DeviceError on the CPU is a failure, not a missing kernel") {
    const bo::Case c{"relu", "relu throwing",
                     [](bo::InputMaker& m) { return std::vector<Tensor>{m.uniform({4})}; },
                     [&](const std::vector<Tensor>& x) {
                       if (is_f32(x[0])) throw DeviceError("relu: no CUDA kernel yet (this op runs on the CPU only)");
                       return bo::Outputs{{"y", ops::relu(x[0])}};
                     },
                     1e-6};
    const auto r = bo::compare(c, bo::cpu_backend());
    CHECK_FALSE(r.ok());
    CHECK_FALSE(r.no_kernel);
    CHECK(r.error.find("no CUDA kernel yet") != std::string::npos);
  }
  SUBCASE("on a GPU backend, \"no CUDA kernel yet\" is a skip, never a pass; other DeviceErrors fail") {
    // A stand-in for cuda:0 whose tensors stay on the CPU, so that this runs without a GPU.
    const bo::Backend gpu{bo::Backend::Kind::cuda, Device::cpu(), DType::f32, 0};
    const auto throwing = [&](const char* message) {
      return bo::Case{"relu", std::string("relu throwing ") + message,
                      [](bo::InputMaker& m) { return std::vector<Tensor>{m.uniform({4})}; },
                      [&is_f32, message](const std::vector<Tensor>& x) {
                        if (is_f32(x[0])) throw DeviceError(message);
                        return bo::Outputs{{"y", ops::relu(x[0])}};
                      },
                      1e-6};
    };
    const bo::Case missing = throwing("relu: no CUDA kernel yet (this op runs on the CPU only)");
    const auto r = bo::compare(missing, gpu);
    CHECK(r.no_kernel);
    CHECK_FALSE(r.ok());
    CHECK(bo::check_backend(gpu, {missing}) == 0);  // reported with MESSAGE, not counted as compared
    const auto other = bo::compare(throwing("relu: x is on cuda:1, expected cuda:0"), gpu);
    CHECK_FALSE(other.no_kernel);
    CHECK_FALSE(other.ok());
  }
  SUBCASE("a wrong dtype or shape") {
    const bo::Case c{"scale", "scale returning float64 with one element more",
                     [](bo::InputMaker& m) { return std::vector<Tensor>{m.uniform({4})}; },
                     [&](const std::vector<Tensor>& x) {
                       const Tensor y = ops::scale(x[0], 2.0);
                       return bo::Outputs{{"y", y}, {"z", is_f32(y) ? y.to(DType::f64) : y},
                                          {"w", is_f32(y) ? Tensor::zeros({5}) : Tensor::zeros({4}, DType::f64)}};
                     },
                     1e-6};
    const auto r = bo::compare(c, bo::cpu_backend());
    REQUIRE(r.outputs.size() == 3);
    CHECK(r.outputs[0].ok);
    CHECK_FALSE(r.outputs[1].ok);
    CHECK(r.outputs[1].problem.find("float64") != std::string::npos);
    CHECK_FALSE(r.outputs[2].ok);
    CHECK(r.outputs[2].problem.find("shape") != std::string::npos);
  }
}
