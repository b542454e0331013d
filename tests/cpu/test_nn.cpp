// tests/cpu/test_nn.cpp: (being written)
#include <doctest/doctest.h>
