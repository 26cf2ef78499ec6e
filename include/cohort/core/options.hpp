/// @file
/// Deadlines and per-call options.
#pragma once

#include <chrono>

namespace cohort {

/// The clock every deadline is measured on.
using clock = std::chrono::steady_clock;

/// A point in time after which a wait gives up with `errc::timed_out`.
using deadline = clock::time_point;

/// The deadline a communicator gives a call unless the call says otherwise.
inline constexpr std::chrono::milliseconds default_timeout{30'000};

/// Options every collective takes; designated initializers read best: `{.timeout = 5s}`.
struct call_options {
  /// How long the whole call may take; zero means the communicator's default. A negative
  /// timeout is a bad argument: the call fails with `errc::invalid_argument`.
  std::chrono::milliseconds timeout{0};
};

}  // namespace cohort
