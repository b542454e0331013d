// nn/module.hpp: the base of every layer, block, stage and model.
//
// A Module owns named parameters (Variables that require gradients), named buffers (plain
// Tensors such as batch norm's running statistics) and named child modules. Names compose into
// dotted paths ("stages.3.f.conv1.weight"), which are also the file names of the saved state: a
// directory with one .npy file per parameter and buffer, so weights move freely between petra,
// NumPy and PyTorch.
//
// Parameters and buffers are allocated by the module's constructor, so they get the tag and owner
// of the MemoryScope active then (the model factory opens MemoryScope(parameters, stage index)).
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "petra/autograd.hpp"

namespace petra::nn {

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Recursive, in registration order, with dotted names.
  std::vector<std::pair<std::string, Variable>> named_parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  std::vector<Variable> parameters() const;
  std::int64_t parameter_count() const;

  // Moves every parameter (with its gradient, if any) and every buffer to `device`, in place: the
  // Variables and Tensors that already refer to them (a layer's members, an optimizer's groups)
  // follow, since their storage moves (Storage::move_to), and keep their tag and owner. An
  // optimizer's state follows its parameters at the optimizer's next step (nn/optimizer.hpp).
  // Synchronous; not while other threads run the module.
  void to(Device device) const;
  // The device of the first parameter (or buffer); cpu:0 for a module with neither.
  Device device() const;

  void train(bool on = true);  // recursive
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void zero_grad() const;

  // One <dotted name>.npy per parameter and buffer, written atomically. load_state checks every
  // file's shape and dtype and raises IOError naming the file when one is missing or differs.
  void save_state(const std::filesystem::path& dir) const;
  void load_state(const std::filesystem::path& dir) const;

 protected:
  Variable register_parameter(std::string name, Tensor value);
  Tensor register_buffer(std::string name, Tensor value);
  template <class M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    children_.emplace_back(std::move(name), module);
    return module;
  }

 private:
  void collect_parameters(const std::string& prefix, std::vector<std::pair<std::string, Variable>>& out) const;
  void collect_buffers(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const;

  std::vector<std::pair<std::string, Variable>> parameters_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace petra::nn
