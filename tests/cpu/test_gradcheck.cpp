// tests/cpu/test_gradcheck.cpp: (being written)
#include <doctest/doctest.h>
