/// @file
/// Membership of an elastic job: generations whose member lists a store decides once for all.
///
/// Store keys (all under "elastic/<job>/"):
///
/// | key               | written by | meaning |
/// |-------------------|------------|---------|
/// | `id`              | `add`      | the last member id handed out (ids start at 1, never reused) |
/// | `pending/n`, `pending/<k>` | `add`, then `set` | newcomers, in arrival order |
/// | `g<G>/n`, `g<G>/r/<k>` | `add`, then `set` | members of generation G-1 going on to G: "<id> <lost ids...>" |
/// | `g<G>/claim`      | `add`      | the caller that gets 1 decides generation G |
/// | `g<G>/members`    | the decider, once | "<pending taken> <id> <id> ..." in rank order, or "stop <why>" |
/// | `latest`          | the decider | the number of the latest decided generation |
///
/// **Invariant.** Only the caller whose `add` on `g<G>/claim` returned 1 writes `g<G>/members`,
/// once; everybody else reads it. So no two processes can hold different member lists for one
/// generation. Rank r of generation G is the r-th id of that list: survivors in their old rank
/// order first, then newcomers in arrival order.
///
/// **Deciding.** The decider of generation 0 waits until `max_size` newcomers came, or until
/// `join_window` passed with at least `min_size`. The decider of a later generation waits until
/// every member of the previous one has gone on or been reported lost (an `errc::peer_lost`
/// names a process that died or already left its communicator, having gone on first), or until
/// `join_window` passed; it takes every newcomer that fits under `max_size`. Fewer than
/// `min_size` members stop the job: everybody reads "stop" and fails with `errc::aborted`.
///
/// **Limits.** A decider that dies between its claim and its write leaves the others waiting
/// for the list: they fail with `errc::timed_out` after `join_timeout` (a second decider could
/// not know whether the first one's list was read already). Newcomers are not checked for
/// life: one that died while waiting makes the next generation's communicator fail to form,
/// and the generation after it goes on without it (after `join_window`). Keys are never
/// removed: give each job its own name (or store).
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/rendezvous/store.hpp>

namespace cohort::elastic {

/// Settings of an elastic job; every process of the job passes the same ones.
struct options {
  std::string job = "job";  ///< Names the job's keys in the store (and its communicators).
  int min_size = 1;         ///< Below this many members the job stops.
  int max_size = 1 << 20;   ///< Newcomers beyond this wait for a later generation.
  /// How long a decider waits for members that neither went on nor were reported lost (a rank
  /// that hangs), and for the first `max_size` newcomers of generation 0.
  std::chrono::milliseconds join_window{1000};
  /// How long a process waits for a generation to be decided and formed before it gives up.
  std::chrono::milliseconds join_timeout{60000};
  /// The deadline of each collective call inside a generation: the failure-detection bound.
  std::chrono::milliseconds timeout{10000};
  /// Every how many `commit`s the running ranks look for newcomers (an `add` of 0 at rank 0,
  /// which is a round trip to a TCP store or an flock on a file store, and a one-integer
  /// all_reduce); 0 never looks (newcomers then join at the next failure).
  int check_every = 1;
  /// At most this many generations in one `run` (a bound on a job that keeps failing).
  int max_generations = 1000;
};

/// One generation: its number, its members (ids in rank order) and this process's place.
struct generation {
  std::uint64_t number = 0;
  std::vector<std::int64_t> members;
  int rank = -1;
  std::int64_t taken = 0;  ///< Newcomers taken in, in arrival order, up to this generation.
  /// The communicators' job id for this generation: "<job>-g<number>".
  std::string job_id;
  /// The number of ranks.
  int size() const { return static_cast<int>(members.size()); }
};

/// The store side of an elastic job: joining, going on to the next generation, newcomers.
class membership {
 public:
  membership(store& s, options o) : s_(&s), o_(std::move(o)), prefix_("elastic/" + o_.job + "/") {
    if (o_.min_size < 1 || o_.max_size < o_.min_size)
      throw error(errc::invalid_argument, "elastic", -1,
                  "elastic: need 1 <= min_size <= max_size, not " + std::to_string(o_.min_size) +
                      " and " + std::to_string(o_.max_size));
  }

  /// The job's settings.
  const options& settings() const { return o_; }
  /// The store the job meets at.
  store& backing_store() { return *s_; }
  /// This process's member id (0 before `join`).
  std::int64_t id() const { return id_; }

  /// Registers this process as a newcomer and waits for the generation that takes it in.
  /// Throws `cohort::error` (operation "elastic.join"): `errc::timed_out` after `join_timeout`,
  /// `errc::aborted` when the job stopped.
  generation join() {
    const deadline until = deadline_after(o_.join_timeout);
    id_ = s_->add(prefix_ + "id", 1);
    const std::int64_t k = s_->add(prefix_ + "pending/n", 1);
    s_->set(prefix_ + "pending/" + std::to_string(k), std::to_string(id_));
    // The latest decided generation may have taken this process in already: its decider can
    // read our registration and publish between our `set` and this read. So the search starts
    // at that generation (its list is there: one read), not at the one after it.
    std::uint64_t g = 0;
    if (auto latest = s_->try_get(prefix_ + "latest"))
      g = static_cast<std::uint64_t>(number("latest", *latest));
    for (int tries = 0; tries < 1 << 20; ++tries) {
      if (g == 0 && s_->add(key(0, "claim"), 1) == 1) decide_first();
      auto gen = read_members("elastic.join", g, until);
      if (gen.rank >= 0) return gen;
      ++g;  // decided without us (we came late): wait for the next one
    }
    throw error(errc::timed_out, "elastic.join", -1, "elastic.join: gave up");
  }

  /// Registers this member of `cur` for the next generation (after a failure, or to take
  /// newcomers in), naming the ranks of `cur` known to be gone (`lost`: ranks that failed with
  /// `errc::peer_lost`). Call it before this process leaves `cur`'s communicator, so that a
  /// peer that sees it leave knows it registered. Store errors throw (operation "store.*").
  void go_on(const generation& cur, const std::vector<int>& lost) {
    const std::uint64_t g = cur.number + 1;
    std::string line = std::to_string(id_);
    for (int r : lost)
      if (r >= 0 && r < cur.size() && r != cur.rank)
        line += " " + std::to_string(cur.members[static_cast<std::size_t>(r)]);
    const std::int64_t k = s_->add(key(g, "n"), 1);
    s_->set(key(g, "r/" + std::to_string(k)), line);
  }

  /// After `go_on`: decides the next generation if this process claims it first, and returns
  /// it. Throws `cohort::error` (operation "elastic.next"): `errc::aborted` when this process
  /// was left out (it came too late) or the job stopped (fewer than `min_size`), each with
  /// its sentence; `errc::timed_out` when no list came within `join_timeout`.
  generation next(const generation& cur) {
    const deadline until = deadline_after(o_.join_timeout);
    const std::uint64_t g = cur.number + 1;
    if (s_->add(key(g, "claim"), 1) == 1) decide_next(cur);
    auto gen = read_members("elastic.next", g, until);
    if (gen.rank < 0)
      throw error(errc::aborted, "elastic.next", -1,
                  "elastic.next: this process (member " + std::to_string(id_) + ", rank " +
                      std::to_string(cur.rank) + " of generation " + std::to_string(cur.number) +
                      ") was left out of generation " + std::to_string(g) + ", which " +
                      std::to_string(gen.size()) +
                      " ranks formed without it (it was too slow to go on; join again as a "
                      "newcomer)");
    return gen;
  }

  /// Whether newcomers wait beyond those `cur` took in (one store read).
  bool newcomers_waiting(const generation& cur) {
    return s_->add(prefix_ + "pending/n", 0) > cur.taken && cur.size() < o_.max_size;
  }

 private:
  std::string key(std::uint64_t g, const std::string& k) const {
    return prefix_ + "g" + std::to_string(g) + "/" + k;
  }

  // A non-negative integer the store holds at `k`; anything else is `errc::protocol_error`.
  std::int64_t number(const std::string& k, const std::string& v) const {
    std::int64_t x = -1;
    const auto [end, e] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (e != std::errc{} || end != v.data() + v.size() || x < 0)
      throw error(errc::protocol_error, "elastic", -1,
                  "elastic: " + s_->describe() + " holds \"" + v.substr(0, 40) + "\" at \"" +
                      prefix_ + k + "\", not a member count or id (another program's key?)");
    return x;
  }

  static std::vector<std::int64_t> parse_ids(const std::string& s) {
    std::vector<std::int64_t> v;
    std::istringstream in(s);
    for (std::int64_t x; in >> x;) v.push_back(x);
    return v;
  }

  // Newcomers in (taken, pending/n], at most `room` of them; returns the new `taken`.
  std::int64_t take_newcomers(std::int64_t taken, std::size_t room, std::vector<std::int64_t>& into,
                              deadline until) {
    const std::int64_t n = s_->add(prefix_ + "pending/n", 0);
    std::int64_t k = taken + 1;
    for (; k <= n && room > 0; ++k, --room) {
      // `add` came first, `set` follows at once; a newcomer that died between them is skipped.
      std::error_code ec;
      const std::string v = s_->get(prefix_ + "pending/" + std::to_string(k),
                                    std::min(until, deadline_after(std::chrono::seconds(2))), ec);
      if (!ec) into.push_back(number("pending/" + std::to_string(k), v));
    }
    return k - 1;
  }

  void publish(std::uint64_t g, const std::vector<std::int64_t>& members, std::int64_t taken) {
    std::string v;
    if (static_cast<int>(members.size()) < o_.min_size) {
      v = "stop generation " + std::to_string(g) + " would have " +
          std::to_string(members.size()) + " member(s), fewer than the job's minimum of " +
          std::to_string(o_.min_size);
    } else {
      v = std::to_string(taken);
      for (auto id : members) v += " " + std::to_string(id);
    }
    s_->set(key(g, "members"), v);
    s_->set(prefix_ + "latest", std::to_string(g));
  }

  void decide_first() {
    const auto start = clock::now();
    const deadline until = later(start, o_.join_timeout);
    for (int polls = 0; polls < 1'000'000; ++polls) {  // and by time: 5 ms a poll
      const std::int64_t n = s_->add(prefix_ + "pending/n", 0);
      if (n >= o_.max_size || (n >= o_.min_size && clock::now() >= later(start, o_.join_window)) ||
          clock::now() >= until)
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::vector<std::int64_t> members;
    const std::int64_t taken =
        take_newcomers(0, static_cast<std::size_t>(o_.max_size), members, until);
    publish(0, members, taken);
  }

  void decide_next(const generation& cur) {
    const std::uint64_t g = cur.number + 1;
    const auto start = clock::now();
    const deadline until = later(start, o_.join_timeout);
    std::vector<std::int64_t> going, lost;
    std::int64_t seen = 0;
    // Only members of `cur` register here: a count beyond them is not read.
    const std::int64_t most = static_cast<std::int64_t>(cur.members.size()) + 16;
    for (int polls = 0; polls < 1'000'000; ++polls) {  // and by time: join_window
      const std::int64_t n = std::min(s_->add(key(g, "n"), 0), most);
      for (; seen < n; ++seen) {
        std::error_code ec;
        const deadline slice = std::min(until, deadline_after(std::chrono::seconds(2)));
        const std::string line = s_->get(key(g, "r/" + std::to_string(seen + 1)), slice, ec);
        if (ec) continue;
        auto ids = parse_ids(line);
        if (ids.empty()) continue;
        going.push_back(ids[0]);
        lost.insert(lost.end(), ids.begin() + 1, ids.end());
      }
      bool all_known = true;
      for (auto id : cur.members)
        all_known = all_known && (std::find(going.begin(), going.end(), id) != going.end() ||
                                  std::find(lost.begin(), lost.end(), id) != lost.end());
      if (all_known || clock::now() >= later(start, o_.join_window)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    // Survivors in their old rank order (a member both lost and going on went on: it left
    // its communicator only after it registered).
    std::vector<std::int64_t> members;
    for (auto id : cur.members)
      if (std::find(going.begin(), going.end(), id) != going.end()) members.push_back(id);
    const std::size_t room =
        members.size() < static_cast<std::size_t>(o_.max_size) ? o_.max_size - members.size() : 0;
    const std::int64_t taken = take_newcomers(cur.taken, room, members, until);
    publish(g, members, taken);
  }

  generation read_members(const char* op, std::uint64_t g, deadline until) {
    std::error_code ec;
    const std::string v = s_->get(key(g, "members"), until, ec);
    if (ec)
      throw error(ec, op, -1,
                  std::string(op) + ": generation " + std::to_string(g) + " of elastic job \"" +
                      o_.job + "\" was not decided in time (" + s_->describe() + ": " +
                      s_->last_error() + ")");
    if (v.starts_with("stop"))
      throw error(errc::aborted, op, -1,
                  std::string(op) + ": elastic job \"" + o_.job + "\" stopped: " + v.substr(5));
    generation gen;
    gen.number = g;
    auto ids = parse_ids(v);
    gen.taken = ids.empty() ? 0 : ids[0];
    gen.members.assign(ids.begin() + (ids.empty() ? 0 : 1), ids.end());
    for (std::size_t r = 0; r < gen.members.size(); ++r)
      if (gen.members[r] == id_) gen.rank = static_cast<int>(r);
    gen.job_id = o_.job + "-g" + std::to_string(g);
    return gen;
  }

  store* s_;
  options o_;
  std::string prefix_;
  std::int64_t id_ = 0;
};

}  // namespace cohort::elastic
