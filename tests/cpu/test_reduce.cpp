// tests/cpu/test_reduce.cpp: (being written)
#include <doctest/doctest.h>
