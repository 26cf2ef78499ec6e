/// @file
/// compressed_all_reduce: an all_reduce of float gradients that sends them through a codec
/// and picks the aggregation the codec needs.
///
/// ```
/// cohort::compress::error_feedback topk{cohort::compress::top_k(0.01) | cohort::compress::bf16};
/// auto rep = cohort::compressed_all_reduce(comm, grads, topk, cohort::ops::avg);
/// // rep.used == aggregation::gather, rep.bytes_sent ~ 3 * 6 * 0.01 * grads.size() at P = 4
/// ```
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>

#include <cohort/collectives/detail/call.hpp>
#include <cohort/compress/cast.hpp>
#include <cohort/compress/codec.hpp>
#include <cohort/compress/compose.hpp>
#include <cohort/compress/detail/gather.hpp>
#include <cohort/compress/detail/hash.hpp>
#include <cohort/compress/detail/metered_call.hpp>
#include <cohort/compress/detail/summable.hpp>
#include <cohort/compress/detail/two_phase.hpp>
#include <cohort/compress/error_feedback.hpp>
#include <cohort/compress/quantize.hpp>
#include <cohort/compress/report.hpp>
#include <cohort/compress/top_k.hpp>
#include <cohort/core/buffer.hpp>
#include <cohort/core/communicator.hpp>
#include <cohort/core/ops.hpp>

namespace cohort {
namespace detail {

// The reduction the call header announces: the wire codec's type and the op, so that ranks
// calling with different codecs, or a plain all_reduce, fail with errc::mismatch. Runtime
// parameters (top-k ratio, stochastic rounding) need no agreement and are not announced.
template <class Codec, class Op>
struct compressed_op {};

template <class Op>
concept compressible_op = std::same_as<Op, ops::sum_t> || std::same_as<Op, ops::avg_t>;

template <class C, class Op>
concept compressed_all_reduce_args =
    compress::codec<std::remove_cvref_t<C>> && compressible_op<Op> &&
    // Error feedback keeps state: pass it as a named, non-const object.
    (!compress::detail::is_error_feedback<std::remove_cvref_t<C>> ||
     (std::is_lvalue_reference_v<C> && !std::is_const_v<std::remove_reference_t<C>>));

// The salt of this rank's encodings (stochastic rounding, sampling): fixed per rank, so that
// a run is reproducible.
constexpr std::uint64_t compression_salt(int rank) noexcept {
  return compress::detail::mix64(0xC0DEC000ull + static_cast<std::uint64_t>(rank));
}

template <communicator Comm, class Codec, class Op>
failure compressed_all_reduce(Comm& comm, std::span<float> data, Codec& codec, const Op& op,
                              const call_options& opts, compress::report& rep) {
  namespace cd = compress::detail;
  using C = std::remove_const_t<Codec>;
  using W = compress::wire_codec_t<C>;
  constexpr compress::aggregation kind = compress::aggregation_of<W>;
  const std::size_t n = data.size();
  cd::metered_call c(comm, opts);
  c.template describe_data<float>(n);
  c.template describe_op<compressed_op<W, Op>>();
  rep = {kind, 0, 0, 1.0};
  if constexpr (cd::is_error_feedback<C>) {
    if (!codec.fits(n)) return c.invalid(codec.size_error(n)), c.result();
  }
  if (kind == compress::aggregation::gather && n >= (std::size_t{1} << 32))
    return c.invalid(text("top-k indices are 32-bit: ", n, " floats is too many")), c.result();
  if (!c.start()) return c.result();

  const W* wire = nullptr;
  if constexpr (cd::is_error_feedback<C>) wire = &codec.inner();
  else wire = &codec;
  auto no_feedback = cd::no_feedback{};
  auto& feedback = [&]() -> auto& {
    if constexpr (cd::is_error_feedback<C>) return codec;
    else return no_feedback;
  }();
  // The contribution: `data` itself, or the residual corrected by it (error feedback). The
  // summable aggregation reads it corrected; the others correct as they encode (`begin`): the
  // gradient and the residual are read once, in the pass that encodes or selects.
  std::span<const float> contribution = data;
  if constexpr (kind == compress::aggregation::summable) contribution = feedback.correct(data);
  else feedback.begin(n);
  const int p = c.size();
  const std::uint64_t salt = compression_salt(c.rank());
  bool ok = false;
  if constexpr (kind == compress::aggregation::summable) {
    auto scratch = comm.scratch(cd::summable_scratch<W>(n));
    ok = cd::summable_all_reduce(c, contribution, data, *wire, op, feedback, scratch, rep);
  } else if constexpr (kind == compress::aggregation::two_phase) {
    using request = typename Comm::transport_type::request;
    auto scratch = comm.scratch(cd::two_phase_scratch<W, request>(*wire, n, p));
    const std::uint64_t salts[2] = {salt, cd::mix64(salt)};
    ok = cd::two_phase_all_reduce(c, contribution, data, *wire, op, feedback, scratch, salts, rep);
  } else {
    auto scratch = comm.scratch(cd::gather_scratch(*wire, n, p));
    ok = cd::gather_all_reduce(c, contribution, data, *wire, op, feedback, scratch, salt, rep);
  }
  feedback.end();
  if (ok) c.finish();
  rep.bytes_sent = c.bytes_sent();
  failure f = c.result();
  if (f.code == errc::mismatch)
    f.what += " (this rank: compressed_all_reduce with " + codec.name() +
              "; a rank with another codec or a plain all_reduce sends another header)";
  return f;
}

}  // namespace detail

/// Sums (`ops::sum`) or averages (`ops::avg`) the float gradients `data` across all ranks,
/// sending them through `codec`; every rank ends with the same result in `data`.
///
/// Every rank of `comm` calls it with the same element count and codec type (mismatches fail
/// with `errc::mismatch`; runtime parameters such as the top-k ratio may differ). The
/// aggregation follows the codec (`compress::aggregation_of`):
/// - summable (fp16, bf16): a ring reduce-scatter and all-gather whose wire carries 16-bit
///   partial sums; each hop adds the rank's own fp32 values in fp32 and rounds once. Each rank
///   sends about 2(P-1)/P * 2n bytes (the f32 ring: 2(P-1)/P * 4n);
/// - two-phase (int8): every rank sends each chunk, quantized, to its owner, which sums the P
///   contributions in rank order in fp32 and quantizes once; then a ring all-gather of the
///   quantized chunks: about 2(P-1)/P * (n + 4n/256) bytes;
/// - gather (top-k): all-gather of the payload sizes, then of the sparse payloads, each rank
///   decode-adding them in rank order: 8(P-1) + about (P-1) * 8k bytes for k float entries
///   (6k with 16-bit values). Where a payload would outweigh the dense bf16 ring (density above
///   about 1/(2P)), every rank runs the bf16 summable ring instead (`dense_fallback`).
/// Work and transfer overlap: sends leave as soon as their part is encoded, and all-gathered
/// blocks are decoded as they arrive. The report says which aggregation ran and how many bytes
/// this rank sent, the 32-byte call header included. With `error_feedback` the rank
/// contributes `data` + residual, and the residual then keeps what its encoding dropped.
/// Determinism: every rank decodes the same bytes in the same order: bitwise identical
/// results, which depend only on the inputs, P and the codec (for stochastic rounding and
/// sampling, also on each rank's fixed salt). `avg` divides the fp32 sum by P before the last
/// rounding. Allocates nothing but error feedback's residual (on its first call); buffers come
/// from `comm.scratch`. On failure `data` and the residual are unspecified. Throws
/// `cohort::error`.
template <communicator Comm, mutable_buffer Data, class Codec, class Op>
  requires std::same_as<buffer_element_t<Data>, float> &&
           detail::compressed_all_reduce_args<Codec, Op>
compress::report compressed_all_reduce(Comm& comm, Data&& data, Codec&& codec, const Op& op,
                                       const call_options& opts = {}) {
  compress::report rep;
  detail::throw_if_failed(
      detail::compressed_all_reduce(comm, std::span<float>(data), codec, op, opts, rep),
      "compressed_all_reduce");
  return rep;
}

/// As above; reports failure through `ec`, and its sentence through `comm.last_error()`
/// (a bad argument, `errc::invalid_argument`, included: it does not poison).
template <communicator Comm, mutable_buffer Data, class Codec, class Op>
  requires std::same_as<buffer_element_t<Data>, float> &&
           detail::compressed_all_reduce_args<Codec, Op>
compress::report compressed_all_reduce(Comm& comm, Data&& data, Codec&& codec, const Op& op,
                                       const call_options& opts, std::error_code& ec) {
  compress::report rep;
  ec = detail::error_code_for(comm, detail::compressed_all_reduce(comm, std::span<float>(data),
                                                                  codec, op, opts, rep));
  return rep;
}

/// As above, with the communicator's default deadline.
template <communicator Comm, mutable_buffer Data, class Codec, class Op>
  requires std::same_as<buffer_element_t<Data>, float> &&
           detail::compressed_all_reduce_args<Codec, Op>
compress::report compressed_all_reduce(Comm& comm, Data&& data, Codec&& codec, const Op& op,
                                       std::error_code& ec) {
  return compressed_all_reduce(comm, data, codec, op, call_options{}, ec);
}

/// The sum (`ops::sum`), throwing `cohort::error` on failure.
template <communicator Comm, mutable_buffer Data, class Codec>
  requires std::same_as<buffer_element_t<Data>, float> &&
           detail::compressed_all_reduce_args<Codec, ops::sum_t>
compress::report compressed_all_reduce(Comm& comm, Data&& data, Codec&& codec,
                                       const call_options& opts = {}) {
  return compressed_all_reduce(comm, data, codec, ops::sum, opts);
}

/// The sum, reporting failure through `ec`.
template <communicator Comm, mutable_buffer Data, class Codec>
  requires std::same_as<buffer_element_t<Data>, float> &&
           detail::compressed_all_reduce_args<Codec, ops::sum_t>
compress::report compressed_all_reduce(Comm& comm, Data&& data, Codec&& codec,
                                       const call_options& opts, std::error_code& ec) {
  return compressed_all_reduce(comm, data, codec, ops::sum, opts, ec);
}

}  // namespace cohort
