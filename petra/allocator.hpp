// petra/allocator.hpp: (being written)
#pragma once
