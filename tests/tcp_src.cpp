// The TCP setup, compiled once for the test programs built with COHORT_SEPARATE_COMPILATION
// (tests/meson.build: tcp_src_dep).
#include <cohort/impl/src.hpp>
