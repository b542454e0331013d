// nn/module.cpp: parameter registry, train/eval, and state directories of .npy files.
#include "petra/nn/module.hpp"

#include "petra/npy.hpp"

namespace petra::nn {

namespace {
std::string join(const std::string& prefix, const std::string& name) { return prefix.empty() ? name : prefix + "." + name; }
}  // namespace

Variable Module::register_parameter(std::string name, Tensor value) {
  Variable v(std::move(value), /*requires_grad=*/true);
  parameters_.emplace_back(std::move(name), v);
  return v;
}

Tensor Module::register_buffer(std::string name, Tensor value) {
  buffers_.emplace_back(std::move(name), value);
  return value;
}

void Module::collect_parameters(const std::string& prefix, std::vector<std::pair<std::string, Variable>>& out) const {
  for (const auto& [name, v] : parameters_) out.emplace_back(join(prefix, name), v);
  for (const auto& [name, child] : children_) child->collect_parameters(join(prefix, name), out);
}

void Module::collect_buffers(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [name, t] : buffers_) out.emplace_back(join(prefix, name), t);
  for (const auto& [name, child] : children_) child->collect_buffers(join(prefix, name), out);
}

std::vector<std::pair<std::string, Variable>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Variable>> out;
  collect_parameters("", out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect_buffers("", out);
  return out;
}

std::vector<Variable> Module::parameters() const {
  std::vector<Variable> out;
  for (auto& [name, v] : named_parameters()) out.push_back(v);
  return out;
}

std::int64_t Module::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& [name, v] : named_parameters()) n += v.data().numel();
  return n;
}

void Module::to(Device device) const {
  for (const auto& [name, v] : named_parameters()) {
    v.data().storage()->move_to(device);
    if (v.grad().defined()) v.grad().storage()->move_to(device);
  }
  for (const auto& [name, t] : named_buffers()) t.storage()->move_to(device);
}

Device Module::device() const {
  const auto params = named_parameters();
  if (!params.empty()) return params.front().second.data().device();
  const auto buffers = named_buffers();
  return buffers.empty() ? Device::cpu() : buffers.front().second.device();
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::zero_grad() const {
  for (const auto& [name, v] : named_parameters()) v.zero_grad();
}

void Module::save_state(const std::filesystem::path& dir) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  PETRA_CHECK(!ec, IOError, "save_state: cannot create directory ", dir.string(), ": ", ec.message());
  for (const auto& [name, v] : named_parameters()) save_npy(dir / (name + ".npy"), v.data());
  for (const auto& [name, t] : named_buffers()) save_npy(dir / (name + ".npy"), t);
}

namespace {
Tensor load_checked(const std::filesystem::path& file, const Tensor& like) {
  PETRA_CHECK(std::filesystem::exists(file), IOError, "load_state: missing ", file.string());
  const Tensor loaded = load_npy(file, like.device());
  PETRA_CHECK(loaded.shape() == like.shape() && loaded.dtype() == like.dtype(), IOError, "load_state: ", file.string(),
              " holds ", loaded.str(), " but the model expects ", like.str());
  return loaded;
}
}  // namespace

void Module::load_state(const std::filesystem::path& dir) const {
  // Read everything first, then assign: a bad file leaves the module unchanged.
  const auto params = named_parameters();
  const auto buffers = named_buffers();
  std::vector<Tensor> param_values, buffer_values;
  for (const auto& [name, v] : params) param_values.push_back(load_checked(dir / (name + ".npy"), v.data()));
  for (const auto& [name, t] : buffers) buffer_values.push_back(load_checked(dir / (name + ".npy"), t));
  for (std::size_t i = 0; i < params.size(); ++i) params[i].second.data().copy_from(param_values[i]);
  for (std::size_t i = 0; i < buffers.size(); ++i) buffers[i].second.copy_from(buffer_values[i]);
}

}  // namespace petra::nn
