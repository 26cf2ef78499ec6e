/// @file
/// Reductions: the built-in menu `cohort::ops` and the concept a user-defined one satisfies.
///
/// A reduction is a function object `acc op(acc a, acc b)` over the accumulator type of the
/// element (`float` for fp16 and bf16, the element type otherwise). It must be associative. It
/// says whether it commutes with a `static constexpr bool commutative` member (or a
/// specialization of `cohort::is_commutative`); one that says nothing is treated as ordered,
/// and the collectives then combine contributions strictly in rank order 0, 1, ..., P-1.
#pragma once

#include <concepts>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <typeinfo>

#include <cohort/core/detail/reduction_tags.hpp>
#include <cohort/core/dtype.hpp>

namespace cohort {

/// Whether `Op` commutes; reads `Op::commutative`, false when absent. Specialize to override.
template <class Op>
struct is_commutative : std::false_type {};

template <class Op>
  requires requires { { Op::commutative } -> std::convertible_to<bool>; }
struct is_commutative<Op> : std::bool_constant<Op::commutative> {};

template <class Op>
inline constexpr bool is_commutative_v = is_commutative<Op>::value;

/// An associative function object that combines two accumulators of element type `T`.
template <class Op, class T>
concept reduction_for =
    element<T> && std::copy_constructible<Op> &&
    requires(const Op& op, accumulator_t<T> a) {
      { op(a, a) } -> std::convertible_to<accumulator_t<T>>;
    };

/// A reduction that transforms the combined value once at the end (avg divides by P).
template <class Op, class T>
concept finalizing_reduction_for =
    reduction_for<Op, T> && requires(const Op& op, accumulator_t<T> a, int ranks) {
      { op.finalize(a, ranks) } -> std::convertible_to<accumulator_t<T>>;
    };

/// The built-in reductions. Integer sum and prod wrap modulo 2^bits (no undefined behaviour).
namespace ops {

namespace detail {
template <class A>
constexpr A wrap_add(A a, A b) noexcept {
  if constexpr (std::is_integral_v<A>) {
    using u = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<u>(static_cast<u>(a) + static_cast<u>(b)));
  } else {
    return a + b;
  }
}
template <class A>
constexpr A wrap_mul(A a, A b) noexcept {
  if constexpr (std::is_integral_v<A>) {
    // unsigned int arithmetic, wide enough that u8 and i8 do not promote to signed int.
    using u = std::conditional_t<(sizeof(A) < sizeof(unsigned)), unsigned, std::make_unsigned_t<A>>;
    return static_cast<A>(static_cast<u>(static_cast<u>(a) * static_cast<u>(b)));
  } else {
    return a * b;
  }
}
}  // namespace detail

/// a + b.
struct sum_t {
  static constexpr bool commutative = true;
  static constexpr std::string_view name = "sum";
  template <class A>
  constexpr A operator()(A a, A b) const noexcept { return detail::wrap_add(a, b); }
};
/// a * b.
struct prod_t {
  static constexpr bool commutative = true;
  static constexpr std::string_view name = "prod";
  template <class A>
  constexpr A operator()(A a, A b) const noexcept { return detail::wrap_mul(a, b); }
};
/// The smaller of a and b.
struct min_t {
  static constexpr bool commutative = true;
  static constexpr std::string_view name = "min";
  template <class A>
  constexpr A operator()(A a, A b) const noexcept { return b < a ? b : a; }
};
/// The larger of a and b.
struct max_t {
  static constexpr bool commutative = true;
  static constexpr std::string_view name = "max";
  template <class A>
  constexpr A operator()(A a, A b) const noexcept { return a < b ? b : a; }
};
/// The mean over ranks: summed like `sum`, divided by P once at the end. Floating types only.
struct avg_t {
  static constexpr bool commutative = true;
  static constexpr std::string_view name = "avg";
  template <std::floating_point A>
  constexpr A operator()(A a, A b) const noexcept { return a + b; }
  template <std::floating_point A>
  constexpr A finalize(A a, int ranks) const noexcept { return a / static_cast<A>(ranks); }
};

inline constexpr sum_t sum{};    ///< Sum.
inline constexpr prod_t prod{};  ///< Product.
inline constexpr min_t min{};    ///< Minimum.
inline constexpr max_t max{};    ///< Maximum.
inline constexpr avg_t avg{};    ///< Mean over ranks (floating types).

/// Wraps a function object and declares that it commutes.
template <class F>
struct commutative_fn : F {
  static constexpr bool commutative = true;
};
/// Wraps a function object and declares that it does not commute.
template <class F>
struct ordered_fn : F {
  static constexpr bool commutative = false;
};

/// `ops::commutative([](auto a, auto b) { return a + b; })`: a lambda that commutes.
template <class F>
constexpr commutative_fn<F> commutative(F f) { return {f}; }
/// `ops::ordered(f)`: a function object combined strictly in rank order.
template <class F>
constexpr ordered_fn<F> ordered(F f) { return {f}; }

}  // namespace ops

namespace detail {

/// A printable name for a reduction: the built-in's name, or "user-defined".
template <class Op>
constexpr std::string_view reduction_name() noexcept {
  if constexpr (requires { { Op::name } -> std::convertible_to<std::string_view>; }) {
    return Op::name;
  } else {
    return "user-defined";
  }
}

/// The number of a built-in reduction type (core/detail/reduction_tags.hpp), `none` for any
/// other type.
template <class Op>
inline constexpr builtin_reduction builtin_reduction_of = builtin_reduction::none;
template <>
inline constexpr builtin_reduction builtin_reduction_of<ops::sum_t> = builtin_reduction::sum;
template <>
inline constexpr builtin_reduction builtin_reduction_of<ops::prod_t> = builtin_reduction::prod;
template <>
inline constexpr builtin_reduction builtin_reduction_of<ops::min_t> = builtin_reduction::min;
template <>
inline constexpr builtin_reduction builtin_reduction_of<ops::max_t> = builtin_reduction::max;
template <>
inline constexpr builtin_reduction builtin_reduction_of<ops::avg_t> = builtin_reduction::avg;

/// The name of the built-in reduction with tag `tag` ("sum"), or "" when `tag` names none.
constexpr std::string_view builtin_reduction_name(std::uint32_t tag) noexcept {
  switch (static_cast<builtin_reduction>(tag)) {
    case builtin_reduction::sum: return ops::sum_t::name;
    case builtin_reduction::prod: return ops::prod_t::name;
    case builtin_reduction::min: return ops::min_t::name;
    case builtin_reduction::max: return ops::max_t::name;
    case builtin_reduction::avg: return ops::avg_t::name;
    case builtin_reduction::none: break;
  }
  return {};
}

/// A tag that differs between reduction types, so that ranks passing different ops are told.
/// Built-ins get their fixed numbers (`builtin_reduction`); user types a hash of their type
/// name (same binary, same hash; different binaries of one job must be built by the same
/// compiler).
template <class Op>
std::uint32_t reduction_tag() noexcept {
  if constexpr (builtin_reduction_of<Op> != builtin_reduction::none) {
    return static_cast<std::uint32_t>(builtin_reduction_of<Op>);
  } else {
    static const std::uint32_t tag = [] {
      std::uint32_t h = 2166136261u;  // FNV-1a
      for (const char* p = typeid(Op).name(); *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 16777619u;
      static_assert(last_builtin_reduction < 0x100u);
      return h | 0x100u;  // never collides with the built-ins
    }();
    return tag;
  }
}

}  // namespace detail
}  // namespace cohort
