/// @file
/// What the collectives accept as buffers: contiguous ranges of a supported element type.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>  // std::data, std::size (available from <span> as from <iterator>)
#include <type_traits>
#include <utility>

#include <cohort/core/dtype.hpp>

namespace cohort {

namespace detail {

/// What `std::data` gives for an lvalue of `R`: the pointer to a buffer's first element.
template <class R>
using data_pointer_t = decltype(std::data(std::declval<R&>()));

/// The element type `data_pointer_t<R>` points at, without const.
template <class R>
using data_element_t = std::remove_cv_t<std::remove_pointer_t<data_pointer_t<R>>>;

}  // namespace detail

/// A contiguous, sized range of elements the collectives can read (`std::vector`, `std::span`,
/// `std::array`, a C array, ...): `std::data` gives a pointer to its first element and
/// `std::size` the number of elements. Stated with `std::data` and `std::size` rather than
/// `std::ranges::contiguous_range`, so that the collectives need `<span>` and not `<ranges>`,
/// which costs every translation unit that includes cohort a third of a second to parse.
template <class R>
concept buffer = requires(R& r) {
  requires std::is_pointer_v<detail::data_pointer_t<R>>;
  { std::size(r) } -> std::convertible_to<std::size_t>;
} && element<detail::data_element_t<R>>;

/// A `buffer` the collectives can write.
template <class R>
concept mutable_buffer =
    buffer<R> && !std::is_const_v<std::remove_pointer_t<detail::data_pointer_t<R>>>;

/// The element type of a buffer.
template <buffer R>
using buffer_element_t = detail::data_element_t<R>;

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

/// True when [a, a+n) and [b, b+m) share memory.
template <class T>
bool overlap(const T* a, std::size_t n, const T* b, std::size_t m) noexcept {
  if (n == 0 || m == 0) return false;
  // Addresses as integers: a total order over buffers that need not share an array.
  const auto ia = reinterpret_cast<std::uintptr_t>(a), ib = reinterpret_cast<std::uintptr_t>(b);
  return ia < ib + m * sizeof(T) && ib < ia + n * sizeof(T);
}

/// True when [a, a+n) and [b, b+m) share memory but do not start at the same place: a bad
/// argument for the calls whose in-place form is `out == in` (all_reduce, reduce, broadcast).
template <class T>
bool partly_overlap(const T* a, std::size_t n, const T* b, std::size_t m) noexcept {
  return a != b && overlap(a, n, b, m);
}

}  // namespace detail
}  // namespace cohort
