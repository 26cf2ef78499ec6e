/// @file
/// Who is at the other end of a TCP connection, when it is a process of this host: the user
/// that owns the peer's socket, asked of the kernel for that one socket (sock_diag over netlink,
/// as `ss` does), or, where netlink is not allowed, read from its socket tables (/proc/net/tcp
/// and tcp6, whose cost grows with the sockets of the host). The store uses it to admit,
/// without a token, only the processes of its own user.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace cohort::detail::net {

/// What `peer_uid` found.
struct peer_owner {
  enum class kind {
    local,      ///< A socket of this host (and network namespace); `uid` owns it.
    not_local,  ///< No socket here has this connection's ends: the peer is elsewhere.
    unknown,    ///< The tables cannot be read, or the connection is gone.
  } what = kind::unknown;
  uid_t uid = 0;
};

namespace peer_uid_detail {

// An address and port as the kernel prints them in /proc/net/tcp{,6}: each 32-bit word of the
// address as it lies in memory, read as a native integer, then the port; "" for other families.
inline std::string proc_text(const void* addr, std::size_t words, std::uint16_t port_be) {
  std::string s;
  char buf[16];
  for (std::size_t i = 0; i < words; ++i) {
    std::uint32_t w;
    std::memcpy(&w, static_cast<const unsigned char*>(addr) + 4 * i, 4);
    std::snprintf(buf, sizeof buf, "%08X", w);
    s += buf;
  }
  std::snprintf(buf, sizeof buf, ":%04X", unsigned(ntohs(port_be)));
  return s + buf;
}

// The texts of `sa` in /proc/net/tcp (v4) and /proc/net/tcp6 (v6); an IPv4-mapped IPv6 address
// has both, since the socket at the other end may be of either family.
inline void texts_of(const sockaddr_storage& sa, std::string& v4, std::string& v6) {
  v4.clear();
  v6.clear();
  if (sa.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(sa);
    v4 = proc_text(&a.sin_addr, 1, a.sin_port);
    in6_addr mapped{};
    mapped.s6_addr[10] = mapped.s6_addr[11] = 0xff;
    std::memcpy(&mapped.s6_addr[12], &a.sin_addr, 4);
    v6 = proc_text(&mapped, 4, a.sin_port);
  } else if (sa.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(sa);
    v6 = proc_text(&a.sin6_addr, 4, a.sin6_port);
    if (IN6_IS_ADDR_V4MAPPED(&a.sin6_addr))
      v4 = proc_text(&a.sin6_addr.s6_addr[12], 1, a.sin6_port);
  }
}

inline bool read_all(const char* path, std::string& out) {
  out.clear();
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return true;
}

// Searches one table for the socket whose local end is `local` and remote end `remote`; its
// owner's uid in `uid`. Columns: sl local rem st queues timer retransmits uid timeout inode.
inline bool find(const std::string& table, const std::string& local, const std::string& remote,
                 uid_t& uid) {
  std::size_t at = table.find('\n');  // the header line
  while (at != std::string::npos && at + 1 < table.size()) {
    const std::size_t end = table.find('\n', at + 1);
    const std::string_view line(table.data() + at + 1,
                                (end == std::string::npos ? table.size() : end) - at - 1);
    at = end;
    std::string_view field[8];
    std::size_t p = 0;
    int n = 0;
    for (; n < 8; ++n) {
      while (p < line.size() && line[p] == ' ') ++p;
      const std::size_t q = line.find(' ', p);
      field[n] = line.substr(p, q == std::string_view::npos ? line.size() - p : q - p);
      if (q == std::string_view::npos) break;
      p = q;
    }
    if (n < 7 || field[1] != local || field[2] != remote) continue;
    // TIME_WAIT (06) has no owner any more (it reads as uid 0).
    if (field[3] == "06") return false;
    unsigned long v = 0;
    for (char c : field[7]) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + static_cast<unsigned long>(c - '0');
    }
    uid = static_cast<uid_t>(v);
    return true;
  }
  return false;
}

// One socket's end in the terms of sock_diag: family, address words, port (network order).
struct diag_end {
  int family = 0;
  std::uint32_t addr[4] = {};
  std::uint16_t port_be = 0;
};

// The ends `sa` may be listed under: itself, and for an IPv4-mapped IPv6 address its IPv4 form
// too, since the socket at the other end may be of either family.
inline int diag_ends(const sockaddr_storage& sa, diag_end (&out)[2]) {
  if (sa.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(sa);
    out[0].family = AF_INET;
    std::memcpy(out[0].addr, &a.sin_addr, 4);
    out[0].port_be = a.sin_port;
    return 1;
  }
  if (sa.ss_family != AF_INET6) return 0;
  const auto& a = reinterpret_cast<const sockaddr_in6&>(sa);
  out[0].family = AF_INET6;
  std::memcpy(out[0].addr, &a.sin6_addr, 16);
  out[0].port_be = a.sin6_port;
  if (!IN6_IS_ADDR_V4MAPPED(&a.sin6_addr)) return 1;
  out[1].family = AF_INET;
  std::memcpy(out[1].addr, &a.sin6_addr.s6_addr[12], 4);
  out[1].port_be = a.sin6_port;
  return 2;
}

enum class diag_result { found, absent, unavailable };

// Asks the kernel (NETLINK_SOCK_DIAG, one exact lookup, no dump) for the TCP socket whose local
// end is `local` and remote end `remote`. `found` with the owner in `uid`; `absent` where no
// such socket lives (or it is in TIME_WAIT, which has no owner); `unavailable` where netlink
// cannot be used here.
inline diag_result diag_lookup(const diag_end& local, const diag_end& remote, uid_t& uid) {
  const int s = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (s < 0) return diag_result::unavailable;
  const timeval limit{1, 0};  // the kernel answers at once; never wait on it for long
  ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  struct {
    nlmsghdr header;
    inet_diag_req_v2 req;
  } msg{};
  msg.header.nlmsg_len = sizeof msg;
  msg.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.header.nlmsg_flags = NLM_F_REQUEST;
  msg.header.nlmsg_seq = 1;
  msg.req.sdiag_family = static_cast<std::uint8_t>(local.family);
  msg.req.sdiag_protocol = IPPROTO_TCP;
  msg.req.idiag_states = ~0u;
  msg.req.id.idiag_sport = local.port_be;
  msg.req.id.idiag_dport = remote.port_be;
  std::memcpy(msg.req.id.idiag_src, local.addr, sizeof local.addr);
  std::memcpy(msg.req.id.idiag_dst, remote.addr, sizeof remote.addr);
  msg.req.id.idiag_cookie[0] = msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  diag_result result = diag_result::unavailable;
  alignas(nlmsghdr) char buf[8192];
  if (::sendto(s, &msg, sizeof msg, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) ==
      static_cast<ssize_t>(sizeof msg)) {
    const ssize_t n = ::recv(s, buf, sizeof buf, 0);
    const auto* h = reinterpret_cast<const nlmsghdr*>(buf);
    if (n >= static_cast<ssize_t>(sizeof(nlmsghdr)) && NLMSG_OK(h, static_cast<unsigned>(n))) {
      if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY &&
          h->nlmsg_len >= NLMSG_LENGTH(sizeof(inet_diag_msg))) {
        const auto* m = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
        if (m->idiag_state == TCP_TIME_WAIT) {
          result = diag_result::absent;
        } else {
          uid = static_cast<uid_t>(m->idiag_uid);
          result = diag_result::found;
        }
      } else if (h->nlmsg_type == NLMSG_ERROR &&
                 h->nlmsg_len >= NLMSG_LENGTH(sizeof(nlmsgerr))) {
        // ENOENT: no such socket. Anything else (EPERM, EOPNOTSUPP...): ask the tables.
        if (static_cast<const nlmsgerr*>(NLMSG_DATA(h))->error == -ENOENT)
          result = diag_result::absent;
      }
    }
  }
  ::close(s);
  return result;
}

// peer_uid through sock_diag, into `found`; false where netlink cannot answer.
inline bool peer_uid_by_diag(const sockaddr_storage& mine, const sockaddr_storage& theirs,
                             peer_owner& found) {
  diag_end m[2], t[2];
  const int nm = diag_ends(mine, m), nt = diag_ends(theirs, t);
  for (int i = 0; i < nt; ++i)
    for (int j = 0; j < nm; ++j) {
      if (t[i].family != m[j].family) continue;
      switch (diag_lookup(t[i], m[j], found.uid)) {
        case diag_result::found:
          found.what = peer_owner::kind::local;
          return true;
        case diag_result::absent:
          break;
        case diag_result::unavailable:
          return false;
      }
    }
  found.what = nm > 0 && nt > 0 ? peer_owner::kind::not_local : peer_owner::kind::unknown;
  return true;
}

}  // namespace peer_uid_detail

/// The owner of the socket at the other end of connected TCP socket `fd`, when that socket is
/// on this host: the kernel lists it with its ends swapped. One sock_diag lookup per family;
/// where netlink is refused, a read of /proc/net/tcp and tcp6, which costs time in proportion
/// to the sockets of the host. `use_tables` skips netlink (for tests).
inline peer_owner peer_uid(int fd, bool use_tables = false) {
  namespace d = peer_uid_detail;
  sockaddr_storage mine{}, theirs{};
  socklen_t a = sizeof mine, b = sizeof theirs;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &a) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &b) != 0)
    return {};
  peer_owner found;
  if (!use_tables && d::peer_uid_by_diag(mine, theirs, found)) return found;
  std::string mine4, mine6, theirs4, theirs6, table;
  d::texts_of(mine, mine4, mine6);
  d::texts_of(theirs, theirs4, theirs6);
  bool readable = false;
  const struct {
    const char* path;
    const std::string& local;
    const std::string& remote;
  } tables[] = {{"/proc/net/tcp", theirs4, mine4}, {"/proc/net/tcp6", theirs6, mine6}};
  for (const auto& t : tables) {
    if (t.local.empty() || t.remote.empty()) continue;
    if (!d::read_all(t.path, table)) continue;
    readable = true;
    if (d::find(table, t.local, t.remote, found.uid)) {
      found.what = peer_owner::kind::local;
      return found;
    }
  }
  found.what = readable ? peer_owner::kind::not_local : peer_owner::kind::unknown;
  return found;
}

}  // namespace cohort::detail::net
