// kernels/ref/conv2d.cpp: (being written)
#include "kernels/conv2d.hpp"
