// kernels/ref/elementwise.cpp: (being written)
#include "kernels/elementwise.hpp"
