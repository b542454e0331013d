// kernels/cpu/linear.cpp: (being written)
#include "kernels/linear.hpp"
