// kernels/ref/reduce.cpp: (being written)
#include "kernels/reduce.hpp"
