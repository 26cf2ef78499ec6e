// Elastic jobs with ranks as processes, over shm and TCP (meeting at a file store): a rank
// killed mid-all_reduce, the survivors going on, a newcomer taken in, all ending with the same
// model to the bit; two ranks killed below the minimum size; a stopped rank resumed after it
// was left out.
#include <doctest/doctest.h>

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <cohort/elastic.hpp>
#include <cohort/elastic/tcp.hpp>
#include <cohort/rendezvous/file_store.hpp>
#include <cohort/rendezvous/tcp_store.hpp>
#include <cohort/rendezvous/tcp_store_server.hpp>

#include "../faults/process.hpp"

namespace {

using namespace std::chrono_literals;
using cohort::faults::reap;
using cohort::faults::spawn;
using cohort::faults::status_text;

enum class fault { none, kill, stop };

struct scenario {
  bool tcp = false;
  std::string dir, job;
  int min_size = 2;
  int steps = 30;         // at least this many steps...
  int until_size = 0;     // ...and then on (at most 3000) until the job has this many ranks
  // Members register within the window (the processes starting, for generation 0; survivors
  // going on, later): 1 s, 3 s in a sanitized build, whose processes a loaded machine has kept
  // from registering within 1 s.
  std::chrono::milliseconds timeout = 10s, join_timeout = 30s,
                            window = cohort::faults::sanitized ? 3000ms : 1000ms;
  int store_port = 0;     // > 0: the job meets at the TCP store there, not at the file store
};

// Where a process dies in the middle of the agreement on generation 1.
enum class agreement_death {
  none,
  decider,  // right after it won the claim to decide generation 1, before it wrote the list
  gone_on,  // right after it registered to go on to generation 1, before the list was decided
};

// A store that forwards to another and dies (SIGKILL) at its agreement_death point.
class dying_store final : public cohort::store {
 public:
  dying_store(cohort::store& inner, agreement_death at) : inner_(inner), at_(at) {}
  std::string describe() const override { return inner_.describe(); }

 protected:
  void do_set(std::string_view key, std::string_view value, std::error_code& ec) override {
    inner_.set(key, value, ec);
    if (ec) return fail(ec, ec, inner_.last_error());
    if (at_ == agreement_death::gone_on && key.find("/g1/r/") != std::string_view::npos) die();
  }
  std::optional<std::string> do_try_get(std::string_view key, std::error_code& ec) override {
    auto v = inner_.try_get(key, ec);
    if (ec) fail(ec, ec, inner_.last_error());
    return v;
  }
  std::int64_t do_add(std::string_view key, std::int64_t n, std::error_code& ec) override {
    const auto v = inner_.add(key, n, ec);
    if (ec) fail(ec, ec, inner_.last_error());
    if (!ec && at_ == agreement_death::decider && key.ends_with("/g1/claim") && v == 1) die();
    return v;
  }
  std::vector<std::string> do_wait(std::span<const std::string> keys, cohort::deadline until,
                                   std::error_code& ec) override {
    auto v = inner_.wait(keys, until, ec);
    if (ec) fail(ec, ec, inner_.last_error());
    return v;
  }

 private:
  static void die() {
    std::fflush(nullptr);
    ::raise(SIGKILL);
  }
  cohort::store& inner_;
  agreement_death at_;
};

constexpr std::size_t model_size = 4096;

void gradient(std::vector<float>& g, const std::vector<float>& w, int rank, std::int64_t step) {
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] = static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 13 +
                                                static_cast<std::size_t>(step) * 31) % 9) - 4) +
           (w[i] > 0 ? 0.5f : 0.0f);
}

std::uint64_t checksum(const std::vector<float>& w) {
  std::uint64_t h = 1469598103934665603ull;
  for (float x : w) {
    std::uint32_t bits;
    std::memcpy(&bits, &x, 4);
    h = (h ^ bits) * 1099511628211ull;
  }
  return h;
}

// Generation 0 is the test's first n processes: each waits here (a minute at most) until all of
// them are up, so that one the machine was slow to start (a loaded sanitized build has taken
// longer than the join window) is not taken for a newcomer. A newcomer, later, passes at once.
void start_together(cohort::store& board, int n) {
  board.add("started", 1);
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (board.add("started", 0) < n && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(2ms);
}

// One process of the job. Exit codes: 0 trained to the end, 3 the job stopped (aborted, and
// the message says so), 4 left out of a generation, 1 anything else. With `rejoin`, a process
// left out joins again (once) as a newcomer.
int worker(const scenario& sc, const char* name, fault f, int fault_step, bool rejoin = false,
           agreement_death death = agreement_death::none) {
  cohort::file_store board(sc.dir);  // results and errors, which outlive the job's store
  start_together(board, 4);  // every test starts four
  std::optional<cohort::tcp_store> tcp_store;
  if (sc.store_port > 0)
    tcp_store.emplace("127.0.0.1", sc.store_port, cohort::tcp_store_options{.token = {}, .timeout = 3s});
  dying_store store(tcp_store ? static_cast<cohort::store&>(*tcp_store) : board, death);
  cohort::elastic::options o;
  o.job = sc.job;
  o.min_size = sc.min_size;
  o.max_size = 4;
  o.timeout = sc.timeout;
  o.join_window = sc.window;
  o.join_timeout = sc.join_timeout;
  std::vector<float> w(model_size, 0.0f), g(model_size);
  cohort::elastic::state st;
  st.add(std::span(w));
  std::string log;
  std::int64_t id = 0;
  auto train = [&](auto& ctx) {
    for (std::int64_t step = st.step();
         step < sc.steps || (ctx.size() < sc.until_size && step < 3000); ++step) {
      if (f != fault::none && step == fault_step && ctx.current().number == 0) {
        std::fflush(nullptr);
        ::raise(f == fault::kill ? SIGKILL : SIGSTOP);  // the others are in the all_reduce
      }
      gradient(g, w, ctx.rank(), step);
      cohort::all_reduce(ctx.comm(), g, cohort::ops::sum);
      for (std::size_t i = 0; i < w.size(); ++i) w[i] -= g[i] / 1024;
      ctx.commit(step + 1);
      if (sc.until_size > 0) std::this_thread::sleep_for(2ms);
    }
  };
  auto on_generation = [&](const auto& ctx) {
    const auto& gen = ctx.current();
    // A victim that failed before its kill point (a ring all_reduce can fail at one rank after
    // another rank left it complete: the other victim died first) dies here instead.
    if (f == fault::kill && gen.number > 0) {
      std::fflush(nullptr);
      ::raise(SIGKILL);
    }
    id = gen.members[static_cast<std::size_t>(gen.rank)];
    log += " " + std::to_string(gen.number) + ":" + std::to_string(gen.size());
    std::printf("%s: generation %llu: rank %d of %d (state of step %lld from rank %d)\n", name,
                static_cast<unsigned long long>(gen.number), ctx.rank(), ctx.size(),
                static_cast<long long>(st.step()), ctx.synced_from());
    std::fflush(stdout);
  };
  for (int attempt = 0;; ++attempt) {
    try {
      if (sc.tcp) {
        cohort::tcp_options t;
        t.interface = "lo";
        t.connect_timeout = 10s;
        cohort::elastic::run(store, o, st, cohort::elastic::tcp_generations{&store, t}, train,
                             on_generation);
      } else {
        cohort::shm_options so;
        so.connect_timeout = 10s;
        cohort::elastic::run(store, o, st, cohort::elastic::shm_generations{so}, train,
                             on_generation);
      }
      break;
    } catch (const cohort::error& e) {
      std::printf("%s: %s\n", name, e.what());
      std::fflush(stdout);
      board.set(std::string("error/") + name, e.what());
      const std::string what = e.what();
      if (e.code() == cohort::errc::aborted && what.find("stopped") != std::string::npos) return 3;
      const bool left_out =
          e.code() == cohort::errc::aborted && what.find("left out") != std::string::npos;
      if (left_out && rejoin && attempt == 0) {
        log += " rejoin";
        continue;
      }
      return left_out ? 4 : 1;
    }
  }
  board.set(std::string("result/") + name, std::to_string(checksum(w)) + " step " +
                                               std::to_string(st.step()) + " id " +
                                               std::to_string(id) + " log" + log);
  return 0;
}

struct job_dir {
  std::string path;
  job_dir() {
    char d[] = "/tmp/cohort-elastic-XXXXXX";
    REQUIRE(::mkdtemp(d) != nullptr);
    path = d;
  }
  ~job_dir() { std::filesystem::remove_all(path); }
};

scenario make(bool tcp, const job_dir& d, const char* what) {
  scenario sc;
  sc.tcp = tcp;
  sc.dir = d.path;
  sc.job = std::string("el-") + what + "-" + std::to_string(::getpid());
  return sc;
}

std::string result(const scenario& sc, const std::string& name) {
  cohort::file_store s(sc.dir);
  return s.try_get("result/" + name).value_or("(none)");
}

void kill_one_then_grow(bool tcp) {
  job_dir d;
  scenario sc = make(tcp, d, tcp ? "grow-tcp" : "grow-shm");
  sc.until_size = 4;
  const auto start = cohort::faults::steady::now();
  std::vector<pid_t> pids;
  for (int r = 0; r < 4; ++r) {
    const std::string name = "w" + std::to_string(r);
    pids.push_back(spawn(r, [&, name](int rr) {
      return worker(sc, name.c_str(), rr == 3 ? fault::kill : fault::none, 5);
    }));
  }
  // Once the victim is dead and generation 1 is decided, a replacement comes.
  int st = 0;
  REQUIRE(::waitpid(pids[3], &st, 0) == pids[3]);
  CHECK(WIFSIGNALED(st));
  {
    cohort::file_store s(sc.dir);
    s.get("elastic/" + sc.job + "/g1/members", cohort::clock::now() + 30s);
  }
  pids[3] = spawn(4, [&](int) { return worker(sc, "new", fault::none, 0); });
  const auto status = reap(pids, 60s);
  const double seconds =
      std::chrono::duration<double>(cohort::faults::steady::now() - start).count();
  MESSAGE("kill one, grow back (" << (tcp ? "tcp" : "shm") << "): " << seconds << " s");
  for (std::size_t i = 0; i < status.size(); ++i) CHECK_MESSAGE(status[i] == 0, status_text(status[i]));
  const std::string want = result(sc, "w0");
  const std::string sum = want.substr(0, want.find(' '));
  for (const char* n : {"w0", "w1", "w2", "new"}) {
    const std::string r = result(sc, n);
    INFO(n << ": " << r);
    CHECK(r.substr(0, r.find(' ')) == sum);  // the same model to the bit
  }
  for (const char* n : {"w0", "w1", "w2"}) CHECK(result(sc, n).find("log 0:4 1:3 2:4") != std::string::npos);
  CHECK(result(sc, "new").find("log 2:4") != std::string::npos);
  CHECK(cohort::faults::shm_names(sc.job).empty());
}

TEST_CASE("elastic shm: a rank killed mid-all_reduce, 3 go on, a newcomer joins") {
  kill_one_then_grow(false);
}

TEST_CASE("elastic tcp: a rank killed mid-all_reduce, 3 go on, a newcomer joins") {
  kill_one_then_grow(true);
}

void kill_two_below_minimum(bool tcp) {
  job_dir d;
  scenario sc = make(tcp, d, tcp ? "min-tcp" : "min-shm");
  sc.min_size = 3;
  std::vector<pid_t> pids;
  for (int r = 0; r < 4; ++r) {
    const std::string name = "w" + std::to_string(r);
    pids.push_back(spawn(r, [&, name](int rr) {
      return worker(sc, name.c_str(), rr >= 2 ? fault::kill : fault::none, 5);
    }));
  }
  const auto status = reap(pids, 40s);
  for (int r = 0; r < 2; ++r) {
    INFO("w" << r << ": " << status_text(status[static_cast<std::size_t>(r)]));
    CHECK(status[static_cast<std::size_t>(r)] == 3);  // stopped, with the reason
  }
  CHECK(status[2] == -SIGKILL);
  CHECK(status[3] == -SIGKILL);
  cohort::file_store s(sc.dir);
  const std::string e = s.try_get("error/w0").value_or("");
  INFO(e);
  CHECK(e.find("fewer than the job's minimum of 3") != std::string::npos);
  CHECK(cohort::faults::shm_names(sc.job).empty());
}

TEST_CASE("elastic shm: two ranks killed at once leave fewer than the minimum: the job stops") {
  kill_two_below_minimum(false);
}

TEST_CASE("elastic tcp: two ranks killed at once leave fewer than the minimum: the job stops") {
  kill_two_below_minimum(true);
}

// The join window of the tests that stop a rank: short, so that generation 1 is decided soon
// after the survivors registered. It also bounds how long generation 0 waits for the four
// processes to register, which a loaded sanitized build has taken more than 300 ms to do even
// after all four were up (one was left out of generation 0 and joined generation 1 as a
// newcomer): there it stays as long as the scenario's.
std::chrono::milliseconds stopped_rank_window() {
  return cohort::faults::sanitized ? scenario{}.window : 300ms;
}

void stopped_rank_left_out(bool tcp) {
  job_dir d;
  scenario sc = make(tcp, d, tcp ? "stop-tcp" : "stop-shm");
  sc.timeout = 1000ms;
  sc.window = stopped_rank_window();
  std::vector<pid_t> pids;
  for (int r = 0; r < 4; ++r) {
    const std::string name = "w" + std::to_string(r);
    pids.push_back(spawn(r, [&, name](int rr) {
      return worker(sc, name.c_str(), rr == 3 ? fault::stop : fault::none, 5);
    }));
  }
  {
    cohort::file_store s(sc.dir);
    s.get("elastic/" + sc.job + "/g1/members", cohort::clock::now() + 30s);
  }
  ::kill(pids[3], SIGCONT);
  const auto status = reap(pids, 40s);
  for (int r = 0; r < 3; ++r) CHECK_MESSAGE(status[static_cast<std::size_t>(r)] == 0,
                                            status_text(status[static_cast<std::size_t>(r)]));
  CHECK_MESSAGE(status[3] == 4, status_text(status[3]));
  cohort::file_store s(sc.dir);
  const std::string e = s.try_get("error/w3").value_or("");
  INFO(e);
  CHECK(e.find("left out of generation 1") != std::string::npos);
  for (int r = 0; r < 3; ++r)
    CHECK(result(sc, "w" + std::to_string(r)).find("log 0:4 1:3") != std::string::npos);
  CHECK(cohort::faults::shm_names(sc.job).empty());
}

void stopped_rank_rejoins(bool tcp) {
  job_dir d;
  scenario sc = make(tcp, d, tcp ? "rejoin-tcp" : "rejoin-shm");
  sc.timeout = 1000ms;
  sc.window = stopped_rank_window();
  sc.until_size = 4;
  std::vector<pid_t> pids;
  for (int r = 0; r < 4; ++r) {
    const std::string name = "w" + std::to_string(r);
    pids.push_back(spawn(r, [&, name](int rr) {
      return worker(sc, name.c_str(), rr == 3 ? fault::stop : fault::none, 5, true);
    }));
  }
  {
    cohort::file_store s(sc.dir);
    s.get("elastic/" + sc.job + "/g1/members", cohort::clock::now() + 30s);
  }
  ::kill(pids[3], SIGCONT);
  const auto status = reap(pids, 60s);
  for (std::size_t r = 0; r < 4; ++r) CHECK_MESSAGE(status[r] == 0, status_text(status[r]));
  cohort::file_store s(sc.dir);
  CHECK(s.try_get("error/w3").value_or("").find("left out of generation 1") != std::string::npos);
  const std::string want = result(sc, "w0");
  for (int r = 0; r < 4; ++r) {
    const std::string got = result(sc, "w" + std::to_string(r));
    INFO("w" << r << ": " << got);
    CHECK(got.substr(0, got.find(' ')) == want.substr(0, want.find(' ')));
  }
  // The survivors went on with 3, then with 4 again; w3 was left out and came back.
  INFO("w0: " << result(sc, "w0") << "; w3: " << result(sc, "w3"));
  CHECK(result(sc, "w0").find("log 0:4 1:3 ") != std::string::npos);
  CHECK(result(sc, "w0").ends_with(":4"));
  CHECK(result(sc, "w3").find("log 0:4 rejoin ") != std::string::npos);
  CHECK(result(sc, "w3").ends_with(":4"));
  CHECK(cohort::faults::shm_names(sc.job).empty());
}

TEST_CASE("elastic shm: a stopped rank left out joins again as a newcomer") {
  stopped_rank_rejoins(false);
}

TEST_CASE("elastic tcp: a stopped rank left out joins again as a newcomer") {
  stopped_rank_rejoins(true);
}

// Rank 3 is killed mid-all_reduce; the survivor that wins the claim to decide generation 1 dies
// before it writes the list. The list can never come (a second decider could not know whether
// the first one's was read already): the other two fail with timed_out at join_timeout, saying
// that generation 1 was not decided, never hang.
void decider_dies(bool tcp) {
  job_dir d;
  scenario sc = make(tcp, d, tcp ? "decider-tcp" : "decider-shm");
  sc.join_timeout = 3s;
  const auto start = cohort::faults::steady::now();
  std::vector<pid_t> pids;
  for (int r = 0; r < 4; ++r) {
    const std::string name = "w" + std::to_string(r);
    pids.push_back(spawn(r, [&, name](int rr) {
      return worker(sc, name.c_str(), rr == 3 ? fault::kill : fault::none, 5, false,
                    rr == 3 ? agreement_death::none : agreement_death::decider);
    }));
  }
  const auto status = reap(pids, 60s);
  const auto took = cohort::faults::steady::now() - start;
  int killed = 0, failed = 0;
  cohort::file_store s(sc.dir);
  for (int r = 0; r < 4; ++r) {
    const std::string name = "w" + std::to_string(r);
    const std::string error = s.try_get("error/" + name).value_or("(none)");
    INFO(name << ": " << status_text(status[r]) << ": " << error);
    if (status[r] == -SIGKILL) {
      ++killed;
      continue;
    }
    CHECK(status[r] == 1);
    CHECK(error.find("generation 1") != std::string::npos);
    CHECK(error.find("was not decided in time") != std::string::npos);
    ++failed;
  }
  CHECK(killed == 2);  // rank 3, and the decider
  CHECK(failed == 2);
  CHECK(took < 30s);   // join_timeout (3 s) after the failure, not a hang
  CHECK(cohort::faults::shm_names(sc.job).empty());
}

TEST_CASE("elastic shm: the decider of the next generation dies before it decides") {
  decider_dies(false);
}

TEST_CASE("elastic tcp: the decider of the next generation dies before it decides") {
  decider_dies(true);
}

// Rank 3 is killed mid-all_reduce; rank 1 dies right after it registered to go on, so the
// decider counts it in generation 1, whose communicator cannot form. The survivors go on to
// generation 2 without it and finish with the same model.
void member_dies_while_going_on(bool tcp) {
  job_dir d;
  scenario sc = make(tcp, d, tcp ? "goneon-tcp" : "goneon-shm");
  std::vector<pid_t> pids;
  for (int r = 0; r < 4; ++r) {
    const std::string name = "w" + std::to_string(r);
    pids.push_back(spawn(r, [&, name](int rr) {
      return worker(sc, name.c_str(), rr == 3 ? fault::kill : fault::none, 5, false,
                    rr == 1 ? agreement_death::gone_on : agreement_death::none);
    }));
  }
  const auto status = reap(pids, 90s);
  CHECK(status[1] == -SIGKILL);
  CHECK(status[3] == -SIGKILL);
  CHECK_MESSAGE(status[0] == 0, status_text(status[0]), ": ", result(sc, "w0"));
  CHECK_MESSAGE(status[2] == 0, status_text(status[2]), ": ", result(sc, "w2"));
  const std::string a = result(sc, "w0"), b = result(sc, "w2");
  INFO("w0: " << a << "; w2: " << b);
  CHECK(a.substr(0, a.find(' ')) == b.substr(0, b.find(' ')));  // the same model to the bit
  CHECK(a.ends_with(":2"));  // the last generation: the two survivors
  CHECK(a.find("log 0:4 ") != std::string::npos);
  CHECK(cohort::faults::shm_names(sc.job).empty());
}

TEST_CASE("elastic shm: a member dies after it registered to go on") {
  member_dies_while_going_on(false);
}

TEST_CASE("elastic tcp: a member dies after it registered to go on") {
  member_dies_while_going_on(true);
}

// The job meets at a TCP store in a process of its own, which dies while the job trains. The
// store is the job's single point of failure: every rank ends with an error that names the
// store within its timeout (3 s), never a hang. (A store that outlives any host, such as Redis
// or a file store on a shared file system, is the answer; README, "Elastic jobs".)
void store_host_dies(bool tcp) {
  job_dir d;
  scenario sc = make(tcp, d, tcp ? "store-tcp" : "store-shm");
  sc.steps = 3000;
  sc.until_size = 0;
  sc.store_port = cohort::faults::free_port();
  const pid_t server = spawn(9, [&](int) -> int {
    cohort::tcp_store_server srv("127.0.0.1", sc.store_port, {.token = {}, .log = [](std::string_view) {}});
    for (;;) ::pause();
  });
  std::vector<pid_t> pids;
  for (int r = 0; r < 4; ++r) {
    const std::string name = "w" + std::to_string(r);
    pids.push_back(spawn(r, [&, name](int) { return worker(sc, name.c_str(), fault::none, 0); }));
  }
  {  // generation 0 formed: the job trains
    cohort::tcp_store probe("127.0.0.1", sc.store_port, {.token = {}, .timeout = 30s});
    probe.get("elastic/" + sc.job + "/g0/members", cohort::clock::now() + 30s);
  }
  std::this_thread::sleep_for(200ms);
  const auto start = cohort::faults::steady::now();
  ::kill(server, SIGKILL);
  ::waitpid(server, nullptr, 0);
  const auto status = reap(pids, 60s);
  const auto took = cohort::faults::steady::now() - start;
  cohort::file_store s(sc.dir);
  for (int r = 0; r < 4; ++r) {
    const std::string name = "w" + std::to_string(r);
    const std::string error = s.try_get("error/" + name).value_or("(none)");
    INFO(name << ": " << status_text(status[r]) << ": " << error);
    CHECK(status[r] == 1);
    CHECK(error.find("store") != std::string::npos);
  }
  CHECK(took < 40s);
  CHECK(cohort::faults::shm_names(sc.job).empty());
}

TEST_CASE("elastic shm: the process hosting the TCP store dies: every rank fails naming it") {
  store_host_dies(false);
}

TEST_CASE("elastic tcp: the process hosting the TCP store dies: every rank fails naming it") {
  store_host_dies(true);
}

TEST_CASE("elastic shm: a stopped rank resumed after it was left out fails cleanly") {
  stopped_rank_left_out(false);
}

TEST_CASE("elastic tcp: a stopped rank resumed after it was left out fails cleanly") {
  stopped_rank_left_out(true);
}

}  // namespace
