/// @file
/// Splitting a communicator: the ranks that pass the same color form a new communicator,
/// ordered by key, then by rank in the parent (the semantics of `MPI_Comm_split` and
/// `ncclCommSplit`); a rank that passes a negative color (`split_none`) gets none.
///
/// ```cpp
/// auto world = cohort::make_tcp_communicator(cohort::launch_info_from_env());
/// auto host = cohort::split_by_host(world);          // shm among the ranks of this host
/// auto pairs = cohort::split_shm(world, world.rank() / 2, world.rank());
/// cohort::all_reduce(*host, grads, cohort::ops::sum);
/// ```
///
/// Every split is collective over the parent: each rank of it calls the same split at the same
/// point of its sequence of calls (the colors and keys are exchanged with one `all_gather` on
/// the parent, which also checks that the ranks agree). Each rank then knows the new group
/// (`split_info`) and sets up the new communicator with the transport it chooses, through a
/// factory: `split_shm` builds a shared-memory communicator (every rank of a color on one
/// host), `split_tcp` (in <cohort/split_tcp.hpp>) a TCP one through a store, and `split` takes
/// any factory. The new communicators are independent of the parent and of each other: they
/// may be used in any order, and the parent stays usable.
///
/// The new job id, which names the shared-memory segment or the keys at the store, is
/// `<base>.s<sequence>.c<color>`: `base` is rank 0's random id unless `split_options::base`
/// names one (e.g. the launcher's job id), and `sequence` is the parent's call sequence number,
/// so that the splits of one parent never collide.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <cohort/collectives/all_gather.hpp>
#include <cohort/core/communicator.hpp>
#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/launch/env.hpp>
#include <cohort/transport/shm.hpp>

namespace cohort {

/// The color that asks for no new communicator (any negative color does).
inline constexpr int split_none = -1;

/// Options of a split.
struct split_options {
  /// The start of the new job ids; empty: a random id that rank 0 draws. 1-80 characters of
  /// [A-Za-z0-9_.-] when given (e.g. `launch_info::job_id`).
  std::string base{};
  /// The deadline of the exchange on the parent (zero: the parent's default).
  std::chrono::milliseconds timeout{0};
};

/// What a rank learnt from the exchange: where it sits in its new communicator.
struct split_info {
  int color = split_none;  ///< The color this rank passed.
  int key = 0;             ///< The key this rank passed.
  int rank = -1;           ///< This rank in the new communicator; -1 for `split_none`.
  int size = 0;            ///< The ranks of the new communicator; 0 for `split_none`.
  int local_rank = 0;      ///< This rank among the new communicator's ranks on this host.
  int local_size = 0;      ///< The new communicator's ranks on this host.
  std::vector<int> members;  ///< The parent ranks of the new communicator, in its rank order.
  std::string job_id;        ///< The new communicator's job id (see the file comment).
};

namespace detail {

/// A 64-bit id of this host: hostname and boot id (so that containers with the same hostname
/// on different machines differ, and the same machine after a reboot too). COHORT_HOST, when
/// set and not empty, replaces both: processes with the same value count as one host (tests
/// fake several hosts on one machine with it; shared memory must still reach every process
/// of one such host).
inline std::uint64_t host_id() {
  std::string id;
  if (const char* fake = std::getenv("COHORT_HOST"); fake && *fake) {
    id = std::string("COHORT_HOST=") + fake;
  } else {
    char name[256] = {};
    ::gethostname(name, sizeof name - 1);
    id = name;
    std::ifstream boot("/proc/sys/kernel/random/boot_id");
    std::string boot_id;
    if (boot) std::getline(boot, boot_id);
    id += '/' + boot_id;
  }
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (char c : id) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h & 0x7fffffffffffffffull;
}

inline std::string hex64(std::uint64_t v) {
  std::string s;
  for (int shift = 60; shift >= 0; shift -= 4) s += "0123456789abcdef"[(v >> shift) & 15];
  return s;
}

}  // namespace detail

/// Exchanges (color, key, host) over `parent` (one `all_gather`; collective) and returns this
/// rank's place in the new group. Throws `cohort::error`: `errc::invalid_argument` (operation
/// "split") for a bad `base`, else as `all_gather` (which poisons the parent).
template <communicator Comm>
split_info plan_split(Comm& parent, int color, int key, const split_options& opts = {}) {
  if (!opts.base.empty() && (opts.base.size() > 80 || !detail::valid_job_id(opts.base)))
    throw error(errc::invalid_argument, "split", -1,
                "split: the base \"" + opts.base + "\" is not 1 to 80 of [A-Za-z0-9_.-]");
  const int p = parent.size();
  const std::uint64_t seq = parent.next_sequence();  // every rank takes the same number
  std::uint64_t nonce = 0;
  if (parent.rank() == 0 && opts.base.empty()) {
    std::random_device rd;
    nonce = (std::uint64_t(rd()) << 32) ^ rd() ^ std::uint64_t(::getpid()) ^
            static_cast<std::uint64_t>(clock::now().time_since_epoch().count());
  }
  const std::int64_t mine[4] = {color < 0 ? split_none : color, key,
                                static_cast<std::int64_t>(detail::host_id()),
                                static_cast<std::int64_t>(nonce)};
  std::vector<std::int64_t> all(4 * static_cast<std::size_t>(p));
  all_gather(parent, std::span<const std::int64_t>(mine, 4), all, {.timeout = opts.timeout});
  const auto at = [&](int q, int field) { return all[4 * static_cast<std::size_t>(q) + field]; };

  split_info s;
  s.color = color < 0 ? split_none : color;
  s.key = key;
  if (s.color == split_none) return s;
  for (int q = 0; q < p; ++q)
    if (at(q, 0) == s.color) s.members.push_back(q);
  std::stable_sort(s.members.begin(), s.members.end(),
                   [&](int a, int b) { return at(a, 1) < at(b, 1); });  // ties: parent rank
  s.size = static_cast<int>(s.members.size());
  for (int i = 0; i < s.size; ++i) {
    const int q = s.members[static_cast<std::size_t>(i)];
    if (at(q, 2) != at(parent.rank(), 2)) continue;
    if (q == parent.rank()) {
      s.rank = i;
      s.local_rank = s.local_size;
    }
    ++s.local_size;
  }
  const std::string base =
      opts.base.empty() ? "split-" + detail::hex64(static_cast<std::uint64_t>(at(0, 3))) : opts.base;
  s.job_id = base + ".s" + std::to_string(seq) + ".c" + std::to_string(s.color);
  return s;
}

/// Splits `parent` and builds the new communicator with `make(const split_info&)`, which
/// returns an owning pointer (e.g. `std::unique_ptr<shm_communicator>`); a rank with a
/// negative color gets a null one. Collective over `parent`.
template <communicator Comm, class Factory>
auto split(Comm& parent, int color, int key, Factory&& make, const split_options& opts = {})
    -> std::invoke_result_t<Factory&, const split_info&> {
  const split_info s = plan_split(parent, color, key, opts);
  if (s.color == split_none) return {};
  return std::invoke(make, s);
}

/// Splits `parent` into shared-memory communicators: every rank of one color must be on this
/// host (else `errc::unsupported`, on the ranks of that color, before anything is set up).
/// Null for a negative color. Throws as `plan_split` and `shm_transport`'s constructor.
template <communicator Comm>
std::unique_ptr<shm_communicator> split_shm(Comm& parent, int color, int key,
                                            shm_options shm = {}, const split_options& opts = {}) {
  return split(parent, color, key, [&](const split_info& s) {
    if (s.local_size != s.size)
      throw error(errc::unsupported, "split_shm", -1,
                  "split_shm: color " + std::to_string(s.color) + " has " +
                      std::to_string(s.size - s.local_size) + " of its " + std::to_string(s.size) +
                      " ranks on other hosts; shared memory needs all of them on one");
    return std::make_unique<shm_communicator>(std::in_place, s.job_id, s.rank, s.size, shm);
  }, opts);
}

/// The color of this host among the ranks of `parent`: the lowest parent rank on the same host
/// (hostname and boot id; one `all_gather`, collective). Ranks on one host get the same color.
template <communicator Comm>
int host_color(Comm& parent, const split_options& opts = {}) {
  const auto mine = static_cast<std::int64_t>(detail::host_id());
  std::vector<std::int64_t> all(static_cast<std::size_t>(parent.size()));
  all_gather(parent, std::span<const std::int64_t>(&mine, 1), all, {.timeout = opts.timeout});
  return static_cast<int>(std::find(all.begin(), all.end(), mine) - all.begin());
}

/// A shared-memory communicator of the ranks of `parent` on this host, in the parent's order
/// (`split_shm(parent, host_color(parent), parent.rank())`). Collective over `parent`.
template <communicator Comm>
std::unique_ptr<shm_communicator> split_by_host(Comm& parent, shm_options shm = {},
                                                const split_options& opts = {}) {
  return split_shm(parent, host_color(parent, opts), parent.rank(), shm, opts);
}

}  // namespace cohort
