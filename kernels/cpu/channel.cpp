// kernels/cpu/channel.cpp: (being written)
#include "kernels/channel.hpp"
