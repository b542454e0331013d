// petra/cuda_backend.hpp: (being written)
#pragma once
