// tests/cpu/test_autograd.cpp: (being written)
#include <doctest/doctest.h>
