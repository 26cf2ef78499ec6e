// The mismatch matrix, generic over the transport: one rank calls something other than the
// rest at the same sequence number; every rank must fail with errc::mismatch, and the message
// must describe both calls. Used by the loopback test here and by the process transports.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cohort/cohort.hpp>

namespace cohort::test {

enum class call_kind { all_reduce, reduce_scatter, all_gather, broadcast, reduce, barrier };
inline constexpr call_kind every_call[] = {call_kind::all_reduce, call_kind::reduce_scatter,
                                           call_kind::all_gather, call_kind::broadcast,
                                           call_kind::reduce, call_kind::barrier};

// What one rank calls: a collective and the arguments that can disagree.
struct call_spec {
  call_kind kind = call_kind::all_reduce;
  std::size_t count = 4096;
  bool f64 = false;   // element type: float or double
  bool max = false;   // reduction: sum or max
  int root = 0;
};

// The text `describe()` gives the call in an error message, e.g. "reduce #0 with 4096 f32 sum
// to root 1" (without the sequence number, which the caller adds).
inline std::string expected_text(const call_spec& c) {
  constexpr const char* names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                   "reduce", "barrier"};
  return names[static_cast<int>(c.kind)];
}

template <class T, communicator Comm>
void run_call(Comm& comm, const call_spec& c) {
  std::vector<T> in(c.count, T(1)), out(c.count * comm.size());
  auto apply = [&](auto op) {
    switch (c.kind) {
      case call_kind::all_reduce: all_reduce(comm, in, op); break;
      case call_kind::reduce_scatter: reduce_scatter(comm, in, op); break;
      case call_kind::reduce: reduce(comm, in, op, c.root); break;
      default: break;
    }
  };
  switch (c.kind) {
    case call_kind::all_gather: all_gather(comm, in, out); break;
    case call_kind::broadcast: broadcast(comm, in, c.root); break;
    case call_kind::barrier: barrier(comm); break;
    default:
      if (c.max) apply(ops::max);
      else apply(ops::sum);
  }
}

// Runs the call; returns the error it ended with (empty if none) and its message.
template <communicator Comm>
std::pair<std::error_code, std::string> try_call(Comm& comm, const call_spec& c) {
  try {
    if (c.f64) run_call<double>(comm, c);
    else run_call<float>(comm, c);
  } catch (const cohort::error& e) {
    return {e.code(), e.what()};
  }
  return {};
}

// What a rank ended with: the error (empty if none), its message, and whether it came at the
// rank's next call.
struct mismatch_outcome {
  std::error_code code;
  std::string what;
  bool late = false;
};

// Runs the call and, where it completed, a barrier after it: a rank whose part of the call only
// sends (the first of a chain reduce, a small broadcast's root over an eager transport), or that
// took its data from ranks that agree with it (a leaf of the broadcast tree), can finish before
// a peer sees the disagreement, and must learn at its next call.
template <communicator Comm>
mismatch_outcome try_call_or_next(Comm& comm, const call_spec& c) {
  if (auto [code, what] = try_call(comm, c); code) return {code, what, false};
  auto [code, what] = try_call(comm, {.kind = call_kind::barrier});
  return {code, what, true};
}

// Every disagreement the matrix covers: each pair of distinct collectives, and for each
// collective each argument it takes, changed on the odd one out.
inline std::vector<std::pair<call_spec, call_spec>> mismatch_cases() {
  std::vector<std::pair<call_spec, call_spec>> cases;
  for (call_kind a : every_call)
    for (call_kind b : every_call)
      if (a != b) cases.push_back({{.kind = a}, {.kind = b}});
  for (call_kind k : every_call) {
    if (k == call_kind::barrier) continue;
    cases.push_back({{.kind = k}, {.kind = k, .count = 4095}});
    cases.push_back({{.kind = k}, {.kind = k, .f64 = true}});
    if (k == call_kind::all_reduce || k == call_kind::reduce_scatter || k == call_kind::reduce)
      cases.push_back({{.kind = k}, {.kind = k, .max = true}});
    if (k == call_kind::broadcast || k == call_kind::reduce) {
      cases.push_back({{.kind = k}, {.kind = k, .root = 1}});
      // At P = 2 the two ranks then take each other for the root: each waits for the other's
      // data, and only the call headers tell them why.
      cases.push_back({{.kind = k, .root = 1}, {.kind = k}});
    }
  }
  return cases;
}

}  // namespace cohort::test
