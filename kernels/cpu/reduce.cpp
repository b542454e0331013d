// kernels/cpu/reduce.cpp: (being written)
#include "kernels/reduce.hpp"
