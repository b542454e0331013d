// tests/cpu/test_pool.cpp: (being written)
#include <doctest/doctest.h>
