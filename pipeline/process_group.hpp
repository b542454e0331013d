// pipeline/process_group.hpp: the processes of a training run spread over MPI (petra-train --mpi),
// as the trainer sees them. No MPI type appears here, so the trainer builds the same with or without
// MPI; pipeline/mpi_executor.cpp implements it where MPI is found.
//
// Each process hosts a contiguous group of stages and runs their cells (pipeline/mpi_executor.hpp).
// At the end of an epoch the processes agree on what happened: the head's numbers are summed over
// the processes, and every stage's parameters and buffers (batch norm's running statistics) go from
// the process that trained them to all, so every process holds the whole model and evaluates it
// identically.
#pragma once

#include <memory>
#include <span>

#include "petra/nn/models.hpp"
#include "petra/pipeline/executor.hpp"

namespace petra::pipeline {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The executor of this process's stages (contiguous groups, balanced by count).
  virtual std::unique_ptr<SequentialExecutor> make_executor(nn::Model& model, const RuntimeOptions& options) = 0;
  // Element-wise sums over the processes, in place.
  virtual void sum(std::span<double> values) = 0;
  // Every stage's parameters and buffers, from the process hosting it to all (collective).
  virtual void share_model(nn::Model& model) = 0;
};

// The processes of MPI_COMM_WORLD; initialises MPI if needed (and finalises it at exit). DeviceError
// when petra was built without MPI.
std::unique_ptr<ProcessGroup> mpi_process_group();

}  // namespace petra::pipeline
