// kernels/cpu/coupling.cpp: (being written)
#include "kernels/coupling.hpp"
