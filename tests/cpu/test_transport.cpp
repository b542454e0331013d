// tests/cpu/test_transport.cpp: the parts of the multi-process transports that need no MPI, NCCL or
// GPU (pipeline/transport.hpp): which transport a run gets (--transport), which GPU each process
// of --mpi trains on, the duplicate-GPU refusal NCCL needs, and the wire header every message
// carries over MPI, encoded and checked on arrival.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "petra/error.hpp"
#include "petra/pipeline/run_config.hpp"
#include "petra/pipeline/transport.hpp"

using namespace petra;
using namespace petra::pipeline;

namespace {

std::string message_of(const auto& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("transport: --transport parses auto, mpi and nccl, and names the flag otherwise") {
  CHECK(parse_transport("auto") == Transport::automatic);
  CHECK(parse_transport("mpi") == Transport::mpi);
  CHECK(parse_transport("nccl") == Transport::nccl);
  CHECK(name_of(Transport::nccl) == "nccl");
  CHECK_THROWS_AS(parse_transport("gloo"), ValueError);
  CHECK(message_of([] { parse_transport("NCCL"); }).find("--transport 'NCCL'") != std::string::npos);
}

TEST_CASE("transport: auto is NCCL for a GPU where NCCL is built, MPI otherwise") {
  CHECK(resolve_transport(Transport::automatic, Device::cuda(0), true) == Transport::nccl);
  CHECK(resolve_transport(Transport::automatic, Device::cuda(0), false) == Transport::mpi);
  CHECK(resolve_transport(Transport::automatic, Device::cpu(), true) == Transport::mpi);
  CHECK(resolve_transport(Transport::mpi, Device::cuda(1), true) == Transport::mpi);  // host copies: always allowed
  CHECK(resolve_transport(Transport::nccl, Device::cuda(1), true) == Transport::nccl);
  // nccl on the CPU: a bad argument; nccl not built: the machine's (petra-train's exit 6).
  CHECK_THROWS_AS(resolve_transport(Transport::nccl, Device::cpu(), true), ValueError);
  CHECK_THROWS_AS(resolve_transport(Transport::nccl, Device::cuda(0), false), DeviceError);
  CHECK(message_of([] { resolve_transport(Transport::nccl, Device::cuda(0), false); }).find("built without NCCL") !=
        std::string::npos);
}

TEST_CASE("transport: each process of --mpi trains on entry (local rank mod count) of --devices") {
  CHECK(device_of_process({}, 3) == Device::cpu());
  const std::vector<Device> four = {Device::cuda(0), Device::cuda(1), Device::cuda(2), Device::cuda(3)};
  CHECK(device_of_process(four, 0) == Device::cuda(0));
  CHECK(device_of_process(four, 3) == Device::cuda(3));
  CHECK(device_of_process(four, 5) == Device::cuda(1));  // 6 processes on a host of 4 GPUs
  CHECK(device_of_process({Device::cuda(2)}, 7) == Device::cuda(2));
  CHECK_THROWS_AS(device_of_process({Device::cpu(1)}, 0), ValueError);
}

TEST_CASE("transport: two processes of a host on one GPU are named before NCCL refuses them") {
  CHECK(duplicate_gpu({0, 1, 2, 3}).empty());
  CHECK(duplicate_gpu({0}).empty());
  const std::string shared = duplicate_gpu({0, 1, 1});
  CHECK(shared.find("local ranks 1 and 2") != std::string::npos);
  CHECK(shared.find("cuda:1") != std::string::npos);
  CHECK(shared.find("--transport mpi") != std::string::npos);
}

TEST_CASE("transport: run configuration: --mpi takes GPUs only, --transport needs --mpi, nccl needs a GPU") {
  TrainConfig c;
  c.dataset = "synthetic";
  c.mpi = true;
  c.devices = {Device::cpu(1)};
  CHECK_THROWS_AS(validate(c), ValueError);
  CHECK(message_of([&] { validate(c); }).find("--mpi --devices cpu:1") != std::string::npos);
  c.devices.clear();
  validate(c);  // one CPU worker per process, as before
  c.transport = Transport::nccl;  // but the process trains on the CPU
  CHECK(message_of([&] { validate(c); }).find("--transport nccl moves device tensors") != std::string::npos);
  c.transport = Transport::mpi;
  c.mpi = false;
  CHECK(message_of([&] { validate(c); }).find("--transport mpi carries the messages") != std::string::npos);
  // A GPU that is not there: DeviceError naming it, before anything else (exit 6 in petra-train),
  // checked here only where this machine has no cuda:7.
  c.mpi = true;
  c.transport = Transport::automatic;
  c.devices = {Device::cuda(7)};
  CHECK_THROWS_AS(validate(c), DeviceError);
}

TEST_CASE("transport: a header round-trips kind, mini-batch, dtypes and shapes, and sizes its payloads") {
  const Tensor activation = Tensor::zeros({4, 6, 8, 8});
  const Tensor labels = Tensor::zeros({4}, DType::i64);
  const std::vector<std::int64_t> header = encode_header(0, 17, activation, labels);
  REQUIRE(header.size() == static_cast<std::size_t>(kWireHeaderSize));
  const DecodedHeader h = decode_header(header, 0, 17);
  CHECK(h.wrong.empty());
  CHECK(h.payload[0].defined);
  CHECK(h.payload[0].shape == Shape({4, 6, 8, 8}));
  CHECK(h.payload[0].dtype == DType::f32);
  CHECK(h.payload[0].bytes == 4 * 6 * 8 * 8 * 4);
  CHECK(h.payload[1].dtype == DType::i64);
  CHECK(h.payload[1].bytes == 4 * 8);
  // An undefined tensor (nothing to send) has no payload bytes.
  const DecodedHeader none = decode_header(encode_header(1, 3, activation, Tensor()), 1, 3);
  CHECK(none.wrong.empty());
  CHECK_FALSE(none.payload[1].defined);
  CHECK(none.payload[1].bytes == 0);
}

TEST_CASE("transport: a malformed header is described, never trusted") {
  const std::vector<std::int64_t> good = encode_header(0, 5, Tensor::zeros({2, 3}), Tensor::zeros({2}, DType::i64));
  CHECK(decode_header(good, 1, 5).wrong == "kind 0, expected 1");
  CHECK(decode_header(good, 0, 6).wrong == "it carries mini-batch 5");
  CHECK(decode_header(std::span(good).first(17), 0, 5).wrong == "a header of 17 values, expected 18");
  std::vector<std::int64_t> bad = good;
  bad[2] = 99;  // dtype
  CHECK(decode_header(bad, 0, 5).wrong.find("tensor 0: dtype 99") != std::string::npos);
  bad = good;
  bad[3] = 7;  // rank beyond the 6 dims the header holds
  CHECK(decode_header(bad, 0, 5).wrong.find("rank 7") != std::string::npos);
  bad = good;
  bad[4] = -2;  // a negative dimension
  CHECK(decode_header(bad, 0, 5).wrong == "tensor 0: a dimension of -2");
  bad = good;
  bad[4] = bad[5] = std::int64_t{1} << 30;  // 2^60 elements: refused before any allocation
  CHECK(decode_header(bad, 0, 5).wrong.find("a dimension of") != std::string::npos);
  CHECK_THROWS_AS(encode_header(0, 0, Tensor::zeros({1, 1, 1, 1, 1, 1, 2}), Tensor()), ShapeError);
}
