// Failures a user can cause or meet, on the in-process transport: every one ends in the right
// error code, naming the operation and the peer, within the deadline.
#include "../support.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <latch>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <cohort/cohort.hpp>
#include <cohort/training/local_sgd.hpp>

// local_sgd is synchronous: nothing on its include path drags Asio in.
#ifdef BOOST_ASIO_DETAIL_CONFIG_HPP
#error "cohort/training/local_sgd.hpp (or cohort/cohort.hpp) includes Asio"
#endif

using namespace std::chrono_literals;
using cohort::errc;

namespace {

// Runs fn(comm) on P threads and collects what each rank threw (nullopt: returned normally).
struct outcome {
  std::error_code code;
  std::string what;
  std::string operation;
  int peer = -2;
  bool threw = false;
};

template <class Fn>
std::vector<outcome> run_collecting(int p, Fn fn) {
  std::vector<outcome> out(p);
  cohort::run_loopback(p, [&](cohort::loopback_communicator& comm) {
    try {
      fn(comm);
    } catch (const cohort::error& e) {
      out[comm.rank()] = {e.code(), e.what(), e.operation(), e.peer(), true};
    }
  });
  return out;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("ranks calling different collectives get errc::mismatch with both sides described") {
  auto out = run_collecting(2, [](auto& comm) {
    std::vector<float> v(1024, 1.0f), all(2048);
    comm.set_timeout(5s);
    if (comm.rank() == 0) cohort::all_reduce(comm, v, cohort::ops::sum);
    else cohort::all_gather(comm, v, all);
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank ", r, ": ", out[r].what);
    CHECK(out[r].threw);
    CHECK(out[r].code == errc::mismatch);
  }
  // Rank 0 compares with its left neighbour, rank 1 (or hears of rank 1's verdict first).
  const std::string& w = out[0].what;
  INFO(w);
  CHECK(contains(w, "all_reduce #0 with 1024 f32 sum"));
  CHECK(contains(w, "all_gather #0 with 1024 f32"));
}

TEST_CASE("disagreeing counts, types, ops and roots are each a mismatch on every rank") {
  using fn = void (*)(cohort::loopback_communicator&);
  const fn cases[] = {
      [](cohort::loopback_communicator& c) {  // count
        std::vector<float> v(c.rank() == 2 ? 100 : 99);
        cohort::all_reduce(c, v, cohort::ops::sum);
      },
      [](cohort::loopback_communicator& c) {  // element type
        if (c.rank() == 2) {
          std::vector<double> v(64);
          cohort::all_reduce(c, v, cohort::ops::sum);
        } else {
          std::vector<float> v(64);
          cohort::all_reduce(c, v, cohort::ops::sum);
        }
      },
      [](cohort::loopback_communicator& c) {  // reduction
        std::vector<float> v(5000);
        if (c.rank() == 2) cohort::all_reduce(c, v, cohort::ops::max);
        else cohort::all_reduce(c, v, cohort::ops::sum);
      },
      [](cohort::loopback_communicator& c) {  // root
        std::vector<int> v(10);
        cohort::broadcast(c, v, c.rank() == 2 ? 2 : 0);
      },
      [](cohort::loopback_communicator& c) {  // sequence: rank 2 skipped a call
        std::vector<int> v(10);
        if (c.rank() != 2) cohort::barrier(c);
        cohort::broadcast(c, v, 0);
      },
  };
  for (fn f : cases) {
    auto out = run_collecting(3, [f](auto& comm) {
      comm.set_timeout(5s);
      f(comm);
    });
    for (int r = 0; r < 3; ++r) {
      INFO("rank ", r, ": ", out[r].what);
      CHECK(out[r].code == errc::mismatch);
    }
  }
}

TEST_CASE("a rank that never calls makes the others time out within the deadline") {
  std::latch others_done(2);
  auto start = std::chrono::steady_clock::now();
  auto out = run_collecting(3, [&](auto& comm) {
    if (comm.rank() == 1) {
      others_done.wait();  // stays alive but never calls
      return;
    }
    std::vector<float> v(100000, 1.0f);
    try {
      cohort::all_reduce(comm, v, cohort::ops::sum, {.timeout = 300ms});
    } catch (...) {
      others_done.count_down();
      throw;
    }
    others_done.count_down();
  });
  auto elapsed = std::chrono::steady_clock::now() - start;
  CHECK(elapsed >= 300ms);
  CHECK(elapsed < 3s);
  for (int r : {0, 2}) {
    INFO("rank ", r, ": ", out[r].what);
    CHECK(out[r].code == errc::timed_out);
    CHECK(out[r].operation == "all_reduce");
  }
  // Rank 2 waits on its left neighbour, rank 1, directly.
  CHECK((out[2].peer == 1 || out[0].peer == 1));
  CHECK((contains(out[2].what, "rank 1") || contains(out[0].what, "rank 1")));
}

TEST_CASE("after a failure the communicator is poisoned: later calls fail at once") {
  std::latch ready(2);
  run_collecting(2, [&](auto& comm) {
    std::vector<float> v(10);
    if (comm.rank() == 1) {
      ready.arrive_and_wait();
      return;  // never takes part: rank 0 times out
    }
    std::error_code ec;
    cohort::all_reduce(comm, v, cohort::ops::sum, {.timeout = 100ms}, ec);
    ready.arrive_and_wait();
    CHECK(ec == errc::timed_out);
    REQUIRE(comm.last_failure() != nullptr);
    CHECK(contains(comm.last_failure()->what, "all_reduce #0"));
    REQUIRE(comm.last_error() != nullptr);  // the error_code overload's sentence
    CHECK(comm.last_error()->code == errc::timed_out);
    CHECK(comm.last_error()->peer == 1);
    CHECK(contains(comm.last_error()->what, "all_reduce #0"));
    CHECK(comm.poisoned());
    auto t0 = std::chrono::steady_clock::now();
    cohort::barrier(comm, {}, ec);
    CHECK(ec == errc::poisoned);
    CHECK(std::chrono::steady_clock::now() - t0 < 1s);  // not the default timeout (30 s)
    // The later call's sentence replaces it, and says what poisoned the communicator.
    REQUIRE(comm.last_error() != nullptr);
    CHECK(comm.last_error()->code == errc::poisoned);
    CHECK(contains(comm.last_error()->what, "barrier #1"));
    CHECK(contains(comm.last_error()->what, "all_reduce #0"));
    try {
      cohort::broadcast(comm, v, 0);
      FAIL("a poisoned communicator accepted a call");
    } catch (const cohort::error& e) {
      CHECK(e.code() == errc::poisoned);
      CHECK(contains(e.what(), "all_reduce #0"));  // says what poisoned it
    }
  });
}

TEST_CASE("a peer that leaves mid-call is errc::peer_lost naming it") {
  auto out = run_collecting(2, [](auto& comm) {
    comm.set_timeout(5s);
    if (comm.rank() == 1) return;  // its transport is destroyed: the peer is gone
    std::vector<float> v(1 << 20, 1.0f);
    cohort::all_reduce(comm, v, cohort::ops::sum);
  });
  CHECK(out[0].code == errc::peer_lost);
  CHECK(out[0].peer == 1);
  CHECK(contains(out[0].what, "lost rank 1"));
}

TEST_CASE("abort reaches every peer with the reason") {
  std::latch waiting(1);
  auto out = run_collecting(3, [&](auto& comm) {
    comm.set_timeout(5s);
    std::vector<float> v(1000, 1.0f);
    if (comm.rank() == 0) {
      std::this_thread::sleep_for(50ms);  // let the others block in the call
      comm.abort("operator pressed stop");
      CHECK(comm.poisoned());
      return;
    }
    cohort::all_reduce(comm, v, cohort::ops::sum);
  });
  for (int r : {1, 2}) {
    INFO("rank ", r, ": ", out[r].what);
    CHECK(out[r].code == errc::aborted);
    CHECK(out[r].peer == 0);
    CHECK(contains(out[r].what, "operator pressed stop"));
  }
}

TEST_CASE("bad arguments are rejected before anything is sent, without poisoning") {
  run_collecting(3, [](auto& comm) {
    std::vector<float> in(100), small(10);
    std::error_code ec;
    CHECK(comm.last_error() == nullptr);
    cohort::all_reduce(comm, in, small, cohort::ops::sum, {}, ec);
    CHECK(ec == errc::invalid_argument);
    // The error_code overload keeps the sentence the exception would have carried.
    REQUIRE(comm.last_error() != nullptr);
    CHECK(comm.last_error()->code == errc::invalid_argument);
    CHECK(contains(comm.last_error()->what, "all_reduce #"));
    CHECK(contains(comm.last_error()->what, "output holds 10 elements, input 100"));
    CHECK(comm.last_failure() == nullptr);
    cohort::broadcast(comm, in, 3, {}, ec);
    CHECK(ec == errc::invalid_argument);
    REQUIRE(comm.last_error() != nullptr);
    CHECK(contains(comm.last_error()->what, "root 3 is not a rank of a group of 3"));
    cohort::broadcast(comm, in, -1, {}, ec);
    CHECK(ec == errc::invalid_argument);
    cohort::all_gather(comm, in, small, {}, ec);
    CHECK(ec == errc::invalid_argument);
    // Overlapping, but not identical, input and output.
    cohort::all_reduce(comm, std::span(in).first(50), std::span(in).subspan(10, 50),
                       cohort::ops::sum, {}, ec);
    CHECK(ec == errc::invalid_argument);
    CHECK_FALSE(comm.poisoned());
    cohort::barrier(comm, {}, ec);  // still healthy: every rank rejected the same calls
    CHECK_FALSE(ec);
    // A call that succeeds leaves the last failed call's sentence in place.
    REQUIRE(comm.last_error() != nullptr);
    CHECK(contains(comm.last_error()->what, "overlap"));
  });
}

TEST_CASE("an output that starts where the input does is in place only where the call says so") {
  // reduce_scatter's in-place form is `out == in + own block`, all_gather's `in == out + own
  // block`. On rank 1 an output at the input's start overlaps the input without being that,
  // and is refused: the overlap check let buffers that start at the same place through, and
  // the call gave wrong results on the loopback transport. Rank 0 passes the other rank's
  // block, refused too, so that both reject alike.
  auto out = run_collecting(2, [](auto& comm) {
    const std::size_t n = 12;
    const int other = 1 - comm.rank();
    std::vector<float> in(n, 1.0f);
    const cohort::block theirs = cohort::block_of(n, comm.size(), other);
    std::error_code ec;
    cohort::reduce_scatter(comm, std::span<const float>(in),
                           std::span(in.data() + theirs.offset, theirs.count), cohort::ops::sum,
                           {}, ec);
    CHECK(ec == errc::invalid_argument);
    std::vector<float> all(2 * n, 0.0f);
    cohort::all_gather(comm, std::span<const float>(all.data() + n * other, n), std::span(all),
                       {}, ec);
    CHECK(ec == errc::invalid_argument);
    CHECK_FALSE(comm.poisoned());
    // The in-place forms themselves, rank 0's at the start of the buffer.
    const cohort::block mine = cohort::block_of(n, comm.size(), comm.rank());
    cohort::reduce_scatter(comm, std::span<const float>(in),
                           std::span(in.data() + mine.offset, mine.count), cohort::ops::sum);
    CHECK(in[mine.offset] == 2.0f);
    std::fill(all.begin() + n * comm.rank(), all.begin() + n * (comm.rank() + 1),
              static_cast<float>(comm.rank() + 1));
    cohort::all_gather(comm, std::span<const float>(all.data() + n * comm.rank(), n),
                       std::span(all));
    CHECK(all[0] == 1.0f);
    CHECK(all[n] == 2.0f);
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank ", r, ": ", out[r].what);
    CHECK(!out[r].threw);
  }
}

TEST_CASE("an in-place all_gather of a size that is not a multiple of P is a bad argument") {
  // P = 4 and 10 elements left the last two out; P = 2 and sizes 8 and 9 went unnoticed.
  auto out = run_collecting(4, [](auto& comm) {
    std::vector<float> v(10, 1.0f);
    std::error_code ec;
    cohort::all_gather(comm, v, {}, ec);
    CHECK(ec == errc::invalid_argument);
    CHECK_FALSE(comm.poisoned());
    std::vector<float> w(static_cast<std::size_t>(8 + comm.rank() % 2));
    cohort::all_gather(comm, w);
  });
  for (int r = 0; r < 4; ++r) {
    INFO("rank ", r, ": ", out[r].what);
    REQUIRE(out[r].threw);
    if (r % 2 == 1) {
      CHECK(out[r].code == errc::invalid_argument);
      CHECK(out[r].operation == "all_gather");
      CHECK(contains(out[r].what, "the buffer holds 9 elements, not a multiple of 4 ranks"));
    } else {
      CHECK(out[r].code != std::error_code());  // its peers did not join the call
    }
  }
}

TEST_CASE("run_loopback and its world take at least one rank; a transport a rank of the world") {
  for (int bad : {0, -1}) {
    try {
      cohort::run_loopback(bad, [](auto&) { FAIL("ran"); });
      FAIL("run_loopback(" << bad << ") returned");
    } catch (const cohort::error& e) {
      CHECK(e.code() == errc::invalid_argument);
      CHECK(e.operation() == "run_loopback");
      CHECK(contains(e.what(), "at least 1, not " + std::to_string(bad)));
    }
    CHECK_THROWS_AS(cohort::loopback_world{bad}, cohort::error);
  }
  auto world = std::make_shared<cohort::loopback_world>(2);
  for (int bad : {-1, 2}) {
    try {
      cohort::loopback_transport t(world, bad);
      FAIL("rank " << bad << " attached");
    } catch (const cohort::error& e) {
      CHECK(e.code() == errc::invalid_argument);
      CHECK(contains(e.what(), "rank " + std::to_string(bad) + " of 2 ranks"));
    }
  }
}

TEST_CASE("error_code overloads of out-of-place broadcast and in-place reduce: results, bad arguments") {
  run_collecting(3, [](auto& comm) {
    const int r = comm.rank();
    std::vector<float> in(5, 10.0f * static_cast<float>(r + 1)), out(5, -1.0f);
    std::error_code ec = cohort::errc::aborted;  // overwritten on success
    cohort::broadcast(comm, in, out, 1, {}, ec);
    CHECK_FALSE(ec);
    CHECK(out == std::vector<float>(5, 20.0f));                         // rank 1's input
    CHECK(in == std::vector<float>(5, 10.0f * static_cast<float>(r + 1)));  // untouched
    std::vector<int> data(4, r + 1);
    ec = cohort::errc::aborted;
    cohort::reduce(comm, data, cohort::ops::sum, 2, {}, ec);
    CHECK_FALSE(ec);
    CHECK(data == std::vector<int>(4, r == 2 ? 1 + 2 + 3 : r + 1));  // only the root's changes
    // Every rank rejects the same bad root alike: nothing sent, nothing poisoned.
    cohort::broadcast(comm, in, out, 3, {}, ec);
    CHECK(ec == errc::invalid_argument);
    cohort::reduce(comm, data, cohort::ops::sum, -1, {}, ec);
    CHECK(ec == errc::invalid_argument);
    CHECK_FALSE(comm.poisoned());
    cohort::barrier(comm);
  });
}

TEST_CASE("bad arguments at the root only of an out-of-place broadcast: error_code, none hangs") {
  std::vector<std::error_code> codes(3);
  std::vector<bool> poisoned(3);
  run_collecting(3, [&](auto& comm) {
    std::vector<float> in(comm.rank() == 0 ? 3 : 0), out(8);
    std::error_code ec;
    cohort::broadcast(comm, in, out, 0, {.timeout = 300ms}, ec);
    codes[comm.rank()] = ec;
    poisoned[comm.rank()] = comm.poisoned();
  });
  CHECK(codes[0] == errc::invalid_argument);  // the root's input is shorter than its output
  CHECK_FALSE(poisoned[0]);                     // a bad argument does not poison
  for (int r : {1, 2}) {
    INFO("rank ", r, ": ", codes[r].message());
    CHECK((codes[r] == errc::timed_out || codes[r] == errc::peer_lost));
  }
}

TEST_CASE("the root's short input of an out-of-place broadcast, thrown: the counts are named") {
  auto out = run_collecting(2, [](auto& comm) {
    std::vector<float> in(comm.rank() == 0 ? 3 : 0), out(8);
    cohort::broadcast(comm, in, out, 0, {.timeout = 300ms});
  });
  CHECK(out[0].code == errc::invalid_argument);
  CHECK(out[0].operation == "broadcast");
  CHECK(contains(out[0].what, "the root's input holds 3 elements, its output 8"));
  CHECK(out[1].threw);  // its root never joined
}

TEST_CASE("a short output at the root only: the root is told, the others fail, none hangs") {
  auto out = run_collecting(3, [](auto& comm) {
    std::vector<float> in(100), small(comm.rank() == 0 ? 10 : 0);
    cohort::reduce(comm, in, small, cohort::ops::sum, 0, {.timeout = 300ms});
  });
  CHECK(out[0].code == errc::invalid_argument);
  CHECK(out[0].operation == "reduce");
  CHECK(contains(out[0].what, "output holds 10 elements"));
  for (int r : {1, 2}) {
    INFO("rank ", r, ": ", out[r].what);
    CHECK((out[r].code == errc::timed_out || out[r].code == errc::peer_lost));
  }
}

TEST_CASE("ordered user ops are combined in rank order 0..P-1") {
  // op(a, b) = a is associative and not commutative: the result must be rank 0's value;
  // op(a, b) = b must give rank P-1's. Any other order gives another rank's value.
  auto first = cohort::ops::ordered([](auto a, auto) { return a; });
  auto last = cohort::ops::ordered([](auto, auto b) { return b; });
  static_assert(!cohort::is_commutative_v<decltype(first)>);
  for (int p : {2, 3, 4, 7}) {
    for (std::size_t n : {std::size_t{3}, std::size_t{5000}, std::size_t{300001}}) {
      CAPTURE(p);
      CAPTURE(n);
      cohort::run_loopback(p, [&](auto& comm) {
        std::vector<std::int32_t> v(n, comm.rank() * 10 + 1), out(n), mine;
        cohort::all_reduce(comm, v, out, first);
        CHECK(out.front() == 1);
        CHECK(out.back() == 1);
        cohort::all_reduce(comm, v, out, last);
        CHECK(out[n / 2] == (p - 1) * 10 + 1);
        for (int root : {0, p - 1, p / 2}) {
          std::vector<std::int32_t> r(n, -5);
          cohort::reduce(comm, v, r, last, root);
          if (comm.rank() == root) CHECK(r.back() == (p - 1) * 10 + 1);
          else CHECK(r.back() == -5);
        }
        mine.resize(cohort::block_of(n, p, comm.rank()).count);
        cohort::reduce_scatter(comm, v, mine, first);
        if (!mine.empty()) CHECK(mine.front() == 1);
      });
    }
  }
}

TEST_CASE("a commutative user lambda runs on the ring") {
  auto sum_sq = cohort::ops::commutative([](auto a, auto b) { return a + b; });
  cohort::run_loopback(4, [&](auto& comm) {
    std::vector<double> v(100000, comm.rank() + 1.0);
    cohort::all_reduce(comm, v, sum_sq);
    CHECK(v[0] == 10.0);
    CHECK(v[99999] == 10.0);
  });
}

TEST_CASE("local SGD needs no Asio; a period below 1 is refused as bad arguments") {
  try {
    cohort::local_sgd<cohort::loopback_communicator> never(0);
    FAIL("period 0 accepted");
  } catch (const cohort::error& e) {
    CHECK(e.code() == errc::invalid_argument);
    CHECK(e.operation() == "local_sgd");
    CHECK(contains(e.what(), "period 0"));
  }
  run_collecting(3, [](auto& comm) {
    cohort::local_sgd<cohort::loopback_communicator> sgd(2);
    std::vector<float> params(10, float(comm.rank()));
    CHECK_FALSE(sgd.after_step(comm, params));
    CHECK(params[0] == float(comm.rank()));
    CHECK(sgd.after_step(comm, params));
    CHECK(params[9] == 1.0f);  // mean of 0, 1, 2
  });
}

TEST_CASE("a deadline that is not positive (set_timeout(0ms), .timeout = -5ms) is "
          "errc::invalid_argument, not a call that fails at once or a silent default") {
  // set_timeout(0ms) used to be taken: the rank that waits failed at once, the other succeeded.
  auto out = run_collecting(2, [](auto& comm) {
    for (auto bad : {0ms, -5ms}) {
      try {
        comm.set_timeout(bad);
        FAIL("set_timeout(" << bad.count() << "ms) was accepted");
      } catch (const cohort::error& e) {
        CHECK(e.code() == errc::invalid_argument);
        CHECK(contains(e.what(), "positive"));
      }
    }
    CHECK(comm.timeout() == cohort::default_timeout);
    comm.set_timeout(5s);
    // A negative call timeout used to mean the default; now every rank rejects it before
    // anything is sent, and the communicator stays healthy.
    std::vector<float> v(16, 1.0f);
    std::error_code ec;
    cohort::all_reduce(comm, v, cohort::ops::sum, {.timeout = -5ms}, ec);
    CHECK(ec == errc::invalid_argument);
    CHECK(!comm.poisoned());
    CHECK_THROWS_AS(cohort::barrier(comm, {.timeout = -1ms}), cohort::error);
    cohort::all_reduce(comm, v, cohort::ops::sum, {.timeout = 0ms});  // the default
    CHECK(v[0] == 2.0f);
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank ", r, ": ", out[r].what);
    CHECK(!out[r].threw);
  }
}

TEST_CASE("a deadline past the clock's range is no deadline, not one in the past") {
  // now + milliseconds::max() overflowed steady_clock's nanoseconds and wrapped into the past:
  // the rank that waited failed with timed_out at once.
  using ms = std::chrono::milliseconds;
  CHECK(cohort::later(cohort::deadline::max(), 2s) == cohort::deadline::max());
  CHECK(cohort::deadline_after(ms::max()) == cohort::deadline::max());
  CHECK(cohort::deadline_after(std::chrono::hours::max()) == cohort::deadline::max());
  const auto now = cohort::clock::now();
  CHECK(cohort::later(now, 5ms) == now + 5ms);
  CHECK(cohort::later(now, -5ms) == now - 5ms);
  // Durations of other shapes: exact where they fit, saturated where they do not.
  CHECK(cohort::later(now, std::chrono::duration<double>(0.5)) == now + 500ms);
  CHECK(cohort::later(now, std::chrono::duration<double>(1e30)) == cohort::deadline::max());
  CHECK(cohort::later(now, std::chrono::duration<std::int32_t, std::micro>(500)) == now + 500us);
  CHECK(cohort::later(now, std::chrono::duration<std::uint64_t, std::milli>(5000)) == now + 5s);
  CHECK(cohort::later(now, std::chrono::duration<std::uint64_t, std::milli>(~0ull)) ==
        cohort::deadline::max());
  CHECK(cohort::later(now, std::chrono::duration<std::int64_t, std::pico>(5000)) == now + 5ns);
  auto out = run_collecting(2, [](auto& comm) {
    if (comm.rank() == 1) std::this_thread::sleep_for(50ms);
    std::vector<float> v(16, 1.0f);
    cohort::all_reduce(comm, v, cohort::ops::sum, {.timeout = ms::max()});
    CHECK(v[0] == 2.0f);
    comm.set_timeout(ms::max());
    if (comm.rank() == 0) std::this_thread::sleep_for(50ms);
    cohort::barrier(comm);
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank ", r, ": ", out[r].what);
    CHECK(!out[r].threw);
  }
}
