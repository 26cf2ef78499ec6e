// A port for a test's job to listen on, held until the job binds it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <vector>

namespace cohort::test {

/// A TCP port on 127.0.0.1 for a job to listen on, held for it: a socket bound to the port with
/// SO_REUSEADDR, never listening, keeps it out of the kernel's hands, so that no outgoing
/// connection takes it as its source port and no later free_port() is given it, while the job's
/// own listener (the store's and the transport's set SO_REUSEADDR too) may still bind it. A port
/// probed and closed at once was free when asked and could be taken before the job listened: a
/// loaded CI run lost one to the connections of jobs started in the meantime. The newest
/// `held` ports stay held, ample for the jobs a test starts at once; the rest are let go.
inline int free_port() {
  constexpr std::size_t held = 128;
  static std::vector<int> holders;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return 0;
  }
  if (holders.size() == held) {
    ::close(holders.front());
    holders.erase(holders.begin());
  }
  holders.push_back(fd);
  return ntohs(a.sin_port);
}

}  // namespace cohort::test
