// Training the digits MLP with a parameter server: S server ranks hold the model, sharded
// (every layer split evenly over them), and apply SGD with momentum; W worker ranks each pull
// the weights, compute gradients on their shard of the data and push them.
//
// The hyperparameters, data split and learning-rate schedule are train_data_parallel's with
// P = W (learning rate scaled by W, linear warm-up, cosine decay; the server's round stands
// for the step), so the modes can be compared with the all-reduce run at equal epochs:
//
//   train_parameter_server --servers 1 --workers 2 --mode sync     # ~ train_data_parallel --ranks
//   2 train_parameter_server --servers 2 --workers 4 --mode ssp:2 --straggler-ms 5
//   train_parameter_server --servers 1 --workers 3 --mode async --transport tcp
//
// `--straggler-ms N` makes the last worker sleep N ms every step. Worker 0 prints the progress
// (its own loss, test accuracy of the weights it pulls, samples/s of all workers).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cohort/cohort.hpp>
#include <cohort/compress/cast.hpp>
#include <cohort/compress/error_feedback.hpp>
#include <cohort/compress/quantize.hpp>
#include <cohort/compress/top_k.hpp>
#include <cohort/launch/env.hpp>
#include <cohort/parameter_server.hpp>
#include <cohort/transport/shm.hpp>
#include <cohort/transport/tcp.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/digits.hpp"
#include "common/mlp.hpp"

namespace ex = cohort::examples;
namespace ps = cohort::ps;
using clock_type = std::chrono::steady_clock;

namespace {

struct settings {
  int servers = 1, workers = 2;
  std::string transport = "shm";
  std::string mode = "sync";
  std::string compress = "none";
  int epochs = 40;
  int batch = 16;    // per worker
  float lr = 0.02f;  // per worker; scaled by W
  float momentum = 0.9f;
  int warmup_epochs = 2;
  int straggler_ms = 0;
  std::vector<std::size_t> hidden = {64};
  std::uint64_t seed = 1;
  std::string csv, data = COHORT_DIGITS_PATH;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "train_parameter_server: %s\n"
               "usage: train_parameter_server [--servers S] [--workers W]\n"
               "  [--mode sync|async|ssp:S] [--transport shm|tcp] [--epochs E] [--batch B]\n"
               "  [--compress none|fp16|bf16|int8|topk:DENSITY]\n"
               "  [--lr LR] [--momentum M] [--warmup EPOCHS] [--hidden W[,W...]]\n"
               "  [--straggler-ms MS] [--seed S] [--csv FILE] [--data digits.csv.gz]\n",
               why);
  std::exit(2);
}

ps::consistency parse_mode(const std::string& m) {
  if (m == "sync") return ps::consistency::sync();
  if (m == "async") return ps::consistency::async();
  if (m.rfind("ssp:", 0) == 0) return ps::consistency::ssp(std::stoi(m.substr(4)));
  usage("--mode is sync, async or ssp:S");
}

// The push codec: top-k keeps an error-feedback residual per slice on the worker.
ps::push_codec parse_codec(const std::string& c) {
  namespace cc = cohort::compress;
  if (c == "none") return {};
  if (c == "fp16") return ps::push_codec(cc::fp16);
  if (c == "bf16") return ps::push_codec(cc::bf16);
  if (c == "int8") return ps::push_codec(cc::int8);
  if (c.rfind("topk:", 0) == 0) {
    const double d = std::stod(c.substr(5));
    if (d > 0 && d <= 1) return ps::push_codec(cc::error_feedback(cc::top_k(d)));
  }
  usage("--compress is none, fp16, bf16, int8 or topk:DENSITY");
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
      if (a == "--servers")
        s.servers = std::stoi(value());
      else if (a == "--workers")
        s.workers = std::stoi(value());
      else if (a == "--transport")
        s.transport = value();
      else if (a == "--mode")
        s.mode = value();
      else if (a == "--compress")
        s.compress = value();
      else if (a == "--epochs")
        s.epochs = std::stoi(value());
      else if (a == "--batch")
        s.batch = std::stoi(value());
      else if (a == "--lr")
        s.lr = std::stof(value());
      else if (a == "--momentum")
        s.momentum = std::stof(value());
      else if (a == "--warmup")
        s.warmup_epochs = std::stoi(value());
      else if (a == "--straggler-ms")
        s.straggler_ms = std::stoi(value());
      else if (a == "--seed")
        s.seed = std::stoull(value());
      else if (a == "--csv")
        s.csv = value();
      else if (a == "--data")
        s.data = value();
      else if (a == "--hidden") {
        s.hidden.clear();
        std::string v = value();
        for (std::size_t p = 0; p < v.size();) {
          std::size_t q = v.find(',', p);
          s.hidden.push_back(std::stoul(v.substr(p, q - p)));
          p = q == std::string::npos ? v.size() : q + 1;
        }
      } else
        usage(("unknown option " + a).c_str());
    } catch (const std::logic_error&) {
      usage(("bad value for " + a).c_str());
    }
  }
  if (s.servers < 1 || s.workers < 1 || s.epochs < 1 || s.batch < 1 || s.hidden.empty() ||
      s.warmup_epochs < 0 || s.straggler_ms < 0 || !(s.lr > 0))
    usage("values must be positive");
  if (!(s.momentum >= 0 && s.momentum < 1)) usage("--momentum is in [0, 1)");
  if (s.transport != "shm" && s.transport != "tcp") usage("--transport is shm or tcp");
  (void)parse_mode(s.mode);
  (void)parse_codec(s.compress);
  return s;
}

// train_data_parallel's schedule: linear warm-up, then a cosine to zero.
float lr_scale(std::uint64_t step, std::uint64_t warmup, std::uint64_t total) {
  if (step < warmup) return float(step + 1) / float(warmup);
  if (total <= warmup) return 1.0f;
  if (step >= total) return 0.0f;
  return 0.5f * (1.0f + std::cos(3.14159265f * float(step - warmup) / float(total - warmup)));
}

template <class Comm>
int train(Comm& comm, const settings& s) {
  const ps::roles roles{s.servers, comm.size()};
  roles.check("train_parameter_server");
  const int w_count = roles.workers();
  const auto [train_set, test_set] = ex::split(ex::load_digits(s.data), 0.2, 7);
  std::vector<std::size_t> widths = {train_set.features};
  widths.insert(widths.end(), s.hidden.begin(), s.hidden.end());
  widths.push_back(train_set.classes);
  ex::mlp model(widths, s.seed);  // the servers start from these weights

  // One key per layer (weights then biases, as the model lays them out).
  std::vector<ps::key_spec> keys;
  std::vector<std::size_t> offsets;
  for (std::size_t l = 0, off = 0; l < model.layers(); ++l) {
    keys.push_back({l, model.layer_gradients(l).size()});
    offsets.push_back(off);
    off += keys.back().count;
  }
  const auto layer = [&](std::span<float> all, std::size_t l) {
    return all.subspan(offsets[l], keys[l].count);
  };

  const std::size_t per_worker = train_set.size() / static_cast<std::size_t>(w_count);
  const std::size_t steps_per_epoch = per_worker / static_cast<std::size_t>(s.batch);
  const std::uint64_t warmup = steps_per_epoch * static_cast<std::size_t>(s.warmup_epochs);
  const std::uint64_t total = steps_per_epoch * static_cast<std::size_t>(s.epochs);

  if (roles.is_server(comm.rank())) {
    ps::server_options opts;
    opts.mode = parse_mode(s.mode);
    opts.compress = parse_codec(s.compress);
    opts.update = ps::sgd_momentum{s.lr * float(w_count), s.momentum, [=](std::uint64_t round) {
                                     return lr_scale(round, warmup, total);
                                   }};
    ps::server server(comm, keys, roles, opts);
    for (std::size_t l = 0; l < model.layers(); ++l) server.set(l, layer(model.parameters(), l));
    const auto serve_start = clock_type::now();
    server.serve();
    // The job's throughput, up to the last worker's finish (worker 0's figures cover its own
    // epochs: in async mode it may finish long before a straggler).
    const double secs = std::chrono::duration<double>(clock_type::now() - serve_start).count();
    if (comm.rank() == 0)
      std::printf("job: %zu samples in %.2f s, %.0f samples/s\n",
                  std::size_t(total) * std::size_t(s.batch) * std::size_t(w_count), secs,
                  double(total) * s.batch * w_count / secs);
    return 0;
  }

  ps::worker worker(comm, keys, roles, {parse_codec(s.compress)});
  const int w = roles.worker_index(comm.rank());
  const bool straggler = s.straggler_ms > 0 && w == w_count - 1;
  std::unique_ptr<std::ofstream> csv;
  if (w == 0 && !s.csv.empty()) {
    csv = std::make_unique<std::ofstream>(s.csv);
    *csv << "epoch,loss,test_accuracy,seconds,samples_per_s\n";
  }
  if (w == 0)
    std::printf(
        "%d server(s) + %d workers over %s, mode %s, pushes %s, %zu parameters in %zu "
        "keys%s\n",
        s.servers, w_count, s.transport.c_str(), s.mode.c_str(), s.compress.c_str(),
        model.parameters().size(), keys.size(),
        straggler ? (", worker " + std::to_string(w_count - 1) + " sleeps " +
                     std::to_string(s.straggler_ms) + " ms a step")
                        .c_str()
                  : "");
  const auto pull_all = [&] {
    for (std::size_t l = 0; l < keys.size(); ++l) worker.pull(l, layer(model.parameters(), l));
    worker.wait_all();  // these pulls, and the pushes before them
  };
  const auto start = clock_type::now();
  double accuracy = 0, total_samples = 0;
  for (int epoch = 1; epoch <= s.epochs; ++epoch) {
    const auto epoch_start = clock_type::now();
    const std::uint64_t pushed_before = worker.bytes_pushed();
    const auto order = ex::permutation(train_set.size(), s.seed * 1000 + epoch);  // shared
    double loss = 0;
    for (std::size_t b = 0; b < steps_per_epoch; ++b) {
      std::vector<std::size_t> rows(s.batch);
      for (int k = 0; k < s.batch; ++k) rows[k] = order[(b * s.batch + k) * w_count + w];
      pull_all();
      loss += model.backward_batch(train_set, rows);
      if (straggler) std::this_thread::sleep_for(std::chrono::milliseconds(s.straggler_ms));
      for (std::size_t l = 0; l < keys.size(); ++l) worker.push(l, layer(model.gradients(), l));
    }
    pull_all();
    const double seconds = std::chrono::duration<double>(clock_type::now() - epoch_start).count();
    const double samples = double(steps_per_epoch * s.batch * w_count);
    total_samples += samples;
    if (w == 0) {
      accuracy = model.accuracy(test_set);
      const double mean_loss = loss / double(steps_per_epoch);
      std::printf("epoch %3d  loss %.4f  test accuracy %5.1f%%  %8.0f samples/s  pushed %6.3f MB\n",
                  epoch, mean_loss, 100 * accuracy, samples / seconds,
                  double(worker.bytes_pushed() - pushed_before) / 1e6);
      std::fflush(stdout);
      if (csv)
        *csv << epoch << ',' << mean_loss << ',' << accuracy << ',' << seconds << ','
             << samples / seconds << '\n';
    }
  }
  worker.finish();
  const double secs = std::chrono::duration<double>(clock_type::now() - start).count();
  // Each worker's own rate: their sum is the job's rate while all of them run.
  std::printf("worker %d: %.0f samples/s\n", w, total_samples / double(w_count) / secs);
  if (w == 0) {
    std::printf("done: test accuracy %.1f%% after %d epochs in %.1f s, %.0f samples/s\n",
                100 * accuracy, s.epochs, secs, total_samples / secs);
  }
  return 0;
}

int run_rank(const cohort::launch_info& info, const settings& s) {
  try {
    if (s.transport == "tcp") {
      auto comm = cohort::make_tcp_communicator(info);
      return train(comm, s);
    }
    auto comm = cohort::make_shm_communicator(info);
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

// Starts the S + W ranks as processes on this host and waits for them; if one fails, ends
// the others.
int launch_local(const settings& s) {
  cohort::launch_info info;
  info.size = info.local_size = s.servers + s.workers;
  info.job_id = "ps-" + std::to_string(::getpid());
  info.master_addr = "127.0.0.1";
  info.master_port = free_port();
  std::vector<pid_t> children;
  for (int r = 0; r < info.size; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      for (pid_t c : children) ::kill(c, SIGTERM);
      return 1;
    }
    if (pid == 0) {
      info.rank = info.local_rank = r;
      const int code = run_rank(info, s);
      std::fflush(nullptr);
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
  settings s = parse(argc, argv);
  const cohort::launch_info info = cohort::launch_info_from_env();
  if (info.size > 1) {  // under cohort-run, torchrun, mpirun: S from --servers or COHORT_PS_SERVERS
    s.servers = ps::roles::from_env(info.size, s.servers).servers;
    return run_rank(info, s);
  }
  return launch_local(s);
}
