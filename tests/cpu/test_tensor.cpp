// tests/cpu/test_tensor.cpp: (being written)
#include <doctest/doctest.h>
