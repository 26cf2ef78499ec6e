/// @file
/// compressed_all_reduce over a hierarchical communicator (<cohort/hierarchical.hpp>): exact
/// inside each host, compressed only on the rails between hosts, where bandwidth is scarce.
///
/// ```cpp
/// cohort::compress::error_feedback ef{cohort::compress::top_k(0.01) | cohort::compress::bf16};
/// auto rep = cohort::compressed_all_reduce(hier, grads, ef, cohort::ops::avg);
/// ```
#pragma once

#include <span>
#include <system_error>

#include <cohort/compress/all_reduce.hpp>
#include <cohort/hierarchical.hpp>

namespace cohort {
namespace detail::hier {

template <class H, class Codec, class Op>
failure compressed_all_reduce(H& h, std::span<float> data, Codec& codec, const Op& op,
                              const call_options& opts, compress::report& rep) {
  constexpr std::string_view name = "compressed_all_reduce";
  rep = {};
  if (failure f = h.enter(name, opts); f.code) return f;
  const stage_deadline d(opts, h.timeout());
  const std::size_t n = data.size();
  const int l_size = h.local_size();
  const block b = block_of(n, l_size, h.local_rank());
  float* shard = data.data() + b.offset;
  failure f;
  if (!stage(h, f, detail::reduce_scatter(h.local(), data.data(), n, shard, b.count, ops::sum,
                                          d.next()), false, name) ||
      !stage(h, f, detail::compressed_all_reduce(h.rail(), std::span(shard, b.count), codec,
                                                 ops::sum, d.next(), rep), true, name))
    return f;
  finalize_in_place(shard, b.count, op, h.size());
  stage(h, f, all_gather_at(h.local(), data.data(), n,
                            [&](int i) { return block_of(n, l_size, i); }, d.next()),
        false, name);
  return f;
}

}  // namespace detail::hier

/// Sums (`ops::sum`) or averages (`ops::avg`) the float gradients `data` across all ranks of
/// `h`, compressing only between hosts: an exact f32 reduce-scatter inside each host (local
/// rank l keeps `block_of(n, L, l)`), `compressed_all_reduce` of that block with `codec` on
/// each rail (all rails at once, always a sum), `avg` dividing by P after it, then an exact
/// all-gather inside each host. Every rank calls it with the same count and codec type. The
/// codec (and an error feedback's residual) sees only this rank's block, n/L floats; the report
/// is the rail stage's (bytes sent across hosts). Results are bitwise identical on every rank.
/// Throws `cohort::error`.
template <hierarchical H, mutable_buffer Data, class Codec, class Op>
  requires std::same_as<buffer_element_t<Data>, float> &&
           detail::compressed_all_reduce_args<Codec, Op>
compress::report compressed_all_reduce(H& h, Data&& data, Codec&& codec, const Op& op,
                                       const call_options& opts = {}) {
  compress::report rep;
  detail::throw_if_failed(
      detail::hier::compressed_all_reduce(h, std::span<float>(data), codec, op, opts, rep),
      "compressed_all_reduce");
  return rep;
}

/// As above; reports failure through `ec`, and its sentence through `h.last_error()`
/// (a bad argument, `errc::invalid_argument`, included: it does not poison).
template <hierarchical H, mutable_buffer Data, class Codec, class Op>
  requires std::same_as<buffer_element_t<Data>, float> &&
           detail::compressed_all_reduce_args<Codec, Op>
compress::report compressed_all_reduce(H& h, Data&& data, Codec&& codec, const Op& op,
                                       const call_options& opts, std::error_code& ec) {
  compress::report rep;
  ec = detail::error_code_for(h, detail::hier::compressed_all_reduce(h, std::span<float>(data),
                                                                     codec, op, opts, rep));
  return rep;
}

/// The sum (`ops::sum`), throwing `cohort::error` on failure.
template <hierarchical H, mutable_buffer Data, class Codec>
  requires std::same_as<buffer_element_t<Data>, float> &&
           detail::compressed_all_reduce_args<Codec, ops::sum_t>
compress::report compressed_all_reduce(H& h, Data&& data, Codec&& codec,
                                       const call_options& opts = {}) {
  return compressed_all_reduce(h, data, codec, ops::sum, opts);
}

}  // namespace cohort
