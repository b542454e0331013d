// pipeline/nccl_transport.cpp: NCCL payloads and all-reduce for --mpi on GPUs (see the header).
// Compile-checked against CUDA 13's NCCL; not run with two ranks (one GPU at most was ever lent).
#include "petra/pipeline/nccl_transport.hpp"

#include <fmt/format.h>

#include "petra/config.hpp"
#include "petra/error.hpp"
#include "petra/stream.hpp"

#if PETRA_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace petra::pipeline {

bool nccl_compiled() { return PETRA_HAVE_NCCL != 0; }

#if PETRA_HAVE_NCCL

namespace {

void check_nccl(ncclResult_t result, const char* call, ncclComm_t comm = nullptr) {
  if (result == ncclSuccess) return;
  const char* detail = ncclGetLastError(comm);
  const std::string message = fmt::format("{} failed: {}{}{}", call, ncclGetErrorString(result),
                                          detail && *detail ? ": " : "", detail ? detail : "");
  // Usage and system errors (a duplicate GPU, no driver, a lost peer) are about the machine.
  if (result == ncclInvalidUsage || result == ncclSystemError || result == ncclUnhandledCudaError ||
      result == ncclRemoteError)
    throw DeviceError(message);
  throw Error(message);
}

void check_mpi(int code, const char* call) {
  if (code != MPI_SUCCESS) throw Error(fmt::format("{} failed (MPI error {})", call, code));
}

void select_gpu(Device device) {
  PETRA_CHECK(device.is_cuda(), ValueError, "nccl: ", device.str(), " is not a GPU");
  const cudaError_t e = cudaSetDevice(device.index);
  if (e != cudaSuccess)
    throw DeviceError(fmt::format("nccl: cudaSetDevice({}) failed: {}", device.index, cudaGetErrorString(e)));
}

// One communicator over the processes of `comm`: the first makes the unique id and sends it to
// all, with whether it could (so that a failure there stops every process, not only the first).
ncclComm_t communicator_over(MPI_Comm comm, Device device) {
  int rank = 0, size = 1;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  struct {
    int result = ncclSuccess;
    ncclUniqueId id{};
  } bootstrap;
  if (rank == 0) bootstrap.result = ncclGetUniqueId(&bootstrap.id);
  check_mpi(MPI_Bcast(&bootstrap, sizeof bootstrap, MPI_BYTE, 0, comm), "MPI_Bcast");
  check_nccl(static_cast<ncclResult_t>(bootstrap.result), "ncclGetUniqueId (on the first process)");
  select_gpu(device);
  ncclComm_t communicator = nullptr;
  check_nccl(ncclCommInitRank(&communicator, size, bootstrap.id, rank), "ncclCommInitRank");
  return communicator;
}

cudaStream_t native(const Stream& stream) { return static_cast<cudaStream_t>(stream.handle().cuda_stream); }

std::int64_t bytes_of(const Tensor& t) {
  return t.defined() ? t.numel() * static_cast<std::int64_t>(size_of(t.dtype())) : 0;
}

// A communicator destroyed with its owner (after the owner's streams are idle).
struct Communicator {
  ncclComm_t comm = nullptr;
  explicit Communicator(ncclComm_t c) : comm(c) {}
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator() {
    if (comm) ncclCommDestroy(comm);
  }
};

class NcclPayloads : public PayloadTransport {
 public:
  // The two communicators are made in the same order on every process (collective).
  NcclPayloads(MPI_Comm comm, Device device)
      : device_(device),
        up_(communicator_over(comm, device)),
        down_(communicator_over(comm, device)),
        send_up_(device),
        send_down_(device) {}
  ~NcclPayloads() override {
    try {
      send_up_.synchronize();
      send_down_.synchronize();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "nccl: sends still in flight at exit: %s\n", e.what());
    }
  }
  Transport kind() const override { return Transport::nccl; }

  class Sending : public PendingSend {
   public:
    explicit Sending(Device device) : finished(device) {}
    Tensor payload;  // alive until the send stream has read it
    Event finished;
    bool done() override { return finished.query(); }
    void wait() override { finished.synchronize(); }
  };

  std::unique_ptr<PendingSend> send(const Tensor& payload, int peer, int, Direction direction) override {
    auto sending = std::make_unique<Sending>(device_);
    if (bytes_of(payload) == 0) return sending;  // nothing on the wire: the header says it all
    PETRA_CHECK(payload.device() == device_, DeviceError, "nccl: a message on ", payload.device().str(),
                " from a process training on ", device_.str());
    Stream& producer = Stream::for_device(device_);
    Stream& sender = direction == Direction::up ? send_up_ : send_down_;
    Event written(device_);
    written.record(producer);
    sender.wait(written);
    const ncclComm_t comm = communicator(direction);
    check_nccl(ncclSend(payload.raw_data(), static_cast<std::size_t>(bytes_of(payload)), ncclUint8, peer, comm,
                        native(sender)),
               "ncclSend", comm);
    payload.storage()->record_stream(sender);
    sending->payload = payload;
    sending->finished.record(sender);
    return sending;
  }

  std::string receive(Tensor& into, const PayloadLayout& layout, int peer, int, Direction direction,
                      Device device) override {
    if (!layout.defined) return {};
    PETRA_CHECK(device == device_, DeviceError, "nccl: a message for ", device.str(), " in a process training on ",
                device_.str());
    into = Tensor::empty(layout.shape, layout.dtype, device);
    if (layout.bytes == 0) return {};
    const ncclComm_t comm = communicator(direction);
    check_nccl(ncclRecv(into.raw_data(), static_cast<std::size_t>(layout.bytes), ncclUint8, peer, comm,
                        native(Stream::for_device(device))),
               "ncclRecv", comm);
    return {};
  }

  // The size of a refused header's payload is unknown, so NCCL cannot take it off the wire; the
  // receiver raises and the run stops (mpirun ends the other processes).
  bool discard(int, int, Direction) override { return false; }

 private:
  ncclComm_t communicator(Direction d) const { return d == Direction::up ? up_.comm : down_.comm; }
  Device device_;
  Communicator up_, down_;
  Stream send_up_, send_down_;
};

class NcclAllReduce : public DeviceAllReduce {
 public:
  NcclAllReduce(MPI_Comm comm, Device device) : device_(device), communicator_(communicator_over(comm, device)) {}
  void sum(const Tensor& values) override {
    PETRA_CHECK(values.device() == device_, DeviceError, "nccl all-reduce: a tensor on ", values.device().str(),
                " in a process training on ", device_.str());
    PETRA_CHECK(values.dtype() == DType::f32 || values.dtype() == DType::f64, ValueError,
                "nccl all-reduce: tensors of dtype ", name_of(values.dtype()), " cannot be summed");
    PETRA_CHECK(values.is_contiguous(), ValueError, "nccl all-reduce: ", values.str(), " is not contiguous");
    const ncclDataType_t type = values.dtype() == DType::f64 ? ncclFloat64 : ncclFloat32;
    check_nccl(ncclAllReduce(values.raw_data(), values.raw_data(), static_cast<std::size_t>(values.numel()), type,
                             ncclSum, communicator_.comm, native(Stream::for_device(device_))),
               "ncclAllReduce", communicator_.comm);
  }

 private:
  Device device_;
  Communicator communicator_;
};

}  // namespace

std::unique_ptr<PayloadTransport> nccl_payload_transport(MPI_Comm comm, Device device) {
  return std::make_unique<NcclPayloads>(comm, device);
}

std::unique_ptr<DeviceAllReduce> nccl_all_reduce(MPI_Comm comm, Device device) {
  return std::make_unique<NcclAllReduce>(comm, device);
}

#else  // no NCCL in this build

std::unique_ptr<PayloadTransport> nccl_payload_transport(MPI_Comm, Device) {
  throw DeviceError("--transport nccl: petra was built without NCCL; use --transport mpi");
}

std::unique_ptr<DeviceAllReduce> nccl_all_reduce(MPI_Comm, Device) {
  throw DeviceError("--replicas on GPUs with NCCL: petra was built without NCCL; use --transport mpi");
}

#endif

}  // namespace petra::pipeline
