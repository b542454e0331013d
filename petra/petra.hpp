// petra.hpp umbrella (being written)
#pragma once
