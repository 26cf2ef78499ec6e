/// @file
/// The hierarchical communicator: the two-level collectives of NCCL and Horovod, for jobs of
/// many hosts with several ranks each. Inside a host the ranks talk over a `local`
/// communicator (shared memory); between hosts, each local rank talks to the ranks of the same
/// local rank on the other hosts over its `rail` (TCP), all rails at once. An all_reduce then
/// moves n/L elements per rank across hosts instead of n (L ranks per host).
///
/// ```cpp
/// auto world = cohort::make_tcp_communicator(cohort::launch_info_from_env());
/// auto hier = cohort::make_hierarchical_communicator(world, store);  // <cohort/hierarchical_tcp.hpp>
/// cohort::all_reduce(hier, grads, cohort::ops::avg);
/// ```
///
/// Layout: every host has the same number of ranks L; host h's local rank l is rank h*L+l of
/// the hierarchical communicator (host-major). Its collectives are overloads of the flat ones
/// (which take a `communicator`, a concept this class does not model) with the same arguments,
/// the same results for integer types, and bitwise identical results on every rank for
/// floating types; but floating sums are combined in another order than the flat ring's (each
/// host's contributions first, then the hosts'), so they may differ from it in the last bits.
/// A failure in any stage poisons both communicators (the peers of both fail too) and
/// is reported as `cohort::error` naming the operation, the stage and the world rank of the
/// peer. The detail of each stage is in <cohort/detail/hierarchical.hpp>.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <cohort/collectives/all_gather.hpp>
#include <cohort/core/buffer.hpp>
#include <cohort/core/communicator.hpp>
#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/detail/hierarchical.hpp>

namespace cohort {

/// A communicator of H hosts x L ranks made of two: `local` (this host's L ranks, rank = local
/// rank) and `rail` (the H ranks of this local rank, one per host, rank = host index).
/// Not thread-safe; every rank calls the same collectives in the same order, as on any
/// communicator.
template <communicator Local, communicator Rail>
class hierarchical_communicator {
 public:
  using local_type = Local;
  using rail_type = Rail;

  /// Takes both communicators; collective over both (one all_gather on each), so every rank
  /// of the job constructs it at the same point. Throws `cohort::error`
  /// (`errc::invalid_argument`, operation "hierarchical_communicator") when one is null, when
  /// the hosts have different numbers of ranks, or when the ranks of one host disagree on
  /// their host index; else as `all_gather`.
  hierarchical_communicator(std::unique_ptr<Local> local, std::unique_ptr<Rail> rail)
      : local_(std::move(local)), rail_(std::move(rail)) {
    if (!local_ || !rail_)
      throw error(errc::invalid_argument, "hierarchical_communicator", -1,
                  "hierarchical_communicator: the local or the rail communicator is null");
    const std::int32_t host = rail_->rank(), l_size = local_->size();
    std::vector<std::int32_t> hosts(static_cast<std::size_t>(local_->size()));
    std::vector<std::int32_t> sizes(static_cast<std::size_t>(rail_->size()));
    all_gather(*local_, std::span(&host, 1), hosts);
    all_gather(*rail_, std::span(&l_size, 1), sizes);
    for (std::size_t k = 0; k < sizes.size(); ++k)
      if (sizes[k] != l_size)
        throw error(errc::invalid_argument, "hierarchical_communicator", -1,
                    "hierarchical_communicator: host " + std::to_string(k) + " has " +
                        std::to_string(sizes[k]) + " ranks and host " + std::to_string(host) +
                        " has " + std::to_string(l_size) +
                        "; every host must have the same number of ranks");
    if (std::ranges::any_of(hosts, [&](std::int32_t h) { return h != host; }))
      throw error(errc::invalid_argument, "hierarchical_communicator", -1,
                  "hierarchical_communicator: the ranks of one local communicator have "
                  "different rail ranks; rail rank must be the host index");
  }

  /// This rank: host() * local_size() + local_rank().
  int rank() const { return host() * local_size() + local_rank(); }
  /// The ranks of the job: hosts() * local_size().
  int size() const { return hosts() * local_size(); }
  /// This rank among the ranks of its host.
  int local_rank() const { return local_->rank(); }
  /// The ranks of each host (the same on every host).
  int local_size() const { return local_->size(); }
  /// This host's index, in [0, hosts()).
  int host() const { return rail_->rank(); }
  /// The number of hosts.
  int hosts() const { return rail_->size(); }

  /// The communicator of this host's ranks.
  Local& local() { return *local_; }
  /// The communicator of this local rank on every host.
  Rail& rail() { return *rail_; }

  /// The deadline of a whole call unless its options say otherwise (30 s to start); the
  /// stages of a call share it.
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// Sets the default deadline. Throws `cohort::error` (`errc::invalid_argument`) unless
  /// `t` is positive.
  void set_timeout(std::chrono::milliseconds t) {
    if (t.count() <= 0)
      throw error(errc::invalid_argument, "set_timeout", -1,
                  "set_timeout: the timeout must be positive, not " + std::to_string(t.count()) +
                      " ms");
    timeout_ = t;
  }

  /// The first failure of a call on this communicator (peer: a world rank), or null.
  const failure* last_failure() const { return failure_ ? &*failure_ : nullptr; }
  /// What the last call that reported through a `std::error_code` failed with (a bad
  /// argument's refusal too), or null while none has; as `basic_communicator::last_error`.
  const failure* last_error() const { return error_ ? &*error_ : nullptr; }
  /// Keeps `f` as `last_error()` (the collectives' business: `detail::error_code_for`).
  void note_error(failure&& f) noexcept { error_ = std::move(f); }
  /// True after a failure: later calls fail at once with `errc::poisoned`.
  bool poisoned() const { return failure_.has_value(); }

  /// Fails both communicators, so that every peer's pending and later calls fail with
  /// `errc::aborted`. Safe to call more than once.
  void abort(std::string_view why = "aborted by the application") noexcept {
    try {
      if (!failure_) failure_ = failure{make_error_code(errc::aborted), rank(), std::string(why)};
    } catch (...) {
    }
    local_->abort(why);
    rail_->abort(why);
  }

  /// Scratch memory of the collectives (packing), reused across calls; called by them only.
  std::span<std::byte> scratch(std::size_t bytes) {
    if (scratch_.size() < (bytes + 7) / 8) scratch_.resize((bytes + 7) / 8);
    return std::as_writable_bytes(std::span(scratch_)).first(bytes);
  }

  /// Called by the collectives at entry: fails at once when poisoned or when the call's
  /// timeout is negative.
  failure enter(std::string_view op, const call_options& opts) const {
    if (opts.timeout.count() < 0)
      return {make_error_code(errc::invalid_argument), -1,
              std::string(op) + ": the call's timeout is " + std::to_string(opts.timeout.count()) +
                  " ms; it must be positive, or zero for the default"};
    if (failure_)
      return {make_error_code(errc::poisoned), failure_->peer,
              std::string(op) + ": the hierarchical communicator failed earlier and must be "
                                "rebuilt: " + failure_->what};
    return {};
  }

  /// Called by the collectives when a stage failed with `f` (its peer a rank of that stage's
  /// communicator): maps the peer to its world rank, poisons both communicators (aborting
  /// the peers of the other one too) and returns the failure to report.
  failure stage_failed(failure f, bool on_rail, std::string_view op) {
    failure g = f;
    if (f.peer >= 0) g.peer = on_rail ? f.peer * local_size() + local_rank()
                                      : host() * local_size() + f.peer;
    g.what = std::string(op) + " (hierarchical, " + (on_rail ? "rail" : "host") +
             " stage, on rank " + std::to_string(rank()) + " = host " + std::to_string(host()) +
             " local rank " + std::to_string(local_rank()) + "): " + f.what;
    if (f.peer >= 0)
      g.what += " [that " + std::string(on_rail ? "rail" : "host") + " rank " +
                std::to_string(f.peer) + " is rank " + std::to_string(g.peer) + "]";
    if (f.code == errc::invalid_argument) return g;  // nothing was sent
    if (!failure_) failure_ = g;
    local_->fail(f);  // the first failure of each stays: this adds to the other only
    rail_->fail(f);
    return g;
  }

 private:
  std::unique_ptr<Local> local_;
  std::unique_ptr<Rail> rail_;
  std::chrono::milliseconds timeout_ = default_timeout;
  std::optional<failure> failure_, error_;
  std::vector<std::uint64_t> scratch_;
};

/// True for the specializations of `hierarchical_communicator`.
template <class T>
inline constexpr bool is_hierarchical_v = false;
template <class L, class R>
inline constexpr bool is_hierarchical_v<hierarchical_communicator<L, R>> = true;

/// A hierarchical communicator (any specialization).
template <class T>
concept hierarchical = is_hierarchical_v<T>;

/// all_reduce over hosts: a reduce-scatter inside each host (local rank l keeps
/// `block_of(n, L, l)`), an all_reduce of that block across hosts on each rail (all rails at
/// once), an all-gather inside each host. Each rank sends 2(L-1)/L * n elements on its host
/// and 2(H-1)/H * n/L across hosts. Every rank calls it, as the flat `all_reduce`; `in` and
/// `out` may be the same buffer. Results: integers equal the flat ring's; floats are bitwise
/// identical on every rank, each element combined over its host first (ring order), then over
/// the hosts (the rail's order), rounded once per step for fp16 and bf16; `avg` sums and
/// divides by P once at the end. Throws `cohort::error`.
template <hierarchical H, class In, class Out, class Op>
  requires detail::all_reduce_args<In, Out, Op>
void all_reduce(H& h, const In& in, Out&& out, const Op& op, const call_options& opts = {}) {
  detail::throw_if_failed(
      detail::hier::all_reduce(h, std::data(in), std::size(in),
                               std::data(out), std::size(out), op, opts),
      "all_reduce");
}

/// As above; reports failure through `ec`, and its sentence through `h.last_error()`
/// (a bad argument, `errc::invalid_argument`, included: it does not poison).
template <hierarchical H, class In, class Out, class Op>
  requires detail::all_reduce_args<In, Out, Op>
void all_reduce(H& h, const In& in, Out&& out, const Op& op, const call_options& opts,
                std::error_code& ec) {
  ec = detail::error_code_for(h, detail::hier::all_reduce(h, std::data(in), std::size(in),
                                                          std::data(out), std::size(out), op,
                                                          opts));
}

/// As above, with the communicator's default deadline.
template <hierarchical H, class In, class Out, class Op>
  requires detail::all_reduce_args<In, Out, Op>
void all_reduce(H& h, const In& in, Out&& out, const Op& op, std::error_code& ec) {
  all_reduce(h, in, out, op, call_options{}, ec);
}

/// In place: reduces `data` across all ranks and leaves the result in `data`.
template <hierarchical H, mutable_buffer Data, class Op>
  requires reduction_for<Op, buffer_element_t<Data>>
void all_reduce(H& h, Data&& data, const Op& op, const call_options& opts = {}) {
  all_reduce(h, std::span(data), std::span(data), op, opts);
}

/// In place, reporting failure through `ec`.
template <hierarchical H, mutable_buffer Data, class Op>
  requires reduction_for<Op, buffer_element_t<Data>>
void all_reduce(H& h, Data&& data, const Op& op, const call_options& opts, std::error_code& ec) {
  all_reduce(h, std::span(data), std::span(data), op, opts, ec);
}

/// In place, reporting failure through `ec`, with the default deadline.
template <hierarchical H, mutable_buffer Data, class Op>
  requires reduction_for<Op, buffer_element_t<Data>>
void all_reduce(H& h, Data&& data, const Op& op, std::error_code& ec) {
  all_reduce(h, std::span(data), std::span(data), op, call_options{}, ec);
}

/// reduce_scatter over hosts: rank r keeps `block_of(n, P, r)` of the reduction. Inside each
/// host, a ring reduce-scatter of the input packed by local rank (segment l: the blocks of
/// every host's local rank l), then on each rail a ring reduce-scatter of that segment. Each
/// rank sends (L-1)/L * n elements on its host and (H-1)/H * n/L across hosts. Every rank calls
/// it with the same n, type and op. Results as `all_reduce`'s (the same combination order);
/// ordered ops run the hierarchical all_reduce and keep the block. `out` may be this rank's
/// block of `in`. Throws `cohort::error`.
template <hierarchical H, class In, class Out, class Op>
  requires detail::reduce_scatter_args<In, Out, Op>
void reduce_scatter(H& h, const In& in, Out&& out, const Op& op, const call_options& opts = {}) {
  detail::throw_if_failed(
      detail::hier::reduce_scatter(h, std::data(in), std::size(in),
                                   std::data(out), std::size(out), op, opts),
      "reduce_scatter");
}

/// As above; reports failure through `ec`.
template <hierarchical H, class In, class Out, class Op>
  requires detail::reduce_scatter_args<In, Out, Op>
void reduce_scatter(H& h, const In& in, Out&& out, const Op& op, const call_options& opts,
                    std::error_code& ec) {
  ec = detail::error_code_for(h, detail::hier::reduce_scatter(h, std::data(in), std::size(in),
                                                              std::data(out), std::size(out), op,
                                                              opts));
}

/// In place: this rank's block of `data` (`block_of(n, P, rank)`) receives its block of the
/// result; the rest of `data` is unspecified.
template <hierarchical H, mutable_buffer Data, class Op>
  requires reduction_for<Op, buffer_element_t<Data>>
void reduce_scatter(H& h, Data&& data, const Op& op, const call_options& opts = {}) {
  const block b = block_of(std::size(data), h.size(), h.rank());
  std::span all(data);
  reduce_scatter(h, all, all.subspan(b.offset, b.count), op, opts);
}

/// all_gather over hosts: rank r's n elements land at out[r*n, (r+1)*n) on every rank. Each
/// rail gathers its hosts' contributions ((H-1) * n elements sent per rank across hosts), then
/// each host gathers its rails' ((L-1) * H * n per rank). Every rank calls it with the same n;
/// `out` holds P*n elements. Bitwise copies, identical on every rank. Throws `cohort::error`.
template <hierarchical H, class In, class Out>
  requires detail::buffer_pair<In, Out>
void all_gather(H& h, const In& in, Out&& out, const call_options& opts = {}) {
  detail::throw_if_failed(
      detail::hier::all_gather(h, std::data(in), std::size(in),
                               std::data(out), std::size(out), opts),
      "all_gather");
}

/// As above; reports failure through `ec`.
template <hierarchical H, class In, class Out>
  requires detail::buffer_pair<In, Out>
void all_gather(H& h, const In& in, Out&& out, const call_options& opts, std::error_code& ec) {
  ec = detail::error_code_for(h, detail::hier::all_gather(h, std::data(in), std::size(in),
                                                          std::data(out), std::size(out), opts));
}

/// In place: `data` holds P blocks of size()/P elements (a size that is not a multiple of P
/// is `errc::invalid_argument`); this rank's block is already filled.
template <hierarchical H, mutable_buffer Data>
void all_gather(H& h, Data&& data, const call_options& opts = {}) {
  detail::throw_if_failed(
      detail::hier::all_gather_in_place(h, std::data(data), std::size(data), opts),
      "all_gather");
}

/// In place, reporting failure through `ec`.
template <hierarchical H, mutable_buffer Data>
void all_gather(H& h, Data&& data, const call_options& opts, std::error_code& ec) {
  ec = detail::error_code_for(h, detail::hier::all_gather_in_place(h, std::data(data),
                                                                   std::size(data), opts));
}

/// broadcast over hosts: the root's rail (a chain across hosts), then every host (a chain from
/// its rank of that rail). The buffer crosses hosts H-1 times. Bitwise copies. Every rank calls
/// it with the same count and root (a rank of the hierarchical communicator). Throws.
template <hierarchical H, mutable_buffer Data>
void broadcast(H& h, Data&& data, int root, const call_options& opts = {}) {
  detail::throw_if_failed(detail::hier::broadcast(h, std::data(data),
                                                  std::data(data),
                                                  std::size(data), root, opts),
                          "broadcast");
}

/// As above; reports failure through `ec`.
template <hierarchical H, mutable_buffer Data>
void broadcast(H& h, Data&& data, int root, const call_options& opts, std::error_code& ec) {
  ec = detail::error_code_for(h, detail::hier::broadcast(h, std::data(data), std::data(data),
                                                         std::size(data), root, opts));
}

/// Out of place: the root sends `in`; every rank, the root included, receives into `out`
/// (`in` is read on the root only; `out.size()` elements move).
template <hierarchical H, class In, class Out>
  requires detail::buffer_pair<In, Out>
void broadcast(H& h, const In& in, Out&& out, int root, const call_options& opts = {}) {
  detail::throw_if_failed(detail::hier::broadcast_buffers(h, in, out, root, opts), "broadcast");
}

/// Out of place, reporting failure through `ec`.
template <hierarchical H, class In, class Out>
  requires detail::buffer_pair<In, Out>
void broadcast(H& h, const In& in, Out&& out, int root, const call_options& opts,
               std::error_code& ec) {
  ec = detail::error_code_for(h, detail::hier::broadcast_buffers(h, in, out, root, opts));
}

/// reduce over hosts: each host reduces to its rank of the root's rail (a chain), then that
/// rail reduces to the root (a chain across hosts). Every rank calls it with the same count,
/// type, op and root; each sends the buffer once, on its host or (one rank per host) across.
/// The same combination order as `all_reduce`; `out` is written on the root only. Throws.
template <hierarchical H, class In, class Out, class Op>
  requires detail::reduce_args<In, Out, Op>
void reduce(H& h, const In& in, Out&& out, const Op& op, int root,
            const call_options& opts = {}) {
  detail::throw_if_failed(
      detail::hier::reduce(h, std::data(in), std::size(in),
                           std::data(out), std::size(out), op, root, opts),
      "reduce");
}

/// As above; reports failure through `ec`.
template <hierarchical H, class In, class Out, class Op>
  requires detail::reduce_args<In, Out, Op>
void reduce(H& h, const In& in, Out&& out, const Op& op, int root, const call_options& opts,
            std::error_code& ec) {
  ec = detail::error_code_for(h, detail::hier::reduce(h, std::data(in), std::size(in),
                                                      std::data(out), std::size(out), op, root,
                                                      opts));
}

/// In place: the root's `data` receives the result; other ranks' `data` is left as it was.
template <hierarchical H, mutable_buffer Data, class Op>
  requires reduction_for<Op, buffer_element_t<Data>>
void reduce(H& h, Data&& data, const Op& op, int root, const call_options& opts = {}) {
  reduce(h, std::span(data), std::span(data), op, root, opts);
}

/// barrier over hosts: every rank calls it; a barrier inside each host (L-1 one-byte steps),
/// then on each rail (H-1). Throws `cohort::error`.
template <hierarchical H>
void barrier(H& h, const call_options& opts = {}) {
  detail::throw_if_failed(detail::hier::barrier(h, opts), "barrier");
}

/// As above; reports failure through `ec`.
template <hierarchical H>
void barrier(H& h, const call_options& opts, std::error_code& ec) {
  ec = detail::error_code_for(h, detail::hier::barrier(h, opts));
}

}  // namespace cohort
