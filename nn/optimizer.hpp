// nn/optimizer.hpp: optimizers over named parameter groups (SGD, Adam, LARS), with PyTorch's
// semantics (the update formulas are in kernels/optim.hpp), and their state on disk.
//
// An optimizer holds groups of named parameters (Variables). Each group has its own weight decay
// and a learning-rate scale; step(lr) updates, for every parameter whose grad() is defined, the
// parameter in place with learning rate lr * lr_scale. Parameters without a gradient are skipped
// and their state does not advance, as in PyTorch. The state of a parameter (momentum buffer,
// Adam's moments, its own step count) is allocated on its first update, on the parameter's device,
// with tag optimizer_state and the owner of the parameter's storage, so a pipeline stage's
// optimizer memory is counted against that stage.
//
//   auto groups = nn::decay_groups(model.named_parameters(), 5e-4);  // no decay on BN and biases
//   auto optimizer = nn::make_optimizer("sgd", groups, {.momentum = 0.9, .nesterov = true});
//   optimizer->step(nn::learning_rate(schedule, iteration, iterations_per_epoch));
//   optimizer->zero_grad();
//
// LARS adapts the learning rate of a parameter by its trust ratio only in groups with weight
// decay: a group with weight_decay == 0 (batch-norm parameters and biases, see decay_groups) gets
// plain momentum SGD (trust ratio 1), as the common LARS implementations for ResNets exclude them.
//
// Devices: the state of a parameter lives on the parameter's device. It is allocated there on the
// first update, read there by load_state, and it follows its parameter: a step that finds a
// parameter on another device than its state (the model was moved with nn::Module::to) moves the
// state first, in place. to(device) moves all the state at once (for example before measuring
// memory).
//
// save_state(dir) writes one .npy file per state tensor, named <parameter>.<state>.npy (e.g.
// "stages.3.f.conv1.weight.momentum_buffer.npy"), then the manifest optimizer_state.txt:
//   petra-optimizer-state 1
//   optimizer sgd
//   step_count 120
//   param stages.3.f.conv1.weight 120      (one line per parameter with state: its own step count)
// The manifest is written last, so a directory with a manifest holds complete tensor files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "petra/autograd.hpp"
#include "petra/tensor.hpp"

namespace petra::nn {

using NamedParameters = std::vector<std::pair<std::string, Variable>>;

struct ParamGroup {
  NamedParameters params;
  double weight_decay = 0;  // coupled L2: added to the gradient (SGD, Adam) or inside LARS
  double lr_scale = 1;      // this group's learning rate is step(lr)'s lr * lr_scale
};

class Optimizer {
 public:
  // Parameter names must be unique across groups; weight_decay and lr_scale non-negative.
  explicit Optimizer(std::vector<ParamGroup> groups);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient, with learning rate lr (>= 0) times the
  // group's lr_scale. Gradients are read, not cleared.
  void step(double lr);
  // Drops every parameter's gradient (PyTorch's zero_grad(set_to_none=True)).
  void zero_grad();
  // Moves every state tensor to `device` (in place; the parameters are moved by Module::to).
  void to(Device device);

  const std::vector<ParamGroup>& groups() const { return groups_; }
  std::int64_t step_count() const { return step_count_; }  // calls of step() so far

  virtual std::string name() const = 0;                       // "sgd", "adam", "lars"
  virtual std::vector<std::string> state_names() const = 0;   // per-parameter tensors, in order

  // A state tensor of a parameter ("momentum_buffer", "exp_avg", "exp_avg_sq"); undefined before
  // the parameter's first update. Throws ValueError for an unknown parameter or state name.
  Tensor state(const std::string& param_name, const std::string& state_name) const;
  // How many updates this parameter has received (0 before its first).
  std::int64_t parameter_steps(const std::string& param_name) const;

  // Writes the state into `dir` (created if missing). Throws IOError if it cannot.
  void save_state(const std::filesystem::path& dir) const;
  // Replaces the state by the one saved in `dir` by an optimizer of the same kind over parameters
  // of the same names and shapes; parameters absent from the manifest get fresh state. Throws
  // IOError for a missing or malformed file, ValueError for a mismatch (kind, name, shape).
  void load_state(const std::filesystem::path& dir);

 protected:
  struct ParameterState {
    std::int64_t steps = 0;       // updates received so far
    std::vector<Tensor> tensors;  // one per state_names(), empty until the first update
  };
  // Applies one update to `param` (its data and grad are defined) with this group's learning rate.
  // state.steps counts the updates before this one.
  virtual void update(const Variable& param, const ParamGroup& group, double lr, ParameterState& state) = 0;

 private:
  struct Location {
    std::size_t group, index;
  };
  const Location& locate(const std::string& param_name) const;
  void allocate_state(const Variable& param, ParameterState& state) const;

  std::vector<ParamGroup> groups_;
  std::vector<std::vector<ParameterState>> states_;  // [group][parameter]
  std::unordered_map<std::string, Location> by_name_;
  std::int64_t step_count_ = 0;
};

// torch.optim.SGD. Nesterov needs momentum > 0 and dampening == 0.
class Sgd final : public Optimizer {
 public:
  // delay > 0: spike compensation for gradients `delay` updates late (kernels/optim.hpp,
  // SgdOptions::delay); needs 0 < momentum < 1 and dampening 0.
  Sgd(std::vector<ParamGroup> groups, double momentum = 0, double dampening = 0, bool nesterov = false,
      double delay = 0);
  std::string name() const override { return "sgd"; }
  std::vector<std::string> state_names() const override;  // {"momentum_buffer"}, or {} without momentum

 private:
  void update(const Variable& param, const ParamGroup& group, double lr, ParameterState& state) override;
  double momentum_, dampening_;
  bool nesterov_;
  double delay_;
};

// torch.optim.Adam (L2 weight decay added to the gradient, not AdamW; no amsgrad). Each parameter
// counts its own steps for the bias corrections, as PyTorch.
class Adam final : public Optimizer {
 public:
  Adam(std::vector<ParamGroup> groups, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8);
  std::string name() const override { return "adam"; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 private:
  void update(const Variable& param, const ParamGroup& group, double lr, ParameterState& state) override;
  double beta1_, beta2_, eps_;
};

// LARS (You et al. 2017) with momentum; trust coefficient eta. Groups with weight_decay == 0 are
// not adapted: they get momentum SGD (torch.optim.SGD, dampening 0).
class Lars final : public Optimizer {
 public:
  Lars(std::vector<ParamGroup> groups, double momentum = 0.9, double eta = 0.001);
  std::string name() const override { return "lars"; }
  std::vector<std::string> state_names() const override { return {"momentum_buffer"}; }

 private:
  void update(const Variable& param, const ParamGroup& group, double lr, ParameterState& state) override;
  double momentum_, eta_;
};

// True unless the parameter is a bias or belongs to a batch-norm module: its name's last dotted
// component is "bias", or the component before it (the owning module) starts with "bn".
//   "stages.3.f.conv1.weight" -> true;  "stages.3.f.bn1.weight", "stages.9.fc.bias" -> false.
bool takes_weight_decay(std::string_view param_name);

// Two groups, in this order: {parameters that take weight decay, weight_decay} and
// {batch-norm parameters and biases, 0}. Either may be empty.
std::vector<ParamGroup> decay_groups(const NamedParameters& named_params, double weight_decay);

// Hyper-parameters of make_optimizer; each optimizer reads its own.
struct OptimizerOptions {
  double momentum = 0.9;   // sgd, lars
  double dampening = 0;    // sgd
  bool nesterov = false;   // sgd
  double delay = 0;        // sgd: spike compensation for gradients this many updates late
  double beta1 = 0.9;      // adam
  double beta2 = 0.999;    // adam
  double eps = 1e-8;       // adam
  double eta = 0.001;      // lars trust coefficient
};

// name: "sgd", "adam" or "lars"; anything else raises ValueError.
std::unique_ptr<Optimizer> make_optimizer(std::string_view name, std::vector<ParamGroup> groups,
                                          const OptimizerOptions& options = {});

}  // namespace petra::nn
