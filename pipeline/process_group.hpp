// pipeline/process_group.hpp: the processes of a training run spread over MPI (petra-train --mpi),
// as the trainer sees them. No MPI type appears here, so the trainer builds the same with or without
// MPI; pipeline/mpi_executor.cpp implements it where MPI is found.
//
// Each process hosts a contiguous group of stages and runs their cells (pipeline/mpi_executor.hpp).
// At the end of an epoch the processes agree on what happened: the head's numbers are summed over
// the processes, and every stage's parameters and buffers (batch norm's running statistics) go from
// the process that trained them to all, so every process holds the whole model and evaluates it
// identically.
//
// Data-parallel replicas (--replicas R): R copies of the pipeline, replica r trains the mini-batches
// r, r + R, r + 2R, ... of each epoch, and every update of a stage first averages its gradients
// over the replicas (MPI_Reduce then MPI_Bcast, so that every replica gets the same bits and the
// copies never drift apart). Batch norm's running statistics stay per replica during an epoch; at
// its end every process takes replica 0's, as PyTorch's DistributedDataParallel does with buffers.
//
// GPUs (--devices cuda:N under --mpi): each process trains all its stages on one GPU, entry
// (local rank mod count) of --devices, the local rank being the process's rank among those of its
// host. The messages' payloads and the replicas' sums then go over NCCL (--transport auto or nccl,
// where petra is built with NCCL; pipeline/nccl_transport.hpp) or through host copies over MPI
// (--transport mpi). The end-of-epoch exchanges (share_model, sum) and checkpoints stay on MPI,
// device tensors through host copies: they happen once an epoch.
//
// Checkpoints (Trainer::save_checkpoint): each process writes its part (its stages' optimizer state,
// gradients and state in flight, after collect_in_flight has taken off the wire the messages its
// stages have been sent but not yet read) and sends it to the first process, which writes the one
// checkpoint directory and its one MANIFEST. A resume goes the other way: the first process reads
// and verifies the checkpoint and sends it to all. So only the first process needs to see the
// checkpoint directory.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "petra/nn/models.hpp"
#include "petra/pipeline/checkpoint.hpp"
#include "petra/pipeline/executor.hpp"
#include "petra/pipeline/transport.hpp"

namespace petra::pipeline {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // --replicas R: the size() processes hold R copies of the pipeline, each spread over size() / R
  // processes (replica r: ranks [r * size() / R, (r + 1) * size() / R)). This process's copy is replica().
  virtual int replica() const = 0;
  virtual int replicas() const = 0;
  // The device this process trains on (cpu:0 without --devices) and what carries its messages.
  virtual Device device() const = 0;
  virtual Transport transport() const = 0;
  // Collective among the processes hosting the same stage in every replica: each gradient of
  // `parameters` becomes the mean over the replicas, the same bits on each.
  virtual void average_over_replicas(const std::vector<Variable>& parameters) = 0;
  // The executor of this process's stages (contiguous groups, balanced by count).
  virtual std::unique_ptr<SequentialExecutor> make_executor(nn::Model& model, const RuntimeOptions& options) = 0;
  // Element-wise sums over the processes, in place.
  virtual void sum(std::span<double> values) = 0;
  // Every stage's parameters and buffers, from the process hosting it to all (collective).
  virtual void share_model(nn::Model& model) = 0;
  // True when stage j's cells run in this process (after make_executor).
  virtual bool hosts(int stage) const = 0;
  // Receives, into the executor's in-process channels, every message that a stage of this process
  // reads after step `boundary` of `schedule` but that another process sent before it: then the
  // executor's save_in_flight holds this process's whole state in flight. Every process must have
  // run the steps before `boundary`. The executor must be the one make_executor returned.
  virtual void collect_in_flight(SequentialExecutor& executor, const Schedule& schedule, std::int64_t boundary) = 0;
  // Collective: every process's files, in rank order, on the first process; nothing elsewhere.
  virtual std::vector<FileBytes> gather_files(const std::vector<FileBytes>& mine) = 0;
  // Collective: the first process's files on every process.
  virtual std::vector<FileBytes> broadcast_files(const std::vector<FileBytes>& from_first) = 0;
  // Collective: "" when every process passes "", else the message of the lowest rank that failed,
  // on every process; so that a failure on one process stops all instead of leaving them waiting.
  virtual std::string first_error(const std::string& mine) = 0;
};

// The processes of MPI_COMM_WORLD as `replicas` copies of the pipeline; initialises MPI if needed
// (and finalises it at exit). Each process trains on device_of_process(devices, local rank) with
// resolve_transport(transport, ...) (pipeline/transport.hpp). ValueError when `replicas` does not
// divide the number of processes, DeviceError when petra was built without MPI, when NCCL is asked
// for where it is not built, or when two processes of a host would share a GPU under NCCL (on
// every process alike: the check is collective).
std::unique_ptr<ProcessGroup> mpi_process_group(int replicas = 1, Transport transport = Transport::automatic,
                                                const std::vector<Device>& devices = {});

}  // namespace petra::pipeline
