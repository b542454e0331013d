// petra/allocator.cpp: (being written)
#include "petra/allocator.hpp"
