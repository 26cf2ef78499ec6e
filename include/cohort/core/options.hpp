/// @file
/// Deadlines and per-call options.
#pragma once

#include <chrono>
#include <ratio>
#include <type_traits>

namespace cohort {

/// The clock every deadline is measured on.
using clock = std::chrono::steady_clock;

/// A point in time after which a wait gives up with `errc::timed_out`.
using deadline = clock::time_point;

/// `from + d`, saturated: a duration past the clock's range (centuries) gives
/// `deadline::max()`, no deadline at all, instead of one that wraps into the past (and a NaN
/// gives `deadline::max()` too).
template <class Rep, class Period>
constexpr deadline later(deadline from, std::chrono::duration<Rep, Period> d) noexcept {
  using step = clock::duration;
  if constexpr (std::is_integral_v<Rep> && std::is_signed_v<Rep> && sizeof(Rep) >= 8 &&
                std::ratio_greater_equal_v<Period, step::period>) {
    // Exact: the limits converted to the coarser unit cannot overflow, and a duration within
    // them converts back to nanoseconds without overflow.
    using D = std::chrono::duration<Rep, Period>;
    step by;
    if (d >= std::chrono::duration_cast<D>(step::max())) by = step::max();
    else if (d <= std::chrono::duration_cast<D>(step::min())) by = step::min();
    else by = std::chrono::duration_cast<step>(d);
    step::rep sum;
    if (__builtin_add_overflow(from.time_since_epoch().count(), by.count(), &sum))
      return by.count() > 0 ? deadline::max() : deadline::min();
    return deadline(step(sum));
  } else {
    // Any other representation (floating point, narrow or unsigned integers, periods finer
    // than the clock's): summed in long double, which holds every nanosecond count exactly.
    const long double sum = static_cast<long double>(from.time_since_epoch().count()) +
                            std::chrono::duration<long double, step::period>(d).count();
    if (!(sum < static_cast<long double>(step::max().count()))) return deadline::max();
    if (!(sum > static_cast<long double>(step::min().count()))) return deadline::min();
    return deadline(step(static_cast<step::rep>(sum)));
  }
}

/// The deadline `timeout` from now (saturated as `later` is).
template <class Rep, class Period>
deadline deadline_after(std::chrono::duration<Rep, Period> timeout) noexcept {
  return later(clock::now(), timeout);
}

/// The deadline a communicator gives a call unless the call says otherwise.
inline constexpr std::chrono::milliseconds default_timeout{30'000};

/// Options every collective takes; designated initializers read best: `{.timeout = 5s}`.
struct call_options {
  /// How long the whole call may take; zero means the communicator's default. A negative
  /// timeout is a bad argument: the call fails with `errc::invalid_argument`.
  std::chrono::milliseconds timeout{0};
};

}  // namespace cohort
