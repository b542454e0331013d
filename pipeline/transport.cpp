// pipeline/transport.cpp: the choice of transport and the wire header of pipeline/transport.hpp
// (plain C++, no MPI: unit-tested on the CPU by tests/cpu/test_transport.cpp).
#include "petra/pipeline/transport.hpp"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "petra/error.hpp"

namespace petra::pipeline {

Transport parse_transport(std::string_view text) {
  if (text == "auto") return Transport::automatic;
  if (text == "mpi") return Transport::mpi;
  if (text == "nccl") return Transport::nccl;
  throw ValueError(fmt::format("--transport '{}': expected auto, mpi or nccl", text));
}

std::string_view name_of(Transport transport) {
  switch (transport) {
    case Transport::automatic: return "auto";
    case Transport::mpi: return "mpi";
    case Transport::nccl: return "nccl";
  }
  return "?";
}

Transport resolve_transport(Transport requested, Device device, bool nccl_built) {
  if (requested == Transport::mpi) return Transport::mpi;
  if (requested == Transport::automatic) return device.is_cuda() && nccl_built ? Transport::nccl : Transport::mpi;
  PETRA_CHECK(device.is_cuda(), ValueError, "--transport nccl moves device tensors, but this process trains on ",
              device.str(), ": name GPUs with --devices cuda:N, or use --transport mpi");
  PETRA_CHECK(nccl_built, DeviceError, "--transport nccl: petra was built without NCCL (nccl.h and libnccl were not "
              "found at configure time); use --transport mpi");
  return Transport::nccl;
}

Device device_of_process(const std::vector<Device>& devices, int local_rank) {
  if (devices.empty()) return Device::cpu();
  for (const Device& d : devices)
    PETRA_CHECK(d.is_cuda(), ValueError, "--mpi --devices ", d.str(), ": under --mpi each process is one CPU worker; "
                "leave --devices out, or name GPUs (process of local rank L trains on entry L mod count)");
  PETRA_CHECK(local_rank >= 0, ValueError, "device_of_process: local rank ", local_rank);
  return devices[static_cast<std::size_t>(local_rank) % devices.size()];
}

std::string duplicate_gpu(const std::vector<int>& gpu_of_local_rank) {
  std::map<int, std::size_t> first_on;
  for (std::size_t r = 0; r < gpu_of_local_rank.size(); ++r) {
    const auto [at, fresh] = first_on.emplace(gpu_of_local_rank[r], r);
    if (!fresh)
      return fmt::format("processes of local ranks {} and {} of one host both train on cuda:{}, and NCCL refuses two "
                         "ranks of a communicator on one GPU; give each process its own GPU (--devices with as many "
                         "GPUs as processes per host) or use --transport mpi",
                         at->second, r, gpu_of_local_rank[r]);
  }
  return {};
}

namespace {

void describe_tensor(const Tensor& t, std::vector<std::int64_t>& header, int at) {
  if (!t.defined()) {
    header[static_cast<std::size_t>(at)] = header[static_cast<std::size_t>(at + 1)] = -1;
    return;
  }
  PETRA_CHECK(t.shape().ndim() <= kWireMaxDims, ShapeError, "message header: tensor ", t.str(), " has more than ",
              kWireMaxDims, " dims");
  header[static_cast<std::size_t>(at)] = static_cast<std::int64_t>(t.dtype());
  header[static_cast<std::size_t>(at + 1)] = static_cast<std::int64_t>(t.shape().ndim());
  for (int d = 0; d < static_cast<int>(t.shape().ndim()); ++d)
    header[static_cast<std::size_t>(at + 2 + d)] = t.shape()[d];
}

}  // namespace

std::vector<std::int64_t> encode_header(int kind, std::int64_t microbatch, const Tensor& first, const Tensor& second) {
  std::vector<std::int64_t> header(kWireHeaderSize, 0);
  header[0] = kind;
  header[1] = microbatch;
  describe_tensor(first, header, 2);
  describe_tensor(second, header, 2 + 2 + kWireMaxDims);
  return header;
}

DecodedHeader decode_header(std::span<const std::int64_t> values, int expected_kind, std::int64_t expected_microbatch) {
  DecodedHeader h;
  if (values.size() != kWireHeaderSize) {
    h.wrong = fmt::format("a header of {} values, expected {}", values.size(), kWireHeaderSize);
    return h;
  }
  if (values[0] != expected_kind) {
    h.wrong = fmt::format("kind {}, expected {}", values[0], expected_kind);
    return h;
  }
  if (values[1] != expected_microbatch) {
    h.wrong = fmt::format("it carries mini-batch {}", values[1]);
    return h;
  }
  for (int i = 0; i < 2; ++i) {
    const std::int64_t* d = &values[static_cast<std::size_t>(2 + i * (2 + kWireMaxDims))];
    PayloadLayout& p = h.payload[i];
    if (d[0] < 0) continue;  // an undefined tensor
    if (d[0] > static_cast<std::int64_t>(DType::u8) || d[1] < 0 || d[1] > kWireMaxDims) {
      h.wrong = fmt::format("tensor {}: dtype {} rank {}", i, d[0], d[1]);
      return h;
    }
    std::int64_t numel = 1;
    for (std::int64_t k = 0; k < d[1]; ++k) {
      const std::int64_t n = d[2 + k];
      if (n < 0 || (n > 0 && numel > (std::int64_t{1} << 40) / n)) {
        h.wrong = fmt::format("tensor {}: a dimension of {}", i, n);
        return h;
      }
      numel *= n;
    }
    p.defined = true;
    p.dtype = static_cast<DType>(d[0]);
    p.shape = Shape(std::span<const std::int64_t>(d + 2, static_cast<std::size_t>(d[1])));
    p.bytes = numel * static_cast<std::int64_t>(size_of(p.dtype));
  }
  return h;
}

}  // namespace petra::pipeline
