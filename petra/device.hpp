// petra/device.hpp: (being written)
#pragma once
