// kernels/ref/channel.cpp: (being written)
#include "kernels/channel.hpp"
