// pipeline/mpi_executor.hpp: a schedule run by several processes, each hosting a contiguous group of
// stages; the messages between stages of different processes travel over MPI.
//
// Every process builds the same model (same seed) and the same schedule, and runs, step after step,
// the cells of its own stages in increasing stage order, exactly as a worker of the concurrent
// executor does. A message to a stage of the same process goes through the in-process channel; one
// to another process is sent with MPI_Isend (so two neighbours sending to each other in the same
// step never block each other) and received with a blocking receive that has a deadline. So on the
// CPU the parameters of every stage are bit-identical to the sequential executor's.
//
// Wire format of one message (two tensors: activation and labels going up, input and gradient going
// down): a header of 18 int64 [kind, mini-batch, then per tensor: dtype, rank, 6 dims] over MPI with
// the tag kind * 4096 + receiving stage, followed by each tensor's bytes through the payload
// transport (pipeline/transport.hpp: MPI with the same tag, or NCCL for device tensors). MPI keeps
// messages of one (source, tag) in order, and NCCL those of one (communicator, peer), so each
// neighbour pair is a FIFO, as a channel. The receiver checks the kind, the mini-batch id the
// schedule expects and every size, and a mismatch is an Error naming the stage, the mini-batch and
// what differs: never a crash or a silent mix-up.
//
// On a GPU (petra-train --mpi --devices cuda:N) the process's stages live on its device; a message
// received is allocated there, on the device's stream of the calling thread, which the stage's
// kernels then run on (so a NCCL receive needs no event: it is in that stream's order).
//
// The labels travel with the activations up to the head (the choice of the in-process executors
// too), so only the first stage's process reads data.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <deque>
#include <vector>

#include "petra/pipeline/executor.hpp"
#include "petra/pipeline/transport.hpp"

namespace petra::pipeline {

class MpiExecutor : public SequentialExecutor {
 public:
  // rank_of_stage[j]: the process (rank of `comm`) that hosts stage j; contiguous and covering
  // every rank of `comm`. The communicator is borrowed: MPI must stay initialised while this lives.
  // `payloads` carries the tensors' bytes (null: MPI over `comm`); messages received go to `device`.
  MpiExecutor(nn::Model& model, const RuntimeOptions& options, std::vector<int> rank_of_stage,
              MPI_Comm comm = MPI_COMM_WORLD, std::unique_ptr<PayloadTransport> payloads = nullptr,
              Device device = Device::cpu());
  // Waits for the sends still in flight (a complete schedule has had them all received).
  ~MpiExecutor() override;

  // Executes steps [first, last) of `schedule` for this process's stages.
  void run(const Schedule& schedule, std::int64_t first, std::int64_t last, const BatchSource& batches,
           const HeadCallback& on_head) override;

  int rank() const { return rank_; }
  Transport transport() const { return payloads_->kind(); }
  bool hosts(int stage) const { return rank_of_stage_.at(static_cast<std::size_t>(stage)) == rank_; }

  // Receives into the in-process channels every message that a stage of this process reads after
  // step `boundary` but that another process sent before it (counted from the schedule's cells), so
  // that save_in_flight holds this process's whole state in flight; a later receive reads them
  // first. Call it between run()s, after the steps before `boundary`, on every process.
  void collect_in_flight(const Schedule& schedule, std::int64_t boundary);

  // Stage j's parameters, from the rank that hosts it to every rank (collective: call it on all).
  void broadcast_parameters(nn::Model& model);

  // Bytes this process has sent to other processes, per sending stage: going up (activations and
  // labels) and going down (the rebuilt or exact input and its gradient), with message counts.
  struct Traffic {
    std::int64_t messages = 0, bytes = 0;
  };
  const std::vector<Traffic>& sent_up() const { return sent_up_; }
  const std::vector<Traffic>& sent_down() const { return sent_down_; }

  // Contiguous groups of stages balanced by count: stage j -> rank floor(j * ranks / J).
  static std::vector<int> even_placement(int stages, int ranks);

 protected:
  bool runs_stage(int j) const override { return hosts(j); }
  ForwardMessage receive_forward(int j, std::int64_t microbatch, bool wait) override;
  void send_forward(int j, ForwardMessage message) override;
  BackwardMessage receive_backward(int j, std::int64_t microbatch, bool wait) override;
  void send_backward(int j, BackwardMessage message) override;

 private:
  struct PendingSend {
    std::vector<std::int64_t> header;  // kept alive until MPI has sent it
    MPI_Request header_request = MPI_REQUEST_NULL;
    std::unique_ptr<PayloadTransport::PendingSend> payloads[2];
    bool done();
    void wait();
  };
  enum Kind : int { kForward = 0, kBackward = 1 };
  void send(int to_stage, Kind kind, std::int64_t microbatch, const Tensor& first, const Tensor& second);
  // Receives the message of `kind` for stage `to_stage` from stage `from_stage`'s process; checks it.
  std::pair<Tensor, Tensor> receive(int to_stage, int from_stage, Kind kind, std::int64_t microbatch,
                                    MemoryTag tag, int owner);
  void complete_finished_sends();
  // Stage j's next message from another process, from MPI itself.
  ForwardMessage receive_forward_from_wire(int j, std::int64_t microbatch);
  BackwardMessage receive_backward_from_wire(int j, std::int64_t microbatch);

  std::vector<int> rank_of_stage_;
  MPI_Comm comm_;
  std::unique_ptr<PayloadTransport> payloads_;
  Device device_;
  int rank_ = 0, ranks_ = 1;
  std::deque<PendingSend> pending_;
  std::vector<Traffic> sent_up_, sent_down_;  // [sending stage]
};

// Payloads over MPI on `comm` (borrowed), with the header's tag: a host tensor's bytes as they are,
// a device tensor's through a host copy (Open MPI is not assumed CUDA-aware). A payload's byte
// count is checked against its header on arrival.
std::unique_ptr<PayloadTransport> mpi_payload_transport(MPI_Comm comm);

}  // namespace petra::pipeline
