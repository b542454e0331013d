// petra/ops.cpp: (being written)
#include "petra/ops.hpp"
