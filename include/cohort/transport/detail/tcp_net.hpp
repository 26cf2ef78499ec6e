/// @file
/// Which local address the TCP transport listens on: the interface named by
/// COHORT_SOCKET_IFNAME (NCCL_SOCKET_IFNAME's syntax), else the interface of the default route.
/// No Asio: getifaddrs and /proc/net.
///
/// Syntax of the interface list: comma-separated name prefixes ("eth,ib"); a leading `^`
/// excludes those instead ("^docker,lo"); a leading `=` makes them exact names ("=eth0").
#pragma once

#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <cohort/detail/net/socket.hpp>

namespace cohort::detail::tcp {

/// One address of one local interface.
struct interface_address {
  std::string name;
  net::endpoint address;  // port 0
  bool loopback = false;
  bool link_local = false;
};

/// The addresses of the interfaces that are up (IPv4 and IPv6).
inline std::vector<interface_address> local_addresses() {
  std::vector<interface_address> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || !(a->ifa_flags & IFF_UP)) continue;
    const int fam = a->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    interface_address x;
    x.name = a->ifa_name;
    x.loopback = (a->ifa_flags & IFF_LOOPBACK) != 0;
    const std::size_t len = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(&x.address.addr, a->ifa_addr, len);
    x.address.len = static_cast<socklen_t>(len);
    if (fam == AF_INET6) {
      auto& s6 = reinterpret_cast<sockaddr_in6&>(x.address.addr);
      x.link_local = IN6_IS_ADDR_LINKLOCAL(&s6.sin6_addr);
      s6.sin6_port = 0;
    } else {
      reinterpret_cast<sockaddr_in&>(x.address.addr).sin_port = 0;
    }
    out.push_back(std::move(x));
  }
  ::freeifaddrs(list);
  return out;
}

/// True when interface `name` is selected by `spec` (see the syntax above; "" selects all).
inline bool interface_matches(std::string_view spec, std::string_view name) {
  if (spec.empty()) return true;
  bool exclude = false, exact = false;
  if (spec.starts_with('^')) {
    exclude = true;
    spec.remove_prefix(1);
  }
  if (spec.starts_with('=')) {
    exact = true;
    spec.remove_prefix(1);
  }
  bool hit = false;
  while (!spec.empty()) {
    const auto comma = spec.find(',');
    const std::string_view item = spec.substr(0, comma);
    if (!item.empty() && (exact ? name == item : name.starts_with(item))) hit = true;
    if (comma == std::string_view::npos) break;
    spec.remove_prefix(comma + 1);
  }
  return hit != exclude;
}

/// The interface of the default route of `family`, from /proc/net/route or ipv6_route.
inline std::string default_route_interface(int family) {
  if (family == AF_INET) {
    std::ifstream f("/proc/net/route");
    std::string line, iface, dest, gw, flags;
    std::getline(f, line);  // column names
    while (std::getline(f, line)) {
      std::istringstream is(line);
      if ((is >> iface >> dest) && dest == "00000000") return iface;
    }
  } else {
    std::ifstream f("/proc/net/ipv6_route");
    std::string line;
    while (std::getline(f, line)) {
      std::istringstream is(line);
      std::string dest, plen, src, slen, next, metric, ref, use, flags, iface;
      if (!(is >> dest >> plen >> src >> slen >> next >> metric >> ref >> use >> flags >> iface))
        continue;
      if (dest == std::string(32, '0') && plen == "00" && iface != "lo") return iface;
    }
  }
  return {};
}

/// Address family preference.
enum class family_choice { any, v4, v6 };

/// Picks the address to listen on. `spec`: the interface list (may be empty); `store_host`:
/// where the store is, whose loopback-ness decides the default (ranks that meet at 127.0.0.1
/// all run here, so they talk over `lo`). Returns nullopt with `why` set when nothing fits.
inline std::optional<interface_address> choose_address(const std::string& spec, family_choice fam,
                                                       const std::string& store_host,
                                                       std::string& why) {
  const auto all = local_addresses();
  auto family_ok = [&](const interface_address& a) {
    return fam == family_choice::any ||
           (fam == family_choice::v4) == (a.address.family() == AF_INET);
  };
  // Within the chosen interfaces: IPv4 first (unless IPv6 is asked for), then global IPv6,
  // then link-local IPv6.
  auto best_of = [&](auto&& selected) -> std::optional<interface_address> {
    const interface_address* best = nullptr;
    auto score = [&](const interface_address& a) {
      const bool v4 = a.address.family() == AF_INET;
      return (v4 ? (fam == family_choice::v6 ? 0 : 4) : (a.link_local ? 1 : 3));
    };
    for (const auto& a : all)
      if (selected(a) && family_ok(a) && (!best || score(a) > score(*best))) best = &a;
    if (best) return *best;
    return std::nullopt;
  };
  std::optional<interface_address> pick;
  if (!spec.empty()) {
    pick = best_of([&](const interface_address& a) { return interface_matches(spec, a.name); });
    if (!pick)
      why = "no interface that is up matches COHORT_SOCKET_IFNAME=\"" + spec +
            "\" with an address of the wanted family";
    return pick;
  }
  if (net::is_loopback_host(store_host)) {
    pick = best_of([](const interface_address& a) { return a.loopback; });
    if (pick) return pick;
  }
  for (int f : {fam == family_choice::v6 ? AF_INET6 : AF_INET,
                fam == family_choice::v6 ? AF_INET : AF_INET6}) {
    const std::string name = default_route_interface(f);
    if (name.empty()) continue;
    pick = best_of([&](const interface_address& a) { return a.name == name; });
    if (pick) return pick;
  }
  pick = best_of([](const interface_address& a) { return !a.loopback; });
  if (!pick) pick = best_of([](const interface_address&) { return true; });
  if (!pick) why = "no interface that is up has an address of the wanted family";
  return pick;
}

/// The numeric host of `e` without a port, e.g. "10.0.0.1" or "fd00::1" (link-local IPv6 gets
/// "%ifname").
inline std::string host_of(const net::endpoint& e, const std::string& ifname = {}) {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (e.family() == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(e.addr).sin_addr, buf, sizeof buf);
    return buf;
  }
  const auto& s6 = reinterpret_cast<const sockaddr_in6&>(e.addr);
  ::inet_ntop(AF_INET6, &s6.sin6_addr, buf, sizeof buf);
  std::string s = buf;
  if (IN6_IS_ADDR_LINKLOCAL(&s6.sin6_addr) && !ifname.empty()) s += "%" + ifname;
  return s;
}

}  // namespace cohort::detail::tcp
