// petra/ops.hpp: (being written)
#pragma once
