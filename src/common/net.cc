// common/net.cc — socket helpers (see net.h for the contracts).
//
// Error policy: a host that cannot be resolved or an address that cannot be
// bound is an InvalidArgument; a connect that fails hard is PeerLost (peer -1);
// running past a deadline is a TimeoutError; system calls that fail for other
// reasons (descriptor limits, bad descriptors) are InternalError. Every message
// names the address and the errno text. A peer that goes away during
// read_full/write_full is not an error here: those return false.
#include "common/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/sock_diag.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include "shoal/error.h"

namespace shoal::net {
namespace {

using std::chrono::milliseconds;

std::string errno_text(int e) {
  char buf[128];
  // GNU strerror_r returns the message (possibly not in buf).
  return std::string(strerror_r(e, buf, sizeof(buf)));
}

// "host:port", with brackets around IPv6 literals.
std::string join_host_port(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

// Milliseconds to pass to poll() for `deadline` (-1 = forever), rounded up so
// that poll never returns before the deadline.
int poll_timeout_ms(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return -1;
  auto now = Clock::now();
  if (deadline <= now) return 0;
  auto ms = std::chrono::ceil<milliseconds>(deadline - now).count();
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

std::string sockaddr_text(const sockaddr* sa, socklen_t len) {
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (getnameinfo(sa, len, host, sizeof(host), serv, sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return join_host_port(host, static_cast<uint16_t>(std::atoi(serv)));
}

// Never throws; for error messages.
std::string peer_text(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "fd " + std::to_string(fd);
  return sockaddr_text(reinterpret_cast<sockaddr*>(&ss), len);
}

struct AddrInfoFree {
  void operator()(addrinfo* ai) const { freeaddrinfo(ai); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoFree>;

// Resolves host:port; returns the getaddrinfo code (0 on success).
int resolve(const std::string& host, uint16_t port, int flags, AddrInfoPtr* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_protocol = IPPROTO_TCP;
  hints.ai_flags = flags | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string serv = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), serv.c_str(), &hints, &res);
  out->reset(rc == 0 ? res : nullptr);
  return rc;
}

bool connect_errno_retriable(int e) {
  switch (e) {
    case ECONNREFUSED: case ENETUNREACH: case EHOSTUNREACH: case ETIMEDOUT: case ECONNRESET:
    case ECONNABORTED: case EADDRNOTAVAIL: case EAGAIN: case EINTR: case ENETDOWN: case EHOSTDOWN:
      return true;
    default:
      return false;
  }
}

bool peer_gone_errno(int e) {
  switch (e) {
    case ECONNRESET: case EPIPE: case ENOTCONN: case ETIMEDOUT: case ECONNABORTED:
    case EHOSTUNREACH: case ENETUNREACH: case ENETRESET: case ENETDOWN: case EHOSTDOWN:
      return true;
    default:
      return false;
  }
}

// True when the socket is connected to itself (TCP simultaneous open onto our
// own ephemeral port, possible when retrying a local port nobody listens on).
bool is_self_connected(int fd) {
  sockaddr_storage a{}, b{};
  socklen_t la = sizeof(a), lb = sizeof(b);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &la) != 0) return false;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&b), &lb) != 0) return false;
  return la == lb && std::memcmp(&a, &b, la) == 0;
}

// One non-blocking connect attempt bounded by `deadline`. Returns the socket or
// an invalid Fd with *err set.
Fd try_connect(const addrinfo* ai, Clock::time_point deadline, const std::string& congestion, int* err) {
  Fd s(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
  if (!s) {
    *err = errno;
    return Fd();
  }
  if (!congestion.empty()) set_congestion(s.get(), congestion);  // best-effort
  if (::connect(s.get(), ai->ai_addr, ai->ai_addrlen) == 0) return s;
  if (errno != EINPROGRESS && errno != EINTR) {
    *err = errno;
    return Fd();
  }
  pollfd p{s.get(), POLLOUT, 0};
  for (;;) {
    int n = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (n > 0) break;
    if (n == 0) {
      *err = ETIMEDOUT;
      return Fd();
    }
    if (errno != EINTR) {
      *err = errno;
      return Fd();
    }
  }
  int so_error = 0;
  socklen_t len = sizeof(so_error);
  if (getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) so_error = errno;
  if (so_error != 0) {
    *err = so_error;
    return Fd();
  }
  return s;
}

// Waits until `fd` is ready for `events` or throws TimeoutError at `deadline`.
void wait_ready(int fd, short events, Clock::time_point deadline, const char* what, size_t left) {
  pollfd p{fd, events, 0};
  for (;;) {
    int n = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (n > 0) return;  // readable/writable, or an error the next call reports
    if (n < 0 && errno != EINTR) {
      throw InternalError("net: poll on " + peer_text(fd) + " failed: " + errno_text(errno));
    }
    if (n == 0 && Clock::now() >= deadline) {
      throw TimeoutError(std::string("net: timed out ") + what + " " + std::to_string(left) +
                         " more bytes " + (events == POLLIN ? "from " : "to ") + peer_text(fd));
    }
  }
}

std::string read_trimmed(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (!f || !std::getline(f, s)) return "";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

}  // namespace

// ---- Fd ---------------------------------------------------------------------

Fd::~Fd() { reset(); }

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void Fd::reset(int fd) {
  if (fd_ >= 0 && fd_ != fd) ::close(fd_);  // close() is not retried on EINTR (Linux)
  fd_ = fd;
}

// ---- listening / connecting ----------------------------------------------------

Fd listen_tcp(const std::string& host, uint16_t port, int backlog) {
  // "" (or "*" / "::") = every interface, IPv6 dual-stack when available;
  // "0.0.0.0" = every IPv4 interface.
  bool any = host.empty() || host == "*" || host == "::";
  std::vector<std::string> nodes;
  if (any) {
    nodes = {"::", "0.0.0.0"};
  } else {
    nodes = {host};
  }
  std::string addr = join_host_port(host.empty() ? "*" : host, port);
  int last_err = 0;
  for (const auto& node : nodes) {
    AddrInfoPtr res;
    int rc = resolve(node, port, AI_PASSIVE, &res);
    if (rc != 0) {
      if (any) continue;  // e.g. no IPv6 support: try the next family
      throw InvalidArgument("net: cannot resolve listen address " + addr + ": " + gai_strerror(rc));
    }
    for (addrinfo* ai = res.get(); ai != nullptr; ai = ai->ai_next) {
      Fd s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
      if (!s) {
        last_err = errno;
        continue;
      }
      int one = 1;
      ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (ai->ai_family == AF_INET6 && any) {
        int zero = 0;
        ::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
      }
      if (::bind(s.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
        last_err = errno;
        continue;
      }
      if (::listen(s.get(), backlog) != 0) {
        last_err = errno;
        continue;
      }
      return s;
    }
  }
  throw InvalidArgument("net: cannot listen on " + addr + ": " +
                        (last_err ? errno_text(last_err) : std::string("no usable address")));
}

uint16_t bound_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    throw InternalError("net: getsockname(fd " + std::to_string(fd) + ") failed: " + errno_text(errno));
  }
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  throw InternalError("net: fd " + std::to_string(fd) + " is not an IP socket");
}

Fd connect_tcp(const std::string& host, uint16_t port, Clock::time_point deadline, Refused refused,
               const std::string& congestion) {
  const std::string addr = join_host_port(host, port);
  const auto start = Clock::now();
  milliseconds backoff(10);
  std::string last = "no attempt made";
  for (;;) {
    AddrInfoPtr res;
    int rc = resolve(host, port, 0, &res);
    if (rc == 0) {
      for (addrinfo* ai = res.get(); ai != nullptr; ai = ai->ai_next) {
        // Bound each attempt so that one black-holed address does not starve the others.
        auto attempt_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(10));
        int err = 0;
        Fd s = try_connect(ai, attempt_deadline, congestion, &err);
        if (s && is_self_connected(s.get())) {
          s.reset();
          err = ECONNREFUSED;
        }
        if (s) {
          set_nonblocking(s.get(), false);
          set_nodelay(s.get());
          return s;
        }
        last = errno_text(err);
        if (!connect_errno_retriable(err) || (err == ECONNREFUSED && refused == Refused::kFinal)) {
          throw PeerLost("net: cannot connect to " + addr + ": " + last, -1);
        }
      }
    } else if (rc == EAI_AGAIN) {
      last = gai_strerror(rc);  // temporary resolver failure: retry
    } else {
      throw InvalidArgument("net: cannot resolve " + addr + ": " + gai_strerror(rc));
    }
    auto now = Clock::now();
    if (now >= deadline) {
      auto waited = std::chrono::duration_cast<milliseconds>(now - start).count();
      throw TimeoutError("net: could not connect to " + addr + " within " + std::to_string(waited) +
                         " ms (last error: " + last + ")");
    }
    auto pause = std::min<Clock::duration>(backoff, deadline - now);
    std::this_thread::sleep_for(pause);
    backoff = std::min(backoff * 2, milliseconds(500));
  }
}

Fd accept_tcp(int listen_fd) {
  for (;;) {
    int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c >= 0) {
      Fd s(c);
      set_nodelay(s.get());
      return s;
    }
    switch (errno) {
      case EINTR: continue;
      case EAGAIN:
#if EAGAIN != EWOULDBLOCK
      case EWOULDBLOCK:
#endif
      case ECONNABORTED:
      case EPROTO:
        return Fd();
      default:
        throw InternalError("net: accept on fd " + std::to_string(listen_fd) + " failed: " + errno_text(errno));
    }
  }
}

// ---- socket options -------------------------------------------------------------

void set_nonblocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0) throw InternalError("net: fcntl(fd " + std::to_string(fd) + ") failed: " + errno_text(errno));
  int want = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (want != flags && ::fcntl(fd, F_SETFL, want) != 0) {
    throw InternalError("net: fcntl(fd " + std::to_string(fd) + ") failed: " + errno_text(errno));
  }
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // best-effort
}

void set_send_buffer(int fd, int bytes) { ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes)); }

TcpHealth tcp_health(int fd) {
  TcpHealth h;
  tcp_info ti{};
  socklen_t len = sizeof(ti);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 || ti.tcpi_state != TCP_ESTABLISHED) return h;
  h.known = true;
  h.retransmits = ti.tcpi_retransmits;
  h.backoff = ti.tcpi_backoff;
  h.rto_us = ti.tcpi_rto;
  h.unacked = ti.tcpi_unacked;
  uint32_t mem[SK_MEMINFO_VARS] = {};
  len = sizeof(mem);
  if (::getsockopt(fd, SOL_SOCKET, SO_MEMINFO, mem, &len) == 0 && len > SK_MEMINFO_DROPS * sizeof(uint32_t)) {
    h.drops = mem[SK_MEMINFO_DROPS];
  }
  return h;
}

std::string describe_trouble(const TcpHealth& h) {
  if (!h.known) return "";
  std::string s;
  if (h.retransmits > 0 || h.backoff > 0) {
    char timer[32];
    std::snprintf(timer, sizeof(timer), "%.1f s", h.rto_us / 1e6);
    s += ", retransmitting: backoff " + std::to_string(h.backoff) + ", timer " + timer + ", " +
         std::to_string(h.unacked) + " segments unacked";
  }
  if (h.drops > 0) s += (s.empty() ? ", " : "; ") + std::to_string(h.drops) + " packets dropped here";
  return s;
}

bool within_host(int fd) {
  sockaddr_storage me{}, peer{};
  socklen_t ml = sizeof(me), pl = sizeof(peer);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&me), &ml) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0 || me.ss_family != peer.ss_family) {
    return false;
  }
  if (peer.ss_family == AF_INET) {
    const in_addr a = reinterpret_cast<const sockaddr_in*>(&me)->sin_addr;
    const in_addr b = reinterpret_cast<const sockaddr_in*>(&peer)->sin_addr;
    return (ntohl(b.s_addr) >> 24) == 127 || a.s_addr == b.s_addr;
  }
  if (peer.ss_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&me)->sin6_addr;
    const in6_addr& b = reinterpret_cast<const sockaddr_in6*>(&peer)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&b) || std::memcmp(&a, &b, sizeof(a)) == 0) return true;
    return IN6_IS_ADDR_V4MAPPED(&b) && b.s6_addr[12] == 127;
  }
  return false;
}

int set_congestion(int fd, const std::string& name) {
  if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.c_str(), static_cast<socklen_t>(name.size())) != 0) {
    return errno;
  }
  return 0;
}

std::string default_congestion() { return read_trimmed("/proc/sys/net/ipv4/tcp_congestion_control"); }

std::string available_congestion() { return read_trimmed("/proc/sys/net/ipv4/tcp_available_congestion_control"); }

std::string congestion_refusal(const std::string& name) {
  Fd probe(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!probe) return "no TCP socket to try it on: " + errno_text(errno);
  const int err = set_congestion(probe.get(), name);
  if (err == 0) return "";
  std::string allowed = read_trimmed("/proc/sys/net/ipv4/tcp_allowed_congestion_control");
  std::string available = available_congestion();
  const std::string what = err == ENOENT ? "this kernel has no such algorithm"
                           : err == EPERM ? "not permitted to this process"
                                          : errno_text(err);
  return what + " (the host allows " + (allowed.empty() ? "?" : allowed) + " to every process and has " +
         (available.empty() ? "?" : available) + ")";
}

// ---- transfers -------------------------------------------------------------------

bool write_full(int fd, const void* buf, size_t n, Clock::time_point deadline) {
  const auto* p = static_cast<const uint8_t*>(buf);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      wait_ready(fd, POLLOUT, deadline, "writing", n);
      continue;
    }
    if (w < 0 && peer_gone_errno(errno)) return false;
    throw InternalError("net: send to " + peer_text(fd) + " failed: " + errno_text(w < 0 ? errno : EIO));
  }
  return true;
}

bool read_full(int fd, void* buf, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return false;  // orderly shutdown by the peer
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_ready(fd, POLLIN, deadline, "reading", n);
      continue;
    }
    if (peer_gone_errno(errno)) return false;
    throw InternalError("net: recv from " + peer_text(fd) + " failed: " + errno_text(errno));
  }
  return true;
}

// ---- addresses and identity ----------------------------------------------------------

std::string local_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    throw InternalError("net: getsockname(fd " + std::to_string(fd) + ") failed: " + errno_text(errno));
  }
  return sockaddr_text(reinterpret_cast<sockaddr*>(&ss), len);
}

std::string peer_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    throw InternalError("net: getpeername(fd " + std::to_string(fd) + ") failed: " + errno_text(errno));
  }
  return sockaddr_text(reinterpret_cast<sockaddr*>(&ss), len);
}

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return std::string(buf);
}

std::string boot_id() { return read_trimmed("/proc/sys/kernel/random/boot_id"); }

std::string host_identity() {
  std::string id = hostname();
  std::string boot = read_trimmed("/proc/sys/kernel/random/boot_id");
  if (!boot.empty()) id.append("/").append(boot);
  // Two network namespaces on one kernel cannot share loopback or abstract
  // sockets, so they count as different hosts.
  char ns[128] = {};
  ssize_t n = ::readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
  if (n > 0) id.append("/").append(ns, static_cast<size_t>(n));
  return id;
}

}  // namespace shoal::net
