// tests/mpi/test_mpi.cpp: stages spread over MPI processes train exactly as in one process.
//
// Run with mpirun (tests/meson.build does, with 2 and 4 processes):
//   mpirun --allow-run-as-root --oversubscribe -np 2 build/tests/test-mpi
// Every process builds the same small RevNet18 (J = 10 stages) and runs a drained PETRA, DSP and
// PipeDream schedule of 8 mini-batches with SGD (the parameters move), hosting a contiguous group of
// stages. Then the stages' parameters are broadcast from their hosts, and rank 0 trains the same
// schedule alone with the sequential executor: every parameter must be equal bit for bit. Rank 0
// also sends a malformed message (the wrong mini-batch id) to rank 1, which must refuse it with an
// Error naming the stage and the mini-batch. Exit status 0 when everything holds on every rank.
//
// NCCL (pipeline/nccl_transport.hpp), where petra has it and there is a GPU per process (one host):
// the communicators are bootstrapped through MPI, an all-reduce gives every process the exact sum,
// the same bits on each, and (two processes or more) payloads cross between ranks 0 and 1 in both
// directions at once, as a forward and a backward message do. Without enough GPUs it says why and
// passes: scripts/gpu-check.sh runs it with one process on the lent GPU.
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "petra/pipeline/executor.hpp"
#include "petra/cuda_backend.hpp"
#include "petra/pipeline/mpi_executor.hpp"
#include "petra/pipeline/nccl_transport.hpp"
#include "petra/stream.hpp"
#include "tests/support/fixtures.hpp"

namespace {

using namespace petra;
using namespace petra::pipeline;

nn::ModelConfig model_config() { return testing::tiny_model_config("revnet18", 11); }

MiniBatch batch(std::int64_t m) { return testing::random_batch({4, 1, 12, 12}, 100 + m, 10, 3 * m); }

RuntimeOptions options_for(PipelineMethod method) {
  RuntimeOptions o;
  o.method = method;
  o.optimizer_options.momentum = 0.9;
  o.schedule.base_lr = 0.05;
  o.message_timeout_seconds = 60;  // a broken transport fails the test instead of hanging it
  return o;
}

std::vector<std::vector<float>> parameters_of(const nn::Model& model) {
  std::vector<std::vector<float>> values;
  for (const auto& p : model.parameters()) values.push_back(p.data().to_vector<float>());
  return values;
}

// True when the distributed run equals the single-process one, bit for bit (decided on rank 0).
bool distributed_equals_sequential(PipelineMethod method, int rank, int ranks) {
  const std::int64_t batches = 8;
  nn::Model distributed(model_config());
  const int J = static_cast<int>(distributed.num_stages());
  const Schedule grid = make_schedule(method, J, batches, 1, /*drain=*/true);
  {
    MpiExecutor executor(distributed, options_for(method), MpiExecutor::even_placement(J, ranks));
    executor.run(grid, 0, grid.steps / 2, batch, {});  // two run() calls: the state in flight carries over
    executor.run(grid, grid.steps / 2, grid.steps, batch, {});
    executor.broadcast_parameters(distributed);
    // What crosses each process boundary, per message: going up an activation (+ labels), going
    // down the sender's input and its gradient, so twice the activation.
    for (int j = 0; j < J; ++j) {
      const auto& up = executor.sent_up()[static_cast<std::size_t>(j)];
      const auto& down = executor.sent_down()[static_cast<std::size_t>(j)];
      if (up.messages > 0)
        std::printf("%s, rank %d: stage %d -> %d: %lld messages, %lld bytes each\n", std::string(name_of(method)).c_str(),
                    rank, j, j + 1, static_cast<long long>(up.messages), static_cast<long long>(up.bytes / up.messages));
      if (down.messages > 0)
        std::printf("%s, rank %d: stage %d -> %d: %lld messages, %lld bytes each\n", std::string(name_of(method)).c_str(),
                    rank, j, j - 1, static_cast<long long>(down.messages),
                    static_cast<long long>(down.bytes / down.messages));
    }
  }
  int equal = 1;
  if (rank == 0) {
    nn::Model alone(model_config());
    SequentialExecutor executor(alone, options_for(method));
    executor.run(grid, 0, grid.steps, batch, {});
    equal = parameters_of(alone) == parameters_of(distributed) ? 1 : 0;
    std::printf("%s on %d processes: parameters %s the single-process run's\n", std::string(name_of(method)).c_str(),
                ranks, equal ? "equal, bit for bit," : "DIFFER from");
  }
  MPI_Bcast(&equal, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return equal == 1;
}

// Rank 0 plays stage 4 and sends stage 5 (on rank 1) the message of mini-batch 9 where the
// schedule expects mini-batch 2: rank 1 must refuse it, naming both.
bool malformed_message_is_refused(int rank, int ranks) {
  if (ranks < 2) return true;
  nn::Model model(model_config());
  const int J = static_cast<int>(model.num_stages());
  std::vector<int> placement(static_cast<std::size_t>(J), 1);
  for (int j = 0; j < 5; ++j) placement[static_cast<std::size_t>(j)] = 0;
  for (int j = 5; j < J; ++j) placement[static_cast<std::size_t>(j)] = ranks - 1;
  MPI_Comm pair;
  MPI_Comm_split(MPI_COMM_WORLD, rank == 0 || rank == ranks - 1 ? 0 : MPI_UNDEFINED, rank, &pair);
  int ok = 1;
  if (pair != MPI_COMM_NULL) {
    for (int& r : placement) r = r == 0 ? 0 : 1;
    MpiExecutor executor(model, options_for(PipelineMethod::petra), placement, pair);
    Schedule one_forward{PipelineMethod::petra, J, 1, 1, 10, {}};
    one_forward.cells.assign(1, std::vector<std::vector<Action>>(static_cast<std::size_t>(J)));
    if (executor.rank() == 0) {
      one_forward.cells[0][4] = {{Action::Kind::forward, 4, 9}};
      // Stage 4 needs its input from stage 3 (same rank): put it there through stages 0..3.
      for (int j = 0; j < 4; ++j) one_forward.cells[0][static_cast<std::size_t>(j)] = {{Action::Kind::forward, j, 9}};
      executor.run(one_forward, 0, 1, batch, {});
    } else {
      one_forward.cells[0][5] = {{Action::Kind::forward, 5, 2}};
      try {
        executor.run(one_forward, 0, 1, batch, {});
        ok = 0;
        std::printf("a message of the wrong mini-batch was accepted\n");
      } catch (const Error& e) {
        const std::string message = e.what();
        ok = message.find("stage 5") != std::string::npos && message.find("mini-batch 2") != std::string::npos &&
             message.find("carries mini-batch 9") != std::string::npos;
        std::printf("malformed message refused: %s\n", e.what());
      }
    }
    MPI_Comm_free(&pair);
  }
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

// NCCL on one GPU per process (see the file comment); true when skipped for want of GPUs.
bool nccl_works(int rank, int ranks) {
  const int gpus = cuda_backend::device_count();
  if (!nccl_compiled() || gpus < ranks) {
    if (rank == 0)
      std::printf("nccl: skipped (%s; %d GPU(s) for %d process(es), NCCL needs one each)\n",
                  nccl_compiled() ? "built with NCCL" : "built without NCCL", gpus, ranks);
    return true;
  }
  const Device gpu = Device::cuda(rank);
  int ok = 1;
  {
    // Sums of small integers times a power of two: exact in f32, so the expected sum is exact too.
    const std::int64_t n = 1000;
    std::vector<float> mine(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) mine[static_cast<std::size_t>(i)] = static_cast<float>((rank + 1) * (i % 7)) * 0.25f;
    const Tensor values = Tensor::from_vector({n}, mine, gpu);
    const std::unique_ptr<DeviceAllReduce> all_reduce = nccl_all_reduce(MPI_COMM_WORLD, gpu);
    all_reduce->sum(values);
    const std::vector<float> sum = values.to_vector<float>();  // waits for the all-reduce
    const float ranks_sum = static_cast<float>(ranks * (ranks + 1) / 2);
    for (std::int64_t i = 0; i < n; ++i)
      if (sum[static_cast<std::size_t>(i)] != ranks_sum * static_cast<float>(i % 7) * 0.25f) ok = 0;
    std::vector<float> first = sum;  // rank 0's bits, compared on every rank
    MPI_Bcast(first.data(), static_cast<int>(n), MPI_FLOAT, 0, MPI_COMM_WORLD);
    if (first != sum) ok = 0;
    std::printf("nccl, rank %d on %s: all-reduce of %lld floats over %d process(es) %s\n", rank, gpu.str().c_str(),
                static_cast<long long>(n), ranks, ok ? "exact, the same bits as rank 0" : "WRONG");
  }
  {
    // Two communicators (up, down) made on every rank; ranks 0 and 1 exchange a payload each way.
    std::unique_ptr<PayloadTransport> payloads = nccl_payload_transport(MPI_COMM_WORLD, gpu);
    if (rank < 2 && ranks >= 2) {
      const Tensor up = Tensor::full({3, 5}, 1.5, DType::f32, gpu), down = Tensor::full({7}, -2.0, DType::f64, gpu);
      const Tensor& mine = rank == 0 ? up : down;
      const Direction mine_goes = rank == 0 ? Direction::up : Direction::down;
      auto sending = payloads->send(mine, 1 - rank, 0, mine_goes);
      PayloadLayout layout;
      layout.defined = true;
      layout.dtype = rank == 0 ? down.dtype() : up.dtype();
      layout.shape = rank == 0 ? down.shape() : up.shape();
      layout.bytes = (rank == 0 ? down : up).numel() * static_cast<std::int64_t>(size_of(layout.dtype));
      Tensor received;
      const std::string wrong =
          payloads->receive(received, layout, 1 - rank, 0, rank == 0 ? Direction::down : Direction::up, gpu);
      sending->wait();
      const bool equal = wrong.empty() && (rank == 0 ? received.to_vector<double>() == down.to_vector<double>()
                                                     : received.to_vector<float>() == up.to_vector<float>());
      if (!equal) ok = 0;
      std::printf("nccl, rank %d: payload from rank %d %s\n", rank, 1 - rank, equal ? "received intact" : "WRONG");
    }
  }
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  Stream::current().set_num_threads(1);  // the reference runs with one kernel thread too
  int failures = 0;
  try {
    for (PipelineMethod method : {PipelineMethod::petra, PipelineMethod::dsp, PipelineMethod::pipedream})
      if (!distributed_equals_sequential(method, rank, ranks)) ++failures;
    if (!malformed_message_is_refused(rank, ranks)) ++failures;
    if (!nccl_works(rank, ranks)) ++failures;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (rank == 0) std::printf("%s (%d processes)\n", failures == 0 ? "all checks passed" : "FAILED", ranks);
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
