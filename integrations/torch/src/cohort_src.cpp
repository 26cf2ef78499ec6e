// The part of cohort compiled once under COHORT_SEPARATE_COMPILATION: the TCP setup (Asio).
#include <cohort/impl/src.hpp>
