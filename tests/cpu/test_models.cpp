// tests/cpu/test_models.cpp: (being written)
#include <doctest/doctest.h>
