// kernels/cpu/elementwise.cpp: (being written)
#include "kernels/elementwise.hpp"
