// tests/cpu/test_rng.cpp: (being written)
#include <doctest/doctest.h>
