// kernels/elementwise.hpp: (being written)
#pragma once
#include "kernels/common.hpp"
