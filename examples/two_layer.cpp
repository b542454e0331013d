// examples/two_layer.cpp: petra's autograd as a small library: a two-layer network, trained.
//
// Fits y = x0 * x1 (an XOR-like target: positive where x0 and x1 have the same sign) on 256
// points drawn from N(0, 1), with a 2-32-1 ReLU network, a mean squared error and plain SGD.
// It shows Tensor::normal, Variables that want gradients, linear (x wᵀ + b), relu, the
// arithmetic operators, loss.backward(), and a manual SGD step on each parameter's data followed
// by zero_grad() (gradients accumulate until then). Only petra-core is needed.
// It prints the loss as it goes down, and exits with 1 unless the final loss is below a quarter of
// the initial one (it is a test: `meson test -C build two-layer`).
//
//   build/two-layer
#include <cstdio>

#include "petra/functions.hpp"

using namespace petra;

int main() {
  const Tensor x = Tensor::normal({256, 2}, /*seed=*/1);
  const Variable input(x), target(ops::mul(x.slice(1, 0, 1).contiguous(), x.slice(1, 1, 2).contiguous()));
  const Variable w1(Tensor::normal({32, 2}, 2, 0.0, 0.7), /*requires_grad=*/true), b1(Tensor::zeros({32}), true);
  const Variable w2(Tensor::normal({1, 32}, 3, 0.0, 0.25), true), b2(Tensor::zeros({1}), true);
  const double lr = 0.05;
  double first = 0, last = 0;
  for (int step = 0; step <= 2000; ++step) {
    const Variable y = linear(relu(linear(input, w1, b1)), w2, b2);  // [256, 1]
    const Variable loss = mean((y - target) * (y - target));
    loss.backward();
    for (const Variable& p : {w1, b1, w2, b2}) {
      ops::axpy_into(p.data(), -lr, p.grad());  // p -= lr * dloss/dp
      p.zero_grad();
    }
    last = loss.data().item();
    if (step == 0) first = last;
    if (step % 250 == 0) std::printf("step %4d  loss %.4f\n", step, last);
  }
  std::printf("loss %.4f -> %.4f\n", first, last);
  return last < 0.25 * first ? 0 : 1;
}
