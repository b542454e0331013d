// tests/cpu/test_conv2d.cpp: (being written)
#include <doctest/doctest.h>
