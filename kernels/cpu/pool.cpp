// kernels/cpu/pool.cpp: (being written)
#include "kernels/pool.hpp"
