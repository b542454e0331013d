// petra/tensor.hpp: (being written)
#pragma once
