// pipeline/messages.hpp: what travels between the stages of a pipeline, and the FIFO it travels in.
//
// A mini-batch enters stage 0 as a MiniBatch {images, labels} (the runtime's own input type: the
// pipeline does not know where data comes from). Going up, a ForwardMessage carries a stage's
// output; the labels travel with it to the head. Going down, a BackwardMessage carries the pair
// PETRA sends: the sender's input (exact, or rebuilt by a reversible stage) and the gradient of the
// loss with respect to it. Every message names its mini-batch, and the receiver checks that id
// against the one the schedule expects.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

#include "petra/error.hpp"
#include "petra/nn/stage.hpp"
#include "petra/stream.hpp"
#include "petra/tensor.hpp"

namespace petra::pipeline {

struct MiniBatch {
  Tensor images;  // float32 [B, C, H, W]
  Tensor labels;  // int64 [B]
};

// Mini-batch m of a run, on demand (the trainer maps m to batch m % S of epoch m / S).
using BatchSource = std::function<MiniBatch(std::int64_t microbatch)>;

struct ForwardMessage {
  std::int64_t microbatch = -1;
  Tensor activation;
  Tensor labels;  // travel with the activation to the head
  // GPU workers (the concurrent executor): recorded on the sender's stream after the kernels that
  // wrote the tensors; the receiver's stream waits for it. Null elsewhere (one stream, in order).
  std::shared_ptr<Event> ready;
};

struct BackwardMessage {
  std::int64_t microbatch = -1;
  Tensor input;     // the sender's input: exact (buffered, head) or rebuilt (reversible)
  Tensor gradient;  // of the loss with respect to that input
  std::shared_ptr<Event> ready;  // as ForwardMessage::ready
};

// What the head reports for each mini-batch it trained on. The numbers stay where the head's
// kernels wrote them until read (nn::HeadNumbers::read): a GPU pipeline never waits for them.
struct HeadStats {
  std::int64_t microbatch = -1;
  nn::HeadNumbers numbers;
  std::int64_t samples = 0;
};
using HeadCallback = std::function<void(const HeadStats&)>;

// A FIFO of messages between two neighbouring stages. pop(wait = false) raises if no message is
// there (sequential executor: a missing message means the schedule and the executor disagree).
// pop(wait = true) blocks (concurrent executor), but never for ever: it raises PipelineStuckError
// after `timeout` without a message, and as soon as the channel is aborted (another worker
// failed). Either way the message popped must be the expected mini-batch's.
class PipelineStuckError : public Error {
 public:
  using Error::Error;
};

template <class Message>
class Channel {
 public:
  void push(Message m) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(m));
    }
    arrived_.notify_one();
  }
  Message pop(bool wait, std::int64_t microbatch, int stage, const char* what,
              std::chrono::milliseconds timeout = std::chrono::milliseconds::max());
  // Wakes every waiting pop, which then raises; reopen() undoes it (before the next run).
  void abort();
  void reopen();
  // The messages waiting, oldest first (between runs only: no lock is taken).
  const std::deque<Message>& pending() const { return queue_; }
  // Drops every message waiting (between runs only: a checkpoint's state replaces them).
  void clear() {
    std::lock_guard lock(mutex_);
    queue_.clear();
  }

 private:
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<Message> queue_;
  bool aborted_ = false;
};

extern template class Channel<ForwardMessage>;
extern template class Channel<BackwardMessage>;

}  // namespace petra::pipeline
