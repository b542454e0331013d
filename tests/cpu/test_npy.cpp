// tests/cpu/test_npy.cpp: (being written)
#include <doctest/doctest.h>
