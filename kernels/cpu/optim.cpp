// kernels/cpu/optim.cpp: (being written)
#include "kernels/optim.hpp"
