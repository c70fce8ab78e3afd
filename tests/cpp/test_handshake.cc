// Tests of the handshake every link opens with (transport/handshake.h) as
// pure functions, and of the TCP transport's side of it driven byte by byte
// from a raw socket (docs/security.md). Synchronisation: the sockets' own
// events (answers, EOF), never sleeps.
#include <gtest/gtest.h>
#include <poll.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/auth.h"
#include "common/net.h"
#include "security_util.h"
#include "shoal/error.h"
#include "transport/handshake.h"
#include "transport/hybrid_transport.h"
#include "transport/liveness.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/tcp_transport.h"

namespace shoal {
namespace {

using namespace test_security;

// ---- the handshake (every link) as pure functions --------------------------

TEST(Handshake, HelloAndAnswerRoundTrip) {
  auth::Secret key = auth::Secret::from_hex(kKeyA), other = auth::Secret::from_hex(kKeyB);
  transport::handshake::Identity r0{77, 0, 4, &key}, r2{77, 2, 4, &key};
  transport::handshake::Hello h = transport::handshake::make_hello(r0, 2);
  EXPECT_EQ(transport::handshake::check_hello(h, r2), "");
  transport::handshake::Accept a = transport::handshake::make_accept(h, r2);
  EXPECT_EQ(transport::handshake::check_accept(a, h, r0), "");

  // The answer to one hello is worthless for another (a fresh nonce each).
  transport::handshake::Hello h2 = transport::handshake::make_hello(r0, 2);
  EXPECT_TRUE(contains(transport::handshake::check_accept(a, h2, r0), "did not prove"));
  // Wrong secret on either side.
  transport::handshake::Identity r2x{77, 2, 4, &other}, r0x{77, 0, 4, &other};
  EXPECT_TRUE(contains(transport::handshake::check_hello(h, r2x), "did not prove"));
  EXPECT_TRUE(contains(transport::handshake::check_accept(a, h, r0x), "did not prove"));
  // Meant for another rank, another job, or lying about itself.
  transport::handshake::Identity r1{77, 1, 4, &key}, r2other_job{78, 2, 4, &key};
  EXPECT_TRUE(contains(transport::handshake::check_hello(h, r1), "reach rank 2"));
  EXPECT_TRUE(contains(transport::handshake::check_hello(h, r2other_job), "another job"));
  transport::handshake::Hello lie = h;
  lie.rank = 1;  // the proof covers the rank
  EXPECT_TRUE(contains(transport::handshake::check_hello(lie, r2), "did not prove"));
  lie = h;
  lie.rank = 3;
  EXPECT_TRUE(contains(transport::handshake::check_hello(lie, r2), "bad rank"));
  lie = h;
  lie.version = 1;
  EXPECT_TRUE(contains(transport::handshake::check_hello(lie, r2), "protocol version 1"));
  const uint8_t http[] = "GET / HTTP/1.0";
  EXPECT_EQ(transport::handshake::check_hello_prefix(http, 3), "");  // too little to judge
  EXPECT_TRUE(contains(transport::handshake::check_hello_prefix(http, 4), "bad magic"));
  EXPECT_EQ(transport::handshake::check_hello_prefix(reinterpret_cast<const uint8_t*>(&h), 6), "");
  // Bound to its link: a TCP hello is no shared-memory or arena hello.
  transport::handshake::Identity r2shm{77, 2, 4, &key, auth::Link::kShm};
  EXPECT_TRUE(contains(transport::handshake::check_hello(h, r2shm), "a hello for a TCP connection")) << transport::handshake::check_hello(h, r2shm);
  lie = h;
  lie.link = static_cast<uint8_t>(auth::Link::kShm);  // the proof covers the link
  EXPECT_TRUE(contains(transport::handshake::check_hello(lie, r2shm), "did not prove"));
  transport::handshake::Accept wrong_link = a;
  wrong_link.link = static_cast<uint8_t>(auth::Link::kArena);
  EXPECT_TRUE(contains(transport::handshake::check_accept(wrong_link, h, r0), "an answer for"));
  // Carried as text (the arena's, through the store): exactly one message.
  transport::handshake::Hello back;
  ASSERT_TRUE(transport::handshake::from_hex(transport::handshake::to_hex(h), &back));
  EXPECT_EQ(transport::handshake::check_hello(back, r2), "");
  EXPECT_FALSE(transport::handshake::from_hex(transport::handshake::to_hex(h) + "00", &back));
}

// ---- the TCP transport against a raw socket --------------------------------

// Rank 1 of a 2-rank job, with a raw socket in the test playing rank 0 (or a
// stranger). Everything runs on the test thread.
// Every peer listens at `at` (what the rendezvous would say).
struct FixedAddress : transport::Liveness {
  explicit FixedAddress(transport::PeerAddress a) : at(std::move(a)) {}
  transport::PeerAddress address(int) override { return at; }
  transport::PeerAddress at;
};

struct AcceptingRank {
  auth::Secret key = auth::Secret::from_hex(kKeyA);
  uint64_t job = 0x5eed;
  FixedAddress peers{{"127.0.0.1", 1, "raw", "raw", ""}};
  transport::tcp::TcpTransport* tcp = nullptr;  // owned by t
  std::unique_ptr<transport::HybridTransport> t;  // the engine that drives it

  explicit AcceptingRank(const std::string& congestion = "auto") {
    transport::tcp::TcpOptions o;
    o.congestion = congestion;
    o.rank = 1;
    o.size = 2;
    o.job = job;
    o.secret = key;
    o.bind_host = "127.0.0.1";
    o.liveness = &peers;
    o.hello_timeout = kStrangerTimeout;
    auto channel = std::make_unique<transport::tcp::TcpTransport>(std::move(o));
    tcp = channel.get();
    t = std::make_unique<transport::HybridTransport>(std::move(channel), nullptr, transport::HybridOptions{});
  }
  net::Fd connect() {
    return net::connect_tcp("127.0.0.1", tcp->listen_port(), Clock::now() + 10s);
  }
  void drive() { t->poll_wait(Clock::now() + 20ms); }
  // Sends `bytes` (then closes its sending side when `eof`) and drives the
  // transport until it has closed the connection.
  bool refused(const void* bytes, size_t n, bool eof = false) {
    net::Fd s = connect();
    if (n) {
      EXPECT_TRUE(net::write_full(s.get(), bytes, n, Clock::now() + 10s));
    }
    if (eof) ::shutdown(s.get(), SHUT_WR);
    return closed_by_peer(s.get(), Clock::now() + 20s, [&] { drive(); });
  }
};

void init_recv(transport::Request& r, std::vector<uint8_t>* buf) {
  r.kind = transport::Request::Kind::kRecv;
  r.peer = 0;
  r.tag = transport::Tag{transport::Space::kCollective, 1, 0};
  r.fp.coll = 1;
  r.fp.count = buf->size();
  r.buf = buf->data();
  r.len = buf->size();
}

// Plays rank 0: a valid hello, then checks the transport's answer.
net::Fd authenticated_peer(AcceptingRank& a, const auth::Secret& key) {
  net::Fd s = a.connect();
  transport::handshake::Identity me{a.job, 0, 2, &key};
  transport::handshake::Hello h = transport::handshake::make_hello(me, 1);
  EXPECT_TRUE(net::write_full(s.get(), &h, sizeof(h), Clock::now() + 10s));
  for (;;) {  // the answer comes once the transport runs
    pollfd p{s.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) break;
    a.drive();
  }
  transport::handshake::Accept ans;
  EXPECT_TRUE(net::read_full(s.get(), &ans, sizeof(ans), Clock::now() + 10s));
  EXPECT_EQ(transport::handshake::check_accept(ans, h, me), "");
  return s;
}

void send_frame(int fd, const transport::Request& like, const std::vector<uint8_t>& payload) {
  transport::tcp::FrameHeader f = transport::tcp::make_header(like);
  f.length = payload.size();
  ASSERT_TRUE(net::write_full(fd, &f, sizeof(f), Clock::now() + 10s));
  ASSERT_TRUE(net::write_full(fd, payload.data(), payload.size(), Clock::now() + 10s));
}

TEST(TcpTransportAuth, StrangersAreRejectedAndLoggedThenTheRankPeerIsServed) {
  AcceptingRank a;
  testing::internal::CaptureStderr();
  transport::handshake::Identity right{a.job, 0, 2, &a.key};
  auth::Secret wrong_key = auth::Secret::from_hex(kKeyB);
  transport::handshake::Identity wrong{a.job, 0, 2, &wrong_key}, stale{a.job + 1, 0, 2, &a.key};

  const char junk[] = "GET / HTTP/1.0\r\n\r\n";
  EXPECT_TRUE(a.refused(junk, sizeof(junk)));
  transport::handshake::Hello h = transport::handshake::make_hello(wrong, 1);
  EXPECT_TRUE(a.refused(&h, sizeof(h)));  // another secret
  h = transport::handshake::make_hello(stale, 1);
  EXPECT_TRUE(a.refused(&h, sizeof(h)));  // a previous run's communicator
  h = transport::handshake::make_hello(right, 1);
  h.version = 1;
  EXPECT_TRUE(a.refused(&h, 8));  // an older release: refused on its first 8 bytes
  h = transport::handshake::make_hello(right, 1);
  h.mac[0] ^= 1;
  EXPECT_TRUE(a.refused(&h, sizeof(h)));  // a forged proof
  h = transport::handshake::make_hello(right, 1);
  EXPECT_TRUE(a.refused(&h, 50, /*eof=*/true));  // cut short
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(log, "shoal: rank 1: rejected a connection from 127.0.0.1:")) << log;
  EXPECT_TRUE(contains(log, "bad magic")) << log;
  EXPECT_TRUE(contains(log, "did not prove the job's secret")) << log;
  EXPECT_TRUE(contains(log, "another job")) << log;
  EXPECT_TRUE(contains(log, "protocol version 1")) << log;
  EXPECT_TRUE(contains(log, "closed before its hello")) << log;
  EXPECT_EQ(a.t->broken(), nullptr);

  // One that connects and resets at once (its address can no longer be
  // asked for): refused without harm, whenever the rank gets to it.
  {
    net::Fd s = a.connect();
    linger lg{1, 0};
    ASSERT_EQ(::setsockopt(s.get(), SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
  }

  // The rank's real peer still gets through, and its frames are delivered.
  std::vector<uint8_t> buf(1000), payload(1000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7);
  transport::Request r;
  init_recv(r, &buf);
  a.t->post_recv(&r);
  net::Fd peer = authenticated_peer(a, a.key);
  send_frame(peer.get(), r, payload);
  transport::Request* rs[] = {&r};
  a.t->wait(rs, 1, Clock::now() + 20s);
  EXPECT_EQ(buf, payload);

  // A replay of a valid hello once the rank is connected is refused too.
  testing::internal::CaptureStderr();
  h = transport::handshake::make_hello(right, 1);
  EXPECT_TRUE(a.refused(&h, sizeof(h)));
  log = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(log, "rank 0 is already connected")) << log;
}

TEST(TcpTransportAuth, SilentStrangerIsDroppedAfterTheHelloTimeout) {
  AcceptingRank a;
  testing::internal::CaptureStderr();
  net::Fd s = a.connect();
  const auto t0 = Clock::now();
  EXPECT_TRUE(closed_by_peer(s.get(), Clock::now() + 30s, [&] { a.drive(); }));
  EXPECT_GE(Clock::now() - t0, kStrangerTimeout - 10ms);
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(log, "no complete hello within 1000 ms")) << log;
  EXPECT_EQ(a.t->broken(), nullptr);
}

TEST(TcpTransportAuth, MalformedFrameFromAnAuthenticatedPeerIsAConnectionError) {
  AcceptingRank a;
  std::vector<uint8_t> buf(16);
  transport::Request r;
  init_recv(r, &buf);
  a.t->post_recv(&r);
  net::Fd peer = authenticated_peer(a, a.key);
  transport::tcp::FrameHeader f = transport::tcp::make_header(r);
  f.kind = 9;
  ASSERT_TRUE(net::write_full(peer.get(), &f, sizeof(f), Clock::now() + 10s));
  transport::Request* rs[] = {&r};
  try {
    a.t->wait(rs, 1, Clock::now() + 20s);
    FAIL() << "a malformed frame was accepted";
  } catch (const PeerLost& e) {
    EXPECT_TRUE(contains(e.what(), "malformed frame header")) << e.what();
  }
}

TEST(TcpTransportAuth, ConnectorRefusesAnAcceptorWithoutTheSecret) {
  // The "peer" is a listener that answers hellos with another secret's proof.
  auth::Secret key = auth::Secret::from_hex(kKeyA), other = auth::Secret::from_hex(kKeyB);
  net::Fd l = net::listen_tcp("127.0.0.1", 0);
  uint16_t port = net::bound_port(l.get());
  transport::tcp::TcpOptions o;
  o.rank = 0;
  o.size = 2;
  o.job = 99;
  o.secret = key;
  o.bind_host = "127.0.0.1";
  o.connect_timeout = 10s;
  FixedAddress peers({"127.0.0.1", port, "impostor", "elsewhere", ""});
  o.liveness = &peers;
  transport::HybridTransport t(std::make_unique<transport::tcp::TcpTransport>(std::move(o)), nullptr, {});
  std::vector<uint8_t> buf(8);
  transport::Request r;
  init_recv(r, &buf);
  r.peer = 1;
  t.post_recv(&r);  // connects and sends the hello
  net::Fd s = net::accept_tcp(l.get());
  ASSERT_TRUE(s);
  transport::handshake::Hello h;
  ASSERT_TRUE(net::read_full(s.get(), &h, sizeof(h), Clock::now() + 10s));
  transport::handshake::Identity impostor{99, 1, 2, &other};
  transport::handshake::Accept ans = transport::handshake::make_accept(h, impostor);
  ASSERT_TRUE(net::write_full(s.get(), &ans, sizeof(ans), Clock::now() + 10s));
  // Frames behind a bad answer are never read.
  transport::tcp::FrameHeader f = transport::tcp::make_header(r);
  f.length = 8;
  ASSERT_TRUE(net::write_full(s.get(), &f, sizeof(f), Clock::now() + 10s));
  ASSERT_TRUE(net::write_full(s.get(), "INJECTED", 8, Clock::now() + 10s));
  testing::internal::CaptureStderr();
  transport::Request* rs[] = {&r};
  try {
    t.wait(rs, 1, Clock::now() + 20s);
    FAIL() << "an impostor's answer was accepted";
  } catch (const PeerLost& e) {
    EXPECT_TRUE(contains(e.what(), "its answer to this rank's hello was refused")) << e.what();
  }
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(log, "rejected the answer of rank 1")) << log;
  EXPECT_NE(std::string(reinterpret_cast<char*>(buf.data()), 8), "INJECTED");
}

// ---- the TCP transport's choice of congestion control ----------------------

// The congestion control of this process's connected TCP socket whose peer's
// address (`peer_side`) or own address is `addr` ("" if there is none).
std::string congestion_of_socket(const std::string& addr, bool peer_side) {
  for (int fd = 0; fd < 4096; ++fd) {
    std::string a;
    try {
      const std::string peer = net::peer_address(fd);  // throws unless connected (no listener)
      a = peer_side ? peer : net::local_address(fd);
    } catch (const Error&) {
      continue;
    }
    if (a != addr) continue;
    char name[32] = {};
    socklen_t len = sizeof(name);
    if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "";
    return std::string(name, strnlen(name, len));
  }
  return "";
}

// With SHOAL_TCP_CONGESTION's value `mode`, what rank 0's socket to rank 1 (it
// connects) and rank 1's socket from rank 0 (it accepts) use.
std::pair<std::string, std::string> congestion_of_transports(const std::string& mode) {
  auth::Secret key = auth::Secret::from_hex(kKeyA);
  AcceptingRank acceptor(mode);  // rank 1; it listens on loopback
  transport::tcp::TcpOptions o;
  o.rank = 0;
  o.size = 2;
  o.job = acceptor.job;
  o.secret = key;
  o.bind_host = "127.0.0.1";
  o.connect_timeout = 10s;
  o.congestion = mode;
  FixedAddress peers({"127.0.0.1", acceptor.tcp->listen_port(), "rank 1", "here", ""});
  o.liveness = &peers;
  transport::HybridTransport t(std::make_unique<transport::tcp::TcpTransport>(std::move(o)), nullptr, {});
  std::vector<uint8_t> out(8, 7), in(8, 0);
  transport::Request s, r;
  init_recv(s, &out);  // (then made a send to rank 1)
  s.kind = transport::Request::Kind::kSend;
  s.peer = 1;
  init_recv(r, &in);
  t.post_send(&s);  // connects
  acceptor.t->post_recv(&r);
  while (!r.complete) {
    t.poll();
    acceptor.drive();
  }
  EXPECT_EQ(in, out);
  const std::string listener = "127.0.0.1:" + std::to_string(acceptor.tcp->listen_port());
  return {congestion_of_socket(listener, true), congestion_of_socket(listener, false)};
}

TEST(TcpTransportTuning, ConnectionsWithinTheHostUseRenoUnlessTold) {
  const std::string host_default = net::default_congestion();
  ASSERT_FALSE(host_default.empty());
  // auto: loopback, so reno, chosen before the connection was made (on the
  // connecting socket and on the listener), both ways.
  EXPECT_EQ(congestion_of_transports("auto"), std::make_pair(std::string("reno"), std::string("reno")));
  // system: the host's default, both ways.
  EXPECT_EQ(congestion_of_transports("system"), std::make_pair(host_default, host_default));
  // A name: that one, both ways. One that neither auto nor system would give
  // here, among those this process may set.
  std::istringstream available(net::available_congestion());
  std::string name, other;
  while (other.empty() && available >> name) {
    if (name != "reno" && name != host_default && net::congestion_refusal(name).empty()) other = name;
  }
  if (other.empty()) GTEST_SKIP() << "no third congestion control this process may set";
  EXPECT_EQ(congestion_of_transports(other), std::make_pair(other, other));
}

// (A connection that leaves the host needs a second network namespace: the
// net bed's tests run ranks across them.)
TEST(TcpTransportTuning, WithinHostOnLoopbackAndNotWhereItCannotTell) {
  net::Fd l = net::listen_tcp("127.0.0.1", 0);
  net::Fd c = net::connect_tcp("127.0.0.1", net::bound_port(l.get()), Clock::now() + 10s);
  net::Fd a = net::accept_tcp(l.get());
  ASSERT_TRUE(a);
  EXPECT_TRUE(net::within_host(c.get()));
  EXPECT_TRUE(net::within_host(a.get()));
  EXPECT_FALSE(net::within_host(l.get()));  // not connected: cannot tell
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  net::Fd u0(sv[0]), u1(sv[1]);
  EXPECT_FALSE(net::within_host(u0.get()));  // not TCP
}

}  // namespace
}  // namespace shoal
