// pipeline/stage_runtime.cpp: one stage under a training method: what its forward keeps, how its
// backward gets its input back (kept graph, stored input, or rebuilt from the output), and its update.
#include "petra/pipeline/stage_runtime.hpp"

#include <tuple>

#include "petra/functions.hpp"
#include "petra/stream.hpp"

namespace petra::pipeline {

Keeping keeping(PipelineMethod method, nn::StageKind kind) {
  if (kind == nn::StageKind::head) return {};  // forward and backward in the same step
  const bool reversible = kind == nn::StageKind::reversible;
  switch (method) {
    case PipelineMethod::backprop: return {.graph = true};
    case PipelineMethod::revbackprop: return {.input = !reversible};
    case PipelineMethod::petra: return {.input = !reversible};
    case PipelineMethod::delayed_reversible: return {.input = !reversible, .parameters = true};
    case PipelineMethod::dsp: return {.input = true};
    case PipelineMethod::pipedream: return {.input = true, .parameters = true};
  }
  return {};
}

namespace {

// Runs with the stashed parameters for its lifetime, then puts the current ones back.
template <class Swap>
struct StashedParameters {
  Swap swap;
  bool active;
  StashedParameters(Swap s, bool on) : swap(s), active(on) {
    if (active) swap();
  }
  ~StashedParameters() {
    if (active) swap();
  }
};

}  // namespace

bool rebuilds_input(PipelineMethod method, nn::StageKind kind) {
  const Keeping k = keeping(method, kind);
  return kind == nn::StageKind::reversible && !k.input && !k.graph;
}

double update_delay(PipelineMethod method, int index, int stages, std::int64_t accumulation) {
  if (!is_delayed(method)) return 0;
  return 2.0 * (stages - 1 - index) / static_cast<double>(accumulation);
}

StageRuntime::StageRuntime(nn::Stage& stage, int index, int stages, const RuntimeOptions& options,
                           bool next_keeps_input, bool previous_rebuilds_input)
    : stage_(stage), index_(index), stages_(stages), options_(options), keeping_(keeping(options.method, stage.kind())),
      next_keeps_input_(next_keeps_input),
      previous_rebuilds_input_(previous_rebuilds_input),
      delay_(update_delay(options.method, index, stages, options.accumulation)) {
  nn::OptimizerOptions optimizer_options = options.optimizer_options;
  if (options.delay_compensation) optimizer_options.delay = delay_;
  optimizer_ = nn::make_optimizer(options.optimizer, nn::decay_groups(stage.named_parameters(), options.weight_decay),
                                  optimizer_options);
}

void StageRuntime::swap_parameters(std::vector<Tensor>& values) {
  const auto params = stage_.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    Tensor current = params[i].data();
    params[i].set_data(values[i]);
    values[i] = std::move(current);
  }
}

std::vector<Tensor> StageRuntime::gradients_before() const {
  std::vector<Tensor> copies;
  if (!capture_gradient_) return copies;
  for (const auto& p : stage_.parameters()) copies.push_back(p.grad().defined() ? p.grad().clone() : Tensor());
  return copies;
}

void StageRuntime::capture(const std::vector<Tensor>& before, std::int64_t microbatch) {
  if (!capture_gradient_) return;
  captured_gradient_.clear();
  const auto params = stage_.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& after = params[i].grad();
    if (!after.defined()) {
      captured_gradient_.push_back(Tensor::zeros(params[i].shape(), params[i].data().dtype(), params[i].data().device()));
      continue;
    }
    captured_gradient_.push_back(before[i].defined() ? ops::sub(after, before[i]) : after.clone());
  }
  captured_microbatch_ = microbatch;
}

double StageRuntime::learning_rate(std::int64_t microbatch) const {
  const std::int64_t m = replica_microbatch(microbatch, options_.iterations_per_epoch, options_.replicas);
  const double lr = nn::learning_rate(options_.schedule, m, options_.iterations_per_epoch);
  const double factor = delay_lr_factor(delay_, m, options_.delay_lr_warmup);
  return factor == 1.0 ? lr : lr * factor;
}

// The momentum buffer is what the coming updates will apply (see delay_mitigation.hpp), at the
// learning rate of this mini-batch: the rate moves little over one delay. A parameter without a
// buffer yet (before its first update) is used as it is.
std::vector<std::pair<Variable, Tensor>> StageRuntime::predict_parameters(std::int64_t microbatch) {
  std::vector<std::pair<Variable, Tensor>> current;
  const double updates_ahead = options_.prediction_horizon * delay_;
  if (options_.weight_prediction == WeightPrediction::none || updates_ahead == 0) return current;
  const double lr = learning_rate(microbatch);
  MemoryScope scope(MemoryTag::param_stash, index_);  // the predicted copies live for one forward
  for (const nn::ParamGroup& group : optimizer_->groups()) {
    for (const auto& [name, param] : group.params) {
      const Tensor velocity = optimizer_->state(name, "momentum_buffer");
      if (!velocity.defined()) continue;
      current.emplace_back(param, param.data());
      param.set_data(predict_parameter(param.data(), velocity, lr * group.lr_scale * updates_ahead));
    }
  }
  return current;
}

StageRuntime::Kept StageRuntime::pop(std::int64_t microbatch, const char* what) {
  PETRA_CHECK(!fifo_.empty(), Error, "stage ", index_, ": ", what, " of mini-batch ", microbatch,
              " but no mini-batch is in flight here");
  PETRA_CHECK(fifo_.front().microbatch == microbatch, Error, "stage ", index_, ": ", what, " of mini-batch ", microbatch,
              " but the oldest in flight is ", fifo_.front().microbatch, " (messages out of order)");
  Kept kept = std::move(fifo_.front());
  fifo_.pop_front();
  return kept;
}

namespace {

// Puts the parameters' current data back when the forward that ran with predicted ones ends.
struct RestoreParameters {
  std::vector<std::pair<Variable, Tensor>> current;
  ~RestoreParameters() {
    for (auto& [param, data] : current) param.set_data(std::move(data));
  }
};

}  // namespace

ForwardMessage StageRuntime::forward(ForwardMessage in) {
  // With weight prediction the forward (and a parameter stash, which then holds what it used)
  // sees the parameters predicted for this mini-batch's backward.
  const RestoreParameters restore{predict_parameters(in.microbatch)};
  Kept kept{in.microbatch, {}, {}, {}, {}};
  if (keeping_.input || options_.track_reconstruction) kept.input = in.activation;
  if (keeping_.parameters) {
    MemoryScope scope(MemoryTag::param_stash, index_);
    for (const auto& p : stage_.parameters()) kept.parameters.push_back(p.data().clone());
  }
  ForwardMessage out{in.microbatch, {}, std::move(in.labels), nullptr};
  MemoryScope scope(MemoryTag::activations, index_);  // the forward's temporaries (or its kept graph)
  if (keeping_.graph) {
    // Exact backprop: record the graph and keep it until this mini-batch's backward. The output is
    // part of that graph, so it stays this stage's activation.
    GradModeGuard grad(true);
    nn::RunningStatsGuard statistics(true);  // no recomputation follows: the forward moves them
    kept.graph_input = Variable(in.activation, /*requires_grad=*/index_ > 0);
    kept.graph_output = stage_.forward(kept.graph_input);
    out.activation = kept.graph_output.data();
  } else {
    NoGradGuard no_grad;
    nn::RunningStatsGuard statistics(options_.statistics_pass == nn::StatisticsPass::forward);
    out.activation = stage_.forward(Variable(in.activation)).data();
    out.activation.storage()->retag(next_keeps_input_ ? MemoryTag::input_buffer : MemoryTag::messages,
                                    next_keeps_input_ ? index_ + 1 : index_);
  }
  fifo_.push_back(std::move(kept));
  return out;
}

// Back-propagates dy through the graph the forward kept, returning the input's gradient (none for
// stage 0, whose input is the images). The graph is freed as it is walked.
Tensor StageRuntime::backward_through_graph(Kept& kept, const Tensor& dy) {
  const Variable outputs[] = {kept.graph_output};
  const Tensor seeds[] = {dy};
  Tensor dx;
  if (index_ == 0) {
    petra::backward(outputs, seeds);
  } else {
    const Variable capture[] = {kept.graph_input};
    dx = petra::backward(outputs, seeds, capture)[0];
  }
  kept.graph_output = {};
  return dx;
}

namespace {
// What a backward reads from the kept state runs on the calling thread's stream of its device,
// which need not be the stream that last used it (a checkpoint loaded on another thread, a worker's
// stream after the one its forward ran on): the allocator must wait for this stream too before it
// reuses the blocks.
void record_use_on_current_stream(const Tensor& t) {
  if (t.defined() && t.device().is_cuda()) t.storage()->record_stream(Stream::for_device(t.device()));
}
}  // namespace

BackwardMessage StageRuntime::backward(BackwardMessage from_above) {
  Kept kept = pop(from_above.microbatch, "backward");
  record_use_on_current_stream(kept.input);
  for (const Tensor& p : kept.parameters) record_use_on_current_stream(p);
  BackwardMessage out{from_above.microbatch, {}, {}, nullptr};
  MemoryScope scope(MemoryTag::activations, index_);  // the recomputed graph, freed at the end
  const std::vector<Tensor> before = gradients_before();
  nn::StatisticsPassScope statistics(options_.statistics_pass);
  StashedParameters stash([&] { swap_parameters(kept.parameters); }, keeping_.parameters);
  const bool rebuilds = rebuilds_input(options_.method, stage_.kind());
  if (keeping_.graph) {
    out.gradient = backward_through_graph(kept, from_above.gradient);
    out.input = kept.graph_input.data();
  } else if (rebuilds) {
    // PETRA (current parameters) or delayed-reversible (stashed ones): rebuild the input from the
    // output received from above, reusing F's graph for the backward.
    std::tie(out.input, out.gradient) = stage_.reconstruct_and_backward(from_above.input, from_above.gradient);
    // (A mini-batch in flight from a checkpoint of a run that did not track has no true input.)
    if (options_.track_reconstruction && kept.input.defined())
      last_reconstruction_error_ = ops::relative_error(out.input, kept.input);
  } else {
    out.gradient = nn::backward_from_input(stage_, kept.input, from_above.gradient, /*input_gradient=*/index_ > 0);
    out.input = std::move(kept.input);
  }
  if (out.gradient.defined()) out.gradient.storage()->retag(MemoryTag::messages, index_);
  if (!previous_rebuilds_input_) out.input = Tensor();  // the stage below keeps what it needs
  if (rebuilds && out.input.defined()) out.input.storage()->retag(MemoryTag::messages, index_);  // it travels down
  ++received_;
  capture(before, from_above.microbatch);
  return out;
}

std::int64_t replica_microbatch(std::int64_t m, std::int64_t iterations_per_epoch, int replicas) {
  if (replicas == 1) return m;
  const std::int64_t per_replica = iterations_per_epoch / replicas;
  return m / per_replica * iterations_per_epoch + m % per_replica * replicas + replicas - 1;
}

BackwardMessage StageRuntime::head_step(ForwardMessage in, HeadStats& stats) {
  MemoryScope scope(MemoryTag::activations, index_);
  const std::vector<Tensor> before = gradients_before();
  const nn::HeadResult r = stage_.loss_and_backward(in.activation, in.labels);
  r.dx.storage()->retag(MemoryTag::messages, index_);
  stats = {in.microbatch, r.numbers, in.labels.numel()};
  ++received_;
  capture(before, in.microbatch);
  return {in.microbatch, previous_rebuilds_input_ ? std::move(in.activation) : Tensor(), r.dx, nullptr};
}

void StageRuntime::update(std::int64_t microbatch) {
  if (received_ == 0) return;
  if (options_.apply_updates) {
    if (received_ > 1) {
      MemoryScope scope(MemoryTag::gradients, index_);
      const double inverse = 1.0 / static_cast<double>(received_);
      for (const auto& p : stage_.parameters())
        if (p.grad().defined()) p.set_grad(ops::scale(p.grad(), inverse));
    }
    if (options_.average_over_replicas) options_.average_over_replicas(stage_.parameters());
    optimizer_->step(learning_rate(microbatch));
    optimizer_->zero_grad();
  }
  received_ = 0;
}

}  // namespace petra::pipeline
