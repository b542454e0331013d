// pipeline/mpi_executor.cpp: stages on several processes, messages between them over MPI.
#include "petra/pipeline/mpi_executor.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <span>
#include <thread>

#include <fmt/format.h>

#include "petra/allocator.hpp"
#include "petra/ops.hpp"
#include "petra/pipeline/process_group.hpp"
#include "petra/stream.hpp"

namespace petra::pipeline {

namespace {

constexpr int kHeaderSize = 18;   // kind, mini-batch, then (dtype, rank, 6 dims) per tensor
constexpr int kMaxDims = 6;
constexpr int kTagPerKind = 4096;  // tag = kind * 4096 + receiving stage

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(fmt::format("{} failed: {}", call, std::string(text, static_cast<std::size_t>(length))));
}

// Writes (dtype, rank, dims) of t, or (-1, -1, ...) for an undefined tensor, at header[at].
void describe_tensor(const Tensor& t, std::vector<std::int64_t>& header, int at) {
  if (!t.defined()) {
    header[at] = header[at + 1] = -1;
    return;
  }
  PETRA_CHECK(t.shape().ndim() <= kMaxDims, ShapeError, "mpi executor: tensor ", t.str(), " has more than ",
              kMaxDims, " dims");
  header[at] = static_cast<std::int64_t>(t.dtype());
  header[at + 1] = static_cast<std::int64_t>(t.shape().ndim());
  for (int d = 0; d < static_cast<int>(t.shape().ndim()); ++d) header[static_cast<std::size_t>(at + 2 + d)] = t.shape()[d];
}

std::int64_t bytes_of(const Tensor& t) {
  return t.defined() ? t.numel() * static_cast<std::int64_t>(size_of(t.dtype())) : 0;
}

}  // namespace

std::vector<int> MpiExecutor::even_placement(int stages, int ranks) {
  PETRA_CHECK(ranks >= 1 && ranks <= stages, ValueError, "mpi executor: ", ranks, " processes for ", stages,
              " stages; each process needs at least one stage");
  std::vector<int> placement(static_cast<std::size_t>(stages));
  for (int j = 0; j < stages; ++j)
    placement[static_cast<std::size_t>(j)] = static_cast<int>(static_cast<std::int64_t>(j) * ranks / stages);
  return placement;
}

MpiExecutor::MpiExecutor(nn::Model& model, const RuntimeOptions& options, std::vector<int> rank_of_stage,
                         MPI_Comm comm)
    : SequentialExecutor(model, options), rank_of_stage_(std::move(rank_of_stage)), comm_(comm) {
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
  for (PendingSend& p : pending_) MPI_Waitall(3, p.requests, MPI_STATUSES_IGNORE);
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
  while (!pending_.empty()) {
    int done = 0;
    check_mpi(MPI_Testall(3, pending_.front().requests, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (!done) return;
    pending_.pop_front();
  }
}

void MpiExecutor::send(int to_stage, Kind kind, std::int64_t microbatch, const Tensor& first, const Tensor& second) {
  const int destination = rank_of_stage_[static_cast<std::size_t>(to_stage)];
  const int tag = kind * kTagPerKind + to_stage;
  PendingSend& p = pending_.emplace_back();
  p.header.assign(kHeaderSize, 0);
  p.header[0] = kind;
  p.header[1] = microbatch;
  describe_tensor(first, p.header, 2);
  describe_tensor(second, p.header, 2 + 2 + kMaxDims);
  p.first = first.defined() ? first.contiguous() : Tensor();
  p.second = second.defined() ? second.contiguous() : Tensor();
  check_mpi(MPI_Isend(p.header.data(), kHeaderSize, MPI_INT64_T, destination, tag, comm_, &p.requests[0]), "MPI_Isend");
  const auto send_bytes = [&](const Tensor& t, MPI_Request* request) {
    void* data = t.defined() ? t.raw_data() : nullptr;
    check_mpi(MPI_Isend(data, static_cast<int>(bytes_of(t)), MPI_BYTE, destination, tag, comm_, request), "MPI_Isend");
  };
  send_bytes(p.first, &p.requests[1]);
  send_bytes(p.second, &p.requests[2]);
  Traffic& traffic = kind == kForward ? sent_up_[static_cast<std::size_t>(to_stage - 1)]
                                      : sent_down_[static_cast<std::size_t>(to_stage + 1)];
  ++traffic.messages;
  traffic.bytes += bytes_of(p.first) + bytes_of(p.second);
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
  std::vector<std::int64_t> header(kHeaderSize);
  MPI_Status status;
  check_mpi(MPI_Recv(header.data(), kHeaderSize, MPI_INT64_T, source, tag, comm_, &status), "MPI_Recv");
  int count = 0;
  MPI_Get_count(&status, MPI_INT64_T, &count);
  // Everything the header says is checked before anything is allocated; whatever is wrong, both
  // payloads are still received (into a sink), so the sender is never left blocked on them.
  std::string wrong;
  if (count != kHeaderSize)
    wrong = fmt::format("a header of {} values, expected {}", count, kHeaderSize);
  else if (header[0] != kind)
    wrong = fmt::format("kind {}, expected {}", header[0], static_cast<int>(kind));
  else if (header[1] != microbatch)
    wrong = fmt::format("it carries mini-batch {}", header[1]);
  std::vector<Shape> shapes(2);
  std::vector<std::int64_t> dtypes(2, -1);
  for (int i = 0; i < 2 && wrong.empty(); ++i) {
    const std::int64_t* d = &header[static_cast<std::size_t>(2 + i * (2 + kMaxDims))];
    dtypes[static_cast<std::size_t>(i)] = d[0];
    if (d[0] < 0) continue;  // an undefined tensor
    if (d[0] > static_cast<std::int64_t>(DType::u8) || d[1] < 0 || d[1] > kMaxDims) {
      wrong = fmt::format("tensor {}: dtype {} rank {}", i, d[0], d[1]);
      break;
    }
    std::int64_t numel = 1;
    for (std::int64_t k = 0; k < d[1]; ++k) {
      const std::int64_t n = d[2 + k];
      if (n < 0 || (n > 0 && numel > (std::int64_t{1} << 40) / n)) wrong = fmt::format("tensor {}: a dimension of {}", i, n);
      numel *= std::max<std::int64_t>(n, 0);
    }
    shapes[static_cast<std::size_t>(i)] = Shape(std::span<const std::int64_t>(d + 2, static_cast<std::size_t>(d[1])));
  }
  std::pair<Tensor, Tensor> tensors;
  for (int i = 0; i < 2; ++i) {
    check_mpi(MPI_Probe(source, tag, comm_, &status), "MPI_Probe");
    MPI_Get_count(&status, MPI_BYTE, &count);
    Tensor& t = i == 0 ? tensors.first : tensors.second;
    const std::int64_t dtype = dtypes[static_cast<std::size_t>(i)];
    if (wrong.empty() && dtype >= 0) {
      const std::int64_t expected = shapes[static_cast<std::size_t>(i)].numel() *
                                    static_cast<std::int64_t>(size_of(static_cast<DType>(dtype)));
      if (count == expected) {
        MemoryScope scope(i == 0 || kind == kBackward ? memory_tag : MemoryTag::messages, owner);
        t = Tensor::empty(shapes[static_cast<std::size_t>(i)], static_cast<DType>(dtype));
      } else {
        wrong = fmt::format("tensor {}: {} bytes, the header says {}", i, count, expected);
      }
    } else if (wrong.empty() && count != 0) {
      wrong = fmt::format("tensor {}: {} bytes for an undefined tensor", i, count);
    }
    std::vector<char> sink(t.defined() ? 0 : static_cast<std::size_t>(count));
    check_mpi(MPI_Recv(t.defined() ? t.raw_data() : sink.data(), count, MPI_BYTE, source, tag, comm_, MPI_STATUS_IGNORE),
              "MPI_Recv");
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
    for (const auto& p : model.stage(j).parameters()) {
      const Tensor& data = p.data();
      check_mpi(MPI_Bcast(data.raw_data(), static_cast<int>(bytes_of(data)), MPI_BYTE, root, comm_), "MPI_Bcast");
    }
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
  explicit MpiProcessGroup(int replicas) : replicas_(replicas) {
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
  }
  ~MpiProcessGroup() override {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (finalised) return;
    MPI_Comm_free(&pipeline_);
    MPI_Comm_free(&across_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int replica() const override { return replica_; }
  int replicas() const override { return replicas_; }
  std::unique_ptr<SequentialExecutor> make_executor(nn::Model& model, const RuntimeOptions& options) override {
    PETRA_CHECK(is_delayed(options.method) || group_size_ == 1, ValueError, "--mpi: ", name_of(options.method),
                " is synchronous, its stages cannot overlap across processes; run one process per replica "
                "(--replicas equal to mpirun's -np, ", size_, ") or a pipelined method");
    placement_ = MpiExecutor::even_placement(static_cast<int>(model.num_stages()), group_size_);
    return std::make_unique<MpiExecutor>(model, options, placement_, pipeline_);
  }
  bool hosts(int stage) const override {
    return placement_.at(static_cast<std::size_t>(stage)) == rank_ % group_size_;
  }
  void average_over_replicas(const std::vector<Variable>& parameters) override {
    // A reduction to one process then a broadcast, rather than MPI_Allreduce, whose result MPI
    // does not promise to be the same bits on every process.
    for (const Variable& p : parameters) {
      if (!p.grad().defined()) continue;
      PETRA_CHECK(p.grad().device().is_cpu(), DeviceError, "--replicas: gradients on ", p.grad().device().str(),
                  " need NCCL, which petra does not use yet");
      MemoryScope scope(MemoryTag::gradients, p.data().storage()->owner());
      Tensor sum = p.grad().clone();
      const MPI_Datatype type = p.grad().dtype() == DType::f64 ? MPI_DOUBLE : MPI_FLOAT;
      PETRA_CHECK(p.grad().dtype() == DType::f64 || p.grad().dtype() == DType::f32, ValueError,
                  "--replicas: gradients of dtype ", name_of(p.grad().dtype()), " cannot be averaged");
      const int count = static_cast<int>(sum.numel());
      if (replica_ == 0)
        check_mpi(MPI_Reduce(MPI_IN_PLACE, sum.raw_data(), count, type, MPI_SUM, 0, across_), "MPI_Reduce");
      else
        check_mpi(MPI_Reduce(sum.raw_data(), nullptr, count, type, MPI_SUM, 0, across_), "MPI_Reduce");
      check_mpi(MPI_Bcast(sum.raw_data(), count, type, 0, across_), "MPI_Bcast");
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
      const auto share = [&](const Tensor& t) {
        check_mpi(MPI_Bcast(t.raw_data(), static_cast<int>(bytes_of(t)), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
      };
      for (const auto& p : model.stage(j).parameters()) share(p.data());
      for (const auto& [name, buffer] : model.stage(j).named_buffers()) share(buffer);
    }
  }

 private:
  int rank_ = 0, size_ = 1;
  int replicas_ = 1, replica_ = 0, group_size_ = 1;  // group size: the processes of one replica
  MPI_Comm pipeline_ = MPI_COMM_NULL, across_ = MPI_COMM_NULL;
  std::vector<int> placement_;  // stage -> rank within a replica
};

}  // namespace

std::unique_ptr<ProcessGroup> mpi_process_group(int replicas) { return std::make_unique<MpiProcessGroup>(replicas); }

}  // namespace petra::pipeline
