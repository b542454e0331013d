// pipeline/transport.hpp: how the messages between stages on different processes travel, as the
// MPI executor (pipeline/mpi_executor.hpp) sees it, with no MPI or NCCL type in sight.
//
// A message between processes is a header and two payloads (activation and labels going up, input
// and gradient going down). The header always goes over MPI: 18 int64 [kind, mini-batch, then per
// tensor: dtype, rank, 6 dims], tagged kind * 4096 + receiving stage, and checked on arrival
// against what the schedule expects before anything is allocated (decode_header). The payloads go
// through a PayloadTransport:
//   - MPI (pipeline/mpi_executor.cpp): the tensor's bytes with the header's tag; a device tensor
//     is staged through host memory (Open MPI here is not CUDA-aware);
//   - NCCL (pipeline/nccl_transport.cpp): ncclSend / ncclRecv of device memory, one communicator
//     per direction (up, down) so that two neighbours sending to each other never wait on each
//     other's queue; sends on a dedicated stream per direction, receives on the stage's stream.
// So the wire is the same tagged, checked FIFO per neighbour pair whatever carries the bytes.
//
// Which transport a run uses (--transport, resolve_transport): "auto" takes NCCL when the process
// trains on a GPU and petra was built with NCCL, MPI otherwise; "nccl" on the CPU, or where NCCL is
// not built, is refused naming the flag. Under --mpi each process trains on one device:
// device_of_process picks entry (local rank mod count) of --devices, so one list serves every host.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "petra/device.hpp"
#include "petra/dtype.hpp"
#include "petra/shape.hpp"
#include "petra/tensor.hpp"

namespace petra::pipeline {

enum class Transport { automatic, mpi, nccl };

// "auto", "mpi" or "nccl"; ValueError naming --transport otherwise.
Transport parse_transport(std::string_view text);
std::string_view name_of(Transport transport);

// The transport of a process training on `device`: NCCL for a GPU where NCCL is built (auto), MPI
// otherwise. ValueError for nccl on a CPU device, DeviceError for nccl where `nccl_built` is false.
Transport resolve_transport(Transport requested, Device device, bool nccl_built);

// The device of the process of local rank `local_rank` (its rank among the processes of its host):
// cpu:0 when `devices` is empty, else devices[local_rank % devices.size()]. ValueError when
// `devices` names a CPU device (under --mpi a process is one CPU worker: leave --devices out).
Device device_of_process(const std::vector<Device>& devices, int local_rank);

// NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected"): given the GPU
// index of each local rank of a host, "" when they differ, else a message naming two local ranks
// that share one.
std::string duplicate_gpu(const std::vector<int>& gpu_of_local_rank);

// ---- the header every message carries over MPI
constexpr int kWireHeaderSize = 18;  // kind, mini-batch, then (dtype, rank, 6 dims) per tensor
constexpr int kWireMaxDims = 6;

// What a header says of one payload.
struct PayloadLayout {
  bool defined = false;  // false: no tensor (e.g. no labels going down), 0 bytes
  DType dtype = DType::f32;
  Shape shape;
  std::int64_t bytes = 0;
};

// The header of a message of `kind` for `microbatch` with tensors `first` and `second` (either may
// be undefined). ShapeError for a tensor of more than kWireMaxDims dims.
std::vector<std::int64_t> encode_header(int kind, std::int64_t microbatch, const Tensor& first, const Tensor& second);

struct DecodedHeader {
  std::string wrong;  // "" when the header is what the receiver expects; else what differs
  PayloadLayout payload[2];
};

// Reads a header of `values` int64 received for a message of `expected_kind` and mini-batch
// `expected_microbatch`; never throws: whatever is wrong (count, kind, mini-batch, dtype, rank, a
// negative or huge dimension) is described in `wrong`, so the caller can still drain the payloads.
DecodedHeader decode_header(std::span<const std::int64_t> values, int expected_kind, std::int64_t expected_microbatch);

// ---- what carries the payloads
enum class Direction { up, down };  // up: forward messages (stage j -> j + 1); down: backward

class PayloadTransport {
 public:
  // A payload on its way; keeps alive what must live until the bytes have left.
  class PendingSend {
   public:
    virtual ~PendingSend() = default;
    virtual bool done() = 0;  // never blocks
    virtual void wait() = 0;
  };

  virtual ~PayloadTransport() = default;
  virtual Transport kind() const = 0;
  // Starts sending `payload` (contiguous, possibly undefined) to process `peer` of the pipeline.
  virtual std::unique_ptr<PendingSend> send(const Tensor& payload, int peer, int tag, Direction direction) = 0;
  // Receives the payload `layout` announces from `peer` into a new tensor on `device` (allocated
  // under the caller's MemoryScope). Returns "" or what was wrong with the bytes that came (then
  // `into` is undefined and the payload is off the wire).
  virtual std::string receive(Tensor& into, const PayloadLayout& layout, int peer, int tag, Direction direction,
                              Device device) = 0;
  // Takes off the wire the payload of a refused header, so that the sender is not left blocked;
  // false when the transport cannot (NCCL: the size is unknown; the run stops anyway).
  virtual bool discard(int peer, int tag, Direction direction) = 0;
};

}  // namespace petra::pipeline
