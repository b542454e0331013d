// data/loader.cpp: the Loader: epoch orders, batch assembly, and the prefetch thread.
//
// The prefetch thread and the consumer share a queue of prepared batches, each tagged with its
// (epoch, index). The consumer knows which batch it wants next; if the head of the queue (or the
// batch the thread is making) is not that one, it clears the queue and restarts the thread there
// (a new generation; a batch finished for an older generation is dropped). Since a batch is a pure
// function of (epoch, index), the thread never changes the numbers, only when they are made.
#include "petra/data/loader.hpp"

#include <numeric>
#include <utility>

#include "petra/error.hpp"
#include "petra/rng.hpp"

namespace petra::data {

namespace {

Augmentation effective_augmentation(const Dataset& dataset, const LoaderOptions& options) {
  if (!options.augment) return Augmentation{};
  return options.augmentation.value_or(dataset.augmentation);
}

}  // namespace

Loader::Loader(const Dataset& dataset, const LoaderOptions& options)
    : dataset_(dataset), options_(options), assembler_(dataset, effective_augmentation(dataset, options)) {
  PETRA_CHECK(options.batch_size >= 1, ValueError, "Loader(", dataset.name, "): batch size ", options.batch_size);
  PETRA_CHECK(options.prefetch_depth >= 1, ValueError, "Loader(", dataset.name, "): prefetch depth ", options.prefetch_depth);
  if (options_.prefetch && batches_per_epoch() > 0) thread_ = std::thread([this] { prefetch_loop(); });
}

Loader::~Loader() {
  if (!thread_.joinable()) return;
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

std::int64_t Loader::batches_per_epoch() const { return (size() + options_.batch_size - 1) / options_.batch_size; }

std::vector<std::int64_t> Loader::order(std::int64_t epoch) const {
  PETRA_CHECK(epoch >= 0, ValueError, "Loader::order: epoch ", epoch);
  if (options_.shuffle) return Philox(options_.seed, shuffle_stream(epoch)).permutation(size());
  std::vector<std::int64_t> identity(static_cast<std::size_t>(size()));
  std::iota(identity.begin(), identity.end(), std::int64_t{0});
  return identity;
}

Batch Loader::make_batch(Position position, std::span<const std::int64_t> order) const {
  const std::int64_t first = position.index * options_.batch_size;
  const std::int64_t count = std::min(options_.batch_size, size() - first);
  const MemoryScope scope(options_.memory_tag);
  Batch batch;
  batch.epoch = position.epoch;
  batch.index = position.index;
  batch.images = Tensor::empty({count, dataset_.channels(), dataset_.height(), dataset_.width()}, DType::f32);
  batch.labels = Tensor::empty({count}, DType::i64);
  std::int64_t* labels = batch.labels.data_ptr<std::int64_t>();
  assembler_.assemble(order.subspan(static_cast<std::size_t>(first), static_cast<std::size_t>(count)), options_.seed,
                      position.epoch, batch.images.data_ptr<float>(), labels);
  for (std::int64_t i = 0; i < count; ++i)
    PETRA_CHECK(labels[i] >= 0 && labels[i] < dataset_.classes, ValueError, "Loader(", dataset_.name, "): sample ",
                order[static_cast<std::size_t>(first + i)], " has label ", labels[i], ", outside [0, ", dataset_.classes, ")");
  return batch;
}

Batch Loader::batch(std::int64_t epoch, std::int64_t index) const {
  PETRA_CHECK(index >= 0 && index < batches_per_epoch(), ValueError, "Loader::batch: index ", index, " of ",
              batches_per_epoch(), " batches");
  std::shared_ptr<const std::vector<std::int64_t>> epoch_order;
  {
    const std::lock_guard lock(order_mutex_);
    if (cached_order_epoch_ != epoch) {
      cached_order_ = std::make_shared<const std::vector<std::int64_t>>(order(epoch));
      cached_order_epoch_ = epoch;
    }
    epoch_order = cached_order_;
  }
  return make_batch({epoch, index}, *epoch_order);
}

Loader::Position Loader::following(Position p) const {
  return p.index + 1 < batches_per_epoch() ? Position{p.epoch, p.index + 1} : Position{p.epoch + 1, 0};
}

void Loader::steer_producer_locked(Position p) {
  const bool on_course = !ready_.empty() ? ready_.front().position == p : (!producer_failed_ && producer_ == p);
  if (on_course) return;
  ready_.clear();
  ++generation_;
  producer_ = p;
  producer_failed_ = false;
  changed_.notify_all();
}

void Loader::start_epoch(std::int64_t epoch) {
  PETRA_CHECK(epoch >= 0, ValueError, "Loader::start_epoch: epoch ", epoch);
  consumer_ = {epoch, 0};
  if (!thread_.joinable()) return;
  const std::lock_guard lock(mutex_);
  steer_producer_locked(consumer_);
}

std::optional<Batch> Loader::next() {
  if (consumer_.index >= batches_per_epoch()) return std::nullopt;
  if (!thread_.joinable()) {
    if (inline_order_epoch_ != consumer_.epoch) {
      inline_order_ = order(consumer_.epoch);
      inline_order_epoch_ = consumer_.epoch;
    }
    Batch batch = make_batch(consumer_, inline_order_);
    ++consumer_.index;
    return batch;
  }
  Prepared item;
  {
    std::unique_lock lock(mutex_);
    steer_producer_locked(consumer_);
    changed_.wait(lock, [this] { return !ready_.empty(); });
    item = std::move(ready_.front());
    ready_.pop_front();
  }
  changed_.notify_all();  // room in the queue
  if (item.error) std::rethrow_exception(item.error);
  ++consumer_.index;
  return std::move(item.batch);
}

void Loader::prefetch_loop() {
  std::int64_t order_epoch = -1;
  std::vector<std::int64_t> epoch_order;
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [this] {
      return stopping_ || (!producer_failed_ && ready_.size() < static_cast<std::size_t>(options_.prefetch_depth));
    });
    if (stopping_) return;
    const Position position = producer_;
    const std::uint64_t generation = generation_;
    lock.unlock();
    Prepared item{position, {}, nullptr};
    try {
      if (order_epoch != position.epoch) {
        epoch_order = order(position.epoch);
        order_epoch = position.epoch;
      }
      item.batch = make_batch(position, epoch_order);
    } catch (...) {
      item.error = std::current_exception();
    }
    lock.lock();
    if (generation != generation_) continue;  // restarted meanwhile: this batch is not wanted
    producer_failed_ = item.error != nullptr;  // a failed thread waits for the consumer to restart it
    if (!producer_failed_) producer_ = following(position);
    ready_.push_back(std::move(item));
    changed_.notify_all();
  }
}

}  // namespace petra::data
