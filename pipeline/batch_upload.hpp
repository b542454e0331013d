// pipeline/batch_upload.hpp: mini-batches to a GPU through pinned host buffers on a copy stream,
// the next one's copy overlapping the current step.
//
// BatchUploader copies a host MiniBatch to its device in two halves. start() packs the images and
// labels into a page-locked host buffer (one of `slots`, used in turn) and queues their copy on the
// uploader's own copy stream, then returns at once; finish(), called by the thread that will
// compute on the batch, makes that thread's stream of the device (Stream::for_device) wait for the
// copy's event, with no host wait, and tells the allocator that this stream reads the tensors
// (Storage::record_stream), so their blocks are not reused before it is done. The device tensors
// are allocated for the copy stream; the host waits only before it overwrites a buffer whose
// previous copy may still run (two slots: the copy of two batches ago).
//
// DeviceBatches wraps a host BatchSource: asked for mini-batch m, it finishes m (started when
// m - 1 was asked for, else now) and starts m + 1, so that m + 1's copy runs on the copy stream
// while the compute stream runs step m. On a GPU that is the overlap; on the emulated device (whose
// work is synchronous) it is the same calls in the same order.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "petra/allocator.hpp"
#include "petra/stream.hpp"
#include "petra/pipeline/messages.hpp"

namespace petra::pipeline {

class BatchUploader {
 public:
  // A copy stream and `slots` pinned buffers (grown to the largest batch) for `device` (a GPU).
  explicit BatchUploader(Device device, int slots = 2);
  ~BatchUploader();
  BatchUploader(const BatchUploader&) = delete;
  BatchUploader& operator=(const BatchUploader&) = delete;

  struct InFlight {
    MiniBatch batch;              // on the device, being written by the copy stream
    std::shared_ptr<Event> copied;  // recorded after the copy
  };
  // Queues the copy of `host` (CPU tensors, any layout) and returns.
  InFlight start(const MiniBatch& host);
  // The batch, ready for the calling thread's stream of the device (which waits for the copy).
  MiniBatch finish(InFlight in_flight) const;
  MiniBatch upload(const MiniBatch& host) { return finish(start(host)); }

  Device device() const { return device_; }

 private:
  struct Slot {
    Allocation pinned;
    std::shared_ptr<Event> copied;  // the last copy out of this buffer
  };
  Device device_;
  Stream copy_stream_;
  std::vector<Slot> slots_;
  std::size_t next_ = 0;
};

class DeviceBatches {
 public:
  // Mini-batches [0, batches) of `host` on `device`.
  DeviceBatches(Device device, BatchSource host, std::int64_t batches);
  MiniBatch operator()(std::int64_t microbatch);
  BatchUploader& uploader() { return uploader_; }

 private:
  BatchUploader uploader_;
  BatchSource host_;
  std::int64_t batches_;
  std::mutex mutex_;  // the first stage's worker asks, whichever thread that is
  std::optional<std::pair<std::int64_t, BatchUploader::InFlight>> started_;
};

}  // namespace petra::pipeline
