// COHORT_SEPARATE_COMPILATION, the one implementation translation unit (Boost.Asio lives here).
#include <cohort/impl/src.hpp>
