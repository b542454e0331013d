// tests/cpu/test_loss.cpp: (being written)
#include <doctest/doctest.h>
