// petra/stream.hpp: (being written)
#pragma once
