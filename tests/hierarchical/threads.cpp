// The hierarchical communicator with ranks as threads: H hosts x L ranks, each rank's local and
// rail communicators on the loopback transport. Every collective against the serial reference
// (the collective suite's checks, which also compare every rank's bits), random floats within
// the rounding bound, compressed all_reduce, and failures naming world ranks.
#include "../support.hpp"

#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <cohort/cohort.hpp>
#include <cohort/compress/hierarchical.hpp>
#include <cohort/hierarchical.hpp>

#include "../collectives/suite.hpp"

namespace ct = cohort::test;
using namespace std::chrono_literals;

namespace {

using loopback_hier =
    cohort::hierarchical_communicator<cohort::loopback_communicator, cohort::loopback_communicator>;

static_assert(cohort::hierarchical<loopback_hier>);
static_assert(!cohort::communicator<loopback_hier>);

struct layout {
  int hosts, l_size;
};
constexpr layout layouts[] = {{1, 1}, {1, 3}, {2, 1}, {2, 2}, {3, 2}, {2, 3}};

/// Runs `fn(h)` on hosts x l_size threads, each with its hierarchical communicator; rethrows
/// the first exception (after every thread ended).
template <class Fn>
void run_hierarchical(layout lay, Fn&& fn) {
  std::vector<std::shared_ptr<cohort::loopback_world>> local, rail;
  for (int h = 0; h < lay.hosts; ++h) local.push_back(std::make_shared<cohort::loopback_world>(lay.l_size));
  for (int l = 0; l < lay.l_size; ++l) rail.push_back(std::make_shared<cohort::loopback_world>(lay.hosts));
  const int p = lay.hosts * lay.l_size;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(p));
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r)
    threads.emplace_back([&, r] {
      const int h = r / lay.l_size, l = r % lay.l_size;
      try {
        loopback_hier comm(
            std::make_unique<cohort::loopback_communicator>(cohort::loopback_transport(local[h], l)),
            std::make_unique<cohort::loopback_communicator>(cohort::loopback_transport(rail[l], h)));
        fn(comm);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

std::vector<std::size_t> counts(layout lay) {
  const auto p = static_cast<std::size_t>(lay.hosts * lay.l_size);
  std::vector<std::size_t> n{0, 1, static_cast<std::size_t>(lay.l_size - 1), p + 1, 1000};
  if (ct::test_scale() == 1.0) n.push_back(65537);
  return n;
}

template <class T, class Op>
void every_kind(const Op& op) {
  for (layout lay : layouts)
    for (std::size_t n : counts(lay)) {
      const int p = lay.hosts * lay.l_size;
      const int root = p - 1 - static_cast<int>(n % static_cast<std::size_t>(p));
      INFO("H=", lay.hosts, " L=", lay.l_size, " n=", n, " root=", root);
      CHECK_NOTHROW(run_hierarchical(lay, [&](loopback_hier& comm) {
        for (ct::kind k : ct::every_kind) {
          INFO(ct::kind_name(k));
          ct::check<T>(comm, k, op, n, root, 4321 + n);
        }
      }));
    }
}

}  // namespace

TEST_CASE_TEMPLATE("hierarchical: every collective, sum and max", T, float, double, std::int32_t,
                   cohort::fp16, cohort::bf16) {
  every_kind<T>(cohort::ops::sum);
  every_kind<T>(cohort::ops::max);
  if constexpr (!std::is_integral_v<T>) every_kind<T>(cohort::ops::avg);
}

// Associative ops that do not commute (no `commutative` member): the result names the first or
// the last rank of the order they were combined in.
struct keep_first {
  template <class A>
  constexpr A operator()(A a, A) const { return a; }
};
struct keep_last {
  template <class A>
  constexpr A operator()(A, A b) const { return b; }
};

TEST_CASE("hierarchical: ordered ops combine in rank order; prod") {
  every_kind<std::int32_t>(keep_first{});
  every_kind<std::int32_t>(keep_last{});
  every_kind<float>(keep_last{});
  every_kind<std::int32_t>(cohort::ops::prod);
}

TEST_CASE_TEMPLATE("hierarchical: random floats bitwise equal on every rank, within the bound",
                   T, float, double, cohort::fp16, cohort::bf16) {
  for (layout lay : layouts)
    for (std::size_t n : {std::size_t{1000}, std::size_t{65537}}) {
      INFO("H=", lay.hosts, " L=", lay.l_size, " n=", n);
      CHECK_NOTHROW(run_hierarchical(lay, [&](loopback_hier& comm) {
        ct::check_rounding<T>(comm, n, 77 + n);
      }));
    }
}

TEST_CASE("hierarchical: accessors, host-major ranks") {
  run_hierarchical({3, 2}, [](loopback_hier& comm) {
    CHECK(comm.size() == 6);
    CHECK(comm.hosts() == 3);
    CHECK(comm.local_size() == 2);
    CHECK(comm.rank() == comm.host() * 2 + comm.local_rank());
  });
}

TEST_CASE("hierarchical: hosts of different sizes are invalid_argument on every rank") {
  // Host 0 has two ranks, host 1 one: the rail of local rank 0 sees sizes 2 and 1.
  auto local0 = std::make_shared<cohort::loopback_world>(2);
  auto local1 = std::make_shared<cohort::loopback_world>(1);
  auto rail0 = std::make_shared<cohort::loopback_world>(2);
  auto rail1 = std::make_shared<cohort::loopback_world>(1);
  std::vector<int> codes(3, 0);
  auto body = [&](int i, std::shared_ptr<cohort::loopback_world> lw, int lr,
                  std::shared_ptr<cohort::loopback_world> rw, int rr) {
    try {
      loopback_hier comm(
          std::make_unique<cohort::loopback_communicator>(cohort::loopback_transport(lw, lr)),
          std::make_unique<cohort::loopback_communicator>(cohort::loopback_transport(rw, rr)));
    } catch (const cohort::error& e) {
      codes[static_cast<std::size_t>(i)] = e.code() == cohort::errc::invalid_argument ? 1 : 2;
    }
  };
  std::thread a(body, 0, local0, 0, rail0, 0), b(body, 1, local0, 1, rail1, 0),
      c(body, 2, local1, 0, rail0, 1);
  a.join();
  b.join();
  c.join();
  CHECK(codes[0] == 1);
  CHECK(codes[2] == 1);
}

TEST_CASE("hierarchical: bad buffers are invalid_argument on every rank that passes them") {
  // 2 hosts x 2 ranks. An in-place all_gather of 10 elements (not a multiple of 4), and outputs
  // that start at the input without being this rank's block (in place only where they are).
  run_hierarchical({2, 2}, [](loopback_hier& h) {
    std::vector<float> v(10, 1.0f);
    try {
      cohort::all_gather(h, v);
      FAIL("an in-place all_gather of 10 elements over 4 ranks was taken");
    } catch (const cohort::error& e) {
      CHECK(e.code() == cohort::errc::invalid_argument);
      CHECK(std::string(e.what()).find("not a multiple of 4 ranks") != std::string::npos);
    }
    const std::size_t n = 8;
    const int other = (h.rank() + 1) % h.size();
    std::vector<float> in(n, 1.0f), all(4 * n, 0.0f);
    const cohort::block theirs = cohort::block_of(n, h.size(), other);
    std::error_code ec;
    cohort::reduce_scatter(h, std::span<const float>(in),
                           std::span(in.data() + theirs.offset, theirs.count), cohort::ops::sum,
                           {}, ec);
    CHECK(ec == cohort::errc::invalid_argument);
    ec = {};
    cohort::all_gather(h, std::span<const float>(all.data() + n * other, n), std::span(all), {},
                       ec);
    CHECK(ec == cohort::errc::invalid_argument);
    ec = {};
    cohort::all_gather(h, v, {}, ec);  // the in-place form's error_code overload
    CHECK(ec == cohort::errc::invalid_argument);
    REQUIRE(h.last_error() != nullptr);  // with the exception's sentence
    CHECK(h.last_error()->code == cohort::errc::invalid_argument);
    CHECK(h.last_error()->what.find("not a multiple of 4 ranks") != std::string::npos);
    CHECK(h.last_failure() == nullptr);
    cohort::all_reduce(h, in, cohort::ops::sum);  // nothing was sent: the ranks still agree
    CHECK(in[0] == 4.0f);
    // The same overload, given a good size, gathers.
    std::vector<float> rows(4 * 3, -1.0f);
    for (std::size_t i = 0; i < 3; ++i) rows[3 * h.rank() + i] = float(10 * h.rank() + int(i));
    ec = {};
    cohort::all_gather(h, rows, {}, ec);
    CHECK(!ec);
    for (int q = 0; q < 4; ++q)
      for (std::size_t i = 0; i < 3; ++i) CHECK(rows[3 * q + i] == float(10 * q + int(i)));
  });
}

TEST_CASE("hierarchical: compressed all_reduce, exact inside hosts, compressed on the rails") {
  for (layout lay : layouts)
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{65537}}) {
      INFO("H=", lay.hosts, " L=", lay.l_size, " n=", n);
      CHECK_NOTHROW(run_hierarchical(lay, [&](loopback_hier& comm) {
        const int p = comm.size();
        // Small integers: exact in bf16 and their sums too, so bf16 gives the exact sum.
        auto value = [&](int q, std::size_t i) {
          return static_cast<float>(static_cast<int>(ct::mix(q * 1000003ull + i) % 17) - 8);
        };
        std::vector<float> x(n), want(n, 0.0f);
        for (std::size_t i = 0; i < n; ++i) {
          x[i] = value(comm.rank(), i);
          for (int q = 0; q < p; ++q) want[i] += value(q, i);
        }
        auto bf = x;
        const auto rep = cohort::compressed_all_reduce(comm, bf, cohort::compress::bf16,
                                                       cohort::ops::sum);
        CHECK(rep.used == cohort::compress::aggregation::summable);
        for (std::size_t i = 0; i < n; ++i)
          if (bf[i] != want[i]) FAIL("bf16: element ", i, " is ", bf[i], ", expected ", want[i]);
        auto avg = x;
        cohort::compressed_all_reduce(comm, avg, cohort::compress::bf16, cohort::ops::avg);
        for (std::size_t i = 0; i < n; ++i)
          if (avg[i] != want[i] / static_cast<float>(p)) FAIL("bf16 avg: element ", i);
        // Top-k at full density keeps everything: exact too; at 1% the ranks agree bitwise.
        auto all = x;
        cohort::compressed_all_reduce(comm, all, cohort::compress::top_k(1.0));
        for (std::size_t i = 0; i < n; ++i)
          if (all[i] != want[i]) FAIL("top-k(1): element ", i);
        cohort::compress::error_feedback ef{cohort::compress::top_k(0.01)};
        auto sparse = x;
        cohort::compressed_all_reduce(comm, sparse, ef, cohort::ops::sum);
        auto h = static_cast<std::int64_t>(ct::hash_bytes(std::as_bytes(std::span(sparse))));
        std::vector<std::int64_t> hashes(static_cast<std::size_t>(p));
        cohort::all_gather(comm, std::span(&h, 1), hashes);
        for (auto v : hashes) CHECK(v == hashes[0]);
      }));
    }
}

TEST_CASE("hierarchical: a rank that leaves fails every other rank, naming world ranks") {
  for (layout lay : {layout{2, 2}, layout{3, 2}}) {
    const int p = lay.hosts * lay.l_size;
    std::vector<int> codes(static_cast<std::size_t>(p), 0);
    std::latch first_done(p);
    const auto start = std::chrono::steady_clock::now();
    run_hierarchical(lay, [&](loopback_hier& comm) {
      std::vector<float> x(10000, 1.0f);
      cohort::all_reduce(comm, x, cohort::ops::sum);
      // Every rank has its result before one leaves: a loopback transport that detaches drops
      // what it had sent and a peer had not taken yet.
      first_done.arrive_and_wait();
      if (comm.rank() == p - 1) return;  // leaves: its transports detach
      try {
        for (int i = 0; i < 3; ++i) cohort::all_reduce(comm, x, cohort::ops::sum, {.timeout = 10s});
      } catch (const cohort::error& e) {
        codes[static_cast<std::size_t>(comm.rank())] = static_cast<int>(e.code().value());
        CHECK(comm.poisoned());
        CHECK(e.peer() >= 0);
        CHECK(e.peer() < p);
        std::error_code ec;
        cohort::all_reduce(comm, x, cohort::ops::sum, ec);
        CHECK(ec == cohort::errc::poisoned);
        cohort::barrier(comm, {}, ec);
        CHECK(ec == cohort::errc::poisoned);
      }
    });
    CHECK(std::chrono::steady_clock::now() - start < 8s);
    for (int r = 0; r + 1 < p; ++r) {
      INFO("rank ", r);
      CHECK((codes[r] == static_cast<int>(cohort::errc::peer_lost) ||
             codes[r] == static_cast<int>(cohort::errc::aborted)));
    }
  }
}
