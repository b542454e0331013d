// pipeline/process_group_none.cpp: pipeline/process_group.hpp for builds without MPI.
#include "petra/pipeline/process_group.hpp"

namespace petra::pipeline {

std::unique_ptr<ProcessGroup> mpi_process_group(int, Transport, const std::vector<Device>&) {
  throw DeviceError("--mpi: petra was built without MPI (install libopenmpi-dev and reconfigure)");
}

}  // namespace petra::pipeline
