// tests/cpu/test_elementwise.cpp: (being written)
#include <doctest/doctest.h>
