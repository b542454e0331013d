// (being written)
#include "petra/cuda_backend.hpp"
