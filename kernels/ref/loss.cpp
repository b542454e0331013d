// kernels/ref/loss.cpp: (being written)
#include "kernels/loss.hpp"
