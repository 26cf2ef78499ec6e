// The TCP setup, compiled once for the examples and test programs built with
// COHORT_SEPARATE_COMPILATION (examples/common/meson.build: tcp_src_dep).
#include <cohort/impl/src.hpp>
