// tests/cpu/test_optimizers.cpp: (being written)
#include <doctest/doctest.h>
