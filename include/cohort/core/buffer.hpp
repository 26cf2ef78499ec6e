/// @file
/// What the collectives accept as buffers: contiguous ranges of a supported element type.
#pragma once

#include <cstddef>
#include <functional>
#include <ranges>
#include <type_traits>

#include <cohort/core/dtype.hpp>

namespace cohort {

/// A contiguous, sized range of elements the collectives can read (`std::vector`, `std::span`,
/// `std::array`, ...).
template <class R>
concept buffer = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
                 element<std::ranges::range_value_t<R>>;

/// A `buffer` the collectives can write.
template <class R>
concept mutable_buffer =
    buffer<R> && !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>;

/// The element type of a buffer.
template <buffer R>
using buffer_element_t = std::ranges::range_value_t<R>;

/// A contiguous part of a buffer: `count` elements (or bytes, where so documented) from `offset`.
struct block {
  std::size_t offset = 0;  ///< First element.
  std::size_t count = 0;   ///< Number of elements.
};

/// Part `rank` of `n` elements split into `size` near-equal blocks in rank order; the first
/// `n % size` blocks hold one element more. `reduce_scatter` leaves block `rank` on `rank`.
constexpr block block_of(std::size_t n, int size, int rank) noexcept {
  const std::size_t p = static_cast<std::size_t>(size), k = static_cast<std::size_t>(rank);
  const std::size_t base = n / p, extra = n % p;
  return {k * base + (k < extra ? k : extra), base + (k < extra ? 1 : 0)};
}

namespace detail {

/// Two buffers of the same element type, the second writable.
template <class In, class Out>
concept buffer_pair = buffer<In> && mutable_buffer<Out> &&
                      std::same_as<buffer_element_t<In>, buffer_element_t<Out>>;

/// True when [a, a+n) and [b, b+m) share memory but do not start at the same place.
template <class T>
bool partly_overlap(const T* a, std::size_t n, const T* b, std::size_t m) noexcept {
  if (a == b || n == 0 || m == 0) return false;
  std::less<const T*> lt;
  return lt(a, b + m) && lt(b, a + n);
}

}  // namespace detail
}  // namespace cohort
