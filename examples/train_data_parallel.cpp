// Data-parallel training of an MLP on the UCI digits, with every rank on its own shard.
//
// Each rank reads a disjoint shard of the training set, reshuffled every epoch with a seed all
// ranks share; computes gradients layer by layer, from the top; hands each layer to the
// gradient buckets as soon as it is final, so that the buckets' all-reduces run on the progress
// thread while back-propagation goes on below; and steps SGD with momentum on the averaged
// gradient. The learning rate is scaled by P and reached by a linear warm-up (Goyal et al.,
// 2017), then follows a cosine to zero (Loshchilov and Hutter, 2017), which makes the last
// epoch's accuracy the same within a point for P = 1, 2 and 4.
//
//   train_data_parallel --ranks 4                      # starts 4 ranks on shared memory
//   cohort-run -n 2 train_data_parallel                # or torchrun / mpirun: one rank each
//   train_data_parallel --ranks 2 --transport tcp --compress topk:0.01 --csv curve.csv
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <cohort/async.hpp>
#include <cohort/cohort.hpp>
#include <cohort/compress/all_reduce.hpp>
#include <cohort/launch/env.hpp>
#include <cohort/transport/shm.hpp>
#include <cohort/transport/tcp.hpp>

#include "common/compressor_choice.hpp"
#include "common/digits.hpp"
#include "common/mlp.hpp"

namespace ex = cohort::examples;
using clock_type = std::chrono::steady_clock;

namespace {

struct settings {
  int ranks = 2;
  std::string transport = "shm";
  std::string compress = "none";
  double bucket_mb = 25.0;
  int accumulate = 1;
  int local_sgd = 0;  // average parameters every H steps instead of reducing gradients
  int epochs = 40;
  int batch = 16;  // per rank
  float lr = 0.02f;  // per rank; scaled by P
  float momentum = 0.9f;
  int warmup_epochs = 2;
  bool cosine = true;  // cosine decay of the learning rate to 0 after the warm-up
  std::vector<std::size_t> hidden = {64};
  bool overlap = true;  // false: one blocking all_reduce after back-propagation
  // Busy polling of the transports' waits, in microseconds; negative: each transport's own.
  // Unset: 0 when a progress thread reduces behind back-propagation (a spinning wait would
  // take the core back-propagation runs on), the transports' own otherwise.
  std::optional<int> spin_us;
  std::uint64_t seed = 1;
  std::string csv, data = COHORT_DIGITS_PATH;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "train_data_parallel: %s\n"
               "usage: train_data_parallel [--ranks N] [--transport shm|tcp]\n"
               "  [--compress none|fp16|bf16|int8|topk:DENSITY] [--bucket-mb MB] [--accumulate K]\n"
               "  [--local-sgd H] [--epochs E] [--batch B] [--lr LR] [--momentum M]\n"
               "  [--warmup EPOCHS] [--decay cosine|none] [--hidden W[,W...]] [--no-overlap]\n"
               "  [--spin-us US] [--seed S] [--csv FILE] [--data digits.csv.gz]\n",
               why);
  std::exit(2);
}

settings parse(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    try {
      if (a == "--ranks") s.ranks = std::stoi(value());
      else if (a == "--transport") s.transport = value();
      else if (a == "--compress") s.compress = value();
      else if (a == "--bucket-mb") s.bucket_mb = std::stod(value());
      else if (a == "--accumulate") s.accumulate = std::stoi(value());
      else if (a == "--local-sgd") s.local_sgd = std::stoi(value());
      else if (a == "--epochs") s.epochs = std::stoi(value());
      else if (a == "--batch") s.batch = std::stoi(value());
      else if (a == "--lr") s.lr = std::stof(value());
      else if (a == "--momentum") s.momentum = std::stof(value());
      else if (a == "--warmup") s.warmup_epochs = std::stoi(value());
      else if (a == "--decay") {
        const std::string d = value();
        if (d != "cosine" && d != "none") usage("--decay is cosine or none");
        s.cosine = d == "cosine";
      }
      else if (a == "--seed") s.seed = std::stoull(value());
      else if (a == "--csv") s.csv = value();
      else if (a == "--data") s.data = value();
      else if (a == "--no-overlap") s.overlap = false;
      else if (a == "--spin-us") s.spin_us = std::stoi(value());
      else if (a == "--hidden") {
        s.hidden.clear();
        std::string v = value();
        for (std::size_t p = 0; p < v.size();) {
          std::size_t q = v.find(',', p);
          s.hidden.push_back(std::stoul(v.substr(p, q - p)));
          p = q == std::string::npos ? v.size() : q + 1;
        }
      } else usage(("unknown option " + a).c_str());
    } catch (const std::logic_error&) {
      usage(("bad value for " + a).c_str());
    }
  }
  if (s.ranks < 1 || s.epochs < 1 || s.batch < 1 || s.accumulate < 1 || s.local_sgd < 0 ||
      s.bucket_mb <= 0 || s.hidden.empty() || s.warmup_epochs < 0 || !(s.lr > 0))
    usage("values must be positive");
  if (!(s.momentum >= 0 && s.momentum < 1)) usage("--momentum is in [0, 1)");
  if (s.transport != "shm" && s.transport != "tcp") usage("--transport is shm or tcp");
  if (!ex::compressor_choice::valid(s.compress)) usage("unknown --compress");
  return s;
}

// The busy polling the transports' waits get (see settings::spin_us).
int settings_spin_us(const settings& s) {
  if (s.spin_us) return *s.spin_us;
  return s.overlap && s.local_sgd == 0 ? 0 : -1;
}

// CPU seconds this process has used so far, every thread included.
double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  const auto sec = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

// The learning-rate factor at `step` of `total`: linear warm-up over the first `warmup` steps,
// then constant or a cosine to zero.
float lr_scale(std::size_t step, std::size_t warmup, std::size_t total, bool cosine) {
  if (step < warmup) return float(step + 1) / float(warmup);
  if (!cosine || total <= warmup) return 1.0f;
  return 0.5f * (1.0f + std::cos(3.14159265f * float(step - warmup) / float(total - warmup)));
}

// One epoch's figures, summed over the steps of this rank.
struct epoch_stats {
  double loss = 0, seconds = 0, comm_wait = 0, compute = 0, cpu = 0;
  std::size_t steps = 0, samples = 0, bytes_sent = 0;
};

template <class Comm>
int train(Comm& comm, const settings& s) {
  const int p = comm.size(), r = comm.rank();
  const auto [train_set, test_set] = ex::split(ex::load_digits(s.data), 0.2, 7);
  std::vector<std::size_t> widths = {train_set.features};
  widths.insert(widths.end(), s.hidden.begin(), s.hidden.end());
  widths.push_back(train_set.classes);
  ex::mlp model(widths, s.seed);  // the same initial parameters on every rank
  ex::sgd optimizer(s.lr * static_cast<float>(p), s.momentum);

  cohort::progress_options progress_opts;
  const int spin_us = settings_spin_us(s);
  if (spin_us < 0) progress_opts.spin.reset();
  else progress_opts.spin = std::chrono::microseconds(spin_us);
  cohort::progress_thread progress(comm, progress_opts);
  ex::compressor_choice compression(s.compress);
  cohort::bucket_options<Comm> opts;
  opts.bucket_bytes = static_cast<std::size_t>(s.bucket_mb * (1 << 20));
  opts.accumulate = s.accumulate;
  std::size_t compressed_bytes = 0;
  if (!compression.none())
    opts.reduce = [&](Comm& c, std::span<float> bucket) {
      compressed_bytes += compression.all_reduce(c, bucket);
    };
  std::vector<std::span<float>> layer_grads;
  for (std::size_t l = 0; l < model.layers(); ++l) layer_grads.push_back(model.layer_gradients(l));
  cohort::gradient_buckets buckets(progress, layer_grads, opts);
  cohort::local_sgd<Comm> averaging(std::max(s.local_sgd, 1));

  // Ring all-reduce sends 2(P-1)/P of each buffer; compressed reductions report their own.
  const double ring_share = 2.0 * (p - 1) / p;
  const std::size_t per_rank = train_set.size() / static_cast<std::size_t>(p);
  const std::size_t steps_per_epoch = per_rank / static_cast<std::size_t>(s.batch);
  const std::size_t warmup_steps = steps_per_epoch * static_cast<std::size_t>(s.warmup_epochs);
  const std::size_t total_steps = steps_per_epoch * static_cast<std::size_t>(s.epochs);
  std::unique_ptr<std::ofstream> csv;
  if (r == 0 && !s.csv.empty()) {
    csv = std::make_unique<std::ofstream>(s.csv);
    *csv << "epoch,loss,test_accuracy,seconds,samples_per_s,bytes_sent,comm_share,compute_s,"
            "cpu_s\n";
  }
  if (r == 0)
    std::printf("%d ranks over %s, compression %s, %zu parameters in %zu bucket(s), %s\n", p,
                s.transport.c_str(), s.compress.c_str(), model.parameters().size(),
                buckets.bucket_count(),
                s.local_sgd ? "local SGD" : s.overlap ? "overlapped" : "blocking");
  const auto start = clock_type::now();
  std::size_t step = 0, reduced_before = 0;
  double accuracy = 0;
  for (int epoch = 1; epoch <= s.epochs; ++epoch) {
    epoch_stats e;
    const auto epoch_start = clock_type::now();
    const double cpu_start = cpu_seconds();
    const auto order = ex::permutation(train_set.size(), s.seed * 1000 + epoch);  // shared
    for (std::size_t b = 0; b < steps_per_epoch; ++b, ++step) {
      // This rank's rows: positions r, r+P, r+2P, ... of the shared order.
      std::vector<std::size_t> rows(s.batch);
      for (int k = 0; k < s.batch; ++k)
        rows[k] = order[(b * s.batch + k) * p + r];
      // With --accumulate K, micro-batches add into the gradients; the K-th one reduces.
      const bool add = s.accumulate > 1 && step % s.accumulate != 0;
      const bool reduce_now = s.local_sgd == 0 && s.overlap;
      const auto compute_start = clock_type::now();
      e.loss += model.backward_batch(train_set, rows, add, [&](std::size_t layer) {
        if (reduce_now) buckets.ready(layer);
      });
      e.samples += rows.size() * p;
      const auto wait_start = clock_type::now();
      e.compute += std::chrono::duration<double>(wait_start - compute_start).count();
      bool stepped = true;
      if (s.local_sgd > 0) {
        optimizer.step(model.parameters(), model.gradients());
        averaging.after_step(comm, model.parameters());
      } else if (s.overlap) {
        stepped = buckets.finish();
      } else {
        // The progress thread is idle (it never gets work in this mode), so this thread may
        // call collectives on comm itself.
        cohort::all_reduce(comm, model.gradients(), cohort::ops::avg);
        e.bytes_sent += static_cast<std::size_t>(ring_share * model.gradients().size_bytes());
      }
      e.comm_wait += std::chrono::duration<double>(clock_type::now() - wait_start).count();
      if (s.local_sgd == 0 && stepped) {
        optimizer.set_scale(lr_scale(step, warmup_steps, total_steps, s.cosine));
        optimizer.step(model.parameters(), model.gradients());
      }
      ++e.steps;
    }
    if (s.overlap && s.local_sgd == 0) {
      const std::size_t reduced = buckets.bytes_reduced() - reduced_before;
      e.bytes_sent = compression.none() ? static_cast<std::size_t>(ring_share * reduced)
                                        : compressed_bytes;
      reduced_before = buckets.bytes_reduced();
      compressed_bytes = 0;
    }
    e.seconds = std::chrono::duration<double>(clock_type::now() - epoch_start).count();
    e.cpu = cpu_seconds() - cpu_start;
    double mean_loss = e.loss / static_cast<double>(e.steps);
    // Every bucket was waited for: the progress thread is idle and comm is this thread's.
    cohort::all_reduce(comm, std::span(&mean_loss, 1), cohort::ops::avg);
    if (r == 0) {
      accuracy = model.accuracy(test_set);
      std::printf("epoch %3d  loss %.4f  test accuracy %5.1f%%  %8.0f samples/s  sent %8.2f MB"
                  "  comm %4.1f%%\n",
                  epoch, mean_loss, 100 * accuracy, double(e.samples) / e.seconds,
                  double(e.bytes_sent) / 1e6, 100 * e.comm_wait / e.seconds);
      if (csv)
        *csv << epoch << ',' << mean_loss << ',' << accuracy << ',' << e.seconds << ','
             << double(e.samples) / e.seconds << ',' << e.bytes_sent << ','
             << e.comm_wait / e.seconds << ',' << e.compute << ',' << e.cpu << '\n';
    }
  }
  if (r == 0)
    std::printf("done: test accuracy %.1f%% after %d epochs in %.1f s\n", 100 * accuracy,
                s.epochs, std::chrono::duration<double>(clock_type::now() - start).count());
  return 0;
}

int run_rank(const cohort::launch_info& info, const settings& s) {
  try {
    if (s.transport == "tcp") {
      auto comm = cohort::make_tcp_communicator(info);
      return train(comm, s);
    }
    cohort::shm_options opts;
    if (const int spin_us = settings_spin_us(s); spin_us >= 0) {
      opts.spin = std::chrono::microseconds(spin_us);
      opts.yield = {};
    }
    auto comm = cohort::make_shm_communicator(info, opts);
    return train(comm, s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", info.rank, e.what());
    return 1;
  }
}

// A TCP port on loopback that nothing listens on right now, for the rendezvous store.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  if (fd >= 0) ::close(fd);
  return ok ? ntohs(a.sin_port) : 29500;
}

// Starts `s.ranks` copies of this process as one job on this host and waits for them; if one
// fails, ends the others.
int launch_local(const settings& s) {
  cohort::launch_info info;
  info.size = info.local_size = s.ranks;
  info.job_id = "train-" + std::to_string(::getpid());
  info.master_addr = "127.0.0.1";
  info.master_port = free_port();
  std::vector<pid_t> children;
  for (int r = 0; r < s.ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      for (pid_t c : children) ::kill(c, SIGTERM);
      return 1;
    }
    if (pid == 0) {
      info.rank = info.local_rank = r;
      const int code = run_rank(info, s);
      std::fflush(nullptr);  // _exit skips stdio's buffers
      ::_exit(code);
    }
    children.push_back(pid);
  }
  int result = 0;
  for (std::size_t left = children.size(); left > 0; --left) {
    int status = 0;
    const pid_t pid = ::wait(&status);
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && result == 0) {
      result = 1;
      for (pid_t c : children)
        if (c != pid) ::kill(c, SIGTERM);
    }
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  const settings s = parse(argc, argv);
  const cohort::launch_info info = cohort::launch_info_from_env();
  if (info.size > 1) return run_rank(info, s);  // under cohort-run, torchrun, mpirun, srun
  if (s.ranks == 1) {
    cohort::launch_info solo = info;
    solo.job_id = "train-" + std::to_string(::getpid());
    return run_rank(solo, s);
  }
  return launch_local(s);
}
