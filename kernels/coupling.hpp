// kernels/coupling.hpp: (being written)
#pragma once
#include "kernels/common.hpp"
