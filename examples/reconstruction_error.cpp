// examples/reconstruction_error.cpp: how exact is "rebuild the input instead of storing it"?
//
// Builds a RevNet, pushes one random mini-batch through it keeping every stage's true input (for
// this demonstration only), then walks back down the way reversible backprop does: each reversible
// stage rebuilds its input from the (already rebuilt) output above it, each buffered stage hands
// down its exact stored input. Prints, per stage, the relative error of the rebuilt input in each
// stream: the first stream is a copy (error 0), the second carries float32 rounding, which
// compounds over consecutive reversible stages and is reset by every buffered stage.
//
//   build/examples/reconstruction-error [arch] [width]      (default: revnet18 16)
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "petra/nn/models.hpp"
#include "petra/functions.hpp"
#include "petra/rng.hpp"

using namespace petra;

int main(int argc, char** argv) {
  nn::ModelConfig config;
  config.arch = argc > 1 ? argv[1] : "revnet18";
  config.width = argc > 2 ? std::stoll(argv[2]) : 16;
  config.in_channels = 1;
  nn::Model model(config);
  NoGradGuard no_grad;

  Philox rng(1);
  Tensor images = Tensor::empty({32, 1, 28, 28});
  rng.fill_normal(images.data_ptr<float>(), static_cast<std::size_t>(images.numel()));

  // Forward, keeping the true input of every stage (PETRA keeps none of the reversible ones).
  const std::size_t head = model.num_stages() - 1;
  std::vector<Tensor> true_input(model.num_stages());
  Tensor h = images;
  for (std::size_t j = 0; j < head; ++j) {
    true_input[j] = h;
    h = model.stage(j).forward(Variable(h)).data();
  }

  std::printf("%s, width %lld: relative error of each stage's rebuilt input\n", config.arch.c_str(),
              static_cast<long long>(config.width));
  std::printf("%5s  %-10s  %14s  %14s\n", "stage", "kind", "first stream", "second stream");
  Tensor y = h;  // the head's input is exact (the head keeps what it received)
  for (std::size_t j = head; j-- > 0;) {
    const nn::Stage& stage = model.stage(j);
    if (stage.kind() != nn::StageKind::reversible) {
      std::printf("%5zu  %-10s  %14s  %14s   (sends its stored input: the error is reset)\n", j, "buffered", "exact",
                  "exact");
      y = true_input[j];
      continue;
    }
    const Tensor x = model.stage(j).inverse(y);
    const std::int64_t c = x.size(1) / 2;
    std::printf("%5zu  %-10s  %14.3e  %14.3e\n", j, "reversible",
                ops::relative_error(ops::channel_slice(x, 0, c), ops::channel_slice(true_input[j], 0, c)),
                ops::relative_error(ops::channel_slice(x, c, c), ops::channel_slice(true_input[j], c, c)));
    y = x;
  }
  return 0;
}
