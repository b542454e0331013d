// petra/tensor.cpp: (being written)
#include "petra/tensor.hpp"
