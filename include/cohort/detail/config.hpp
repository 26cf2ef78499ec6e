/// @file
/// Build configuration shared by the headers.
///
/// `COHORT_SEPARATE_COMPILATION` (define it in every translation unit of a program, or in
/// none): the TCP transport's setup, which is what needs Boost.Asio, is compiled once, in the
/// one translation unit that includes <cohort/impl/src.hpp>, instead of in every translation
/// unit that includes <cohort/transport/tcp.hpp>; the others then parse no Boost header. It is
/// Asio's own answer to the cost of a header-only library (BOOST_ASIO_SEPARATE_COMPILATION and
/// <boost/asio/impl/src.hpp>). Without it (the default) cohort is header-only.
#pragma once

/// Marks a function that is defined once, in <cohort/impl/src.hpp>, under
/// COHORT_SEPARATE_COMPILATION, and inline in the header otherwise.
#if defined(COHORT_SEPARATE_COMPILATION)
#define COHORT_DECL
#else
#define COHORT_DECL inline
#endif
