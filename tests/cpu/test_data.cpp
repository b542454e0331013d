// tests/cpu/test_data.cpp: (being written)
#include <doctest/doctest.h>
