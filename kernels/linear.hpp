// kernels/linear.hpp: (being written)
#pragma once
#include "kernels/common.hpp"
