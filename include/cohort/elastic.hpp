/// @file
/// Elastic jobs: training that loses ranks and takes new ones without restarting processes.
///
/// ```cpp
/// cohort::file_store store("/shared/job");                // or tcp_store, redis_store
/// cohort::elastic::state st;
/// st.add(std::span(weights));                              // model and optimizer buffers
/// cohort::elastic::run(store, {.job = "train", .min_size = 2}, st,
///     cohort::elastic::shm_generations{},                  // or tcp_generations{store}
///     [&](auto& ctx) {                                      // once per generation
///       for (auto step = st.step(); step < steps; ++step) {
///         gradient(grads, weights, ctx.rank(), ctx.size());  // shard by the generation's rank
///         cohort::all_reduce(ctx.comm(), grads, cohort::ops::sum);
///         sgd(weights, grads);
///         ctx.commit(step + 1);                            // may move to the next generation
///       }
///     });
/// ```
///
/// `run` joins the job (membership.hpp), builds the generation's communicator, syncs the state
/// (the lowest rank with the highest committed step sends it to everyone, bitwise) and calls
/// `train`. When a collective fails (a rank died: `errc::peer_lost`; a rank hung:
/// `errc::timed_out`) the survivors go on to the next generation and call `train` again from
/// the last committed step. When newcomers wait, `commit` ends the generation at the same step
/// on every rank and the next one takes them in. `train` returning ends `run`.
///
/// Failures `run` does not recover from, as `cohort::error`: `errc::aborted` when the job
/// stopped (fewer than `min_size` left) or this process was left out of a generation (it was
/// too slow), `errc::timed_out` when a generation was not decided in `join_timeout`, any error
/// `train` throws that is not a communication failure, and too many generations.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <cohort/core/communicator.hpp>
#include <cohort/core/error.hpp>
#include <cohort/elastic/membership.hpp>
#include <cohort/elastic/state.hpp>
#include <cohort/launch/env.hpp>
#include <cohort/transport/shm.hpp>

namespace cohort::elastic {

/// Builds each generation's communicator over shared memory (segment "/cohort-<job>-g<G>",
/// unlinked once connected, so nothing is left in /dev/shm).
struct shm_generations {
  shm_options opts{};
  shm_communicator operator()(const generation& g) const {
    return shm_communicator(std::in_place, g.job_id, g.rank, g.size(), opts);
  }
};

/// `base` plus "-r<N>" when TORCHELASTIC_RESTART_COUNT is N (torchrun's elastic agent sets it),
/// else `base`: the name to give `options::job` under a launcher that restarts every process
/// at once. A restart is then a new job of all-new processes (generation 0 again, its state
/// from the user's checkpoint), never a newcomer waiting for the previous run's generations,
/// which nobody is left to decide (when the store outlives the processes: a file store, or
/// torchrun's own).
inline std::string restart_scoped_job(std::string base,
                                      const getenv_function& get = [](const char* n) {
                                        return static_cast<const char*>(std::getenv(n));
                                      }) {
  const char* n = get("TORCHELASTIC_RESTART_COUNT");
  if (n != nullptr && *n != '\0') base += std::string("-r") + n;
  return base;
}

/// What `train` is handed: the generation's communicator, rank and size, and `commit`.
template <class Comm>
class context {
 public:
  context(Comm& comm, const generation& gen, state& st, membership& m)
      : comm_(&comm), gen_(&gen), st_(&st), m_(&m) {}

  /// The communicator of this generation.
  Comm& comm() { return *comm_; }
  /// This process's rank and the size of this generation (data sharding, learning rate).
  int rank() const { return gen_->rank; }
  int size() const { return gen_->size(); }
  /// This generation.
  const generation& current() const { return *gen_; }
  /// The rank this generation's state came from in `sync` (-1 in a fresh job with no commit).
  int synced_from() const { return synced_from_; }

  /// Commits the state after `step` steps. Every `check_every` commits the ranks agree (rank
  /// 0 reads the store, a one-integer all_reduce carries its answer) whether newcomers wait;
  /// if so, every rank ends this generation here (throws `reconfigure`, which `run` catches).
  void commit(std::int64_t step) {
    st_->commit(step);
    const int every = m_->settings().check_every;
    if (every <= 0 || ++commits_ % every != 0) return;
    std::vector<std::int32_t> want{comm_->rank() == 0 && m_->newcomers_waiting(*gen_) ? 1 : 0},
        any(1);
    all_reduce(*comm_, want, any, ops::max);
    if (any[0] != 0) throw reconfigure{};
  }

  /// Thrown by `commit` to end a generation on every rank at once; not an error.
  struct reconfigure {};

  /// Set by `run` after the sync.
  void set_synced_from(int r) { synced_from_ = r; }

 private:
  Comm* comm_;
  const generation* gen_;
  state* st_;
  membership* m_;
  int commits_ = 0;
  int synced_from_ = -1;
};

/// Whether `c` is a failure of the generation's communication, so that the survivors go on:
/// a lost peer, a deadline, an abort, a poisoned communicator, a broken stream. Not
/// `errc::mismatch` (the ranks called different collectives: a bug that every generation would
/// repeat; the rank that sees it fails, and the others go on without it).
inline bool recoverable(const std::error_code& c) {
  return c == errc::peer_lost || c == errc::timed_out || c == errc::aborted ||
         c == errc::poisoned || c == errc::protocol_error;
}

/// Runs `train` over generations until it returns (see the file comment). `make_comm(gen)`
/// builds a generation's communicator (`shm_generations`, `tcp_generations`); `on_generation`
/// (optional) is told of each generation once its state is synced.
template <class MakeComm, class Train, class OnGeneration>
void run(store& s, const options& o, state& st, MakeComm make_comm, Train&& train,
         OnGeneration&& on_generation) {
  membership m(s, o);
  generation gen = m.join();
  bool newcomer = true;  // until the first sync: its state is not a source
  for (int round = 0;; ++round) {
    if (round >= o.max_generations)
      throw error(errc::aborted, "elastic.run", -1,
                  "elastic.run: gave up after " + std::to_string(round) + " generations");
    std::vector<int> lost;
    bool failed = false;
    try {
      auto comm = make_comm(gen);
      comm.set_timeout(o.timeout);
      using context_type = context<std::remove_cvref_t<decltype(comm)>>;
      context_type ctx(comm, gen, st, m);
      try {
        ctx.set_synced_from(st.sync(comm, !newcomer));
        newcomer = false;
        on_generation(std::as_const(ctx));
        train(ctx);
        return;
      } catch (const typename context_type::reconfigure&) {
        m.go_on(gen, lost);  // registered before the communicator closes (membership.hpp)
      } catch (const error& e) {
        if (!recoverable(e.code())) throw;
        // A peer that failed first and aborted passes its own cause on, naming itself: rank 0
        // that lost rank 3 makes rank 1 fail with peer_lost from rank 0. Only a loss this
        // rank saw itself names the lost rank; reporting the messenger as lost would end the
        // next generation's wait for it (membership.hpp), and it would be left out.
        const failure* relayed = comm.transport().remote_failure();
        if (e.code() == errc::peer_lost && e.peer() >= 0 && !(relayed && relayed->peer == e.peer()))
          lost.push_back(e.peer());
        failed = true;
        comm.abort("elastic: " + std::string(e.what()));
        m.go_on(gen, lost);
      }
    } catch (const error& e) {
      // The communicator of this generation could not be built (a member died meanwhile), or
      // going on failed at the store.
      if (failed || e.operation().starts_with("store.")) throw;
      if (!recoverable(e.code())) throw;
      m.go_on(gen, lost);
    }
    st.restore();
    gen = m.next(gen);
  }
}

/// `run` without a generation callback.
template <class MakeComm, class Train>
void run(store& s, const options& o, state& st, MakeComm make_comm, Train&& train) {
  run(s, o, st, std::move(make_comm), std::forward<Train>(train), [](const auto&) {});
}

}  // namespace cohort::elastic
