// kernels/cpu/loss.cpp: (being written)
#include "kernels/loss.hpp"
