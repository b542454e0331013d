// tests/consumer/consumer_core.cpp: a program that links petra-core alone (tensors, autograd, ops).
// Built by check_consumer.sh with nothing but `pkg-config --cflags --libs petra-core`; the script
// then checks that the program pulls in no code of petra's upper floors (nn, data, pipeline).
#include <petra/petra.hpp>

#include <cstdio>

int main() {
  using namespace petra;
  // d/dw sum(relu(w * x)) = x where w * x > 0, else 0.
  const Variable w(Tensor::from_vector<float>({3}, {1.0f, -2.0f, 3.0f}), true);
  const Variable x(Tensor::from_vector<float>({3}, {4.0f, 5.0f, 6.0f}));
  const Variable y = relu(mul(w, x));
  y.backward(Tensor::full({3}, 1.0));
  const auto g = w.grad().to_vector<float>();
  std::printf("petra-core %s: grad = %g %g %g\n", PETRA_VERSION, g[0], g[1], g[2]);
  return (g[0] == 4.0f && g[1] == 0.0f && g[2] == 6.0f) ? 0 : 1;
}
