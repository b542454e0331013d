// benchmarks/kernel_trace.cpp: libpetra-kernel-trace.so, a CUPTI injection library that writes every
// kernel, copy and memset a CUDA program runs to a CSV (start and end in ns of the GPU's clock, the
// stream, the kind, the name): what Nsight Systems' cuda_gpu_trace report gives, for machines with
// no working nsys (the H200 images have Nsight Compute's copy of the nsys CLI, which records but
// cannot import its own trace: "Unable to retrieve the importer version", 2026-12-04).
// scripts/gpu-check.sh's `streams` group merges each stream's intervals into busy shares.
//
//   CUDA_INJECTION64_PATH=/path/libpetra-kernel-trace.so PETRA_KERNEL_TRACE=trace.csv petra-train ...
//
// How: the CUDA driver loads the library named by CUDA_INJECTION64_PATH when the program creates
// its first context and calls InitializeInjection(), before any kernel (the mechanism the NVIDIA
// tools use). That enables CUPTI's activity records for kernels (the concurrent kind, so that
// kernels of different streams may overlap in the trace as they did on the device), copies and
// memsets. CUPTI fills buffers it asks this library for and hands each back full; their records
// are appended to the CSV under a mutex. At exit the remaining records are flushed. The program
// itself is not changed or rebuilt, and pays only CUPTI's timestamping (about 1 us a launch).
//
// Columns: start_ns,end_ns,stream,kind,name. Kernel names are mangled (a profiler's), quoted.
#include <cupti.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace {

std::FILE* trace_file = nullptr;
std::mutex trace_mutex;

constexpr std::size_t kBufferBytes = std::size_t(8) << 20;  // CUPTI's suggested size is a few MiB

void check(CUptiResult result, const char* what) {
  if (result == CUPTI_SUCCESS) return;
  const char* message = nullptr;
  cuptiGetResultString(result, &message);
  std::fprintf(stderr, "petra-kernel-trace: %s failed: %s\n", what, message ? message : "unknown CUPTI error");
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

// One record as a CSV line (caller holds trace_mutex).
void write_record(const CUpti_Activity* record) {
  switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      std::fprintf(trace_file, "%llu,%llu,%u,kernel,\"%s\"\n", static_cast<unsigned long long>(k->start),
                   static_cast<unsigned long long>(k->end), k->streamId, k->name ? k->name : "?");
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      std::fprintf(trace_file, "%llu,%llu,%u,memcpy,\"copy kind %d, %llu bytes\"\n",
                   static_cast<unsigned long long>(m->start), static_cast<unsigned long long>(m->end), m->streamId,
                   int(m->copyKind), static_cast<unsigned long long>(m->bytes));
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      std::fprintf(trace_file, "%llu,%llu,%u,memset,\"%llu bytes\"\n", static_cast<unsigned long long>(m->start),
                   static_cast<unsigned long long>(m->end), m->streamId, static_cast<unsigned long long>(m->bytes));
      break;
    }
    default:
      break;
  }
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t, std::size_t valid) {
  {
    std::lock_guard<std::mutex> lock(trace_mutex);
    CUpti_Activity* record = nullptr;
    while (trace_file && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) write_record(record);
  }
  std::free(buffer);
}

void flush_at_exit() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(trace_mutex);
  if (trace_file) std::fclose(trace_file);
  trace_file = nullptr;
}

}  // namespace

// Called by the CUDA driver (CUDA_INJECTION64_PATH); nonzero: success.
extern "C" int InitializeInjection() {
  const char* path = std::getenv("PETRA_KERNEL_TRACE");
  if (path == nullptr || *path == '\0') path = "kernel-trace.csv";
  trace_file = std::fopen(path, "w");
  if (trace_file == nullptr) {
    std::fprintf(stderr, "petra-kernel-trace: cannot write %s: %s\n", path, std::strerror(errno));
    return 0;
  }
  std::fprintf(trace_file, "start_ns,end_ns,stream,kind,name\n");
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enabling kernel records");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enabling copy records");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enabling memset records");
  std::atexit(flush_at_exit);
  return 1;
}
