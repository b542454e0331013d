// petra/device.cpp: (being written)
#include "petra/device.hpp"
