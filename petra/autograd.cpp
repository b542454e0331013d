// petra/autograd.cpp: (being written)
#include "petra/autograd.hpp"
