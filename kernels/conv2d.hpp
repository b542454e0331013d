// kernels/conv2d.hpp: (being written)
#pragma once
#include "kernels/common.hpp"
