// petra/stream.cpp: (being written)
#include "petra/stream.hpp"
