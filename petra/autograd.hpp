// petra/autograd.hpp: (being written)
#pragma once
