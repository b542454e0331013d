// pipeline/nccl_transport.hpp: NCCL for petra-train --mpi on GPUs: the payloads of the stages'
// messages (ncclSend / ncclRecv) and the replicas' gradient sums (ncclAllReduce), with
// communicators bootstrapped through MPI.
//
// Bootstrap (every constructor here is collective over its MPI communicator): the first process
// calls ncclGetUniqueId and broadcasts it with MPI_Bcast, then every process selects its GPU and
// calls ncclCommInitRank with its rank of that communicator. NCCL refuses two ranks of one
// communicator on one GPU, so the process group checks first that the processes of a host train
// on different GPUs (pipeline/transport.hpp, duplicate_gpu) and names them if not.
//
// Streams. A message's payload is produced on the sending stage's stream; the send waits for it
// through an event and runs on a stream of its own per direction (one for "up", one for "down"),
// so a stage's next kernels never queue behind a send that waits for a neighbour. The two
// directions are two communicators: between two neighbours each communicator carries one way only,
// in schedule order, so the sends and receives of each match in the order both sides issue them.
// A receive runs on the receiving stage's stream (Stream::for_device), which the stage's kernels
// then follow; no event is needed. A sent tensor is kept alive, and its block marked as used by
// the send stream, until the send's completion event has passed.
//
// Compiled wherever MPI is; without NCCL (PETRA_HAVE_NCCL = 0) the factories throw DeviceError.
// Nothing here has run on a GPU with two ranks: see docs/distributed.md, "NCCL".
#pragma once

#include <mpi.h>

#include <memory>

#include "petra/device.hpp"
#include "petra/pipeline/transport.hpp"
#include "petra/tensor.hpp"

namespace petra::pipeline {

// True when petra was built with NCCL.
bool nccl_compiled();

// Payloads over NCCL among the processes of `comm` (borrowed), each on its GPU `device`.
// Collective over `comm`. DeviceError when NCCL is not built or a communicator cannot be made.
std::unique_ptr<PayloadTransport> nccl_payload_transport(MPI_Comm comm, Device device);

// Element-wise sums of device tensors over the processes of an MPI communicator, in place.
class DeviceAllReduce {
 public:
  virtual ~DeviceAllReduce() = default;
  // Collective: every process passes a tensor of the same shape and dtype (f32 or f64) on its GPU;
  // each gets the same bits (NCCL transmits the finished sum unchanged to every rank). Queued on
  // the device's stream of the calling thread.
  virtual void sum(const Tensor& values) = 0;
};

// ncclAllReduce(ncclSum) over the processes of `comm` (borrowed), each on GPU `device`. Collective.
std::unique_ptr<DeviceAllReduce> nccl_all_reduce(MPI_Comm comm, Device device);

}  // namespace petra::pipeline
