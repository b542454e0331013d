// tests/emulation/cuda_emulation.cpp: the launcher, the block's synchronisation and the emulated
// runtime calls of cuda_emulation.hpp.
//
// One launch at a time (a process-wide mutex): the grid's blocks run one after another on a pool
// of std::threads, one per thread of the block. All synchronisation of a block (__syncthreads and
// the warp intrinsics) goes through one mutex and condition variable, which is what lets the
// emulation see a wait that can never complete: under that mutex it knows how many threads still
// run, which of them wait and where. (std::barrier cannot: it does not know that lane 0 waiting
// at __syncthreads blocks lane 1 waiting for lane 0 in a __shfl_sync, nor that a thread returned
// while the others wait.) Correctness over speed: a block of 256 threads costs a few hundred
// microseconds.
//
// Settings::cooperative runs a block's threads as fibers on the launching thread instead (a stack
// each, switched by a few lines of assembly at the waits): the same bookkeeping under the same
// mutex, but a wait yields to the next fiber instead of sleeping on the condition variable.
#include "tests/emulation/cuda_emulation.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <sstream>
#include <sys/mman.h>
#include <thread>
#include <vector>

namespace petra::cuda_emulation {

namespace {

constexpr std::size_t kDefaultSharedBytes = 48 * 1024;   // without opt-in
constexpr unsigned kMaxBlockThreads = 1024;

// Thrown through a thread's kernel code when its block has failed, to unwind it. Not derived from
// std::exception, so that a kernel's own catch clauses do not take it.
struct Abort {};

std::string site(const std::source_location& where) {
  std::string file = where.file_name();
  while (file.rfind("../", 0) == 0) file.erase(0, 3);
  return file + ":" + std::to_string(where.line());
}

bool same_site(const std::source_location& a, const std::source_location& b) {
  return a.line() == b.line() && a.column() == b.column() &&
         std::strcmp(a.file_name(), b.file_name()) == 0;
}

std::string dims(const dim3& d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

std::string hex(unsigned mask) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", mask);
  return text;
}

const char* op_name(detail::WarpOp op) {
  switch (op) {
    case detail::WarpOp::kSync: return "__syncwarp";
    case detail::WarpOp::kShfl: return "__shfl_sync";
    case detail::WarpOp::kShflUp: return "__shfl_up_sync";
    case detail::WarpOp::kShflDown: return "__shfl_down_sync";
    case detail::WarpOp::kShflXor: return "__shfl_xor_sync";
    case detail::WarpOp::kBallot: return "__ballot_sync";
    case detail::WarpOp::kAny: return "__any_sync";
    case detail::WarpOp::kAll: return "__all_sync";
  }
  return "?";
}

constexpr char kSyncthreads[] = "__syncthreads";
constexpr char kClusterSync[] = "cluster_sync";

// What a thread waits at, for the messages ("what" is null while it runs).
struct Wait {
  const char* what = nullptr;
  std::source_location where;
  unsigned mask = 0;

  bool at_barrier() const { return what == kSyncthreads; }
  bool at_cluster_barrier() const { return what == kClusterSync; }
  bool same_as(const Wait& other) const {
    return what != nullptr && other.what != nullptr && std::strcmp(what, other.what) == 0 &&
           mask == other.mask && same_site(where, other.where);
  }
};

// One warp intrinsic that lanes of a warp are meeting at: the lanes of `mask` that have not
// returned must all arrive; then each arrived lane reads the values and the last one removes it.
struct WarpMeeting {
  detail::WarpOp op;
  unsigned mask;
  std::source_location where;  // of the first lane that arrived
  unsigned arrived = 0;
  bool complete = false;
  int readers = 0;
  std::uint64_t values[32] = {};
};

struct Warp {
  unsigned existing = 0;  // lanes the block has (the last warp may be partial)
  unsigned returned = 0;  // lanes whose thread returned
  std::list<WarpMeeting> meetings;
};

struct Block;

// What the blocks of a cluster share (a launch without clusters: a cluster of one block): one
// mutex for all their synchronisation, the first failure, and the cluster barrier (cluster_sync).
// Each block has its own condition variable, so that a __syncthreads or a warp meeting wakes its
// block's threads only; a failure or the cluster barrier wakes every block's (wake_cluster).
struct ClusterState {
  std::mutex mutex;
  bool failed = false;
  std::string error;
  std::vector<Block*> blocks;  // by rank
  int live = 0;                // threads of the cluster still running
  int arrived = 0;             // of them, waiting at cluster_sync
  std::uint64_t phase = 0;     // cluster_sync completed so far
};

// The synchronisation state of a block that is running. Everything is guarded by `mutex`, its
// cluster's.
struct Block {
  explicit Block(ClusterState& c)
      : cluster(c), mutex(c.mutex), failed(c.failed), error(c.error) {}
  ClusterState& cluster;
  std::mutex& mutex;
  std::condition_variable changed;
  bool& failed;
  std::string& error;
  dim3 index, shape;
  int size = 0;
  int live = 0;      // threads still running the kernel
  int blocked = 0;   // live threads that wait and cannot go on by themselves
  int at_barrier = 0;
  std::uint64_t phase = 0;  // __syncthreads completed so far
  int first_returned = -1;
  std::vector<Wait> waits;
  std::vector<Warp> warps;

  void reset(const dim3& block_index, const dim3& block_shape) {
    index = block_index;
    shape = block_shape;
    size = int(block_shape.x * block_shape.y * block_shape.z);
    live = size;
    blocked = 0;
    at_barrier = 0;
    phase = 0;
    first_returned = -1;
    waits.assign(std::size_t(size), Wait{});
    warps.assign(std::size_t((size + 31) / 32), Warp{});
    for (int w = 0; w < int(warps.size()); ++w) {
      const int lanes = std::min(32, size - 32 * w);
      warps[std::size_t(w)].existing = lanes == 32 ? ~0u : (1u << lanes) - 1;
    }
    failed = false;
    error.clear();
  }

  std::string thread_name(int tid) const {
    const unsigned t = unsigned(tid);
    return "thread " + dims(dim3(t % shape.x, t / shape.x % shape.y, t / (shape.x * shape.y)));
  }

  // Records the first failure and wakes every waiting thread of the cluster, which then unwinds
  // (Abort).
  void fail(const std::string& message) {
    if (!failed) {
      failed = true;
      error = message;
    }
    wake_cluster();
  }

  void wake_cluster() {
    for (Block* b : cluster.blocks) b->changed.notify_all();
  }

  // Every running thread waits and none can go on: on a GPU the block hangs. (Threads that all
  // wait at cluster_sync wait for the other blocks of the cluster: the barrier decides.)
  void check_deadlock() {
    if (failed || live == 0 || blocked < live) return;
    if (std::all_of(waits.begin(), waits.end(),
                    [](const Wait& w) { return w.what == nullptr || w.at_cluster_barrier(); }))
      return;
    std::ostringstream out;
    out << "deadlock: every running thread of the block waits and none can go on (on a GPU the "
           "block hangs). Waiting:";
    struct Group {
      Wait wait;
      int first;
      int count;
    };
    std::vector<Group> groups;
    for (int t = 0; t < size; ++t) {
      const Wait& w = waits[std::size_t(t)];
      if (w.what == nullptr) continue;
      auto g = std::find_if(groups.begin(), groups.end(),
                            [&](const Group& x) { return x.wait.same_as(w); });
      if (g == groups.end()) groups.push_back({w, t, 1});
      else ++g->count;
    }
    for (const Group& g : groups) {
      out << "\n  " << g.count << (g.count == 1 ? " thread" : " threads") << " (first "
          << thread_name(g.first) << ") at " << g.wait.what;
      if (!g.wait.at_barrier()) out << " with mask " << hex(g.wait.mask);
      out << ", " << site(g.wait.where);
    }
    if (first_returned >= 0)
      out << "\n  " << (size - live) << " threads have returned, first "
          << thread_name(first_returned);
    fail(out.str());
  }

  // Completes `m` when every lane it names that exists and has not returned has arrived.
  void try_complete(Warp& warp, WarpMeeting& m, int warp_index) {
    if (m.complete) return;
    const unsigned needed = m.mask & warp.existing & ~warp.returned;
    if ((m.arrived & needed) != needed) return;
    m.complete = true;
    m.readers = __builtin_popcount(m.arrived);
    blocked -= m.readers;
    for (int lane = 0; lane < 32; ++lane)
      if (m.arrived >> lane & 1u) waits[std::size_t(32 * warp_index + lane)] = Wait{};
    changed.notify_all();
  }
};

// The context of the calling std::thread while it runs an emulated thread.
struct Current {
  Block* block = nullptr;
  int tid = 0;
  unsigned rank = 0;  // the block's rank in its cluster
};
thread_local Current current;

Current& current_thread(const char* what, const std::source_location& where) {
  if (current.block == nullptr)
    throw KernelError(std::string(what) +
                      " called outside a kernel launched through PETRA_LAUNCH (" + site(where) +
                      ")");
  return current;
}

// Threads that run the emulated threads of one block, thread i running emulated thread i of every
// block. The pool only grows (to the largest block launched so far) and a block uses its first
// `size` threads, so that kernels of different block sizes, one after another, do not create and
// join hundreds of threads per launch.
class Pool {
 public:
  ~Pool() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  // At least `size` threads. Called between runs (launches are serialised), never during one.
  void reserve(int size) {
    // A new thread waits for the next job, not for the generations before it was born.
    for (int i = int(threads_.size()); i < size; ++i)
      threads_.emplace_back([this, i, seen = generation_] { work(i, seen); });
  }

  // Runs job(i) on threads i < size; aborts the process if they are not all done within `timeout`.
  void run(const std::function<void(int)>& job, int size, double timeout_seconds,
           const std::string& what) {
    std::unique_lock lock(mutex_);
    job_ = &job;
    active_ = size;
    remaining_ = size;
    ++generation_;
    start_.notify_all();
    const auto timeout = std::chrono::duration<double>(timeout_seconds);
    if (!done_.wait_for(lock, timeout, [&] { return remaining_ == 0; })) {
      std::fprintf(stderr,
                   "cuda emulation: %s did not finish within %.0f s (a thread spins forever?); "
                   "threads stuck in kernel code cannot be stopped, aborting\n",
                   what.c_str(), timeout_seconds);
      std::fflush(stderr);
      std::abort();
    }
    job_ = nullptr;
  }

 private:
  void work(int i, std::uint64_t seen) {
    for (;;) {
      const std::function<void(int)>* job;
      {
        std::unique_lock lock(mutex_);
        start_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
        if (i >= active_) continue;  // not part of this block
      }
      (*job)(i);
      std::lock_guard lock(mutex_);
      if (--remaining_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable start_, done_;
  std::uint64_t generation_ = 0;
  int active_ = 0;
  int remaining_ = 0;
  bool stop_ = false;
  const std::function<void(int)>* job_ = nullptr;
};

// ---- fibers (Settings::cooperative): the threads of a block as stacks switched on one host thread.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define PETRA_EMULATION_FIBERS 1
// switch_stack(save, next): saves the callee-saved registers and the SSE/x87 control words on the
// current stack, stores the stack pointer in *save, continues on the stack `next` (a stack pointer
// that switch_stack saved, or one set up by Fibers::start), restoring its registers. System V
// x86-64 only; the first switch into a new fiber "returns" into fiber_trampoline.
extern "C" void petra_emulation_switch_stack(void** save, void* next);
extern "C" void petra_emulation_fiber_trampoline();
asm(R"(
  .text
  .globl petra_emulation_switch_stack
  .type petra_emulation_switch_stack, @function
petra_emulation_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size petra_emulation_switch_stack, .-petra_emulation_switch_stack

  .globl petra_emulation_fiber_trampoline
  .type petra_emulation_fiber_trampoline, @function
petra_emulation_fiber_trampoline:
  movq %r12, %rdi
  call petra_emulation_fiber_main
  ud2
  .size petra_emulation_fiber_trampoline, .-petra_emulation_fiber_trampoline
)");
#else
#define PETRA_EMULATION_FIBERS 0
#endif

class Fibers;
struct Fiber {
  Fibers* owner = nullptr;
  int tid = 0;
  void* stack = nullptr;  // mmap'ed, kStackBytes
  void* sp = nullptr;     // saved stack pointer while switched out
  bool finished = true;
};

// Runs job(i) for i < size as fibers, round robin: each runs until it waits or returns. A waiting
// fiber calls yield(); when it is resumed it re-checks what it waits for.
class Fibers {
 public:
  static constexpr std::size_t kStackBytes = std::size_t{256} << 10;  // virtual; touched pages only

  ~Fibers() {
    for (Fiber& f : fibers_) munmap(f.stack, kStackBytes);
  }

  void run(const std::function<void(int)>& job, int size, const std::function<void(int)>& resume) {
    while (int(fibers_.size()) < size) {
      Fiber f;
      f.stack = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
      if (f.stack == MAP_FAILED) throw std::bad_alloc();
      fibers_.push_back(f);
    }
    job_ = &job;
    for (int i = 0; i < size; ++i) start(fibers_[std::size_t(i)], i);
    int running = size;
    while (running > 0) {
      for (int i = 0; i < size; ++i) {
        Fiber& f = fibers_[std::size_t(i)];
        if (f.finished) continue;
        resume(i);  // the thread-locals of emulated thread i (threadIdx, current, ...)
        current_ = &f;
#if PETRA_EMULATION_FIBERS
        petra_emulation_switch_stack(&scheduler_sp_, f.sp);
#endif
        current_ = nullptr;
        if (f.finished) --running;
      }
    }
    job_ = nullptr;
  }

  // Called by a fiber: back to the scheduler, which resumes it after the others had their turn.
  void yield() {
#if PETRA_EMULATION_FIBERS
    Fiber& f = *current_;
    petra_emulation_switch_stack(&f.sp, scheduler_sp_);
#endif
  }

  static Fibers* running() { return active_; }
  static void set_running(Fibers* f) { active_ = f; }

  // The body of every fiber (reached through the trampoline).
  void main(Fiber& f) {
    (*job_)(f.tid);
    f.finished = true;
#if PETRA_EMULATION_FIBERS
    void* discarded = nullptr;
    petra_emulation_switch_stack(&discarded, scheduler_sp_);
#endif
    std::abort();  // never resumed
  }

 private:
  // A new fiber's stack: the frame switch_stack pops (control words, six registers with r12 = the
  // fiber), then the trampoline as the return address. 16-byte aligned at the trampoline's call.
  void start(Fiber& f, int tid) {
    f.owner = this;
    f.tid = tid;
    f.finished = false;
#if PETRA_EMULATION_FIBERS
    auto* top = reinterpret_cast<std::uint64_t*>(static_cast<std::byte*>(f.stack) + kStackBytes);
    std::uint64_t* sp = top - 10;  // 8 slots used, the rest keeps the alignment
    std::uint32_t control[2];
    asm volatile("stmxcsr %0" : "=m"(control[0]));
    asm volatile("fnstcw %0" : "=m"(control[1]));
    std::memcpy(&sp[0], control, sizeof control);
    sp[1] = 0;                                          // r15
    sp[2] = 0;                                          // r14
    sp[3] = 0;                                          // r13
    sp[4] = reinterpret_cast<std::uint64_t>(&f);        // r12: the trampoline's argument
    sp[5] = 0;                                          // rbx
    sp[6] = 0;                                          // rbp
    sp[7] = reinterpret_cast<std::uint64_t>(&petra_emulation_fiber_trampoline);
    f.sp = sp;
#endif
  }

  std::vector<Fiber> fibers_;
  void* scheduler_sp_ = nullptr;
  Fiber* current_ = nullptr;
  const std::function<void(int)>* job_ = nullptr;
  static thread_local Fibers* active_;
};
thread_local Fibers* Fibers::active_ = nullptr;

// Waits, under `lock` on b's mutex, until `done()`: on the condition variable (threads), or
// yielding to the other fibers (cooperative).
template <class Done>
void wait_until(Block& b, std::unique_lock<std::mutex>& lock, Done done) {
  Fibers* fibers = Fibers::running();
  if (fibers == nullptr) {
    b.changed.wait(lock, done);
    return;
  }
  while (!done()) {
    lock.unlock();
    fibers->yield();
    lock.lock();
  }
}

std::mutex launch_mutex;  // one launch at a time: __shared__ is `static`
std::atomic<std::size_t> launch_count{0};
std::mutex record_mutex;
LaunchRecord last_record;
std::deque<LaunchRecord> recent_records;  // the last kRecentLaunches, oldest first
constexpr std::size_t kRecentLaunches = 16;
thread_local const char* launch_name = nullptr;

std::mutex opt_in_mutex;
std::map<const void*, int> opt_in;  // kernel -> cudaFuncAttributeMaxDynamicSharedMemorySize

struct SharedDeleter {
  void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t(256)); }
};
std::unique_ptr<std::byte[], SharedDeleter> dynamic_shared_buffer;  // a block's, or a cluster's
std::size_t shared_stride = 0;   // from one block's dynamic shared memory to the next rank's
std::size_t shared_bytes = 0;    // the launch's, per block
unsigned running_cluster = 1;    // blocks per cluster of the running launch

thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;

cudaError_t record(cudaError_t code) {
  if (code != cudaSuccess) last_error = code;
  return code;
}

// The configuration errors a GPU refuses a launch for.
std::string configuration_error(const detail::LaunchConfig& c) {
  const dim3 g = c.grid, b = c.block;
  const std::string refused = "; a GPU refuses this launch (cudaErrorInvalidConfiguration)";
  if (g.x == 0 || g.y == 0 || g.z == 0)
    return "grid " + dims(g) + " has a zero dimension" + refused +
           ": launch nothing when there is no work";
  if (b.x == 0 || b.y == 0 || b.z == 0)
    return "block " + dims(b) + " has a zero dimension" + refused;
  if (g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535)
    return "grid " + dims(g) + " is too large (x <= 2^31 - 1, y and z <= 65535)" + refused;
  const unsigned long long threads = 1ull * b.x * b.y * b.z;
  if (b.x > 1024 || b.y > 1024 || b.z > 64 || threads > kMaxBlockThreads)
    return "block " + dims(b) + " has " + std::to_string(threads) +
           " threads; a block holds at most 1024 (x and y <= 1024, z <= 64)" + refused;
  int limit = int(kDefaultSharedBytes);
  bool opted_in = false;
  {
    std::lock_guard lock(opt_in_mutex);
    if (auto it = opt_in.find(c.kernel); it != opt_in.end()) {
      limit = std::max(limit, it->second);
      opted_in = true;
    }
  }
  if (c.cluster == 0 || c.cluster > 8 || g.x % c.cluster != 0)
    return "a cluster of " + std::to_string(c.cluster) + " blocks in grid " + dims(g) +
           ": a cluster holds 1 to 8 blocks (portably) and divides grid.x" + refused;
  if (c.shared_bytes > std::size_t(limit)) {
    if (!opted_in)
      return "asks for " + std::to_string(c.shared_bytes) +
             " bytes of dynamic shared memory; a launch gets at most 49152 (48 KB, static and "
             "dynamic together) unless the kernel opts in with cudaFuncSetAttribute(kernel, "
             "cudaFuncAttributeMaxDynamicSharedMemorySize, bytes); a GPU refuses this launch";
    return "asks for " + std::to_string(c.shared_bytes) +
           " bytes of dynamic shared memory, more than the kernel's opt-in of " +
           std::to_string(limit) + " bytes; a GPU refuses this launch";
  }
  return {};
}

}  // namespace

Settings& settings() {
  static Settings s;
  return s;
}

bool cooperative_available() { return PETRA_EMULATION_FIBERS != 0; }

LaunchName::LaunchName(const char* name) : saved_(launch_name) { launch_name = name; }
LaunchName::~LaunchName() { launch_name = saved_; }

std::size_t launches() { return launch_count.load(); }

LaunchRecord last_launch() {
  std::lock_guard lock(record_mutex);
  return last_record;
}

std::vector<LaunchRecord> recent_launches(std::size_t count) {
  std::lock_guard lock(record_mutex);
  count = std::min({count, recent_records.size(), kRecentLaunches});
  return {recent_records.end() - std::ptrdiff_t(count), recent_records.end()};
}

namespace detail {

namespace {
void execute_grid(const LaunchConfig& c, const std::string& what, const std::function<void()>& body);
}  // namespace

void run_grid(const LaunchConfig& c, std::function<void()> body) {
  const std::string name = launch_name != nullptr ? std::string("'") + launch_name + "' (" +
                                                        c.kernel_text + ")"
                                                  : std::string(c.kernel_text);
  std::string what = "emulated kernel " + name + " <<<" + dims(c.grid) + ", " +
                     dims(c.block) + ", " + std::to_string(c.shared_bytes) + ">>>";
  if (current.block != nullptr)
    throw KernelError(what +
                      ": launched from inside a kernel (dynamic parallelism is not emulated)");
  if (settings().check_stream != nullptr) settings().check_stream(c.stream, true, what.c_str());
  {
    std::lock_guard launch_lock(launch_mutex);
    if (const std::string error = configuration_error(c); !error.empty())
      throw KernelError(what + ": " + error);
    ++launch_count;
    std::lock_guard lock(record_mutex);
    last_record = LaunchRecord{launch_name != nullptr ? launch_name : c.kernel_text, c.grid,
                               c.block, c.shared_bytes, c.kernel, c.cluster};
    recent_records.push_back(last_record);
    if (recent_records.size() > kRecentLaunches) recent_records.pop_front();
  }
  std::function<void()> grid = [c, what = std::move(what), body = std::move(body)] { execute_grid(c, what, body); };
  if (settings().submit != nullptr)
    settings().submit(c.stream, std::move(grid));
  else
    grid();
}

namespace {

// Runs the grid of a checked launch: its blocks one after another (a cluster's blocks together),
// a block's threads together.
void execute_grid(const LaunchConfig& c, const std::string& what, const std::function<void()>& body) {
  std::lock_guard launch_lock(launch_mutex);
  const unsigned cluster = c.cluster;
  shared_stride = (std::max<std::size_t>(c.shared_bytes, 1) + 255) / 256 * 256;
  shared_bytes = c.shared_bytes;
  running_cluster = cluster;
  dynamic_shared_buffer.reset(static_cast<std::byte*>(
      ::operator new[](shared_stride * cluster, std::align_val_t(256))));

  static Pool pool;
  static Fibers fibers;
  static ClusterState state;
  static std::list<Block> blocks;  // by rank; grows to the largest cluster
  while (blocks.size() < cluster) blocks.emplace_back(state);
  state.blocks.clear();
  for (Block& b : blocks)
    if (state.blocks.size() < cluster) state.blocks.push_back(&b);
  const int threads = int(c.block.x * c.block.y * c.block.z);
  const int cluster_threads = threads * int(cluster);
  const bool cooperative = settings().cooperative && PETRA_EMULATION_FIBERS;
  if (!cooperative) pool.reserve(cluster_threads);
  // Job i is thread i % threads of the cluster's block i / threads.
  const auto enter = [&](int i) {
    const unsigned rank = unsigned(i / threads), t = unsigned(i % threads);
    Block& block = *state.blocks[rank];
    threadIdx = uint3{t % c.block.x, t / c.block.x % c.block.y, t / (c.block.x * c.block.y)};
    blockIdx = uint3{block.index.x, block.index.y, block.index.z};
    current = Current{&block, int(t), rank};
  };
  const std::function<void(int)> job = [&](int i) {
    enter(i);
    blockDim = c.block;
    gridDim = c.grid;
    Block& block = *current.block;
    const int tid = current.tid;
    try {
      body();
    } catch (const Abort&) {
    } catch (const std::exception& e) {
      std::lock_guard lock(block.mutex);
      block.fail(block.thread_name(tid) + " threw: " + e.what());
    } catch (...) {
      std::lock_guard lock(block.mutex);
      block.fail(block.thread_name(tid) + " threw an exception");
    }
    current = Current{};
    // The thread has returned: a barrier that waits for it can no longer complete; meetings of its
    // warp no longer wait for it.
    std::lock_guard lock(block.mutex);
    --block.live;
    --state.live;
    if (block.first_returned < 0) block.first_returned = tid;
    const int w = tid / 32, lane = tid % 32;
    Warp& warp = block.warps[std::size_t(w)];
    warp.returned |= 1u << lane;
    if (block.at_barrier > 0) {
      const auto waiting = std::find_if(block.waits.begin(), block.waits.end(),
                                        [](const Wait& x) { return x.at_barrier(); });
      block.fail(block.thread_name(tid) + " returned while " + std::to_string(block.at_barrier) +
                 " threads wait at __syncthreads (" + site(waiting->where) +
                 "): on a GPU that barrier never completes, or lets the block through "
                 "unsynchronised; every thread of a block must reach every __syncthreads");
    }
    if (state.arrived > 0)
      block.fail(block.thread_name(tid) + " of block " + dims(block.index) + " returned while " +
                 std::to_string(state.arrived) +
                 " threads of its cluster wait at cluster_sync, a collective of cooperative groups: "
                 "every thread of a cluster must reach every cluster_sync (the hardware's barrier skips "
                 "exited threads, so the others would pass it without the ones that left)");
    for (WarpMeeting& m : warp.meetings)
      if (m.mask >> lane & 1u) block.try_complete(warp, m, w);
    block.check_deadlock();
  };

  for (unsigned z = 0; z < c.grid.z; ++z)
    for (unsigned y = 0; y < c.grid.y; ++y)
      for (unsigned x = 0; x < c.grid.x; x += cluster) {
        for (unsigned rank = 0; rank < cluster; ++rank) {
          state.blocks[rank]->reset(dim3(x + rank, y, z), c.block);
          std::memset(dynamic_shared_buffer.get() + rank * shared_stride, 0xff, c.shared_bytes);  // NaN
        }
        state.live = cluster_threads;
        state.arrived = 0;
        const std::string where = what + (cluster == 1 ? ", block " + dims(dim3(x, y, z))
                                                       : ", the cluster of blocks " + dims(dim3(x, y, z)) +
                                                             " to " + dims(dim3(x + cluster - 1, y, z)));
        if (cooperative) {
          Fibers::set_running(&fibers);
          try {
            fibers.run(job, cluster_threads, enter);
          } catch (...) {
            Fibers::set_running(nullptr);
            throw;
          }
          Fibers::set_running(nullptr);
        } else {
          pool.run(job, cluster_threads, settings().block_timeout_seconds, where);
        }
        if (state.failed) throw KernelError(where + ": " + state.error);
      }
}

}  // namespace

void* dynamic_shared_memory() {
  if (current.block == nullptr)
    throw KernelError("PETRA_DYNAMIC_SHARED used outside a kernel launched through PETRA_LAUNCH");
  return dynamic_shared_buffer.get() + current.rank * shared_stride;
}

unsigned cluster_block_rank() {
  return current_thread("cluster_block_rank", std::source_location::current()).rank;
}

unsigned cluster_block_count() {
  (void)current_thread("cluster_block_count", std::source_location::current());
  return running_cluster;
}

void* cluster_map_shared(void* p, unsigned rank, std::source_location where) {
  Current& t = current_thread("cluster_map_shared", where);
  Block& b = *t.block;
  std::byte* const mine = dynamic_shared_buffer.get() + t.rank * shared_stride;
  const auto* q = static_cast<std::byte*>(p);
  std::lock_guard lock(b.mutex);
  std::string error;
  if (rank >= running_cluster)
    error = "asks for the shared memory of rank " + std::to_string(rank) + " in a cluster of " +
            std::to_string(running_cluster) + " blocks";
  else if (q < mine || q >= mine + std::max<std::size_t>(shared_bytes, 1))
    error = "maps a pointer that is not in its block's dynamic shared memory (the emulation maps "
            "only PETRA_DYNAMIC_SHARED; a static __shared__ array is one array for the whole cluster here)";
  else if (b.cluster.blocks[rank]->live == 0)
    error = "maps the shared memory of block " + dims(b.cluster.blocks[rank]->index) +
            ", whose threads have all returned: on a GPU a block's shared memory is gone when it exits (a "
            "kernel that reads its peers' shared memory ends with a cluster barrier after the last read)";
  if (!error.empty()) {
    b.fail(b.thread_name(t.tid) + " of block " + dims(b.index) + " " + error + ", at " + site(where));
    throw Abort{};
  }
  return dynamic_shared_buffer.get() + rank * shared_stride + std::size_t(q - mine);
}

void cluster_sync(std::source_location where) {
  Current& t = current_thread("cluster_sync", where);
  Block& b = *t.block;
  ClusterState& c = b.cluster;
  std::unique_lock lock(b.mutex);
  if (b.failed) throw Abort{};
  for (const Block* other : c.blocks)
    if (other->first_returned >= 0) {
      b.fail(b.thread_name(t.tid) + " of block " + dims(b.index) + " reaches cluster_sync at " +
             site(where) + " after " + other->thread_name(other->first_returned) + " of block " +
             dims(other->index) +
             " returned: cluster_sync is a collective of cooperative groups, every thread of a cluster must "
             "reach every cluster_sync (the hardware's barrier skips exited threads, so the others would pass "
             "it without the ones that left)");
      throw Abort{};
    }
  b.waits[std::size_t(t.tid)] = Wait{kClusterSync, where, 0};
  ++b.blocked;
  ++c.arrived;
  if (c.arrived == c.live) {
    // Every thread of the cluster is here. On a GPU they must be at the same cluster_sync.
    for (Block* other : c.blocks)
      for (int tid = 0; tid < other->size; ++tid) {
        Wait& w = other->waits[std::size_t(tid)];
        if (!w.at_cluster_barrier()) continue;
        if (!same_site(w.where, where)) {
          b.fail("threads of a cluster wait at different cluster_sync: " + other->thread_name(tid) +
                 " of block " + dims(other->index) + " at " + site(w.where) + ", " +
                 b.thread_name(t.tid) + " of block " + dims(b.index) + " at " + site(where) +
                 " (undefined on a GPU)");
          throw Abort{};
        }
        w = Wait{};
        --other->blocked;
      }
    c.arrived = 0;
    ++c.phase;
    b.wake_cluster();
    return;
  }
  b.check_deadlock();
  const std::uint64_t phase = c.phase;
  wait_until(b, lock, [&] { return c.phase != phase || b.failed; });
  if (c.phase == phase) throw Abort{};
}

void check_width(const char* intrinsic, int width, std::source_location where) {
  if (width >= 1 && width <= 32 && (width & (width - 1)) == 0) return;
  Current& t = current_thread(intrinsic, where);
  {
    std::lock_guard lock(t.block->mutex);
    t.block->fail(t.block->thread_name(t.tid) + " calls " + intrinsic + " with width " +
                  std::to_string(width) + " at " + site(where) +
                  ": the width must be a power of two from 1 to 32 (undefined on a GPU)");
  }
  throw Abort{};
}

WarpResult warp_exchange(WarpOp op, unsigned mask, std::uint64_t value,
                         std::source_location where) {
  Current& t = current_thread(op_name(op), where);
  Block& b = *t.block;
  const int w = t.tid / 32;
  const unsigned lane = unsigned(t.tid % 32);
  Warp& warp = b.warps[std::size_t(w)];
  std::unique_lock lock(b.mutex);
  if (b.failed) throw Abort{};
  if (!(mask >> lane & 1u)) {
    b.fail(b.thread_name(t.tid) + " (lane " + std::to_string(lane) + ") calls " + op_name(op) +
           " with mask " + hex(mask) + ", which leaves the lane itself out, at " + site(where) +
           " (undefined on a GPU)");
    throw Abort{};
  }
  // Join the meeting with this mask, or start it. (At most one is incomplete per mask: every lane
  // that arrived at it waits.)
  auto m = std::find_if(warp.meetings.begin(), warp.meetings.end(),
                        [&](const WarpMeeting& x) { return !x.complete && x.mask == mask; });
  if (m != warp.meetings.end() && m->op != op) {
    b.fail("lanes of warp " + std::to_string(w) + " meet with mask " + hex(mask) +
           " in different intrinsics: " + op_name(m->op) + " at " + site(m->where) + ", and " +
           b.thread_name(t.tid) + " in " + op_name(op) + " at " + site(where) +
           " (undefined on a GPU)");
    throw Abort{};
  }
  if (m == warp.meetings.end()) {
    warp.meetings.push_back(WarpMeeting{op, mask, where});
    m = std::prev(warp.meetings.end());
  }
  m->arrived |= 1u << lane;
  m->values[lane] = value;
  b.waits[std::size_t(t.tid)] = Wait{op_name(op), where, mask};
  ++b.blocked;
  b.try_complete(warp, *m, w);
  if (!m->complete) {
    b.check_deadlock();
    wait_until(b, lock, [&] { return m->complete || b.failed; });
    if (!m->complete) throw Abort{};
  }
  WarpResult r;
  std::copy(std::begin(m->values), std::end(m->values), r.values);
  r.present = m->arrived;
  r.lane = lane;
  if (--m->readers == 0) warp.meetings.erase(m);
  return r;
}

void set_max_dynamic_shared(const void* kernel, int bytes) {
  std::lock_guard lock(opt_in_mutex);
  opt_in[kernel] = bytes;
}

}  // namespace detail

namespace runtime {

namespace {
// A copy's or fill's work: queued on the stream where Settings::submit is set, else done now.
void submit_or_run(cudaStream_t stream, std::function<void()> work) {
  if (settings().submit != nullptr)
    settings().submit(stream, std::move(work));
  else
    work();
}
}  // namespace

cudaError_t get_last_error() {
  const cudaError_t code = last_error;
  last_error = cudaSuccess;
  return code;
}

cudaError_t peek_at_last_error() { return last_error; }

cudaError_t get_device(int* device) {
  if (device == nullptr) return record(cudaErrorInvalidValue);
  *device = current_device;
  return cudaSuccess;
}

// The emulated machine has settings().device_count devices (1 unless the emulated device raised it).
cudaError_t set_device(int device) {
  if (device < 0 || device >= settings().device_count) return record(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

cudaError_t memcpy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind,
                         cudaStream_t stream) {
  if (settings().check_stream != nullptr) settings().check_stream(stream, false, "cudaMemcpyAsync");
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return record(cudaErrorInvalidValue);
  if (settings().check_memory != nullptr) {
    settings().check_memory(src, bytes, "cudaMemcpyAsync (source)");
    settings().check_memory(dst, bytes, "cudaMemcpyAsync (destination)");
  }
  submit_or_run(stream, [=] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}

cudaError_t memset_async(void* dst, int value, std::size_t bytes, cudaStream_t stream) {
  if (settings().check_stream != nullptr) settings().check_stream(stream, false, "cudaMemsetAsync");
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr) return record(cudaErrorInvalidValue);
  if (settings().check_memory != nullptr) settings().check_memory(dst, bytes, "cudaMemsetAsync");
  submit_or_run(stream, [=] { std::memset(dst, value, bytes); });
  return cudaSuccess;
}

cudaError_t stream_synchronize(cudaStream_t stream) {
  if (settings().check_stream != nullptr) settings().check_stream(stream, false, "cudaStreamSynchronize");
  if (settings().synchronize != nullptr) settings().synchronize(stream);
  return cudaSuccess;
}
cudaError_t device_synchronize() {
  if (settings().synchronize != nullptr) settings().synchronize(nullptr);
  return cudaSuccess;
}

cudaError_t func_set_attribute(const void* kernel, cudaFuncAttribute attribute, int value) {
  if (kernel == nullptr) return record(cudaErrorInvalidDeviceFunction);
  if (attribute == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || std::size_t(value) > settings().opt_in_shared_bytes) return record(cudaErrorInvalidValue);
    detail::set_max_dynamic_shared(kernel, value);
  }
  return cudaSuccess;
}

cudaError_t copy_to_symbol(void* symbol, std::size_t symbol_bytes, const void* src,
                           std::size_t bytes, std::size_t offset) {
  if (offset > symbol_bytes || bytes > symbol_bytes - offset || (bytes > 0 && src == nullptr))
    return record(cudaErrorInvalidValue);
  if (bytes > 0) std::memcpy(static_cast<std::byte*>(symbol) + offset, src, bytes);
  return cudaSuccess;
}

}  // namespace runtime

}  // namespace petra::cuda_emulation

void __syncthreads(std::source_location where) {
  using namespace petra::cuda_emulation;
  Current& t = current_thread("__syncthreads", where);
  Block& b = *t.block;
  std::unique_lock lock(b.mutex);
  if (b.failed) throw Abort{};
  if (b.first_returned >= 0) {
    b.fail(b.thread_name(t.tid) + " reaches __syncthreads at " + site(where) + " after " +
           b.thread_name(b.first_returned) +
           " returned: on a GPU that barrier never completes, or lets the block through "
           "unsynchronised; every thread of a block must reach every __syncthreads");
    throw Abort{};
  }
  b.waits[std::size_t(t.tid)] = Wait{kSyncthreads, where, 0};
  ++b.at_barrier;
  ++b.blocked;
  if (b.at_barrier == b.live) {
    // Every thread is here. On a GPU they must be at the same __syncthreads.
    for (int other = 0; other < b.size; ++other) {
      const Wait& w = b.waits[std::size_t(other)];
      if (w.at_barrier() && !same_site(w.where, where)) {
        b.fail("threads wait at different __syncthreads: " + b.thread_name(other) + " at " +
               site(w.where) + ", " + b.thread_name(t.tid) + " at " + site(where) +
               " (a __syncthreads in divergent code: undefined on a GPU)");
        throw Abort{};
      }
    }
    for (Wait& w : b.waits)
      if (w.at_barrier()) w = Wait{};
    b.blocked -= b.at_barrier;
    b.at_barrier = 0;
    ++b.phase;
    b.changed.notify_all();
    return;
  }
  b.check_deadlock();
  const std::uint64_t phase = b.phase;
  wait_until(b, lock, [&] { return b.phase != phase || b.failed; });
  if (b.phase == phase) throw Abort{};
}

#if PETRA_EMULATION_FIBERS
// The trampoline's target: runs the fiber's emulated thread (petra::cuda_emulation::Fibers::main).
extern "C" void petra_emulation_fiber_main(void* fiber) {
  auto& f = *static_cast<petra::cuda_emulation::Fiber*>(fiber);
  f.owner->main(f);
}
#endif
