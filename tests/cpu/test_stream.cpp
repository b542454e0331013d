// tests/cpu/test_stream.cpp: (being written)
#include <doctest/doctest.h>
