// tests/cpu/test_coupling.cpp: (being written)
#include <doctest/doctest.h>
