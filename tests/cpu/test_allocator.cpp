// tests/cpu/test_allocator.cpp: (being written)
#include <doctest/doctest.h>
