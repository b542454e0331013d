// tests/cpu/test_linear.cpp: (being written)
#include <doctest/doctest.h>
