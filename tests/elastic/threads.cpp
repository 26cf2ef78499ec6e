// Elastic jobs with members as threads: the membership protocol over a file store and a TCP
// store (one member list per generation whoever decides it; the minimum size; a member left
// out), and the state's commit, restore and sync over the loopback transport.
#include <doctest/doctest.h>

#include <stdlib.h>

#include <exception>
#include <filesystem>
#include <functional>
#include <latch>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <cohort/cohort.hpp>
#include <cohort/elastic.hpp>
#include <cohort/rendezvous/file_store.hpp>
#include <cohort/rendezvous/tcp_store.hpp>
#include <cohort/rendezvous/tcp_store_server.hpp>
#include <cohort/transport/loopback.hpp>

#include "../scale.hpp"

namespace {

using namespace std::chrono_literals;
using cohort::elastic::generation;
using cohort::elastic::membership;

struct temp_dir {
  std::string path;
  temp_dir() {
    char d[] = "/tmp/cohort-elastic-t-XXXXXX";
    REQUIRE(::mkdtemp(d) != nullptr);
    path = d;
  }
  ~temp_dir() { std::filesystem::remove_all(path); }
};

cohort::elastic::options settings(int min_size, int max_size) {
  cohort::elastic::options o;
  o.job = "t";
  o.min_size = min_size;
  o.max_size = max_size;
  // Members register within the window. Only the left-out case waits it out; elsewhere it is
  // how late a member may come, and a loaded machine has run a thread of a sanitized build more
  // than 1 s late (generation 0 then formed without it).
  o.join_window = cohort::test::sanitized ? 5000ms : 2000ms;
  o.join_timeout = 20s;
  return o;
}

// Runs `body(i)` on n threads at once: none starts before all are up, so that a thread the
// machine was slow to start (a loaded sanitized build has taken longer than the join window)
// does not join late, as a newcomer. After all have ended, a body's exception is rethrown here,
// so that the test case fails with its sentence instead of ending the program; when several
// threads failed, the test fails with every thread's sentence (one member's store error leaves
// the others waiting out their timeout, and that timeout alone would hide the cause).
template <class Body>
void on_threads(int n, Body body) {
  std::latch up(n);
  std::vector<std::exception_ptr> failed(static_cast<std::size_t>(n));
  std::vector<std::thread> ts;
  for (int i = 0; i < n; ++i)
    ts.emplace_back([&, i] {
      up.arrive_and_wait();
      try {
        body(i);
      } catch (...) {
        failed[static_cast<std::size_t>(i)] = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  std::string sentences;
  std::exception_ptr only;
  for (int i = 0; i < n; ++i) {
    if (!failed[static_cast<std::size_t>(i)]) continue;
    only = sentences.empty() ? failed[static_cast<std::size_t>(i)] : nullptr;
    try {
      std::rethrow_exception(failed[static_cast<std::size_t>(i)]);
    } catch (const std::exception& e) {
      sentences += "\n  thread " + std::to_string(i) + ": " + e.what();
    } catch (...) {
      sentences += "\n  thread " + std::to_string(i) + ": an exception of an unknown type";
    }
  }
  if (only) std::rethrow_exception(only);
  if (!sentences.empty()) throw std::runtime_error("several threads failed:" + sentences);
}

template <class Make>
void join_shrink_grow(Make make) {
  // Generation 0: four joiners, one list; generation 1: member 3 lost, 3 go on; generation 2:
  // a newcomer taken in.
  std::vector<generation> g0(4), g1(3);
  std::vector<std::unique_ptr<membership>> ms(4);
  std::vector<std::unique_ptr<cohort::store>> stores(5);
  for (auto& s : stores) s = make();
  on_threads(4, [&](int i) {
    ms[static_cast<std::size_t>(i)] = std::make_unique<membership>(*stores[static_cast<std::size_t>(i)], settings(2, 4));
    g0[static_cast<std::size_t>(i)] = ms[static_cast<std::size_t>(i)]->join();
  });
  for (int i = 0; i < 4; ++i) {
    CHECK(g0[static_cast<std::size_t>(i)].members == g0[0].members);
    CHECK(g0[static_cast<std::size_t>(i)].number == 0);
  }
  REQUIRE(g0[0].size() == 4);
  // The member with rank 3 dies; the one with rank 2 saw it (peer_lost naming rank 3).
  std::vector<int> going;
  for (int i = 0; i < 4; ++i)
    if (g0[static_cast<std::size_t>(i)].rank != 3) going.push_back(i);
  on_threads(3, [&](int k) {
    const int i = going[static_cast<std::size_t>(k)];
    auto& m = *ms[static_cast<std::size_t>(i)];
    const auto& cur = g0[static_cast<std::size_t>(i)];
    m.go_on(cur, cur.rank == 2 ? std::vector<int>{3} : std::vector<int>{});
    g1[static_cast<std::size_t>(k)] = m.next(cur);
  });
  for (const auto& g : g1) {
    CHECK(g.members == g1[0].members);
    CHECK(g.number == 1);
  }
  CHECK(g1[0].size() == 3);
  std::vector<std::int64_t> want(g0[0].members.begin(), g0[0].members.begin() + 3);
  CHECK(g1[0].members == want);  // survivors keep their order
  // A newcomer; the running ranks see it and go on together.
  generation fresh;
  std::exception_ptr newcomer_failed;
  std::vector<generation> g2(3);
  std::jthread newcomer([&] {  // joined on the way out too, when a going-on thread failed
    try {
      membership m(*stores[4], settings(2, 4));
      fresh = m.join();
    } catch (...) {
      newcomer_failed = std::current_exception();
    }
  });
  const int first = going[0];
  for (int tries = 0; tries < 2000 && !ms[static_cast<std::size_t>(first)]->newcomers_waiting(g1[0]); ++tries)
    std::this_thread::sleep_for(5ms);
  CHECK(ms[static_cast<std::size_t>(first)]->newcomers_waiting(g1[0]));
  on_threads(3, [&](int k) {
    auto& m = *ms[static_cast<std::size_t>(going[static_cast<std::size_t>(k)])];
    m.go_on(g1[static_cast<std::size_t>(k)], {});
    g2[static_cast<std::size_t>(k)] = m.next(g1[static_cast<std::size_t>(k)]);
  });
  newcomer.join();
  if (newcomer_failed) std::rethrow_exception(newcomer_failed);
  CHECK(fresh.number == 2);
  CHECK(fresh.rank == 3);
  for (const auto& g : g2) CHECK(g.members == fresh.members);
  CHECK_FALSE(ms[static_cast<std::size_t>(first)]->newcomers_waiting(g2[0]));
}

TEST_CASE("elastic membership over a file store: join, shrink, grow, one list per generation") {
  temp_dir d;
  join_shrink_grow([&]() -> std::unique_ptr<cohort::store> {
    return std::make_unique<cohort::file_store>(d.path);
  });
}

TEST_CASE("elastic membership over a TCP store: join, shrink, grow, one list per generation") {
  cohort::tcp_store_server server("127.0.0.1", 0);
  join_shrink_grow([&]() -> std::unique_ptr<cohort::store> {
    return std::make_unique<cohort::tcp_store>("127.0.0.1", server.port());
  });
}

// A store that passes every call to another and runs `before_latest` (once) just before the
// first read of a job's "latest" key: the moment between a joiner's registration and its look
// at the latest decided generation.
class latest_hook_store final : public cohort::store {
 public:
  latest_hook_store(cohort::store& inner, std::function<void()> before_latest)
      : inner_(&inner), before_latest_(std::move(before_latest)) {}
  std::string describe() const override { return inner_->describe(); }

 protected:
  void do_set(std::string_view k, std::string_view v, std::error_code& ec) override {
    inner_->set(k, v, ec);
  }
  std::optional<std::string> do_try_get(std::string_view k, std::error_code& ec) override {
    if (before_latest_ && k.ends_with("/latest")) std::exchange(before_latest_, nullptr)();
    return inner_->try_get(k, ec);
  }
  std::int64_t do_add(std::string_view k, std::int64_t n, std::error_code& ec) override {
    return inner_->add(k, n, ec);
  }
  std::vector<std::string> do_wait(std::span<const std::string> keys, cohort::deadline until,
                                   std::error_code& ec) override {
    return inner_->wait(keys, until, ec);
  }

 private:
  cohort::store* inner_;
  std::function<void()> before_latest_;
};

TEST_CASE("elastic membership: a joiner taken in before it reads \"latest\" is in generation 0") {
  // The second joiner registers; before it reads "latest", the first one (the decider of
  // generation 0, max_size 2) takes it in and publishes. The second must find itself in
  // generation 0, not wait for a generation 1 that nobody decides.
  temp_dir d;
  cohort::file_store first_store(d.path), second_store(d.path);
  membership first(first_store, settings(2, 2));
  generation g_first;
  std::jthread decider;
  latest_hook_store hooked(second_store, [&] {
    decider = std::jthread([&] { g_first = first.join(); });
    decider.join();
  });
  auto o = settings(2, 2);
  o.join_timeout = 5s;  // the defect waits this long, then fails with elastic.join's timeout
  membership second(hooked, o);
  const generation g_second = second.join();
  CHECK(g_second.number == 0);
  CHECK(g_first.number == 0);
  CHECK(g_second.members == g_first.members);
  CHECK(g_second.size() == 2);
  CHECK(g_second.rank != g_first.rank);
}

TEST_CASE("elastic membership: fewer than the minimum stops the job with the reason") {
  temp_dir d;
  std::vector<generation> g0(3);
  std::vector<std::unique_ptr<cohort::file_store>> stores;
  std::vector<std::unique_ptr<membership>> ms;
  for (int i = 0; i < 3; ++i) {
    stores.push_back(std::make_unique<cohort::file_store>(d.path));
    ms.push_back(std::make_unique<membership>(*stores.back(), settings(3, 3)));
  }
  on_threads(3, [&](int i) { g0[static_cast<std::size_t>(i)] = ms[static_cast<std::size_t>(i)]->join(); });
  // One member is gone, reported by another: two left, the minimum is 3.
  int lost = -1, reporter = -1;
  for (int i = 0; i < 3; ++i) {
    if (g0[static_cast<std::size_t>(i)].rank == 2) lost = i;
    if (g0[static_cast<std::size_t>(i)].rank == 1) reporter = i;
  }
  std::vector<std::string> errors(3);
  on_threads(3, [&](int i) {
    if (i == lost) return;
    const auto& cur = g0[static_cast<std::size_t>(i)];
    ms[static_cast<std::size_t>(i)]->go_on(cur, i == reporter ? std::vector<int>{2} : std::vector<int>{});
    try {
      ms[static_cast<std::size_t>(i)]->next(cur);
    } catch (const cohort::error& e) {
      CHECK(e.code() == cohort::errc::aborted);
      CHECK(e.operation() == "elastic.next");
      errors[static_cast<std::size_t>(i)] = e.what();
    }
  });
  for (int i = 0; i < 3; ++i) {
    if (i == lost) continue;
    INFO(errors[static_cast<std::size_t>(i)]);
    CHECK(errors[static_cast<std::size_t>(i)].find("fewer than the job's minimum of 3") != std::string::npos);
  }
}

TEST_CASE("elastic membership: a member that goes on too late is told it was left out") {
  temp_dir d;
  std::vector<generation> g0(3);
  std::vector<std::unique_ptr<cohort::file_store>> stores;
  std::vector<std::unique_ptr<membership>> ms;
  for (int i = 0; i < 3; ++i) {
    stores.push_back(std::make_unique<cohort::file_store>(d.path));
    ms.push_back(std::make_unique<membership>(*stores.back(), settings(1, 3)));
  }
  on_threads(3, [&](int i) { g0[static_cast<std::size_t>(i)] = ms[static_cast<std::size_t>(i)]->join(); });
  // Two go on; the third is slow (nobody reports it lost: the decider waits join_window).
  std::vector<generation> g1(3);
  on_threads(2, [&](int i) {
    ms[static_cast<std::size_t>(i)]->go_on(g0[static_cast<std::size_t>(i)], {});
    g1[static_cast<std::size_t>(i)] = ms[static_cast<std::size_t>(i)]->next(g0[static_cast<std::size_t>(i)]);
  });
  CHECK(g1[0].size() == 2);
  CHECK(g1[1].members == g1[0].members);
  ms[2]->go_on(g0[2], {});
  try {
    ms[2]->next(g0[2]);
    FAIL("the late member was taken in");
  } catch (const cohort::error& e) {
    CHECK(e.code() == cohort::errc::aborted);
    CHECK(std::string(e.what()).find("left out of generation 1") != std::string::npos);
  }
}

TEST_CASE("elastic state: restore undoes an uncommitted step; sync copies the most advanced source") {
  constexpr int P = 4;
  auto world = std::make_shared<cohort::loopback_world>(P);
  std::vector<std::vector<float>> w(P, std::vector<float>(1000));
  std::vector<std::vector<std::int64_t>> c(P, std::vector<std::int64_t>(3));
  std::vector<int> roots(P);
  std::vector<std::int64_t> steps(P);
  on_threads(P, [&](int r) {
    cohort::basic_communicator<cohort::loopback_transport> comm(std::in_place, world, r);
    cohort::elastic::state st;
    auto& mine = w[static_cast<std::size_t>(r)];
    st.add(std::span(mine));
    st.add(std::span(c[static_cast<std::size_t>(r)]));
    // Ranks 1, 2 and 3 got furthest (step 5), with different bytes; rank 1 is a newcomer (its
    // state is from a history the others left), so rank 2 must win.
    const std::int64_t step = r >= 1 ? 5 : 4;
    for (std::size_t i = 0; i < mine.size(); ++i)
      mine[i] = static_cast<float>(r * 1000 + static_cast<int>(i)) + 0.25f;
    c[static_cast<std::size_t>(r)] = {r, step, 7};
    st.commit(step);
    // An uncommitted step that a failure cut short.
    for (auto& x : mine) x = -1;
    roots[static_cast<std::size_t>(r)] = st.sync(comm, /*source=*/r != 1);
    steps[static_cast<std::size_t>(r)] = st.step();
  });
  for (int r = 0; r < P; ++r) {
    CHECK(roots[static_cast<std::size_t>(r)] == 2);
    CHECK(steps[static_cast<std::size_t>(r)] == 5);
    CHECK(std::memcmp(w[static_cast<std::size_t>(r)].data(), w[2].data(), w[2].size() * 4) == 0);
    CHECK(c[static_cast<std::size_t>(r)] == std::vector<std::int64_t>{2, 5, 7});
  }
  CHECK(w[0][3] == 2003.25f);
}

}  // namespace

TEST_CASE("elastic: a torchrun restart is a job of its own") {
  auto env = [](const char* count) {
    return [count](const char* name) -> const char* {
      return std::string(name) == "TORCHELASTIC_RESTART_COUNT" ? count : nullptr;
    };
  };
  CHECK(cohort::elastic::restart_scoped_job("train", env("2")) == "train-r2");
  CHECK(cohort::elastic::restart_scoped_job("train", env(nullptr)) == "train");
  CHECK(cohort::elastic::restart_scoped_job("train", env("")) == "train");
}

TEST_CASE("elastic membership: a store key that is not a number is a protocol_error") {
  temp_dir d;
  cohort::file_store s(d.path);
  s.set("elastic/t/latest", "not a number");
  membership m(s, settings(1, 2));
  try {
    m.join();
    FAIL("joined");
  } catch (const cohort::error& e) {
    CHECK(e.code() == cohort::errc::protocol_error);
    CHECK(std::string(e.what()).find("elastic/t/latest") != std::string::npos);
  }
}
