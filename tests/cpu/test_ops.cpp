// tests/cpu/test_ops.cpp: (being written)
#include <doctest/doctest.h>
