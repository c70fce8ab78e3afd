// shoalrun/address.cc — see address.h.
#include "address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "cli.h"
#include "cluster.h"
#include "common/net.h"

namespace shoalrun {
namespace {

std::string numeric(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof(buf));
  } else if (sa->sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

bool is_loopback(const std::string& a) {
  return a.rfind("127.", 0) == 0 || a == "::1" || a.rfind("::ffff:127.", 0) == 0;
}

}  // namespace

Endpoint parse_endpoint(const std::string& text, int default_port, const std::string& what) {
  Endpoint e;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos) throw UsageError(what + " '" + text + "': unbalanced '['");
    e.host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') throw UsageError(what + " '" + text + "': expected [HOST]:PORT");
      port = text.substr(close + 2);
    }
  } else if (std::count(text.begin(), text.end(), ':') > 1) {
    e.host = text;  // a bare IPv6 literal
  } else {
    const size_t colon = text.find(':');
    e.host = text.substr(0, colon);
    if (colon != std::string::npos) port = text.substr(colon + 1);
  }
  if (e.host.empty()) throw UsageError(what + " '" + text + "': no host (expected HOST[:PORT])");
  e.port = port.empty() ? default_port : parse_int(port, what + " '" + text + "': port");
  if (e.port < 1 || e.port > 65535) {
    throw UsageError(what + " '" + text + "': port " + std::to_string(e.port) + " is not a TCP port (1 .. 65535)");
  }
  return e;
}

std::vector<std::string> resolve_addresses(const std::string& host) {
  std::vector<std::string> out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return out;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    const std::string a = numeric(ai->ai_addr);
    if (!a.empty() && std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
  }
  ::freeaddrinfo(res);
  return out;
}

bool is_loopback_only(const std::vector<std::string>& addresses) {
  if (addresses.empty()) return false;
  for (const auto& a : addresses) {
    if (!is_loopback(a)) return false;
  }
  return true;
}

bool names_this_machine(const std::string& host) {
  const std::string me = shoal::net::hostname();
  if (!me.empty() && (host == me || host.rfind(me + ".", 0) == 0 || me.rfind(host + ".", 0) == 0)) return true;
  const auto addrs = resolve_addresses(host);
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return false;
  bool found = false;
  for (ifaddrs* i = ifs; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const std::string a = numeric(i->ifa_addr);
    if (a.empty() || is_loopback(a)) continue;
    found = std::find(addrs.begin(), addrs.end(), a) != addrs.end();
  }
  ::freeifaddrs(ifs);
  return found;
}

int free_port_any() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(a);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

std::string join_endpoint(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace shoalrun
