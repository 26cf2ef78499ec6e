/// @file
/// The setup of `tcp_transport`: options from the environment, the store, the token, the
/// listening address, the mesh (with Asio, in tcp_connect.hpp). Included at the end of tcp.hpp,
/// or, under COHORT_SEPARATE_COMPILATION, only by <cohort/impl/src.hpp>: the members defined
/// here are COHORT_DECL (inline, or compiled in that one translation unit).
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include <cohort/core/options.hpp>
#include <cohort/detail/net/socket.hpp>
#include <cohort/rendezvous/file_store.hpp>
#include <cohort/rendezvous/store.hpp>
#include <cohort/rendezvous/tcp_store.hpp>
#include <cohort/rendezvous/tcp_store_server.hpp>
#include <cohort/transport/detail/tcp_connect.hpp>
#include <cohort/transport/detail/tcp_net.hpp>
#include <cohort/transport/detail/tcp_wire.hpp>
#include <cohort/transport/tcp.hpp>
#if defined(COHORT_WITH_HIREDIS)
#include <cohort/rendezvous/redis_store.hpp>
#endif

namespace cohort::detail::tcp {

inline const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

/// More ranks on this host than cores: a waiting rank may hold the core that the peer it
/// waits for needs.
inline bool ranks_outnumber_cores(const launch_info& info) {
  return info.local_size > static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

/// Fills what `o` leaves open from the environment and the defaults.
inline void complete_options(tcp_options& o, const launch_info& info) {
  if (o.interface.empty() && env("COHORT_SOCKET_IFNAME")) o.interface = env("COHORT_SOCKET_IFNAME");
  if (o.family == tcp_family::any) {
    if (const char* f = env("COHORT_SOCKET_FAMILY")) {
      const std::string_view v(f);
      if (v == "AF_INET" || v == "4" || v == "inet" || v == "ipv4")
        o.family = tcp_family::v4;
      else if (v == "AF_INET6" || v == "6" || v == "inet6" || v == "ipv6")
        o.family = tcp_family::v6;
      else
        throw error(errc::invalid_argument, "make_tcp_communicator", -1,
                    "make_tcp_communicator: COHORT_SOCKET_FAMILY=\"" + std::string(v) +
                        "\" is not AF_INET or AF_INET6");
    }
  }
  if (o.store.empty() && env("COHORT_STORE")) o.store = env("COHORT_STORE");
  if (o.store.empty() && !info.master_addr.empty() && info.master_port > 0) {
    const bool v6 = info.master_addr.find(':') != std::string::npos;
    o.store = (v6 ? "[" + info.master_addr + "]" : info.master_addr) + ":" +
              std::to_string(info.master_port);
  }
  if (o.token.empty() && env("COHORT_TOKEN")) o.token = env("COHORT_TOKEN");
  if (o.send_buffer == 0 && env("COHORT_SOCKET_SNDBUF"))
    o.send_buffer = std::atoi(env("COHORT_SOCKET_SNDBUF"));
  if (o.recv_buffer == 0 && env("COHORT_SOCKET_RCVBUF"))
    o.recv_buffer = std::atoi(env("COHORT_SOCKET_RCVBUF"));
  if (o.connect_timeout == tcp_options{}.connect_timeout && env("COHORT_CONNECT_TIMEOUT"))
    o.connect_timeout = std::chrono::milliseconds(
        static_cast<long long>(std::atof(env("COHORT_CONNECT_TIMEOUT")) * 1000));
  if (o.spin.count() < 0) {
    if (const char* s = env("COHORT_TCP_SPIN_US"))
      o.spin = std::chrono::microseconds(std::atoll(s));
    else
      o.spin = std::chrono::microseconds(ranks_outnumber_cores(info) ? 200 : 50);
  }
  if (!o.log)
    o.log = [](std::string_view s) {
      std::fprintf(stderr, "cohort tcp: %.*s\n", static_cast<int>(s.size()), s.data());
    };
}

/// The generation of the next communicator this process makes as `rank` of job `job`: 0 for
/// the first, then 1, 2, ... Every rank makes the same communicators in the same order, so
/// they agree on it without asking anyone; the store keys of a generation are its own, and a
/// communicator made again at once never reads what the previous one left in the store.
inline std::uint64_t next_generation(const std::string& job, int rank) {
  static std::mutex m;
  static std::map<std::pair<std::string, int>, std::uint64_t> made;
  std::lock_guard lock(m);
  return made[{job, rank}]++;
}

/// The prefix of the store keys of generation `gen` of job `job`: "cohort/<job>/", and
/// "cohort/<job>/g<gen>/" after the first.
inline std::string key_prefix(const std::string& job, std::uint64_t gen) {
  return "cohort/" + job + "/" + (gen == 0 ? std::string() : "g" + std::to_string(gen) + "/");
}

/// Whether COHORT_INSECURE_STORE=1 asks that a job without a token use a store anyone may reach.
/// Only "1": a value meant as "no" must not open the store.
inline bool insecure_store() {
  const char* v = env("COHORT_INSECURE_STORE");
  return v && std::string_view(v) == "1";
}

/// Why a job without a token may not hand its secret out through `where`.
inline std::string tokenless_refusal(const std::string& where) {
  return "no COHORT_TOKEN is set and " + where +
         " can be reached from other hosts: rank 0 would hand the job's secret to anyone who "
         "reaches it, who could then take a rank's place. Set COHORT_TOKEN to the same secret on "
         "every rank (for example COHORT_TOKEN=$(openssl rand -hex 32), or tcp_options::token); "
         "or, on a network where everyone is trusted, set COHORT_INSECURE_STORE=1";
}

/// The host part of a "host:port" store, or "" for other kinds.
inline std::string store_host(const std::string& spec) {
  std::string host;
  int port = 0;
  std::string_view s = spec;
  if (s.starts_with("tcp://")) s.remove_prefix(6);
  return net::split_host_port(s, host, port) ? host : std::string();
}

}  // namespace cohort::detail::tcp

namespace cohort {

// Out of line (as are the constructors) because `server_` needs the whole tcp_store_server.
COHORT_DECL tcp_transport::tcp_transport(tcp_transport&&) noexcept = default;
COHORT_DECL tcp_transport& tcp_transport::operator=(tcp_transport&&) noexcept = default;
COHORT_DECL tcp_transport::~tcp_transport() = default;

COHORT_DECL tcp_transport::tcp_transport(const launch_info& info, store& s, tcp_options opts) {
  setup(info, s, std::move(opts));
}

COHORT_DECL tcp_transport::tcp_transport(const launch_info& info, tcp_options opts) {
  rank_ = info.rank;
  size_ = info.size;
  if (info.size == 1) return;
  detail::tcp::complete_options(opts, info);
  const std::string& spec = opts.store;
  auto fail = [](errc e, const std::string& what) {
    throw error(e, "make_tcp_communicator", -1, "make_tcp_communicator: " + what);
  };
  if (spec.empty())
    fail(errc::invalid_argument,
         "no store to meet at: set MASTER_ADDR and MASTER_PORT, or COHORT_STORE");
  std::unique_ptr<store> s;
  if (spec.starts_with("file:")) {
    s = std::make_unique<file_store>(spec.substr(5));
  } else if (spec.starts_with("redis://")) {
#if defined(COHORT_WITH_HIREDIS)
    std::string host;
    int port = 0;
    if (!detail::net::split_host_port(spec.substr(8), host, port))
      fail(errc::invalid_argument, "bad Redis store \"" + spec + "\"");
    // Redis admits whoever reaches it: the token may go through it only on loopback.
    if (opts.token.empty() && !detail::net::is_loopback_host(host) &&
        !detail::tcp::insecure_store())
      fail(errc::invalid_argument, detail::tcp::tokenless_refusal("the Redis store at " + spec));
    redis_store_options ro;
    ro.timeout = opts.connect_timeout;
    s = std::make_unique<redis_store>(host, port, ro);
#else
    fail(errc::unsupported,
         "a Redis store needs hiredis: build with COHORT_WITH_HIREDIS and link hiredis");
#endif
  } else {
    std::string host;
    int port = 0;
    std::string_view hp = spec;
    if (hp.starts_with("tcp://")) hp.remove_prefix(6);
    if (!detail::net::split_host_port(hp, host, port))
      fail(errc::invalid_argument, "bad store address \"" + spec + "\" (want host:port)");
    // Without a token, rank 0 makes one and hands it out through the store, so the store must
    // admit only ranks of this job: on one host, only this user's processes (the server checks);
    // across hosts nothing tells a rank from a stranger, so the user must say it is safe.
    tcp_store_server_options so;
    so.token = opts.token;
    so.log = opts.log;
    // Stopped as soon as the job connected (below), when no rank needs it: nothing may linger
    // that a communicator made again at once with the same store address could reach.
    so.linger = std::chrono::milliseconds(0);
    if (opts.token.empty()) {
      const bool one_host = detail::net::is_loopback_host(host) || info.local_size >= info.size;
      const bool insecure = detail::tcp::insecure_store();
      if (!one_host && !insecure)
        fail(errc::invalid_argument, detail::tcp::tokenless_refusal("the store at " + spec));
      so.tokenless = insecure ? store_access::anyone : store_access::local_user;
      if (insecure && rank_ == 0)
        opts.log("COHORT_INSECURE_STORE=1: the store at " + spec +
                 " admits anyone who reaches it, and hands them the job's token; use it only on "
                 "a network where everyone is trusted, or set COHORT_TOKEN");
    }
    if (rank_ == 0) {
      try {
        server_ = std::make_unique<tcp_store_server>(host, port, so);
      } catch (const error& e) {
        if (e.code() == std::error_code(EADDRINUSE, std::generic_category()))
          fail(errc::invalid_argument,
               "rank 0 cannot host the store at " + spec + ": the port is taken" +
                   (detail::tcp::env("TORCHELASTIC_RUN_ID")
                        ? std::string(" (under torchrun, by torchrun's own store on MASTER_PORT)")
                        : std::string()) +
                   ". Give cohort a store of its own on every rank: COHORT_STORE=" +
                   (host.find(':') != std::string::npos ? "[" + host + "]" : host) +
                   ":<a free port>, or COHORT_STORE=file:<a directory every rank sees>");
        if (e.code() != std::error_code(EADDRNOTAVAIL, std::generic_category())) throw;
        // MASTER_ADDR is not an address of this host (NAT, a name for a proxy): every address.
        opts.log("the store cannot listen on " + host +
                 " (not an address of this host); listening on every address");
        server_ = std::make_unique<tcp_store_server>("", port, so);
      }
    }
    tcp_store_options co;
    co.token = opts.token;
    co.timeout = opts.connect_timeout;
    s = std::make_unique<tcp_store>(host, port, co);
  }
  try {
    setup(info, *s, std::move(opts));
  } catch (...) {
    // The ranks still waiting at this rank's store learn from it why this rank gave up (they
    // look every 100 ms): let them read it before the store goes.
    if (server_) server_->set_linger(std::chrono::milliseconds(300));
    throw;
  }
  // Every rank has read what it needed from the store: each one handshook with rank 0, which
  // it does only after reading the token and every address it needs.
  server_.reset();
}

COHORT_DECL void tcp_transport::setup(const launch_info& info, store& s, tcp_options opts) {
  rank_ = info.rank;
  size_ = info.size;
  if (size_ == 1) return;
  detail::tcp::complete_options(opts, info);
  const deadline until = deadline_after(opts.connect_timeout);
  auto fail = [](std::error_code ec, int peer, const std::string& what) {
    throw error(ec, "make_tcp_communicator", peer, "make_tcp_communicator: " + what);
  };
  detail::tcp::mesh_config cfg;
  cfg.rank = rank_;
  cfg.size = size_;
  cfg.job_id = info.job_id.empty() ? "job" : info.job_id;
  cfg.prefix = detail::tcp::key_prefix(cfg.job_id, detail::tcp::next_generation(cfg.job_id, rank_));
  cfg.until = until;
  cfg.handshake_timeout = opts.handshake_timeout;
  cfg.send_buffer = opts.send_buffer;
  cfg.recv_buffer = opts.recv_buffer;
  cfg.log = opts.log;
  std::error_code ec;
  cfg.token = opts.token;
  if (cfg.token.empty()) {  // rank 0 makes one and hands it out
    if (rank_ == 0) {
      cfg.token = detail::net::random_token();
      if (cfg.token.empty())
        fail(make_error_code(errc::unsupported), -1,
             "cannot make the job's token: the kernel's random generator is unavailable; set "
             "COHORT_TOKEN");
      s.set(cfg.prefix + "token", cfg.token, ec);
    } else {
      cfg.token = s.get(cfg.prefix + "token", until, ec);
    }
    if (ec == errc::timed_out && rank_ != 0)
      fail(ec, 0,
           "rendezvous: rank 0 never arrived (no token at the store: " + s.last_error() + ")");
    if (ec) fail(ec, -1, "rendezvous: " + s.last_error());
  }
  if (cfg.token.size() > detail::tcp::max_token || cfg.job_id.size() > detail::tcp::max_job_id)
    fail(make_error_code(errc::invalid_argument), -1, "the token must be at most 96 bytes");
  std::string why;
  auto fam = opts.family == tcp_family::v4   ? detail::tcp::family_choice::v4
             : opts.family == tcp_family::v6 ? detail::tcp::family_choice::v6
                                             : detail::tcp::family_choice::any;
  auto local =
      detail::tcp::choose_address(opts.interface, fam, detail::tcp::store_host(opts.store), why);
  if (!local) fail(make_error_code(errc::invalid_argument), -1, why);
  cfg.local = *local;
  auto m = detail::tcp::connect_mesh(cfg, s);
  if (m.error.code) {
    detail::tcp::farewell(m.fds, rank_,
                          {m.error.code, m.error.peer, "make_tcp_communicator: " + m.error.what});
    fail(m.error.code, m.error.peer, m.error.what);
  }
  if (auto* t = dynamic_cast<tcp_store*>(&s)) t->disconnect();  // the store is not needed any more
  // A file store keeps keys after the job: take this rank's off (the token first). Every peer
  // has read them by now: each one handshook with this rank, which it does only after reading
  // every address it needs, and with the token.
  if (auto* f = dynamic_cast<file_store*>(&s)) {
    std::error_code ig;
    if (opts.token.empty() && rank_ == 0) f->remove(cfg.prefix + "token", ig);
    f->remove(cfg.prefix + "addr/" + std::to_string(rank_), ig);
  }
  detail::tcp::engine_options eo;
  eo.spin = opts.spin;
  eo.yield = detail::tcp::ranks_outnumber_cores(info);
  eo.log = opts.log;
  engine_ = std::make_unique<detail::tcp::engine>(rank_, size_, std::move(m.fds),
                                                  std::move(m.addresses), std::move(eo));
}

}  // namespace cohort
