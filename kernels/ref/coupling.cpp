// kernels/ref/coupling.cpp: (being written)
#include "kernels/coupling.hpp"
