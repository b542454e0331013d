// kernels/ref/batchnorm.cpp: (being written)
#include "kernels/batchnorm.hpp"
