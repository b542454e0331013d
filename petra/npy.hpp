// petra/npy.hpp: (being written)
#pragma once
