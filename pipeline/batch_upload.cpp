// pipeline/batch_upload.cpp: pinned staging buffers, the copy stream, and the prefetching source.
#include "petra/pipeline/batch_upload.hpp"

#include <cstring>

#include "petra/cuda_backend.hpp"

namespace petra::pipeline {

BatchUploader::BatchUploader(Device device, int slots) : device_(device), copy_stream_(device) {
  PETRA_CHECK(device.is_cuda(), DeviceError, "BatchUploader: uploads go to a GPU, not ", device.str());
  PETRA_CHECK(slots >= 1, ValueError, "BatchUploader: needs at least one buffer, got ", slots);
  slots_.resize(static_cast<std::size_t>(slots));
}

BatchUploader::~BatchUploader() {
  copy_stream_.synchronize();  // no copy may still read a buffer freed here
  for (Slot& slot : slots_) Allocator::instance().deallocate(slot.pinned);
}

BatchUploader::InFlight BatchUploader::start(const MiniBatch& host) {
  PETRA_CHECK(host.images.defined() && host.labels.defined() && host.images.device().is_cpu() &&
                  host.labels.device().is_cpu(),
              DeviceError, "BatchUploader: a batch to upload must be on the CPU");
  const Tensor images = host.images.contiguous(), labels = host.labels.contiguous();
  // Labels start at a 256-byte boundary after the images.
  const std::size_t labels_at = (images.nbytes() + 255) / 256 * 256;
  const std::size_t bytes = labels_at + labels.nbytes();
  Slot& slot = slots_[next_];
  next_ = (next_ + 1) % slots_.size();
  if (slot.copied) slot.copied->synchronize();  // its last copy has read the buffer
  if (slot.pinned.bytes < bytes) {
    Allocator::instance().deallocate(slot.pinned);
    slot.pinned = {};
    slot.pinned = Allocator::instance().allocate_pinned(bytes, MemoryTag::input_buffer, 0);
  }
  auto* staging = static_cast<std::byte*>(slot.pinned.ptr);
  std::memcpy(staging, images.raw_data(), images.nbytes());
  std::memcpy(staging + labels_at, labels.raw_data(), labels.nbytes());

  InFlight out;
  {
    StreamGuard on_copy_stream(copy_stream_);  // the tensors' blocks are the copy stream's
    out.batch.images = Tensor::empty(images.shape(), images.dtype(), device_);
    out.batch.labels = Tensor::empty(labels.shape(), labels.dtype(), device_);
  }
  void* const stream = copy_stream_.handle().cuda_stream;
  cuda_backend::memcpy_async(out.batch.images.raw_data(), staging, images.nbytes(), stream);
  cuda_backend::memcpy_async(out.batch.labels.raw_data(), staging + labels_at, labels.nbytes(), stream);
  out.copied = std::make_shared<Event>(device_);
  out.copied->record(copy_stream_);
  slot.copied = out.copied;
  return out;
}

MiniBatch BatchUploader::finish(InFlight in_flight) const {
  Stream& compute = Stream::for_device(device_);
  compute.wait(*in_flight.copied);
  in_flight.batch.images.storage()->record_stream(compute);
  in_flight.batch.labels.storage()->record_stream(compute);
  return std::move(in_flight.batch);
}

DeviceBatches::DeviceBatches(Device device, BatchSource host, std::int64_t batches)
    : uploader_(device), host_(std::move(host)), batches_(batches) {}

MiniBatch DeviceBatches::operator()(std::int64_t microbatch) {
  std::lock_guard lock(mutex_);
  BatchUploader::InFlight current;
  if (started_ && started_->first == microbatch)
    current = std::move(started_->second);
  else
    current = uploader_.start(host_(microbatch));
  started_.reset();
  if (microbatch + 1 < batches_) started_.emplace(microbatch + 1, uploader_.start(host_(microbatch + 1)));
  return uploader_.finish(std::move(current));
}

}  // namespace petra::pipeline
