// Tests of common/net: listen/connect (IPv4, IPv6, retry), full transfers with
// deadlines, peer loss without SIGPIPE, host identity.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "shoal/error.h"

namespace {

using namespace std::chrono_literals;
using shoal::net::Clock;
using shoal::net::Fd;
namespace net = shoal::net;

Clock::time_point in(std::chrono::milliseconds ms) { return Clock::now() + ms; }

// A port nobody listens on (bound once, then released).
uint16_t unused_port() {
  Fd l = net::listen_tcp("127.0.0.1", 0);
  return net::bound_port(l.get());
}

// Waits (bounded) for a pending connection, then accepts it.
Fd accept_within(int listen_fd, std::chrono::milliseconds limit) {
  pollfd p{listen_fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(limit.count())) != 1) return Fd();
  return net::accept_tcp(listen_fd);
}

struct Pair {
  Fd a, b;  // a: connected side, b: accepted side
};

Pair connected_pair(const std::string& host = "127.0.0.1") {
  Fd l = net::listen_tcp(host, 0);
  Pair p;
  p.a = net::connect_tcp(host, net::bound_port(l.get()), in(10s));
  p.b = accept_within(l.get(), 10s);
  return p;
}

TEST(Net, EphemeralListenConnectRoundTrip) {
  Fd l = net::listen_tcp("127.0.0.1", 0);
  const uint16_t port = net::bound_port(l.get());
  ASSERT_NE(port, 0);
  Fd c = net::connect_tcp("127.0.0.1", port, in(10s));
  Fd s = accept_within(l.get(), 10s);
  ASSERT_TRUE(s);
  EXPECT_EQ(net::peer_address(c.get()), "127.0.0.1:" + std::to_string(port));
  EXPECT_EQ(net::local_address(c.get()), net::peer_address(s.get()));
  const char msg[] = "hello";
  ASSERT_TRUE(net::write_full(c.get(), msg, sizeof(msg), in(10s)));
  char got[sizeof(msg)] = {};
  ASSERT_TRUE(net::read_full(s.get(), got, sizeof(got), in(10s)));
  EXPECT_STREQ(got, msg);
}

TEST(Net, Ipv6Loopback) {
  Fd l;
  try {
    l = net::listen_tcp("::1", 0);
  } catch (const shoal::Error& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  const uint16_t port = net::bound_port(l.get());
  Fd c = net::connect_tcp("::1", port, in(10s));
  Fd s = accept_within(l.get(), 10s);
  ASSERT_TRUE(s);
  EXPECT_EQ(net::peer_address(c.get()), "[::1]:" + std::to_string(port));
  uint32_t v = 0xfeedbeef, got = 0;
  ASSERT_TRUE(net::write_full(s.get(), &v, sizeof(v), in(10s)));
  ASSERT_TRUE(net::read_full(c.get(), &got, sizeof(got), in(10s)));
  EXPECT_EQ(got, v);
}

TEST(Net, WildcardListenerAcceptsIpv4Loopback) {
  Fd l = net::listen_tcp("", 0);
  Fd c = net::connect_tcp("127.0.0.1", net::bound_port(l.get()), in(10s));
  EXPECT_TRUE(accept_within(l.get(), 10s));
}

TEST(Net, ConnectRetriesUntilListenerAppears) {
  const uint16_t port = unused_port();
  int started[2];
  ASSERT_EQ(::pipe(started), 0);
  Fd connected;
  std::string error;
  std::thread t([&] {
    char x = 'x';
    EXPECT_EQ(::write(started[1], &x, 1), 1);
    try {
      connected = net::connect_tcp("127.0.0.1", port, in(30s));
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  char x;
  ASSERT_EQ(::read(started[0], &x, 1), 1);
  // The connector is running and nothing listens yet: a single attempt is refused.
  EXPECT_THROW(net::connect_tcp("127.0.0.1", port, Clock::now()), shoal::TimeoutError);
  Fd l = net::listen_tcp("127.0.0.1", port);
  Fd s = accept_within(l.get(), 30s);
  t.join();
  ::close(started[0]);
  ::close(started[1]);
  ASSERT_TRUE(connected) << error;
  ASSERT_TRUE(s);
  int v = 42, got = 0;
  ASSERT_TRUE(net::write_full(connected.get(), &v, sizeof(v), in(10s)));
  ASSERT_TRUE(net::read_full(s.get(), &got, sizeof(got), in(10s)));
  EXPECT_EQ(got, 42);
}

TEST(Net, ConnectTimesOutNamingTheAddress) {
  const uint16_t port = unused_port();
  const auto t0 = Clock::now();
  try {
    net::connect_tcp("127.0.0.1", port, in(300ms));
    FAIL() << "connected to a port nobody listens on";
  } catch (const shoal::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("refused"), std::string::npos) << e.what();
  }
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 5s);
}

TEST(Net, ReadFullReturnsFalseOnPeerClose) {
  Pair p = connected_pair();
  const char part[3] = {1, 2, 3};
  ASSERT_TRUE(net::write_full(p.a.get(), part, sizeof(part), in(10s)));
  p.a.reset();
  char buf[8];
  EXPECT_FALSE(net::read_full(p.b.get(), buf, sizeof(buf), in(10s)));  // 3 of 8 bytes, then EOF
  EXPECT_FALSE(net::read_full(p.b.get(), buf, 1, in(10s)));
}

TEST(Net, WriteFullReturnsFalseOnPeerCloseWithoutSigpipe) {
  Pair p = connected_pair();
  p.b.reset();
  std::vector<uint8_t> big(16 << 20, 7);
  // The first send may be buffered; the peer's RST makes a later one fail with
  // EPIPE, which must come back as false rather than kill the process.
  bool ok = net::write_full(p.a.get(), big.data(), big.size(), in(10s)) &&
            net::write_full(p.a.get(), big.data(), big.size(), in(10s));
  EXPECT_FALSE(ok);
}

TEST(Net, ReadFullTimesOut) {
  Pair p = connected_pair();
  char c;
  const auto t0 = Clock::now();
  try {
    net::read_full(p.b.get(), &c, 1, in(200ms));
    FAIL() << "read a byte nobody sent";
  } catch (const shoal::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find(net::peer_address(p.b.get())), std::string::npos) << e.what();
  }
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, 200ms);
  EXPECT_LT(took, 5s);
}

TEST(Net, WriteFullTimesOutWhenThePeerDoesNotRead) {
  Pair p = connected_pair();
  net::set_send_buffer(p.a.get(), 64 << 10);
  std::vector<uint8_t> big(64 << 20, 1);
  EXPECT_THROW(net::write_full(p.a.get(), big.data(), big.size(), in(300ms)), shoal::TimeoutError);
}

// A data socket's receive buffer stays the kernel's to size (autotuning):
// set by hand, Linux dropped data it had advertised room for while a rank
// held back messages no receive had asked for yet, and the sender's
// retransmissions backed off for tens of seconds (bench/results/tcp-receive-buffer).
TEST(Net, SendBufferLeavesTheReceiveBufferToTheKernel) {
  Pair p = connected_pair();
  auto get = [&](int opt) {
    int v = 0;
    socklen_t l = sizeof(v);
    EXPECT_EQ(::getsockopt(p.a.get(), SOL_SOCKET, opt, &v, &l), 0);
    return v;
  };
  const int rcv = get(SO_RCVBUF), bytes = 40 << 10;
  ASSERT_NE(rcv, 2 * bytes);  // (so that a receive buffer set alike would show)
  net::set_send_buffer(p.a.get(), bytes);
  EXPECT_EQ(get(SO_SNDBUF), 2 * bytes);  // Linux reports twice what was set (socket(7))
  EXPECT_EQ(get(SO_RCVBUF), rcv);
}

// What a stall report adds about a connection: nothing while it is well;
// the sender's retransmission backoff and this end's drops when not.
TEST(Net, TcpTroubleIsSaidOnlyWhenThereIsSome) {
  Pair p = connected_pair();
  const char byte = 1;
  ASSERT_EQ(::send(p.a.get(), &byte, 1, 0), 1);
  const net::TcpHealth h = net::tcp_health(p.a.get());
  EXPECT_TRUE(h.known);
  EXPECT_GT(h.rto_us, 0u);
  EXPECT_EQ(net::describe_trouble(h), "");
  EXPECT_FALSE(net::tcp_health(-1).known);
  net::TcpHealth bad = h;
  bad.retransmits = 7;
  bad.backoff = 7;
  bad.rto_us = 26112000;
  bad.unacked = 12;
  bad.drops = 57;
  EXPECT_EQ(net::describe_trouble(bad), ", retransmitting: backoff 7, timer 26.1 s, 12 segments unacked; 57 packets dropped here");
  bad.retransmits = bad.backoff = 0;
  EXPECT_EQ(net::describe_trouble(bad), ", 57 packets dropped here");
}

TEST(Net, LargeTransferBothWaysOnNonBlockingSockets) {
  Pair p = connected_pair();
  net::set_nonblocking(p.a.get(), true);
  net::set_nonblocking(p.b.get(), true);
  std::vector<uint8_t> out(24 << 20);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 131 + (i >> 16));
  bool wrote = false;
  std::thread w([&] { wrote = net::write_full(p.a.get(), out.data(), out.size(), in(60s)); });
  std::vector<uint8_t> got(out.size());
  EXPECT_TRUE(net::read_full(p.b.get(), got.data(), got.size(), in(60s)));
  w.join();
  EXPECT_TRUE(wrote);
  EXPECT_TRUE(got == out);
}

TEST(Net, FdOwnership) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  Fd a(fds[0]);
  Fd b(std::move(a));
  EXPECT_FALSE(a);
  EXPECT_EQ(b.get(), fds[0]);
  Fd c(fds[1]);
  c = std::move(b);  // closes fds[1]
  EXPECT_EQ(c.get(), fds[0]);
  EXPECT_EQ(::fcntl(fds[1], F_GETFD), -1);
  c.reset();
  EXPECT_EQ(::fcntl(fds[0], F_GETFD), -1);
}

TEST(Net, HostIdentityIsStableAndSharedWithChildren) {
  const std::string id = net::host_identity();
  EXPECT_EQ(id, net::host_identity());
  EXPECT_EQ(id.rfind(net::hostname(), 0), 0u) << id;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (boot && std::getline(boot, boot_id)) {
    EXPECT_NE(id.find(boot_id), std::string::npos) << id;
  }
  char ns[128] = {};
  if (::readlink("/proc/self/ns/net", ns, sizeof(ns) - 1) > 0) {
    EXPECT_NE(id.find(ns), std::string::npos) << id;
  }

  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::string child = net::host_identity();
    ssize_t n = ::write(fds[1], child.data(), child.size());
    ::_exit(n == static_cast<ssize_t>(child.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  std::string got;
  char buf[256];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(got, id);
}

}  // namespace
