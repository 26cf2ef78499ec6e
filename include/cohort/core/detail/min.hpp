/// @file
/// `min_of`: `std::min` for the headers every collective includes, which would otherwise
/// include `<algorithm>` for it alone (ten thousand lines of C++20 range algorithms that each
/// translation unit parses; fmt keeps `<algorithm>` out of its core the same way).
#pragma once

namespace cohort::detail {

/// The smaller of `a` and `b`; `a` when they are equal, as `std::min`.
template <class T>
constexpr const T& min_of(const T& a, const T& b) noexcept(noexcept(b < a)) {
  return b < a ? b : a;
}

}  // namespace cohort::detail
