// common/net.h — small, blocking-or-nonblocking socket helpers shared by the
// TCP store and the TCP transport. Every function that can fail throws a
// shoal::Error whose message names the address and the errno text:
// InvalidArgument for an address that cannot be resolved or bound, PeerLost
// (peer -1) for a connect that fails hard, TimeoutError past a deadline, and
// InternalError for system calls failing otherwise (descriptor limits, bad fds).
// Sockets are created close-on-exec. Free functions; thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace shoal::net {

using Clock = std::chrono::steady_clock;

// An owned file descriptor (closed on destruction). Movable, not copyable.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd();
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { int f = fd_; fd_ = -1; return f; }
  void reset(int fd = -1);
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Listens on host:port (IPv4 or IPv6 literal or name; "" or "0.0.0.0" = any).
// port 0 binds an ephemeral port; bound_port() tells which.
Fd listen_tcp(const std::string& host, uint16_t port, int backlog = 1024);
// The backlog of a rendezvous store's listener: every rank of a job connects
// at about the same time, and a connection the queue has no room for waits a
// second for its SYN to be sent again (the kernel caps it at somaxconn).
inline constexpr int kStoreBacklog = 65535;
uint16_t bound_port(int fd);

// What a refused connection means to the caller: a server that may not be
// listening yet (retry), or a peer whose listener is known to have existed,
// so that a refusal means it is gone (final).
enum class Refused { kRetry, kFinal };

// Connects to host:port, retrying on ECONNREFUSED (unless `refused` is
// kFinal: then PeerLost at once), ENETUNREACH and timeouts with a short
// backoff until `deadline`, then throws TimeoutError naming host:port and the
// last errno; other errors throw shoal::Error at once. The returned socket is
// blocking with TCP_NODELAY set, and with congestion control `congestion`
// (set before connecting, best-effort) unless that is empty.
Fd connect_tcp(const std::string& host, uint16_t port, Clock::time_point deadline,
               Refused refused = Refused::kRetry, const std::string& congestion = "");

// Accepts one connection (blocking unless the listener is non-blocking; returns
// an invalid Fd on EAGAIN or when the pending connection was already aborted).
// The result is blocking, with TCP_NODELAY set.
Fd accept_tcp(int listen_fd);

void set_nonblocking(int fd, bool on);
void set_nodelay(int fd);  // best-effort (ignored on non-TCP sockets)
// Best-effort: a large send buffer for bulk transfer. The receive buffer is
// left to the kernel's autotuning: one set by hand (SO_RCVBUF) made Linux
// drop data it had advertised room for while a receiver held messages back
// (a collective's message that no receive has asked for yet waits in the
// kernel), and the sender's retransmissions then backed off to tens of
// seconds: a 2-rank allreduce over loopback beside bursty load stalled in
// 6 starts of 12 (bench/results/tcp-receive-buffer).
void set_send_buffer(int fd, int bytes);

// What the kernel says of a connected TCP socket's health: the sender's
// retransmissions (a timer that doubles with each one: a peer that dropped
// data hears of it again only when it fires) and what this end dropped.
struct TcpHealth {
  bool known = false;        // false: not a TCP socket, or not connected
  unsigned retransmits = 0;  // unanswered retransmissions of the oldest unacknowledged segment
  unsigned backoff = 0;      // doublings of the retransmission timer
  unsigned rto_us = 0;       // the timer, microseconds
  unsigned unacked = 0;      // segments sent and not yet acknowledged
  uint32_t drops = 0;        // packets this end's kernel dropped (SK_MEMINFO_DROPS)
};
TcpHealth tcp_health(int fd);
// "" for a healthy connection; else what is wrong, for an error or a stall
// report (", retransmitting: backoff 7, timer 26.1 s, 12 segments unacked;
// 57 packets dropped here").
std::string describe_trouble(const TcpHealth& h);

// Whether both ends of a connected TCP socket are this host's own network
// stack: a loopback peer, or the same address at both ends (a connection to
// one of this host's own addresses, which the kernel carries over loopback).
// False when it cannot tell (e.g. the connection is already gone).
bool within_host(int fd);
// Sets the socket's congestion control (TCP_CONGESTION); 0 or the errno.
// Set before a connection is made (on the connecting socket, or on the
// listener for the connections it accepts), a controller that does not pace
// keeps the connection unpaced; one switched to after the connection began
// leaves the pacing of the one before (BBR's) in place.
int set_congestion(int fd, const std::string& name);
// The host's default congestion control ("" if unknown).
std::string default_congestion();
// The congestion controls this kernel has (tcp_available_congestion_control),
// space-separated; "" if unreadable.
std::string available_congestion();
// Whether this process may set congestion control `name` on its sockets: ""
// if so, else why not (naming what the host allows).
std::string congestion_refusal(const std::string& name);

// Blocking-with-deadline full transfers on a (possibly non-blocking) socket;
// use poll() internally. Return false on EOF/connection reset (peer gone),
// throw TimeoutError past the deadline (Clock::time_point::max() = no deadline).
// Sends use MSG_NOSIGNAL (never SIGPIPE); EINTR is retried.
bool write_full(int fd, const void* buf, size_t n, Clock::time_point deadline);
bool read_full(int fd, void* buf, size_t n, Clock::time_point deadline);

// The local address (numeric) this socket uses and the peer's, as "host:port".
std::string local_address(int fd);
std::string peer_address(int fd);

// This machine's host name and a host identity that is equal for processes on
// the same host (hostname + boot id + network-namespace inode), used to detect
// same-host peers; two network namespaces on one kernel count as two hosts.
std::string hostname();
std::string host_identity();
// This kernel's boot id (empty if unknown): equal on every network namespace.
std::string boot_id();

}  // namespace shoal::net
