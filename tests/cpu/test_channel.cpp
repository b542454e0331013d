// tests/cpu/test_channel.cpp: (being written)
#include <doctest/doctest.h>
