// tests/cpu/test_optim.cpp: (being written)
#include <doctest/doctest.h>
