// petra/rng.hpp: (being written)
#pragma once
