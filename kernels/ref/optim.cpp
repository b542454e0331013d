// kernels/ref/optim.cpp: (being written)
#include "kernels/optim.hpp"
