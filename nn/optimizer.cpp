// nn/optimizer.cpp: the optimizers of nn/optimizer.hpp: the per-parameter loop with lazily
// allocated state, the three updates (which call the kernels through petra/ops), and the state's
// files.
#include "petra/nn/optimizer.hpp"

#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>
#include <system_error>

#include "petra/allocator.hpp"
#include "petra/error.hpp"
#include "petra/npy.hpp"
#include "petra/functions.hpp"
#include "petra/optimizer_steps.hpp"

namespace petra::nn {

namespace {

constexpr const char* kManifestName = "optimizer_state.txt";
constexpr const char* kManifestMagic = "petra-optimizer-state 1";

bool is_valid_parameter_name(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name)
    if (c == '/' || std::isspace(static_cast<unsigned char>(c))) return false;
  return true;
}

void check_hyperparameter(bool ok, const char* optimizer, const char* what, double value) {
  PETRA_CHECK(ok && std::isfinite(value), ValueError, optimizer, ": invalid ", what, " ", value);
}

std::filesystem::path state_file(const std::filesystem::path& dir, const std::string& param_name,
                                 const std::string& state_name) {
  return dir / (param_name + "." + state_name + ".npy");
}

// The manifest as read back: the optimizer's kind, its step count, and each parameter's steps.
struct Manifest {
  std::string optimizer;
  std::int64_t step_count = 0;
  std::vector<std::pair<std::string, std::int64_t>> parameter_steps;
};

[[noreturn]] void manifest_error(const std::filesystem::path& path, int line_number, const std::string& what) {
  throw IOError(detail::concat("load_state: ", path.string(), " line ", line_number, ": ", what));
}

Manifest read_manifest(const std::filesystem::path& path) {
  std::ifstream in(path);
  PETRA_CHECK(in.is_open(), IOError, "load_state: cannot open ", path.string());
  Manifest manifest;
  std::string line;
  int line_number = 0;
  bool has_optimizer = false, has_step_count = false;
  while (std::getline(in, line)) {
    ++line_number;
    if (line_number == 1) {
      if (line != kManifestMagic) manifest_error(path, 1, "expected '" + std::string(kManifestMagic) + "'");
      continue;
    }
    std::istringstream fields(line);
    std::string key, extra;
    fields >> key;
    if (key == "optimizer") {
      fields >> manifest.optimizer;
      has_optimizer = !manifest.optimizer.empty();
    } else if (key == "step_count") {
      has_step_count = static_cast<bool>(fields >> manifest.step_count) && manifest.step_count >= 0;
    } else if (key == "param") {
      std::string name;
      std::int64_t steps = -1;
      if (!(fields >> name >> steps) || steps < 1) manifest_error(path, line_number, "expected 'param NAME STEPS'");
      manifest.parameter_steps.emplace_back(name, steps);
    } else if (!key.empty()) {
      manifest_error(path, line_number, "unknown entry '" + key + "'");
    }
    if (fields >> extra) manifest_error(path, line_number, "unexpected '" + extra + "'");
  }
  if (line_number == 0) manifest_error(path, 1, "empty file");
  if (!has_optimizer || !has_step_count) manifest_error(path, line_number, "missing 'optimizer' or 'step_count'");
  return manifest;
}

// Written to a temporary file renamed over the manifest, so a reader never sees half of it.
void write_manifest(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path temporary = path.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << text;
    out.flush();
    PETRA_CHECK(out.good(), IOError, "save_state: cannot write ", temporary.string());
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  PETRA_CHECK(!error, IOError, "save_state: cannot rename ", temporary.string(), " to ", path.string(), ": ",
              error.message());
}

}  // namespace

// ---------------------------------------------------------------- Optimizer

Optimizer::Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  states_.resize(groups_.size());
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    check_hyperparameter(group.weight_decay >= 0, "optimizer", "weight_decay", group.weight_decay);
    check_hyperparameter(group.lr_scale >= 0, "optimizer", "lr_scale", group.lr_scale);
    states_[g].resize(group.params.size());
    for (std::size_t i = 0; i < group.params.size(); ++i) {
      const auto& [name, param] = group.params[i];
      PETRA_CHECK(is_valid_parameter_name(name), ValueError, "optimizer: parameter name '", name,
                  "' must be non-empty, without spaces or '/'");
      PETRA_CHECK(param.defined(), ValueError, "optimizer: parameter '", name, "' is undefined");
      PETRA_CHECK(by_name_.emplace(name, Location{g, i}).second, ValueError, "optimizer: parameter '", name,
                  "' appears twice");
    }
  }
}

void Optimizer::step(double lr) {
  check_hyperparameter(lr >= 0, name().c_str(), "learning rate", lr);
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    for (std::size_t i = 0; i < group.params.size(); ++i) {
      const Variable& param = group.params[i].second;
      if (!param.grad().defined()) continue;  // no gradient reached it: skipped, as in PyTorch
      ParameterState& state = states_[g][i];
      if (state.tensors.empty()) allocate_state(param, state);
      for (const Tensor& t : state.tensors) t.storage()->move_to(param.data().device());  // follows the parameter
      update(param, group, lr * group.lr_scale, state);
      ++state.steps;
    }
  }
  ++step_count_;
}

void Optimizer::to(Device device) {
  for (auto& group : states_)
    for (ParameterState& state : group)
      for (const Tensor& t : state.tensors) t.storage()->move_to(device);
}

void Optimizer::zero_grad() {
  for (const ParamGroup& group : groups_)
    for (const auto& entry : group.params) entry.second.zero_grad();
}

// Zeros (Adam's moments start at zero; SGD's buffer is overwritten on the first step), on the
// parameter's device, counted as optimizer state of the parameter's owner.
void Optimizer::allocate_state(const Variable& param, ParameterState& state) const {
  const Tensor& data = param.data();
  MemoryScope scope(MemoryTag::optimizer_state, data.storage()->owner());
  for (std::size_t k = 0; k < state_names().size(); ++k)
    state.tensors.push_back(Tensor::zeros(data.shape(), data.dtype(), data.device()));
}

const Optimizer::Location& Optimizer::locate(const std::string& param_name) const {
  const auto found = by_name_.find(param_name);
  PETRA_CHECK(found != by_name_.end(), ValueError, name(), ": no parameter named '", param_name, "'");
  return found->second;
}

Tensor Optimizer::state(const std::string& param_name, const std::string& state_name) const {
  const Location& at = locate(param_name);
  const auto names = state_names();
  for (std::size_t k = 0; k < names.size(); ++k) {
    if (names[k] != state_name) continue;
    const ParameterState& s = states_[at.group][at.index];
    return k < s.tensors.size() ? s.tensors[k] : Tensor();
  }
  throw ValueError(detail::concat(name(), ": no state named '", state_name, "'"));
}

std::int64_t Optimizer::parameter_steps(const std::string& param_name) const {
  const Location& at = locate(param_name);
  return states_[at.group][at.index].steps;
}

void Optimizer::save_state(const std::filesystem::path& dir) const {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  PETRA_CHECK(!error, IOError, "save_state: cannot create ", dir.string(), ": ", error.message());
  const auto names = state_names();
  std::ostringstream manifest;
  manifest << kManifestMagic << "\noptimizer " << name() << "\nstep_count " << step_count_ << "\n";
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    for (std::size_t i = 0; i < groups_[g].params.size(); ++i) {
      const ParameterState& s = states_[g][i];
      if (s.steps == 0) continue;
      const std::string& param_name = groups_[g].params[i].first;
      for (std::size_t k = 0; k < names.size(); ++k) save_npy(state_file(dir, param_name, names[k]), s.tensors[k]);
      manifest << "param " << param_name << " " << s.steps << "\n";
    }
  }
  write_manifest(dir / kManifestName, manifest.str());
}

void Optimizer::load_state(const std::filesystem::path& dir) {
  const std::filesystem::path manifest_path = dir / kManifestName;
  const Manifest manifest = read_manifest(manifest_path);
  PETRA_CHECK(manifest.optimizer == name(), ValueError, "load_state: ", manifest_path.string(), " holds the state of ",
              manifest.optimizer, ", not ", name());
  // Everything is read first and swapped in at the end: a failure leaves the optimizer unchanged.
  std::vector<std::vector<ParameterState>> loaded(groups_.size());
  for (std::size_t g = 0; g < groups_.size(); ++g) loaded[g].resize(groups_[g].params.size());
  const auto names = state_names();
  for (const auto& [param_name, steps] : manifest.parameter_steps) {
    const Location& at = locate(param_name);
    const Tensor& data = groups_[at.group].params[at.index].second.data();
    ParameterState& s = loaded[at.group][at.index];
    PETRA_CHECK(s.steps == 0, ValueError, "load_state: ", manifest_path.string(), " lists '", param_name, "' twice");
    s.steps = steps;
    MemoryScope scope(MemoryTag::optimizer_state, data.storage()->owner());
    for (const std::string& state_name : names) {
      const std::filesystem::path file = state_file(dir, param_name, state_name);
      Tensor t = load_npy(file, data.device());
      PETRA_CHECK(t.shape() == data.shape() && t.dtype() == data.dtype(), ValueError, "load_state: ", file.string(),
                  " holds ", t.str(), " for parameter ", data.str());
      s.tensors.push_back(std::move(t));
    }
  }
  states_ = std::move(loaded);
  step_count_ = manifest.step_count;
}

// ---------------------------------------------------------------- SGD

Sgd::Sgd(std::vector<ParamGroup> groups, double momentum, double dampening, bool nesterov, double delay)
    : Optimizer(std::move(groups)), momentum_(momentum), dampening_(dampening), nesterov_(nesterov), delay_(delay) {
  check_hyperparameter(momentum >= 0, "sgd", "momentum", momentum);
  check_hyperparameter(std::isfinite(dampening), "sgd", "dampening", dampening);
  PETRA_CHECK(!nesterov || (momentum > 0 && dampening == 0), ValueError,
              "sgd: Nesterov momentum needs momentum > 0 and dampening 0 (got momentum ", momentum, ", dampening ",
              dampening, ")");
  check_hyperparameter(delay >= 0 && std::isfinite(delay), "sgd", "delay", delay);
  PETRA_CHECK(delay == 0 || (momentum > 0 && momentum < 1 && dampening == 0), ValueError,
              "sgd: delay compensation needs 0 < momentum < 1 and dampening 0 (got momentum ", momentum,
              ", dampening ", dampening, ")");
}

std::vector<std::string> Sgd::state_names() const {
  if (momentum_ == 0) return {};
  return {"momentum_buffer"};
}

void Sgd::update(const Variable& param, const ParamGroup& group, double lr, ParameterState& state) {
  const SgdOptions options{.lr = lr, .momentum = momentum_, .dampening = dampening_,
                           .weight_decay = group.weight_decay, .nesterov = nesterov_, .delay = delay_};
  const Tensor buffer = state.tensors.empty() ? Tensor() : state.tensors[0];
  ops::sgd_step(param.data(), param.grad(), buffer, options, state.steps == 0);
}

// ---------------------------------------------------------------- Adam

Adam::Adam(std::vector<ParamGroup> groups, double beta1, double beta2, double eps)
    : Optimizer(std::move(groups)), beta1_(beta1), beta2_(beta2), eps_(eps) {
  check_hyperparameter(beta1 >= 0 && beta1 < 1, "adam", "beta1", beta1);
  check_hyperparameter(beta2 >= 0 && beta2 < 1, "adam", "beta2", beta2);
  check_hyperparameter(eps >= 0, "adam", "eps", eps);
}

void Adam::update(const Variable& param, const ParamGroup& group, double lr, ParameterState& state) {
  const AdamOptions options{.lr = lr, .beta1 = beta1_, .beta2 = beta2_, .eps = eps_,
                            .weight_decay = group.weight_decay};
  ops::adam_step(param.data(), param.grad(), state.tensors[0], state.tensors[1], options, state.steps + 1);
}

// ---------------------------------------------------------------- LARS

Lars::Lars(std::vector<ParamGroup> groups, double momentum, double eta)
    : Optimizer(std::move(groups)), momentum_(momentum), eta_(eta) {
  check_hyperparameter(momentum >= 0, "lars", "momentum", momentum);
  check_hyperparameter(eta > 0, "lars", "eta", eta);
}

void Lars::update(const Variable& param, const ParamGroup& group, double lr, ParameterState& state) {
  const Tensor& buffer = state.tensors[0];
  if (group.weight_decay == 0) {  // not adapted: momentum SGD (batch-norm parameters, biases)
    const SgdOptions options{.lr = lr, .momentum = momentum_, .dampening = 0, .weight_decay = 0, .nesterov = false};
    ops::sgd_step(param.data(), param.grad(), buffer, options, state.steps == 0);
    return;
  }
  const LarsOptions options{.lr = lr, .momentum = momentum_, .weight_decay = group.weight_decay, .eta = eta_};
  ops::lars_step(param.data(), param.grad(), buffer, options);
}

// ---------------------------------------------------------------- groups and factory

bool takes_weight_decay(std::string_view param_name) {
  const auto last_dot = param_name.rfind('.');
  if (last_dot == std::string_view::npos) return param_name != "bias";
  if (param_name.substr(last_dot + 1) == "bias") return false;
  const std::string_view module_path = param_name.substr(0, last_dot);
  const auto module_dot = module_path.rfind('.');
  const std::string_view module = module_dot == std::string_view::npos ? module_path : module_path.substr(module_dot + 1);
  return !module.starts_with("bn");
}

std::vector<ParamGroup> decay_groups(const NamedParameters& named_params, double weight_decay) {
  std::vector<ParamGroup> groups(2);
  groups[0].weight_decay = weight_decay;
  groups[1].weight_decay = 0;
  for (const auto& entry : named_params) groups[takes_weight_decay(entry.first) ? 0 : 1].params.push_back(entry);
  return groups;
}

std::unique_ptr<Optimizer> make_optimizer(std::string_view name, std::vector<ParamGroup> groups,
                                          const OptimizerOptions& o) {
  if (name == "sgd") return std::make_unique<Sgd>(std::move(groups), o.momentum, o.dampening, o.nesterov, o.delay);
  PETRA_CHECK(o.delay == 0, ValueError, "make_optimizer: delay compensation is for sgd only (got '", name, "')");
  if (name == "adam") return std::make_unique<Adam>(std::move(groups), o.beta1, o.beta2, o.eps);
  if (name == "lars") return std::make_unique<Lars>(std::move(groups), o.momentum, o.eta);
  throw ValueError(detail::concat("make_optimizer: unknown optimizer '", name, "' (expected sgd, adam or lars)"));
}

}  // namespace petra::nn
