/// @file
/// Composition of codecs with `|`, read left to right as a pipeline: `top_k(0.01) | bf16`
/// selects with top-k, then sends the selected values as bf16 (6 bytes an entry instead of 8).
///
/// The only meaningful composition is a sparsifier whose float values are then cast:
///
/// | left                 | right               | result                |
/// |----------------------|---------------------|-----------------------|
/// | `top_k_codec<float>` | `cast_codec<W>`     | `top_k_codec<W>`      |
///
/// Every other pair of codecs is rejected at compile time (the overload is deleted): casting
/// twice (`fp16 | bf16`), sparsifying cast or quantized values (`bf16 | top_k(r)`), casting
/// int8 (`int8 | bf16`: its values are already 8 bits and its scales must stay fp32), casting
/// values already cast (`(top_k(r) | bf16) | fp16`), and anything with `error_feedback`, which
/// wraps a finished codec (`error_feedback(top_k(0.01) | bf16)`) rather than joining a pipe.
#pragma once

#include <cohort/compress/cast.hpp>
#include <cohort/compress/codec.hpp>
#include <cohort/compress/top_k.hpp>

namespace cohort::compress {

/// True when `a | b` composes codecs `A` and `B` (see the table in this file's comment).
template <class A, class B>
inline constexpr bool composes = false;
template <class W>
inline constexpr bool composes<top_k_codec<float>, cast_codec<W>> = true;

/// `top_k(r) | compress::fp16` or `| compress::bf16`: top-k whose values travel as W.
template <class W>
constexpr top_k_codec<W> operator|(const top_k_codec<float>& sparse,
                                   const cast_codec<W>&) noexcept {
  return {sparse.ratio, sparse.method};
}

/// Every other composition of codecs is meaningless and does not compile.
template <codec A, codec B>
  requires(!composes<A, B>)
void operator|(const A&, const B&) = delete;

}  // namespace cohort::compress
