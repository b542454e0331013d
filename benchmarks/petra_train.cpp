// benchmarks/petra_train.cpp: petra-train, the main job of petra.
//
// Status: the training loop (models, datasets, optimizers, PETRA's pipeline) lands with the next
// issues ("Models, data and the trainer", then "PETRA pipeline runtime"). Until then this binary
// says so plainly, reports what this build can already do, and exits with status 0.
#include <cstdio>

#include "petra/petra.hpp"

int main() {
  const bool gpu = petra::cuda_available();  // logs its own line first when there is no GPU
  std::printf(
      "petra-train %s: training is not implemented yet.\n"
      "This build provides the foundation: tensors, autograd, and the CPU kernels every model of the\n"
      "paper needs, each checked against a reference (meson test -C build) and timed by\n"
      "build/bench-kernels. The trainer (RevNet/ResNet on Fashion-MNIST, backprop and PETRA) comes\n"
      "with the next issues.\n",
      PETRA_VERSION);
  std::printf("backends: cuda compiled=%d gpu available=%d, openmp=%d, mpi=%d\n", PETRA_HAVE_CUDA,
              gpu ? 1 : 0, PETRA_HAVE_OPENMP, PETRA_HAVE_MPI);
  return 0;
}
