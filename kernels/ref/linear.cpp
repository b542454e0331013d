// kernels/ref/linear.cpp: (being written)
#include "kernels/linear.hpp"
