// tests/consumer/consumer.cpp: a program that uses petra as an installed dependency.
// Built by check_consumer.sh with nothing but `pkg-config --cflags --libs petra`: every header is
// reached through the one include root, <petra/...>.
#include <petra/nn/models.hpp>
#include <petra/petra.hpp>
#include <petra/pipeline/schedule.hpp>

#include <cstdio>

int main() {
  using namespace petra;
  const Variable w(Tensor::from_vector<float>({3}, {1.0f, 2.0f, 3.0f}), true);
  const Variable x(Tensor::from_vector<float>({3}, {4.0f, 5.0f, 6.0f}));
  const Variable y = mul(w, x);
  y.backward(Tensor::full({3}, 1.0));
  const auto g = w.grad().to_vector<float>();  // d(w x)/dw = x
  nn::ModelConfig config;  // RevNet18, width 4: 10 stages (stem, 8 blocks, head)
  config.width = 4;
  const nn::Model model(config);
  const auto grid = pipeline::make_schedule(pipeline::PipelineMethod::petra, int(model.num_stages()), 4, 1, true);
  std::printf("petra %s: grad = %g %g %g; revnet18 has %zu stages, a drained grid of 4 mini-batches %lld steps\n",
              PETRA_VERSION, g[0], g[1], g[2], model.num_stages(), static_cast<long long>(grid.steps));
  return (g[0] == 4.0f && g[1] == 5.0f && g[2] == 6.0f && model.num_stages() == 10 && grid.steps == 22) ? 0 : 1;
}
