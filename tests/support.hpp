// Shared helpers for the tests: doctest with the std printers it needs.
#pragma once

#include <ostream>
#include <string>

#include <doctest/doctest.h>
