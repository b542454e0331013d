// petra/rng.cpp: (being written)
#include "petra/rng.hpp"
