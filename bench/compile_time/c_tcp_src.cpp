// Compile-time probe (c, the one TU): the TCP setup compiled once, with
// COHORT_SEPARATE_COMPILATION defined (as in every TU of the program).
#include <cohort/impl/src.hpp>
