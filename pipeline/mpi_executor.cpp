// pipeline/mpi_executor.cpp: stages on several processes, messages between them over MPI.
#include "petra/pipeline/mpi_executor.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <span>
#include <thread>

#include <fmt/format.h>

#include "petra/allocator.hpp"
#include "petra/ops.hpp"
#include "petra/pipeline/nccl_transport.hpp"
#include "petra/pipeline/process_group.hpp"
#include "petra/stream.hpp"

namespace petra::pipeline {

namespace {

constexpr int kTagPerKind = 4096;  // tag = kind * 4096 + receiving stage

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(fmt::format("{} failed: {}", call, std::string(text, static_cast<std::size_t>(length))));
}

std::int64_t bytes_of(const Tensor& t) {
  return t.defined() ? t.numel() * static_cast<std::int64_t>(size_of(t.dtype())) : 0;
}

// Payloads as MPI messages with the header's tag. MPI reads and writes host memory only here: a
// device tensor goes through a host copy each way (the copy synchronises the device's stream).
class MpiPayloads : public PayloadTransport {
 public:
  explicit MpiPayloads(MPI_Comm comm) : comm_(comm) {}
  Transport kind() const override { return Transport::mpi; }

  class Sending : public PendingSend {
   public:
    Tensor host;  // the bytes MPI reads until the send completes
    MPI_Request request = MPI_REQUEST_NULL;
    bool done() override {
      int finished = 0;
      check_mpi(MPI_Test(&request, &finished, MPI_STATUS_IGNORE), "MPI_Test");
      return finished != 0;
    }
    void wait() override { check_mpi(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait"); }
  };

  std::unique_ptr<PendingSend> send(const Tensor& payload, int peer, int tag, Direction) override {
    auto sending = std::make_unique<Sending>();
    if (payload.defined()) sending->host = payload.device().is_cuda() ? payload.to(Device::cpu()) : payload;
    void* data = sending->host.defined() ? sending->host.raw_data() : nullptr;
    check_mpi(MPI_Isend(data, static_cast<int>(bytes_of(sending->host)), MPI_BYTE, peer, tag, comm_, &sending->request),
              "MPI_Isend");
    return sending;
  }

  std::string receive(Tensor& into, const PayloadLayout& layout, int peer, int tag, Direction,
                      Device device) override {
    MPI_Status status;
    check_mpi(MPI_Probe(peer, tag, comm_, &status), "MPI_Probe");
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    if (count != layout.bytes) {
      drain(peer, tag, count);
      return layout.defined ? fmt::format("{} bytes, the header says {}", count, layout.bytes)
                            : fmt::format("{} bytes for an undefined tensor", count);
    }
    if (!layout.defined) {
      drain(peer, tag, 0);
      return {};
    }
    Tensor host = Tensor::empty(layout.shape, layout.dtype);
    check_mpi(MPI_Recv(host.raw_data(), count, MPI_BYTE, peer, tag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
    into = device.is_cuda() ? host.to(device) : host;
    return {};
  }

  bool discard(int peer, int tag, Direction) override {
    MPI_Status status;
    check_mpi(MPI_Probe(peer, tag, comm_, &status), "MPI_Probe");
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    drain(peer, tag, count);
    return true;
  }

 private:
  void drain(int peer, int tag, int count) {
    std::vector<char> sink(static_cast<std::size_t>(count));
    check_mpi(MPI_Recv(sink.data(), count, MPI_BYTE, peer, tag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
  }
  MPI_Comm comm_;
};

// MPI_Bcast of a tensor's bytes from `root`; a device tensor through a host copy.
void broadcast_tensor(const Tensor& t, int root, MPI_Comm comm) {
  const Tensor host = t.device().is_cuda() ? t.to(Device::cpu()) : t;
  check_mpi(MPI_Bcast(host.raw_data(), static_cast<int>(bytes_of(host)), MPI_BYTE, root, comm), "MPI_Bcast");
  if (t.device().is_cuda()) t.copy_from(host);
}

}  // namespace

std::unique_ptr<PayloadTransport> mpi_payload_transport(MPI_Comm comm) { return std::make_unique<MpiPayloads>(comm); }

std::vector<int> MpiExecutor::even_placement(int stages, int ranks) {
  PETRA_CHECK(ranks >= 1 && ranks <= stages, ValueError, "mpi executor: ", ranks, " processes for ", stages,
              " stages; each process needs at least one stage");
  std::vector<int> placement(static_cast<std::size_t>(stages));
  for (int j = 0; j < stages; ++j)
    placement[static_cast<std::size_t>(j)] = static_cast<int>(static_cast<std::int64_t>(j) * ranks / stages);
  return placement;
}

MpiExecutor::MpiExecutor(nn::Model& model, const RuntimeOptions& options, std::vector<int> rank_of_stage,
                         MPI_Comm comm, std::unique_ptr<PayloadTransport> payloads, Device device)
    : SequentialExecutor(model, options),
      rank_of_stage_(std::move(rank_of_stage)),
      comm_(comm),
      payloads_(payloads ? std::move(payloads) : mpi_payload_transport(comm)),
      device_(device) {
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &ranks_), "MPI_Comm_size");
  PETRA_CHECK(rank_of_stage_.size() == model.num_stages(), ValueError, "mpi executor: placement of ",
              rank_of_stage_.size(), " stages for a model of ", model.num_stages());
  PETRA_CHECK(model.num_stages() < kTagPerKind, ValueError, "mpi executor: at most ", kTagPerKind - 1, " stages");
  for (std::size_t j = 0; j < rank_of_stage_.size(); ++j) {
    const int r = rank_of_stage_[j];
    PETRA_CHECK(0 <= r && r < ranks_, ValueError, "mpi executor: stage ", j, " on rank ", r, " of ", ranks_);
    PETRA_CHECK(j == 0 || r == rank_of_stage_[j - 1] || r == rank_of_stage_[j - 1] + 1, ValueError,
                "mpi executor: the stages of a rank must be contiguous and in rank order (stage ", j, " on rank ", r,
                " after rank ", rank_of_stage_[j - 1], ")");
  }
  PETRA_CHECK(rank_of_stage_.front() == 0 && rank_of_stage_.back() == ranks_ - 1, ValueError,
              "mpi executor: every one of the ", ranks_, " ranks needs a stage");
  sent_up_.resize(rank_of_stage_.size());
  sent_down_.resize(rank_of_stage_.size());
}

MpiExecutor::~MpiExecutor() {
  for (PendingSend& p : pending_) {
    try {
      p.wait();
    } catch (const std::exception& e) {  // a destructor does not throw: the run is ending anyway
      std::fprintf(stderr, "mpi executor: a send did not complete: %s\n", e.what());
    }
  }
}

bool MpiExecutor::PendingSend::done() {
  int header_done = 0;
  check_mpi(MPI_Test(&header_request, &header_done, MPI_STATUS_IGNORE), "MPI_Test");
  return header_done && payloads[0]->done() && payloads[1]->done();
}

void MpiExecutor::PendingSend::wait() {
  check_mpi(MPI_Wait(&header_request, MPI_STATUS_IGNORE), "MPI_Wait");
  for (auto& p : payloads) p->wait();
}

void MpiExecutor::run(const Schedule& schedule, std::int64_t first, std::int64_t last, const BatchSource& batches,
                      const HeadCallback& on_head) {
  check_range(schedule, first, last);
  if (ranks_ == 1) return SequentialExecutor::run(schedule, first, last, batches, on_head);  // replicas only
  PETRA_CHECK(is_delayed(schedule.method), ValueError, "mpi executor: ", name_of(schedule.method),
              " is synchronous; its stages cannot overlap across processes");
  step_seconds_.clear();  // this process's view: when it finished its own cells of each step
  auto step_start = std::chrono::steady_clock::now();
  for (std::int64_t t = first; t < last; ++t) {
    for (int j = 0; j < schedule.stages; ++j)
      if (hosts(j)) execute_cell(schedule.cells[static_cast<std::size_t>(t)][static_cast<std::size_t>(j)], true,
                                 batches, on_head);
    complete_finished_sends();
    const auto now = std::chrono::steady_clock::now();
    step_seconds_.push_back(std::chrono::duration<double>(now - step_start).count());
    step_start = now;
  }
}

void MpiExecutor::complete_finished_sends() {
  while (!pending_.empty() && pending_.front().done()) pending_.pop_front();
}

void MpiExecutor::send(int to_stage, Kind kind, std::int64_t microbatch, const Tensor& first, const Tensor& second) {
  const int destination = rank_of_stage_[static_cast<std::size_t>(to_stage)];
  const int tag = kind * kTagPerKind + to_stage;
  const Direction direction = kind == kForward ? Direction::up : Direction::down;
  PendingSend& p = pending_.emplace_back();
  p.header = encode_header(kind, microbatch, first, second);
  check_mpi(MPI_Isend(p.header.data(), kWireHeaderSize, MPI_INT64_T, destination, tag, comm_, &p.header_request),
            "MPI_Isend");
  const Tensor payloads[] = {first.defined() ? first.contiguous() : Tensor(),
                             second.defined() ? second.contiguous() : Tensor()};
  for (int i = 0; i < 2; ++i) p.payloads[i] = payloads_->send(payloads[i], destination, tag, direction);
  Traffic& traffic = kind == kForward ? sent_up_[static_cast<std::size_t>(to_stage - 1)]
                                      : sent_down_[static_cast<std::size_t>(to_stage + 1)];
  ++traffic.messages;
  traffic.bytes += bytes_of(payloads[0]) + bytes_of(payloads[1]);
}

std::pair<Tensor, Tensor> MpiExecutor::receive(int to_stage, int from_stage, Kind kind, std::int64_t microbatch,
                                               MemoryTag memory_tag, int owner) {
  const int source = rank_of_stage_[static_cast<std::size_t>(from_stage)];
  const int tag = kind * kTagPerKind + to_stage;
  const char* what = kind == kForward ? "forward" : "backward";
  // Wait for the header with a deadline, driving MPI's progress meanwhile.
  const auto deadline = std::chrono::steady_clock::now() + message_timeout();
  for (int arrived = 0;;) {
    check_mpi(MPI_Iprobe(source, tag, comm_, &arrived, MPI_STATUS_IGNORE), "MPI_Iprobe");
    if (arrived) break;
    complete_finished_sends();
    if (std::chrono::steady_clock::now() > deadline)
      throw PipelineStuckError(fmt::format(
          "stage {} (rank {}): {} of mini-batch {}: no message from rank {} for {:.0f} s; the pipeline is stuck "
          "(a process stopped, or the schedules disagree)",
          to_stage, rank_, what, microbatch, source, std::chrono::duration<double>(message_timeout()).count()));
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  std::vector<std::int64_t> header(kWireHeaderSize);
  MPI_Status status;
  check_mpi(MPI_Recv(header.data(), kWireHeaderSize, MPI_INT64_T, source, tag, comm_, &status), "MPI_Recv");
  int count = 0;
  MPI_Get_count(&status, MPI_INT64_T, &count);
  // Everything the header says is checked before anything is allocated; whatever is wrong, both
  // payloads are still taken off the wire where the transport can (MPI: into a sink), so the
  // sender is never left blocked on them.
  DecodedHeader decoded = decode_header(std::span<const std::int64_t>(header.data(), static_cast<std::size_t>(count)),
                                        kind, microbatch);
  std::string& wrong = decoded.wrong;
  const Direction direction = kind == kForward ? Direction::up : Direction::down;
  std::pair<Tensor, Tensor> tensors;
  for (int i = 0; i < 2; ++i) {
    if (!wrong.empty()) {
      if (!payloads_->discard(source, tag, direction)) break;
      continue;
    }
    Tensor& t = i == 0 ? tensors.first : tensors.second;
    MemoryScope scope(i == 0 || kind == kBackward ? memory_tag : MemoryTag::messages, owner);
    const std::string bad = payloads_->receive(t, decoded.payload[i], source, tag, direction, device_);
    if (!bad.empty()) wrong = fmt::format("tensor {}: {}", i, bad);
  }
  if (!wrong.empty())
    throw Error(fmt::format("stage {} (rank {}): {} of mini-batch {}: malformed message from rank {}: {}", to_stage,
                            rank_, what, microbatch, source, wrong));
  return tensors;
}

namespace {

// The mini-batches of stage j's actions of `kind` in steps [0, boundary), in order.
std::vector<std::int64_t> actions_before(const Schedule& schedule, int j, Action::Kind kind, std::int64_t boundary) {
  std::vector<std::int64_t> microbatches;
  for (std::int64_t t = 0; t < boundary; ++t)
    for (const Action& a : schedule.cells[static_cast<std::size_t>(t)][static_cast<std::size_t>(j)])
      if (a.kind == kind) microbatches.push_back(a.microbatch);
  return microbatches;
}

}  // namespace

void MpiExecutor::collect_in_flight(const Schedule& schedule, std::int64_t boundary) {
  check_range(schedule, 0, boundary);
  const int J = schedule.stages;
  for (int j = 0; j < J; ++j) {
    if (!hosts(j)) continue;
    if (j > 0 && !hosts(j - 1)) {  // activations sent up by j - 1 that j has not read yet
      const auto sent = actions_before(schedule, j - 1, Action::Kind::forward, boundary);
      const auto read = actions_before(schedule, j, Action::Kind::forward, boundary);
      for (std::size_t i = read.size() + channel_up(j - 1).pending().size(); i < sent.size(); ++i)
        channel_up(j - 1).push(receive_forward_from_wire(j, sent[i]));
    }
    if (j + 1 < J && !hosts(j + 1)) {  // gradients sent down by j + 1 that j has not read yet
      const auto sent = actions_before(schedule, j + 1, Action::Kind::backward, boundary);
      const auto read = actions_before(schedule, j, Action::Kind::backward, boundary);
      for (std::size_t i = read.size() + channel_down(j).pending().size(); i < sent.size(); ++i)
        channel_down(j).push(receive_backward_from_wire(j, sent[i]));
    }
  }
  complete_finished_sends();
}

ForwardMessage MpiExecutor::receive_forward(int j, std::int64_t microbatch, bool wait) {
  // Messages of the same process, and those collected before a checkpoint, wait in the channel.
  if (hosts(j - 1) || !channel_up(j - 1).pending().empty())
    return SequentialExecutor::receive_forward(j, microbatch, wait);
  return receive_forward_from_wire(j, microbatch);
}

ForwardMessage MpiExecutor::receive_forward_from_wire(int j, std::int64_t microbatch) {
  // Tagged as the sender's forward tags it: the input buffer of j when j keeps its inputs.
  const bool kept = stage(static_cast<std::size_t>(j)).keeps_input();
  auto [activation, labels] =
      receive(j, j - 1, kForward, microbatch, kept ? MemoryTag::input_buffer : MemoryTag::messages, kept ? j : j - 1);
  return {microbatch, std::move(activation), std::move(labels), nullptr};
}

void MpiExecutor::send_forward(int j, ForwardMessage message) {
  if (hosts(j + 1)) return SequentialExecutor::send_forward(j, std::move(message));
  send(j + 1, kForward, message.microbatch, message.activation, message.labels);
}

BackwardMessage MpiExecutor::receive_backward(int j, std::int64_t microbatch, bool wait) {
  if (hosts(j + 1) || !channel_down(j).pending().empty())
    return SequentialExecutor::receive_backward(j, microbatch, wait);
  return receive_backward_from_wire(j, microbatch);
}

BackwardMessage MpiExecutor::receive_backward_from_wire(int j, std::int64_t microbatch) {
  auto [input, gradient] = receive(j, j + 1, kBackward, microbatch, MemoryTag::messages, j + 1);
  return {microbatch, std::move(input), std::move(gradient), nullptr};
}

void MpiExecutor::send_backward(int j, BackwardMessage message) {
  if (hosts(j - 1)) return SequentialExecutor::send_backward(j, std::move(message));
  send(j - 1, kBackward, message.microbatch, message.input, message.gradient);
}

void MpiExecutor::broadcast_parameters(nn::Model& model) {
  for (std::size_t j = 0; j < model.num_stages(); ++j) {
    const int root = rank_of_stage_[j];
    for (const auto& p : model.stage(j).parameters()) broadcast_tensor(p.data(), root, comm_);
  }
}

}  // namespace petra::pipeline

// ---------------------------------------------------------------- the processes of a run
namespace petra::pipeline {
namespace {

// MPI for the life of the process: initialised on first use (unless the program did), finalised at
// exit by whoever initialised it.
struct MpiLife {
  bool initialised_here = false;
  MpiLife() {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised) {
      int provided = 0;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
      initialised_here = true;
    }
  }
  ~MpiLife() {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (initialised_here && !finalised) MPI_Finalize();
  }
};

// Files as one string: per file, the path's and the bytes' lengths (8 bytes each), then both.
std::string pack(const std::vector<FileBytes>& files) {
  std::string packed;
  const auto put_size = [&](std::uint64_t n) { packed.append(reinterpret_cast<const char*>(&n), sizeof n); };
  for (const FileBytes& f : files) {
    put_size(f.path.size());
    put_size(f.bytes.size());
    packed += f.path;
    packed += f.bytes;
  }
  return packed;
}

std::vector<FileBytes> unpack(const std::string& packed) {
  std::vector<FileBytes> files;
  std::size_t at = 0;
  const auto take = [&](std::size_t n) {
    PETRA_CHECK(n <= packed.size() - at, Error, "mpi: a packed file list is cut short at byte ", at);
    std::string part = packed.substr(at, n);
    at += n;
    return part;
  };
  const auto take_size = [&] {
    std::uint64_t n = 0;
    std::memcpy(&n, take(sizeof n).data(), sizeof n);
    return static_cast<std::size_t>(n);
  };
  while (at < packed.size()) {
    const std::size_t path_size = take_size(), bytes_size = take_size();
    std::string path = take(path_size);
    files.push_back({std::move(path), take(bytes_size)});
  }
  return files;
}

// MPI counts in int: strings longer than that are sent in pieces (of at most 1 GiB).
constexpr std::size_t kPiece = std::size_t{1} << 30;

void broadcast_string(std::string& text, int root) {
  std::uint64_t size = text.size();
  check_mpi(MPI_Bcast(&size, 1, MPI_UINT64_T, root, MPI_COMM_WORLD), "MPI_Bcast");
  text.resize(static_cast<std::size_t>(size));
  for (std::size_t at = 0; at < text.size(); at += kPiece)
    check_mpi(MPI_Bcast(text.data() + at, static_cast<int>(std::min(kPiece, text.size() - at)), MPI_BYTE, root,
                        MPI_COMM_WORLD),
              "MPI_Bcast");
}

// Every process's string, in rank order, on rank 0 (empty elsewhere): each sends to rank 0 in turn.
std::vector<std::string> gather_strings(const std::string& mine) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  constexpr int kTag = 2 * kTagPerKind;  // beyond the pipeline's tags
  if (rank != 0) {
    std::uint64_t n = mine.size();
    check_mpi(MPI_Send(&n, 1, MPI_UINT64_T, 0, kTag, MPI_COMM_WORLD), "MPI_Send");
    for (std::size_t at = 0; at < mine.size(); at += kPiece)
      check_mpi(MPI_Send(mine.data() + at, static_cast<int>(std::min(kPiece, mine.size() - at)), MPI_BYTE, 0, kTag,
                         MPI_COMM_WORLD),
                "MPI_Send");
    return {};
  }
  std::vector<std::string> all{mine};
  for (int from = 1; from < size; ++from) {
    std::uint64_t n = 0;
    check_mpi(MPI_Recv(&n, 1, MPI_UINT64_T, from, kTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
    std::string text(static_cast<std::size_t>(n), '\0');
    for (std::size_t at = 0; at < text.size(); at += kPiece)
      check_mpi(MPI_Recv(text.data() + at, static_cast<int>(std::min(kPiece, text.size() - at)), MPI_BYTE, from, kTag,
                         MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                "MPI_Recv");
    all.push_back(std::move(text));
  }
  return all;
}

class MpiProcessGroup : public ProcessGroup {
 public:
  MpiProcessGroup(int replicas, Transport transport, const std::vector<Device>& devices) : replicas_(replicas) {
    static MpiLife life;
    check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
    PETRA_CHECK(replicas_ >= 1 && size_ % replicas_ == 0, ValueError, "--replicas ", replicas_,
                " does not divide the ", size_, " processes of mpirun (each replica needs as many processes)");
    group_size_ = size_ / replicas_;
    replica_ = rank_ / group_size_;
    // pipeline_: the processes of this replica; across_: those hosting the same stages in every replica.
    check_mpi(MPI_Comm_split(MPI_COMM_WORLD, replica_, rank_, &pipeline_), "MPI_Comm_split");
    check_mpi(MPI_Comm_split(MPI_COMM_WORLD, rank_ % group_size_, rank_, &across_), "MPI_Comm_split");
    // host_: the processes of this host (shared memory); the local rank picks the GPU.
    check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host_),
              "MPI_Comm_split_type");
    int local_rank = 0;
    check_mpi(MPI_Comm_rank(host_, &local_rank), "MPI_Comm_rank");
    device_ = device_of_process(devices, local_rank);
    transport_ = resolve_transport(transport, device_, nccl_compiled());
    if (transport_ == Transport::nccl) {
      refuse_shared_gpus();
      if (replicas_ > 1) all_reduce_ = nccl_all_reduce(across_, device_);
    }
  }
  ~MpiProcessGroup() override {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (finalised) return;
    all_reduce_.reset();  // NCCL's communicator before MPI's
    MPI_Comm_free(&pipeline_);
    MPI_Comm_free(&across_);
    MPI_Comm_free(&host_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int replica() const override { return replica_; }
  int replicas() const override { return replicas_; }
  Device device() const override { return device_; }
  Transport transport() const override { return transport_; }
  std::unique_ptr<SequentialExecutor> make_executor(nn::Model& model, const RuntimeOptions& options) override {
    PETRA_CHECK(is_delayed(options.method) || group_size_ == 1, ValueError, "--mpi: ", name_of(options.method),
                " is synchronous, its stages cannot overlap across processes; run one process per replica "
                "(--replicas equal to mpirun's -np, ", size_, ") or a pipelined method");
    placement_ = MpiExecutor::even_placement(static_cast<int>(model.num_stages()), group_size_);
    std::unique_ptr<PayloadTransport> payloads =
        transport_ == Transport::nccl ? nccl_payload_transport(pipeline_, device_) : mpi_payload_transport(pipeline_);
    return std::make_unique<MpiExecutor>(model, options, placement_, pipeline_, std::move(payloads), device_);
  }
  bool hosts(int stage) const override {
    return placement_.at(static_cast<std::size_t>(stage)) == rank_ % group_size_;
  }
  void average_over_replicas(const std::vector<Variable>& parameters) override {
    for (const Variable& p : parameters) {
      if (!p.grad().defined()) continue;
      PETRA_CHECK(p.grad().dtype() == DType::f64 || p.grad().dtype() == DType::f32, ValueError,
                  "--replicas: gradients of dtype ", name_of(p.grad().dtype()), " cannot be averaged");
      MemoryScope scope(MemoryTag::gradients, p.data().storage()->owner());
      Tensor sum = p.grad().clone();
      if (sum.device().is_cuda() && all_reduce_)
        all_reduce_->sum(sum);  // NCCL: the same bits on every replica (its sum is sent unchanged to all)
      else
        sum_on_host(sum);
      p.set_grad(ops::scale(sum, 1.0 / static_cast<double>(replicas_)));
    }
  }
  void collect_in_flight(SequentialExecutor& executor, const Schedule& schedule, std::int64_t boundary) override {
    auto* mpi = dynamic_cast<MpiExecutor*>(&executor);
    PETRA_CHECK(mpi != nullptr, ValueError, "collect_in_flight: not the executor of this process group");
    mpi->collect_in_flight(schedule, boundary);
  }
  std::vector<FileBytes> gather_files(const std::vector<FileBytes>& mine) override {
    std::vector<FileBytes> files;
    for (const std::string& part : gather_strings(pack(mine)))
      for (FileBytes& f : unpack(part)) files.push_back(std::move(f));
    return files;
  }
  std::vector<FileBytes> broadcast_files(const std::vector<FileBytes>& from_first) override {
    std::string packed = rank_ == 0 ? pack(from_first) : std::string();
    broadcast_string(packed, 0);
    return unpack(packed);
  }
  std::string first_error(const std::string& mine) override {
    int failed = mine.empty() ? size_ : rank_;  // the lowest failing rank, or size_ for none
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce");
    if (failed == size_) return {};
    std::string message = rank_ == failed ? mine : std::string();
    broadcast_string(message, failed);
    return rank_ == failed ? message : fmt::format("process {}: {}", failed, message);
  }
  void sum(std::span<double> values) override {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_SUM,
                            MPI_COMM_WORLD),
              "MPI_Allreduce");
  }
  void share_model(nn::Model& model) override {
    for (std::size_t j = 0; j < model.num_stages(); ++j) {
      const int root = placement_.at(j);  // in replica 0, whose ranks are 0 .. group size - 1
      for (const auto& p : model.stage(j).parameters()) broadcast_tensor(p.data(), root, MPI_COMM_WORLD);
      for (const auto& [name, buffer] : model.stage(j).named_buffers()) broadcast_tensor(buffer, root, MPI_COMM_WORLD);
    }
  }

 private:
  // The sum over the replicas through MPI on host memory (a device tensor through a host copy): a
  // reduction to one process then a broadcast, rather than MPI_Allreduce, whose result MPI does not
  // promise to be the same bits on every process.
  void sum_on_host(Tensor& sum) {
    Tensor host = sum.device().is_cuda() ? sum.to(Device::cpu()) : sum;
    const MPI_Datatype type = host.dtype() == DType::f64 ? MPI_DOUBLE : MPI_FLOAT;
    const int count = static_cast<int>(host.numel());
    if (replica_ == 0)
      check_mpi(MPI_Reduce(MPI_IN_PLACE, host.raw_data(), count, type, MPI_SUM, 0, across_), "MPI_Reduce");
    else
      check_mpi(MPI_Reduce(host.raw_data(), nullptr, count, type, MPI_SUM, 0, across_), "MPI_Reduce");
    check_mpi(MPI_Bcast(host.raw_data(), count, type, 0, across_), "MPI_Bcast");
    if (sum.device().is_cuda()) sum.copy_from(host);
  }

  // NCCL refuses two ranks of a communicator on one GPU: every process learns the GPUs of its host's
  // processes and all refuse alike, naming them, before any NCCL call.
  void refuse_shared_gpus() {
    int local_size = 1;
    check_mpi(MPI_Comm_size(host_, &local_size), "MPI_Comm_size");
    std::vector<int> gpus(static_cast<std::size_t>(local_size));
    int mine = device_.index;
    check_mpi(MPI_Allgather(&mine, 1, MPI_INT, gpus.data(), 1, MPI_INT, host_), "MPI_Allgather");
    const std::string shared = duplicate_gpu(gpus);
    int refused = shared.empty() ? 0 : 1;  // on any host: every process stops
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &refused, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
    PETRA_CHECK(refused == 0, DeviceError, "--transport nccl: ",
                shared.empty() ? std::string("another host has processes sharing a GPU") : shared);
  }

  int rank_ = 0, size_ = 1;
  int replicas_ = 1, replica_ = 0, group_size_ = 1;  // group size: the processes of one replica
  MPI_Comm pipeline_ = MPI_COMM_NULL, across_ = MPI_COMM_NULL, host_ = MPI_COMM_NULL;
  Device device_ = Device::cpu();
  Transport transport_ = Transport::mpi;
  std::unique_ptr<DeviceAllReduce> all_reduce_;  // NCCL across the replicas, on GPUs
  std::vector<int> placement_;  // stage -> rank within a replica
};

}  // namespace

std::unique_ptr<ProcessGroup> mpi_process_group(int replicas, Transport transport, const std::vector<Device>& devices) {
  return std::make_unique<MpiProcessGroup>(replicas, transport, devices);
}

}  // namespace petra::pipeline
