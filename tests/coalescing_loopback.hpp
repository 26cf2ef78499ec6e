// The in-process transport with the trait of one whose sends posted before a wait leave
// together (TCP's), so that the schedules collectives choose for such transports (recursive
// doubling, with call headers on edges off the ring) run between threads too.
#pragma once

#include <cohort/collectives/detail/call.hpp>
#include <cohort/transport/loopback.hpp>

namespace cohort::test {

struct coalescing_loopback : loopback_transport {
  using loopback_transport::loopback_transport;
  static constexpr bool coalesces_sends = true;
};

}  // namespace cohort::test

static_assert(cohort::detail::coalescing_transport<cohort::test::coalescing_loopback>);
static_assert(!cohort::detail::coalescing_transport<cohort::loopback_transport>);
