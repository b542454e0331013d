// petra/npy.cpp: (being written)
#include "petra/npy.hpp"
