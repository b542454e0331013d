// tests/cpu/test_batchnorm.cpp: (being written)
#include <doctest/doctest.h>
