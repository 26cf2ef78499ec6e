// One rank of an MPI job, for the process tests (mpi_test.py runs it under mpirun). Each mode
// checks what it can on this rank and exits 0 when it passed; on failure it prints why
// ("rank r: FAILED ...") and exits 1.
//
// usage: mpi_rank suite [quick] [MAX_MESSAGE]  the collective suite over mpi_transport (quick:
//                                              small counts; MAX_MESSAGE: cut sends into
//                                              messages of that many bytes, so that they
//                                              straddle the receives)
//        mpi_rank mismatch                     rank 0 all-reduces 10 floats, the others 20:
//                                              errc::mismatch on every rank
//        mpi_rank timeout                      the last rank skips an all_reduce (500 ms
//                                              deadline): errc::timed_out on every other rank
//                                              within the deadline; the last rank then learns it
//        mpi_rank abort                        rank 1 aborts: the others fail with
//                                              errc::aborted naming rank 1 and its words
//        mpi_rank isolation                    the application's messages on the communicator
//                                              never match cohort's, nor cohort's theirs
//        mpi_rank split                        shared-memory communicators split from the MPI
//                                              one: by host, and by rank % 2 with reversed keys
#define DOCTEST_CONFIG_DISABLE  // a plain program: no doctest registry
#include "../support.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <cohort/cohort.hpp>
#include <cohort/split.hpp>
#include <cohort/transport/mpi.hpp>

#include "../collectives/suite.hpp"

namespace ct = cohort::test;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;
using cohort::errc;

static_assert(cohort::transport<cohort::mpi_transport>);
static_assert(!cohort::zero_copy_transport<cohort::mpi_transport>);
static_assert(cohort::communicator<cohort::mpi_communicator>);
// The default message size is the collectives' chunk, so that their messages land in place.
static_assert(cohort::mpi_options{}.max_message_bytes == cohort::detail::tuning::chunk_bytes);
static_assert(std::is_nothrow_move_constructible_v<cohort::mpi_transport>);
static_assert(!std::is_copy_constructible_v<cohort::mpi_transport>);

namespace {

int world_rank = -1;

struct failed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void expect(bool ok, const std::string& what) {
  if (!ok) throw failed(what);
}

long long ms_since(steady::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - t).count();
}

template <class T, class Op, cohort::communicator Comm>
void run_counts(Comm& comm, const Op& op,
                const std::vector<std::size_t>& counts, bool reducing_only, int& checks) {
  const int p = comm.size();
  for (std::size_t n : counts) {
    for (ct::kind k : ct::every_kind) {
      if (reducing_only && !ct::reduces(k)) continue;
      const int root = p - 1 - static_cast<int>(n % static_cast<std::size_t>(p));
      try {
        ct::check<T>(comm, k, op, n, root, 99 + n);
      } catch (const ct::check_failed& e) {
        comm.abort(std::string("check failed: ") + e.what());
        throw failed(std::string(ct::kind_name(k)) + " n=" + std::to_string(n) + ": " + e.what());
      }
      ++checks;
    }
  }
}

void suite(cohort::mpi_communicator& comm, bool quick) {
  using namespace cohort;
  const int p = comm.size();
  int checks = 0;
  auto all = ct::counts_for<float>(p);
  if (quick) all = {0, 1, static_cast<std::size_t>(p - 1), 1025, 3 * 65536 + 7};
  const std::vector<std::size_t> some = {1, 1024, 1025, 70'001};
  run_counts<float>(comm, ops::sum, all, false, checks);
  run_counts<double>(comm, ops::sum, some, false, checks);
  run_counts<std::int32_t>(comm, ops::sum, some, true, checks);
  run_counts<fp16>(comm, ops::sum, some, true, checks);
  run_counts<bf16>(comm, ops::sum, some, true, checks);
  run_counts<float>(comm, ops::prod, some, true, checks);
  run_counts<float>(comm, ops::min, some, true, checks);
  run_counts<std::int32_t>(comm, ops::max, some, true, checks);
  run_counts<float>(comm, ops::avg, some, true, checks);
  ct::check_rounding<float>(comm, 100'003, 7);
  ct::check_rounding<bf16>(comm, 10'007, 8);
  checks += 2;
  std::printf("rank %d: suite passed: %d checks at P=%d\n", comm.rank(), checks, p);
}

void mismatch(cohort::mpi_communicator& comm) {
  std::vector<float> x(comm.rank() == 0 ? 10 : 20, 1.0f);
  std::error_code ec;
  const auto start = steady::now();
  cohort::all_reduce(comm, x, cohort::ops::sum, {.timeout = 20s}, ec);
  expect(ec == errc::mismatch, "all_reduce ended with \"" + ec.message() + "\", not a mismatch");
  expect(ms_since(start) < 10'000, "the mismatch took " + std::to_string(ms_since(start)) + " ms");
  expect(comm.poisoned(), "not poisoned after a mismatch");
  std::printf("rank %d: mismatch seen: %s\n", comm.rank(), comm.last_failure()->what.c_str());
}

void timeout(cohort::mpi_communicator& comm) {
  const int p = comm.size();
  std::vector<float> x(1000, 1.0f);
  if (comm.rank() == p - 1) {
    // Skips the call; once the others gave up, its own next call fails at once with their code.
    std::this_thread::sleep_for(2500ms);
    std::error_code ec;
    const auto start = steady::now();
    cohort::barrier(comm, {.timeout = 10s}, ec);
    expect(ec == errc::timed_out, "the late rank's barrier ended with \"" + ec.message() +
                                      "\", not the others' timed_out");
    expect(ms_since(start) < 2000, "the late rank waited " + std::to_string(ms_since(start)) +
                                       " ms to learn of the others' failure");
    expect(comm.transport().remote_failure() != nullptr, "no remote failure at the late rank");
    std::printf("rank %d: learnt: %s\n", comm.rank(), comm.last_failure()->what.c_str());
    return;
  }
  std::error_code ec;
  const auto start = steady::now();
  cohort::all_reduce(comm, x, cohort::ops::sum, {.timeout = 500ms}, ec);
  const auto took = ms_since(start);
  expect(ec == errc::timed_out, "all_reduce ended with \"" + ec.message() + "\", not timed_out");
  expect(took >= 450 && took < 2000, "timed out after " + std::to_string(took) + " ms, not ~500");
  std::printf("rank %d: timed out after %lld ms: %s\n", comm.rank(), took,
              comm.last_failure()->what.c_str());
}

void abort_mode(cohort::mpi_communicator& comm) {
  std::vector<float> x(100'000, 1.0f);
  if (comm.rank() == 1) {
    std::this_thread::sleep_for(300ms);
    comm.abort("rank 1 gives up on purpose");
    expect(comm.poisoned(), "not poisoned after abort");
    std::error_code ec;
    cohort::all_reduce(comm, x, cohort::ops::sum, ec);
    expect(ec == errc::poisoned, "a call after abort ended with \"" + ec.message() + "\"");
    return;
  }
  std::error_code ec;
  cohort::all_reduce(comm, x, cohort::ops::sum, {.timeout = 20s}, ec);
  expect(ec == errc::aborted, "all_reduce ended with \"" + ec.message() + "\", not aborted");
  const cohort::failure* f = comm.last_failure();
  expect(f && f->peer == 1, "the failure does not name rank 1");
  expect(f->what.find("rank 1 gives up on purpose") != std::string::npos,
         "the failure does not carry rank 1's words: " + f->what);
  std::printf("rank %d: aborted: %s\n", comm.rank(), f->what.c_str());
}

void isolation(cohort::mpi_communicator& comm) {
  const int p = comm.size(), r = comm.rank();
  // A receive of the application's that would take any message on the communicator.
  int theirs = -1;
  MPI_Request any;
  MPI_Irecv(&theirs, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &any);
  std::vector<float> x(70'001, float(r + 1));
  cohort::all_reduce(comm, x, cohort::ops::sum);
  expect(x[70'000] == float(p * (p + 1) / 2), "wrong sum under the application's receive");
  int done = 0;
  MPI_Status st;
  MPI_Test(&any, &done, &st);
  expect(!done, "cohort's traffic matched the application's receive (from rank " +
                    std::to_string(st.MPI_SOURCE) + ", tag " + std::to_string(st.MPI_TAG) +
                    ", value " + std::to_string(theirs) + ")");
  // No rank sends its own message before every rank has checked (the barrier).
  cohort::barrier(comm);
  // The application's own message arrives where it should, and cohort still works after it.
  const int mine = 1000 + r;
  MPI_Send(&mine, 1, MPI_INT, (r + 1) % p, 7, MPI_COMM_WORLD);
  for (const auto until = steady::now() + 20s; !done && steady::now() < until;)
    MPI_Test(&any, &done, MPI_STATUS_IGNORE);
  expect(done, "the application's message never came");
  expect(theirs == 1000 + (r + p - 1) % p, "the application's message was lost");
  cohort::all_reduce(comm, x, cohort::ops::sum);
  expect(x[0] == float(p * p * (p + 1) / 2), "wrong sum after the application's message");
  std::printf("rank %d: isolated\n", r);
}

void split(cohort::mpi_communicator& comm) {
  const int p = comm.size(), r = comm.rank();
  auto host = cohort::split_by_host(comm);  // mpirun runs every rank here
  expect(host && host->size() == p && host->rank() == r, "the host communicator is wrong");
  int checks = 0;
  auto sub = cohort::split_shm(comm, r % 2, -r);
  const int size = (p - r % 2 + 1) / 2;  // ranks of this parity
  expect(sub && sub->size() == size, "the split by parity has " + std::to_string(sub->size()) +
                                         " ranks, not " + std::to_string(size));
  expect(sub->rank() == size - 1 - r / 2, "rank " + std::to_string(sub->rank()) +
                                              " in the split by parity; the keys reverse it");
  const std::vector<std::size_t> counts = {0, 1, 1025, 3 * 65536 + 7};
  auto run = [&](auto& c) {
    run_counts<float>(c, cohort::ops::sum, counts, false, checks);
    run_counts<cohort::bf16>(c, cohort::ops::sum, {1, 70'001}, true, checks);
  };
  run(*host);
  run(*sub);
  // The MPI communicator still works after the splits.
  std::vector<float> x(1000, float(r + 1));
  cohort::all_reduce(comm, x, cohort::ops::sum);
  expect(x[999] == float(p * (p + 1) / 2), "the MPI communicator's sum after the splits");
  std::printf("rank %d: split passed: %d checks (host of %d, parity group of %d)\n", r, checks,
              host->size(), sub->size());
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  const std::string_view mode = argc > 1 ? argv[1] : "";
  int code = 0;
  try {
    cohort::mpi_options opts;
    bool quick = false;
    for (int i = 2; i < argc; ++i) {
      if (std::string_view(argv[i]) == "quick") quick = true;
      else opts.max_message_bytes = std::strtoull(argv[i], nullptr, 10);
    }
    auto comm = cohort::make_mpi_communicator(MPI_COMM_WORLD, opts);
    if (comm.rank() != world_rank) throw failed("rank differs from MPI_COMM_WORLD's");
    if (mode == "suite") suite(comm, quick);
    else if (mode == "mismatch") mismatch(comm);
    else if (mode == "timeout") timeout(comm);
    else if (mode == "abort") abort_mode(comm);
    else if (mode == "isolation") isolation(comm);
    else if (mode == "split") split(comm);
    else {
      std::fprintf(stderr, "usage: mpi_rank suite|mismatch|timeout|abort|isolation|split ...\n");
      code = 2;
    }
  } catch (const std::exception& e) {
    std::printf("rank %d: FAILED %s\n", world_rank, e.what());
    std::fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 1);  // ends the peers too, wherever they wait
  }
  MPI_Finalize();
  return code;
}
