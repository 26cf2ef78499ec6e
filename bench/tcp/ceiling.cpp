// The loopback TCP ceilings the TCP transport is measured against (bench/results/tcp.md):
// two processes on one connection, moving 1 GiB in 1 MiB calls, from a buffer of BUFFER bytes
// (1 MiB: cache-resident; 64 MiB: main memory). Plain sockets, no cohort. Not a test.
//
// usage: tcp_ceiling one|threads|poll [BUFFER]
//   one       one direction
//   threads   both directions, a thread per direction in each process
//   poll      both directions from one thread per process, with poll (what cohort's engine does)
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace {

constexpr std::size_t total = std::size_t(1) << 30, call = std::size_t(1) << 20;
std::size_t buffer = call;

int listener(int& port) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(s, 4) != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    std::exit(2);
  port = ntohs(a.sin_port);
  return s;
}

int connect_to(int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  for (int i = 0; ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0; ++i) {
    if (i > 1000) std::exit(2);
    ::usleep(1000);
  }
  return s;
}

void send_all(int s, char* buf) {
  for (std::size_t done = 0; done < total;) {
    const ssize_t n = ::send(s, buf + done % buffer, std::min(call, total - done), 0);
    if (n <= 0) std::exit(1);
    done += static_cast<std::size_t>(n);
  }
}

void recv_all(int s, char* buf) {
  for (std::size_t done = 0; done < total;) {
    const ssize_t n = ::recv(s, buf + done % buffer, std::min(call, total - done), 0);
    if (n <= 0) std::exit(1);
    done += static_cast<std::size_t>(n);
  }
}

void both_with_poll(int s, char* out, char* in) {
  ::fcntl(s, F_SETFL, O_NONBLOCK);
  std::size_t sent = 0, got = 0;
  while (sent < total || got < total) {
    pollfd p{s, static_cast<short>((sent < total ? POLLOUT : 0) | (got < total ? POLLIN : 0)), 0};
    ::poll(&p, 1, -1);
    if (sent < total) {
      const ssize_t n = ::send(s, out + sent % buffer, std::min(call, total - sent), MSG_DONTWAIT);
      if (n > 0) sent += static_cast<std::size_t>(n);
    }
    if (got < total) {
      const ssize_t n = ::recv(s, in + got % buffer, std::min(call, total - got), MSG_DONTWAIT);
      if (n > 0) got += static_cast<std::size_t>(n);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "one";
  if (argc > 2) buffer = std::max<std::size_t>(call, std::strtoull(argv[2], nullptr, 10));
  int port = 0;
  const int ls = listener(port);
  char* out = static_cast<char*>(std::aligned_alloc(4096, buffer + call));
  char* in = static_cast<char*>(std::aligned_alloc(4096, buffer + call));
  std::memset(out, 1, buffer + call);
  std::memset(in, 0, buffer + call);
  const pid_t child = ::fork();
  const int s = child == 0 ? connect_to(port) : ::accept(ls, nullptr, nullptr);
  int one = 1;
  ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  char go = 'g';
  if (child == 0)
    ::recv(s, &go, 1, MSG_WAITALL);
  else
    ::send(s, &go, 1, 0);
  const auto t0 = std::chrono::steady_clock::now();
  if (std::strcmp(mode, "one") == 0) {
    if (child == 0)
      recv_all(s, in);
    else
      send_all(s, out);
  } else if (std::strcmp(mode, "threads") == 0) {
    std::thread t([&] { send_all(s, out); });
    recv_all(s, in);
    t.join();
  } else {
    both_with_poll(s, out, in);
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (child != 0) {
    ::waitpid(child, nullptr, 0);
    std::printf("%s, %zu-byte buffer: %.2f GB/s per direction\n", mode, buffer,
                double(total) / sec / 1e9);
  }
  return 0;
}
