// kernels/cpu/batchnorm.cpp: (being written)
#include "kernels/batchnorm.hpp"
