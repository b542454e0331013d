// tests/consumer/consumer.cpp: a program that uses petra as an installed dependency.
// Built by check_consumer.sh with nothing but `pkg-config --cflags --libs petra`.
#include <petra/petra.hpp>

#include <cstdio>

int main() {
  using namespace petra;
  const Variable w(Tensor::from_vector<float>({3}, {1.0f, 2.0f, 3.0f}), true);
  const Variable x(Tensor::from_vector<float>({3}, {4.0f, 5.0f, 6.0f}));
  const Variable y = mul(w, x);
  y.backward(Tensor::full({3}, 1.0));
  const auto g = w.grad().to_vector<float>();  // d(w x)/dw = x
  std::printf("petra %s: grad = %g %g %g\n", PETRA_VERSION, g[0], g[1], g[2]);
  return (g[0] == 4.0f && g[1] == 5.0f && g[2] == 6.0f) ? 0 : 1;
}
