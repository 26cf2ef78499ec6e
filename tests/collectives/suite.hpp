// The collective suite, generic over the transport: each rank computes every rank's input
// from (seed, rank, index), so it can compute the serial reference itself and check its own
// result; a follow-up all_gather of result hashes checks that every rank got the same bits.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <cohort/cohort.hpp>

#include "../scale.hpp"

namespace cohort::test {

enum class kind {
  all_reduce, all_reduce_in_place, reduce_scatter, reduce_scatter_in_place, all_gather,
  all_gather_in_place, broadcast, broadcast_out_of_place, reduce, reduce_in_place, barrier
};
inline const char* kind_name(kind k) {
  constexpr const char* names[] = {"all_reduce", "all_reduce(in place)", "reduce_scatter",
                                   "reduce_scatter(in place)", "all_gather",
                                   "all_gather(in place)", "broadcast",
                                   "broadcast(out of place)", "reduce", "reduce(in place)",
                                   "barrier"};
  return names[static_cast<int>(k)];
}
inline constexpr kind every_kind[] = {
    kind::all_reduce, kind::all_reduce_in_place, kind::reduce_scatter,
    kind::reduce_scatter_in_place, kind::all_gather, kind::all_gather_in_place, kind::broadcast,
    kind::broadcast_out_of_place, kind::reduce, kind::reduce_in_place, kind::barrier};
inline bool reduces(kind k) {
  return k == kind::all_reduce || k == kind::all_reduce_in_place || k == kind::reduce_scatter ||
         k == kind::reduce_scatter_in_place || k == kind::reduce || k == kind::reduce_in_place;
}

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The hash behind rank `rank`'s element i of a test input.
inline std::uint64_t element_hash(std::uint64_t seed, int rank, std::size_t i) {
  return mix(seed ^ (std::uint64_t(rank) << 40) ^ i);
}

// Inputs for which every combination order gives the same exact result: small integers for
// sums (exact in every float type for P <= 7), powers of two for products, anything for
// min/max, and full-range integers (which wrap identically in any order). `exact_input` is the
// value as T, `exact_wide` the same value as the accumulator the reference reduces in; both read
// tables converted once, as fp16 and bf16 convert in software.
template <class Op>
constexpr std::size_t exact_choices = std::same_as<Op, ops::prod_t> ? 6 : 33;

template <class T, class Op>
struct exact_table {
  T value[exact_choices<Op>];
  accumulator_t<T> wide[exact_choices<Op>];
};

template <class T, class Op>
const exact_table<T, Op>& exact_values() {
  static const exact_table<T, Op> table = [] {
    constexpr float powers[] = {-2.0f, -1.0f, -0.5f, 0.5f, 1.0f, 2.0f};
    exact_table<T, Op> t{};
    for (std::size_t k = 0; k < exact_choices<Op>; ++k) {
      const float x = std::same_as<Op, ops::prod_t> ? powers[k] : static_cast<float>(k) - 16.0f;
      t.value[k] = T(x);
      t.wide[k] = widen(t.value[k]);
    }
    return t;
  }();
  return table;
}

template <class T, class Op>
T exact_input(std::uint64_t seed, int rank, std::size_t i) {
  const std::uint64_t h = element_hash(seed, rank, i);
  if constexpr (std::is_integral_v<T>) return static_cast<T>(h);
  else return exact_values<T, Op>().value[h % exact_choices<Op>];
}

template <class T, class Op>
accumulator_t<T> exact_wide(std::uint64_t seed, int rank, std::size_t i) {
  if constexpr (std::is_integral_v<T>) return exact_input<T, Op>(seed, rank, i);
  else return exact_values<T, Op>().wide[element_hash(seed, rank, i) % exact_choices<Op>];
}

template <class T>
bool same_bits(const T& a, const T& b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }

template <class T>
std::string show(const T& v) {
  if constexpr (std::is_integral_v<T>) return std::to_string(static_cast<long long>(v));
  else return std::to_string(static_cast<double>(static_cast<float>(v)));
}

inline std::uint64_t hash_bytes(std::span<const std::byte> b) {
  std::uint64_t h = 1469598103934665603ull ^ b.size();
  std::size_t i = 0;
  for (; i + 8 <= b.size(); i += 8) {
    std::uint64_t word;
    std::memcpy(&word, b.data() + i, 8);
    h = mix(h ^ word);
  }
  for (; i < b.size(); ++i) h = mix(h ^ std::uint64_t(b[i]));
  return h;
}

struct check_failed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Runs one collective on this rank and checks this rank's result exactly; then checks that
// every rank's result has the same hash where results are meant to be identical.
template <element T, class Op, class Comm>
void check(Comm& comm, kind k, const Op& op, std::size_t n, int root, std::uint64_t seed) {
  const int p = comm.size(), r = comm.rank();
  std::vector<T> in(n), out;
  for (std::size_t i = 0; i < n; ++i) in[i] = exact_input<T, Op>(seed, r, i);
  std::vector<T> expect;
  auto fail = [&](std::size_t i, const T& got, const T& want) {
    throw check_failed(std::string(kind_name(k)) + " " + std::string(dtype_name(dtype_of<T>)) +
                       " P=" + std::to_string(p) + " n=" + std::to_string(n) + " rank " +
                       std::to_string(r) + ": element " + std::to_string(i) + " is " + show(got) +
                       ", expected " + show(want));
  };
  // Compares got[from, from + want.size()) with want.
  auto compare = [&](std::span<const T> got, std::span<const T> want, std::size_t from = 0) {
    if (got.size() < from + want.size()) throw check_failed("result too short");
    if (want.empty() || std::memcmp(got.data() + from, want.data(), want.size_bytes()) == 0) return;
    for (std::size_t i = 0; i < want.size(); ++i)
      if (!same_bits(got[from + i], want[i])) fail(from + i, got[from + i], want[i]);
  };
  // The serial reference over [from, from+count): rank order, accumulated as the library does.
  auto reduced = [&](std::size_t from, std::size_t count) {
    std::vector<accumulator_t<T>> acc(count);
    for (std::size_t i = 0; i < count; ++i) acc[i] = exact_wide<T, Op>(seed, 0, from + i);
    for (int q = 1; q < p; ++q)
      for (std::size_t i = 0; i < count; ++i)
        acc[i] = op(acc[i], exact_wide<T, Op>(seed, q, from + i));
    std::vector<T> v(count);
    for (std::size_t i = 0; i < count; ++i) {
      if constexpr (finalizing_reduction_for<Op, T>) acc[i] = op.finalize(acc[i], p);
      v[i] = narrow<T>(acc[i]);
    }
    return v;
  };
  // all_reduce: each rank checks its own block against the reference, and the hash check below
  // that every rank holds the same bits, so every element is checked at 1/P of the cost.
  const block mine = block_of(n, p, r);
  switch (k) {
    case kind::all_reduce:
      out.resize(n);
      all_reduce(comm, in, out, op);
      compare(out, reduced(mine.offset, mine.count), mine.offset);
      break;
    case kind::all_reduce_in_place:
      all_reduce(comm, in, op);
      out = in;
      compare(out, reduced(mine.offset, mine.count), mine.offset);
      break;
    case kind::reduce_scatter:
      out.resize(mine.count);
      reduce_scatter(comm, in, out, op);
      compare(out, reduced(mine.offset, mine.count));
      break;
    case kind::reduce_scatter_in_place:
      reduce_scatter(comm, in, op);
      out.assign(in.begin() + mine.offset, in.begin() + mine.offset + mine.count);
      compare(out, reduced(mine.offset, mine.count));
      break;
    case kind::all_gather:
    case kind::all_gather_in_place: {
      std::vector<T> want(n * p);
      for (int q = 0; q < p; ++q)
        for (std::size_t i = 0; i < n; ++i) want[q * n + i] = exact_input<T, Op>(seed, q, i);
      if (k == kind::all_gather) {
        out.resize(n * p);
        all_gather(comm, in, out);
      } else {
        out.assign(n * p, T{});
        std::copy(in.begin(), in.end(), out.begin() + n * r);
        all_gather(comm, out);
      }
      compare(out, want);
      break;
    }
    case kind::broadcast:
    case kind::broadcast_out_of_place: {
      std::vector<T> want(n);
      for (std::size_t i = 0; i < n; ++i) want[i] = exact_input<T, Op>(seed, root, i);
      if (k == kind::broadcast) {
        broadcast(comm, in, root);
        out = in;
      } else {
        out.assign(n, T{});
        broadcast(comm, in, out, root);
      }
      compare(out, want);
      break;
    }
    case kind::reduce:
    case kind::reduce_in_place: {
      const std::vector<T> original = in;
      if (k == kind::reduce) {
        out.assign(r == root ? n : 0, T{});
        reduce(comm, in, out, op, root);
        compare(in, original);  // the input is never written
      } else {
        reduce(comm, in, op, root);
        out = in;
        if (r != root) compare(out, original);  // non-roots keep their data
      }
      if (r == root) compare(out, reduced(0, n));
      out.clear();  // results live on the root only
      break;
    }
    case kind::barrier:
      barrier(comm);
      break;
  }
  // Every rank's result must be the same bits where the collective promises it.
  if (k == kind::reduce_scatter || k == kind::reduce_scatter_in_place) return;
  auto h = static_cast<std::int64_t>(hash_bytes(std::as_bytes(std::span(out))));
  std::vector<std::int64_t> all(p);
  all_gather(comm, std::span(&h, 1), all);
  for (int q = 0; q < p; ++q)
    if (all[q] != all[0]) throw check_failed("ranks 0 and " + std::to_string(q) + " differ");
}

// Random floats in [-1, 1): results must be bitwise equal on every rank and within
// (P + 1) * eps * sum|x| of the exact (double) sum, eps being the unit roundoff of T.
template <element T, class Comm>
void check_rounding(Comm& comm, std::size_t n, std::uint64_t seed) {
  const int p = comm.size(), r = comm.rank();
  auto value = [&](int q, std::size_t i) {
    return T(static_cast<float>(static_cast<double>(element_hash(seed, q, i) >> 11) /
                                    9007199254740992.0 * 2.0 - 1.0));
  };
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = value(r, i);
  all_reduce(comm, x, ops::sum);
  double eps = std::same_as<T, double> ? 0x1p-53 : std::same_as<T, float> ? 0x1p-24
               : std::same_as<T, fp16> ? 0x1p-11 : 0x1p-8;
  for (std::size_t i = 0; i < n; ++i) {
    double exact = 0, magnitude = 0;
    for (int q = 0; q < p; ++q) {
      double v = static_cast<double>(static_cast<accumulator_t<T>>(widen(value(q, i))));
      exact += v;
      magnitude += std::fabs(v);
    }
    double got = static_cast<double>(widen(x[i]));
    double bound = (p + 1) * eps * std::max(magnitude, std::fabs(exact) + 1e-30) + 1e-30;
    if (std::fabs(got - exact) > bound)
      throw check_failed("sum of random values off by " + std::to_string(got - exact) +
                         " at element " + std::to_string(i) + ", bound " + std::to_string(bound));
  }
  auto h = static_cast<std::int64_t>(hash_bytes(std::as_bytes(std::span(x))));
  std::vector<std::int64_t> all(p);
  all_gather(comm, std::span(&h, 1), all);
  for (int q = 0; q < p; ++q)
    if (all[q] != all[0]) throw check_failed("rounded sums differ between ranks 0 and " + std::to_string(q));
}

// The counts every collective is checked at for P ranks: empty, one, P-1, the small/ring
// boundaries (recursive doubling's too, where the transport coalesces sends), a non-multiple of
// the pipeline chunk, and a prime above 10^6 (left out when COHORT_TEST_SCALE thins the matrix:
// three chunks and seven already cross every boundary).
template <class T>
std::vector<std::size_t> counts_for(int p) {
  namespace tuning = detail::tuning;
  const std::size_t chunk = tuning::chunk_bytes / sizeof(T);
  const std::size_t small = tuning::small_all_reduce_bytes / sizeof(T);
  const std::size_t doubling = tuning::doubling_all_reduce_bytes / sizeof(T);
  std::vector<std::size_t> n{0, 1, static_cast<std::size_t>(p - 1), small, small + 1, doubling,
                             doubling + 1, tuning::doubling_all_gather_bytes / sizeof(T),
                             3 * chunk + 7};
  if (test_scale() == 1.0) n.push_back(1'000'003);
  return n;
}

// Broadcast from every root, in turn, at counts on both sides of the bytes a root may leave in
// the transport (8 KiB over shm, 16 KiB over TCP) and of the tree/chain crossover
// (`tuning::tree_broadcast_bytes`), back to back on one communicator, so that the tree's edges
// off the ring carry call after call.
template <element T, class Comm>
void check_broadcast_sweep(Comm& comm) {
  const std::size_t tree = std::max<std::size_t>(detail::tuning::tree_broadcast_bytes / sizeof(T), 2);
  const std::size_t counts[] = {1, 7, 8 * 1024 / sizeof(T) + 1, 16 * 1024 / sizeof(T) + 1,
                                tree - 1, tree, tree + 1};
  for (int root = 0; root < comm.size(); ++root)
    for (std::size_t n : counts)
      for (kind k : {kind::broadcast, kind::broadcast_out_of_place})
        check<T>(comm, k, ops::sum, n, root, 77 + n + static_cast<std::size_t>(root));
}

}  // namespace cohort::test
