// kernels/ref/pool.cpp: (being written)
#include "kernels/pool.hpp"
