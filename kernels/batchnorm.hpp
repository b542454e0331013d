// kernels/batchnorm.hpp: (being written)
#pragma once
#include "kernels/common.hpp"
