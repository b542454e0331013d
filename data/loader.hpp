// data/loader.hpp: batches for training and evaluation, shuffled, augmented, normalised and
// prepared ahead of time on a background thread.
//
//   Loader train(split.train, {.batch_size = 128, .seed = 7});
//   for (std::int64_t epoch = 0; epoch < epochs; ++epoch) {
//     train.start_epoch(epoch);
//     while (std::optional<Batch> batch = train.next()) step(batch->images, batch->labels);
//   }
//
// Epoch e visits the samples in the order Philox(seed, shuffle_stream(e)).permutation(N) (or
// 0..N-1 without shuffling), in batches of batch_size; the last batch holds the remainder (it is
// kept, not dropped). Sample i of epoch e is augmented as data/transforms.hpp says. So the batches
// are a function of (dataset, options, epoch) only: bit-identical with or without prefetching.
//
// Prefetching: a background thread assembles up to prefetch_depth batches ahead, running on into
// the next epoch when it reaches the end of one, so the next step's batch is ready when the step
// starts. start_epoch(e) keeps what was prepared if it is epoch e's, else restarts the thread at e.
// An exception in the thread is rethrown by next(); the destructor stops and joins the thread.
//
// Every label of a batch is checked against the data set's class count (ValueError otherwise).
//
// Batches are allocated under MemoryScope(options.memory_tag) (default: messages; a batch is what
// the first stage receives, and the labels what the last stage receives) in the calling thread or
// the prefetch thread; each batch is new storage (recycled by the caching allocator), so a batch
// stays valid after later calls.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "petra/data/dataset.hpp"
#include "petra/data/transforms.hpp"
#include "petra/allocator.hpp"

namespace petra::data {

struct LoaderOptions {
  std::int64_t batch_size = 128;
  std::uint64_t seed = 0;
  bool shuffle = true;   // false: 0..N-1 every epoch (--no-shuffle)
  bool augment = true;   // false: no crop, no flip (--no-augment; evaluation)
  std::optional<Augmentation> augmentation = std::nullopt;  // default: the data set's own
  bool prefetch = true;                      // a background thread prepares batches ahead
  int prefetch_depth = 2;                    // batches prepared ahead (>= 1)
  MemoryTag memory_tag = MemoryTag::messages;
};

struct Batch {
  Tensor images;  // float32 [B, C, H, W], normalised
  Tensor labels;  // int64 [B]
  std::int64_t epoch = 0;
  std::int64_t index = 0;  // batch number within the epoch
};

class Loader {
 public:
  Loader(const Dataset& dataset, const LoaderOptions& options);  // positioned at the start of epoch 0
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  std::int64_t size() const { return dataset_.size(); }
  std::int64_t batches_per_epoch() const;
  const Dataset& dataset() const { return dataset_; }
  const LoaderOptions& options() const { return options_; }

  // The order in which epoch e visits the samples.
  std::vector<std::int64_t> order(std::int64_t epoch) const;
  // Batch `index` of `epoch`, assembled in the calling thread (random access; the same bits next() gives).
  Batch batch(std::int64_t epoch, std::int64_t index) const;

  void start_epoch(std::int64_t epoch);
  std::optional<Batch> next();  // the next batch of the current epoch; nullopt after its last

 private:
  struct Position {
    std::int64_t epoch = 0;
    std::int64_t index = 0;
    friend bool operator==(const Position&, const Position&) = default;
  };
  struct Prepared {
    Position position;
    Batch batch;
    std::exception_ptr error;
  };
  Batch make_batch(Position position, std::span<const std::int64_t> order) const;
  void prefetch_loop();
  Position following(Position p) const;
  void steer_producer_locked(Position p);  // make p the next prepared batch (restart unless it already is)

  Dataset dataset_;
  LoaderOptions options_;
  BatchAssembler assembler_;
  Position consumer_;  // the batch next() returns next

  // Random access (batch()): the order of the epoch asked for last, made once per epoch (shuffling
  // the whole dataset costs more than assembling a batch). Guarded by order_mutex_: batch() is const
  // and may be called from any thread.
  mutable std::mutex order_mutex_;
  mutable std::int64_t cached_order_epoch_ = -1;
  mutable std::shared_ptr<const std::vector<std::int64_t>> cached_order_;

  // Inline mode (no prefetch): the order of the current epoch.
  std::int64_t inline_order_epoch_ = -1;
  std::vector<std::int64_t> inline_order_;

  // Prefetch mode: guarded by mutex_.
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Prepared> ready_;
  Position producer_;            // the batch the thread makes next
  std::uint64_t generation_ = 0;  // bumped by a restart: work of an older generation is dropped
  bool producer_failed_ = false;  // the thread stopped after an exception, until a restart
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace petra::data
