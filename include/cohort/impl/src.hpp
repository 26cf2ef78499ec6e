/// @file
/// The part of cohort that is compiled once under COHORT_SEPARATE_COMPILATION: include this
/// header in exactly one translation unit of the program (and nothing else of cohort need be
/// compiled there), with COHORT_SEPARATE_COMPILATION defined in every translation unit.
///
/// ```cpp
/// // cohort_src.cpp: the TCP setup with Boost.Asio, compiled once
/// #include <cohort/impl/src.hpp>
/// ```
///
/// What it holds today: the TCP transport's setup (`tcp_transport`'s constructors, the store
/// it meets at, the mesh built with Asio), so that the translation units that include
/// <cohort/transport/tcp.hpp> parse no Boost header. Build it with COHORT_WITH_HIREDIS too if
/// the program uses "redis://" stores. See <cohort/detail/config.hpp>.
#pragma once

#if !defined(COHORT_SEPARATE_COMPILATION)
#error "cohort/impl/src.hpp is for COHORT_SEPARATE_COMPILATION builds: define that macro in every translation unit (without it cohort is header-only and needs no source file)"
#endif

#include <cohort/transport/detail/tcp_setup.hpp>
