// Tests of "strangers are kept out" (docs/security.md): the HMAC primitives,
// the store's handshake, and whole jobs with strangers knocking on every
// door (the links' handshake and the TCP transport's side of it:
// test_handshake.cc).
// Synchronisation: the sockets' own events (answers, EOF) and the store,
// never sleeps.
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cinttypes>
#include <cstring>
#include <string>
#include <thread>

#include "common/auth.h"
#include "common/net.h"
#include "harness.h"
#include "security_util.h"
#include "rendezvous/store_protocol.h"
#include "shoal/error.h"
#include "shoal/store.h"
#include "transport/handshake.h"
#include "transport/hybrid_transport.h"
#include "transport/liveness.h"
#include "transport/shm/shm_segment.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/tcp_transport.h"

namespace shoal {
namespace {

using namespace test_security;
using test::run_ranks;

// ---- the primitives ------------------------------------------------------

TEST(Auth, HmacSha256MatchesRfc4231) {
  // RFC 4231, test cases 1 and 3.
  auth::Mac m1 = auth::hmac(auth::Secret::from_hex("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b"), "Hi There", 8);
  const uint8_t want1[] = {0xb0, 0x34, 0x4c, 0x61, 0xd8, 0xdb, 0x38, 0x53, 0x5c, 0xa8, 0xaf,
                           0xce, 0xaf, 0x0b, 0xf1, 0x2b, 0x88, 0x1d, 0xc2, 0x00, 0xc9, 0x83,
                           0x3d, 0xa7, 0x26, 0xe9, 0x37, 0x6c, 0x2e, 0x32, 0xcf, 0xf7};
  EXPECT_TRUE(auth::equal(m1.data(), want1, sizeof(want1)));
  std::string data(50, '\xdd');
  auth::Mac m3 = auth::hmac(auth::Secret::from_hex(std::string(40, 'a')), data.data(), data.size());
  const uint8_t want3[] = {0x77, 0x3e, 0xa9, 0x1e, 0x36, 0x80, 0x0e, 0x46, 0x85, 0x4d, 0xb8,
                           0xeb, 0xd0, 0x91, 0x81, 0xa7, 0x29, 0x59, 0x09, 0x8b, 0x3e, 0xf8,
                           0xc1, 0x22, 0xd9, 0x63, 0x55, 0x14, 0xce, 0xd5, 0x65, 0xfe};
  EXPECT_TRUE(auth::equal(m3.data(), want3, sizeof(want3)));
  EXPECT_FALSE(auth::equal(m1.data(), want3, sizeof(want3)));
}

TEST(Auth, SecretParsing) {
  EXPECT_EQ(auth::Secret::from_hex(std::string("  ") + kKeyA + "\n").hex(), kKeyA);
  EXPECT_EQ(auth::Secret::from_hex(kKeyA).size(), 32u);
  EXPECT_THROW(auth::Secret::from_hex("abc"), InvalidArgument);                     // odd
  EXPECT_THROW(auth::Secret::from_hex(std::string(30, 'a')), InvalidArgument);      // 15 bytes
  EXPECT_THROW(auth::Secret::from_hex(std::string(130, 'a')), InvalidArgument);     // 65 bytes
  EXPECT_THROW(auth::Secret::from_hex(std::string(64, 'g')), InvalidArgument);      // not hex
  try {
    auth::Secret::from_hex("zz", "SHOAL_SECRET");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "SHOAL_SECRET")) << e.what();
  }
  auth::Secret r1 = auth::Secret::random(), r2 = auth::Secret::random();
  EXPECT_EQ(r1.size(), auth::kSecretBytes);
  EXPECT_NE(r1.hex(), r2.hex());
  {
    ScopedSecret s(kKeyB);
    EXPECT_EQ(auth::Secret::from_env().hex(), kKeyB);
  }
  EXPECT_TRUE(auth::Secret::from_env().empty());
}

TEST(Auth, ProofRoundTripAndEveryFieldCounts) {
  auth::Secret key = auth::Secret::from_hex(kKeyA);
  auth::Transcript t;
  t.link = auth::Link::kTcp;
  t.job = 0x1234567890abcdefULL;
  t.from = 2;
  t.to = 5;
  t.size = 8;
  t.connector = auth::fresh_nonce();
  t.acceptor = auth::fresh_nonce();
  auth::Mac m = auth::prove(key, auth::Role::kConnector, t);
  EXPECT_TRUE(auth::verify(key, auth::Role::kConnector, t, m.data()));
  EXPECT_FALSE(auth::verify(key, auth::Role::kAcceptor, t, m.data()));  // no reflection
  EXPECT_FALSE(auth::verify(auth::Secret::from_hex(kKeyB), auth::Role::kConnector, t, m.data()));
  EXPECT_FALSE(auth::verify(auth::Secret(), auth::Role::kConnector, t, m.data()));
  auto changed = [&](auto edit) {
    auth::Transcript u = t;
    edit(u);
    return !auth::verify(key, auth::Role::kConnector, u, m.data());
  };
  EXPECT_TRUE(changed([](auth::Transcript& u) { u.link = auth::Link::kShm; }));
  EXPECT_TRUE(changed([](auth::Transcript& u) { u.job ^= 1; }));
  EXPECT_TRUE(changed([](auth::Transcript& u) { u.from = 3; }));
  EXPECT_TRUE(changed([](auth::Transcript& u) { u.to = 4; }));
  EXPECT_TRUE(changed([](auth::Transcript& u) { u.size = 9; }));
  EXPECT_TRUE(changed([](auth::Transcript& u) { u.connector[31] ^= 1; }));
  EXPECT_TRUE(changed([](auth::Transcript& u) { u.acceptor[0] ^= 0x80; }));
  auth::Mac bad = m;
  bad[7] ^= 1;
  EXPECT_FALSE(auth::verify(key, auth::Role::kConnector, t, bad.data()));
  EXPECT_NE(auth::fresh_nonce(), auth::fresh_nonce());
}

TEST(Auth, SealedSecretOpensOnlyForItsRecipientAndContext) {
  auth::Secret s = auth::Secret::random();
  auth::Recipient me, other;
  std::string sealed = auth::seal(s, me.public_hex(), "job 7");
  EXPECT_EQ(me.open(sealed, "job 7").hex(), s.hex());
  EXPECT_NE(auth::seal(s, me.public_hex(), "job 7"), sealed);  // a fresh key pair each time
  EXPECT_THROW(other.open(sealed, "job 7"), InvalidArgument);
  EXPECT_THROW(me.open(sealed, "job 8"), InvalidArgument);
  for (size_t i : {size_t{0}, size_t{70}, sealed.size() - 1}) {
    std::string altered = sealed;
    altered[i] = altered[i] == '0' ? '1' : '0';
    EXPECT_THROW(me.open(altered, "job 7"), InvalidArgument) << i;
  }
  EXPECT_THROW(me.open("00", "job 7"), InvalidArgument);
  EXPECT_THROW(auth::seal(s, "not a key", "job 7"), InvalidArgument);
}

// ---- the store -------------------------------------------------------------

std::unique_ptr<TcpStore> store(bool server, uint16_t port, const std::string& secret) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.is_server = server;
  o.secret = secret;
  o.timeout = 30s;
  o.connect_timeout = 10s;
  o.handshake_timeout = kStrangerTimeout;
  return std::make_unique<TcpStore>(o);
}

std::string store_error(uint16_t port, const std::string& secret) {
  try {
    store(false, port, secret);
  } catch (const StoreError& e) {
    return e.what();
  }
  return "";
}

TEST(StoreAuth, OnlyClientsWithTheSecretAreServed) {
  auto server = store(true, 0, kKeyA);
  const uint16_t port = server->port();
  auto good = store(false, port, kKeyA);
  good->set_str("k", "v");
  EXPECT_EQ(server->get_str("k"), "v");

  testing::internal::CaptureStderr();
  std::string none = store_error(port, "");
  std::string wrong = store_error(port, kKeyB);
  // A raw client that claims a secret but proves it wrongly.
  net::Fd s = net::connect_tcp("127.0.0.1", port, Clock::now() + 10s);
  auth::Secret key_b = auth::Secret::from_hex(kKeyB);
  auth::Nonce nonce;
  Bytes hello = store_proto::client_hello(key_b, &nonce);
  ASSERT_TRUE(net::write_full(s.get(), hello.data(), hello.size(), Clock::now() + 10s));
  uint8_t answer[store_proto::kAnswerBytes];
  ASSERT_TRUE(net::read_full(s.get(), answer, sizeof(answer), Clock::now() + 10s));
  Bytes forged(store_proto::kProofBytes, 0x42);
  ASSERT_TRUE(net::write_full(s.get(), forged.data(), forged.size(), Clock::now() + 10s));
  Bytes get = {6, 0, 0, 0, 2, 1, 0, 0, 0, 'k'};  // GET "k", behind the forged proof
  net::write_full(s.get(), get.data(), get.size(), Clock::now() + 10s);
  EXPECT_TRUE(closed_by_peer(s.get(), Clock::now() + 20s));
  // Junk before any handshake.
  net::Fd j = net::connect_tcp("127.0.0.1", port, Clock::now() + 10s);
  ASSERT_TRUE(net::write_full(j.get(), "GET / HTTP/1.0\r\n\r\n", 18, Clock::now() + 10s));
  EXPECT_TRUE(closed_by_peer(j.get(), Clock::now() + 20s));
  good->set_str("after", "1");  // (the server thread has handled the strangers before this)
  std::string log = testing::internal::GetCapturedStderr();

  EXPECT_TRUE(contains(none, "requires the job's secret and this process has none")) << none;
  EXPECT_TRUE(contains(wrong, "did not prove the job's secret")) << wrong;
  EXPECT_TRUE(contains(log, "rejected a connection from 127.0.0.1:")) << log;
  EXPECT_TRUE(contains(log, "it has no secret")) << log;
  EXPECT_TRUE(contains(log, "it refused this store's proof")) << log;
  EXPECT_TRUE(contains(log, "it did not prove the job's secret")) << log;
  EXPECT_TRUE(contains(log, "not a shoal store client (bad magic)")) << log;
  EXPECT_EQ(store(false, port, kKeyA)->get_str("after"), "1");
  EXPECT_EQ(good->get_str("k"), "v");
}

TEST(StoreAuth, ClientWithASecretRefusesAStoreWithoutOne) {
  auto server = store(true, 0, "");
  std::string err = store_error(server->port(), kKeyA);
  EXPECT_TRUE(contains(err, "does not check the job's secret")) << err;
  // Without secrets on either side the store works as before.
  store(false, server->port(), "")->set_str("a", "b");
  EXPECT_EQ(server->get_str("a"), "b");
  // SHOAL_SECRET is the default.
  ScopedSecret env(kKeyA);
  try {
    store(false, server->port(), "");
    FAIL() << "a client with SHOAL_SECRET accepted a store without it";
  } catch (const StoreError& e) {
    EXPECT_TRUE(contains(e.what(), "does not check the job's secret")) << e.what();
  }
}

TEST(StoreAuth, SilentStrangerIsDroppedAfterTheHandshakeTimeout) {
  auto server = store(true, 0, kKeyA);
  testing::internal::CaptureStderr();
  net::Fd s = net::connect_tcp("127.0.0.1", server->port(), Clock::now() + 10s);
  ASSERT_TRUE(net::write_full(s.get(), "SH", 2, Clock::now() + 10s));  // a hello that never ends
  const auto t0 = Clock::now();
  EXPECT_TRUE(closed_by_peer(s.get(), Clock::now() + 30s));
  EXPECT_GE(Clock::now() - t0, kStrangerTimeout - 10ms);
  server->set_str("alive", "1");
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(log, "no complete handshake within 1000 ms")) << log;
}

TEST(StoreAuth, MalformedRequestsAfterTheHandshakeCloseOnlyThatConnection) {
  auto server = store(true, 0, kKeyA);
  auth::Secret key = auth::Secret::from_hex(kKeyA);
  auto authed = [&] {
    net::Fd s = net::connect_tcp("127.0.0.1", server->port(), Clock::now() + 10s);
    auth::Nonce nonce;
    Bytes hello = store_proto::client_hello(key, &nonce);
    EXPECT_TRUE(net::write_full(s.get(), hello.data(), hello.size(), Clock::now() + 10s));
    uint8_t answer[store_proto::kAnswerBytes];
    EXPECT_TRUE(net::read_full(s.get(), answer, sizeof(answer), Clock::now() + 10s));
    Bytes proof;
    EXPECT_EQ(store_proto::check_answer(answer, key, nonce, &proof), "");
    EXPECT_TRUE(net::write_full(s.get(), proof.data(), proof.size(), Clock::now() + 10s));
    return s;
  };
  for (Bytes bad : {Bytes{0xff, 0xff, 0xff, 0xff}, Bytes{0, 0, 0, 0}, Bytes{4, 0, 0, 0, 0x7f, 1, 2, 3},
                    Bytes{6, 0, 0, 0, 2, 9, 0, 0, 0, 'k'}, Bytes{5, 0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff}}) {
    net::Fd s = authed();
    ASSERT_TRUE(net::write_full(s.get(), bad.data(), bad.size(), Clock::now() + 10s));
    EXPECT_TRUE(closed_by_peer(s.get(), Clock::now() + 20s));
  }
  // A well-formed request on a raw authenticated connection is served.
  net::Fd s = authed();
  Bytes set = {12, 0, 0, 0, 1, 1, 0, 0, 0, 'x', 2, 0, 0, 0, 'o', 'k'};
  ASSERT_TRUE(net::write_full(s.get(), set.data(), set.size(), Clock::now() + 10s));
  uint8_t reply[5];
  ASSERT_TRUE(net::read_full(s.get(), reply, sizeof(reply), Clock::now() + 10s));
  EXPECT_EQ(reply[4], 0);  // ok
  EXPECT_EQ(server->get_str("x"), "ok");
}

TEST(StoreProtocol, ParseRequest) {
  store_proto::Request req;
  const uint8_t set[] = {1, 1, 0, 0, 0, 'k', 2, 0, 0, 0, 'v', 'w'};
  ASSERT_TRUE(store_proto::parse_request(set, sizeof(set), &req));
  EXPECT_EQ(req.cmd, store_proto::Cmd::kSet);
  EXPECT_EQ(req.key, "k");
  EXPECT_EQ(req.value, "vw");
  EXPECT_FALSE(store_proto::parse_request(set, sizeof(set) - 1, &req));  // cut short
  const uint8_t wait[] = {5, 2, 0, 0, 0, 1, 0, 0, 0, 'a', 0, 0, 0, 0};
  ASSERT_TRUE(store_proto::parse_request(wait, sizeof(wait), &req));
  ASSERT_EQ(req.keys.size(), 2u);
  EXPECT_EQ(req.keys[0], "a");
  EXPECT_EQ(req.keys[1], "");
  const uint8_t many[] = {4, 0xff, 0xff, 0x0f, 0x00};  // a million keys in no bytes
  EXPECT_FALSE(store_proto::parse_request(many, sizeof(many), &req));
  const uint8_t unknown[] = {0x7f};
  EXPECT_FALSE(store_proto::parse_request(unknown, sizeof(unknown), &req));
  const uint8_t* body;
  size_t len, used;
  const uint8_t frame[] = {2, 0, 0, 0, 9, 9, 1};
  EXPECT_EQ(store_proto::next_frame(frame, 3, &body, &len, &used), store_proto::FrameStatus::kNeedMore);
  EXPECT_EQ(store_proto::next_frame(frame, sizeof(frame), &body, &len, &used), store_proto::FrameStatus::kOk);
  EXPECT_EQ(len, 2u);
  EXPECT_EQ(used, 6u);
  const uint8_t zero[] = {0, 0, 0, 0};
  EXPECT_EQ(store_proto::next_frame(zero, sizeof(zero), &body, &len, &used), store_proto::FrameStatus::kBad);
}

// ---- whole jobs ------------------------------------------------------------

// Connects to rank `peer`'s TCP port and its shared-memory socket and to the
// store as strangers of every kind; returns once each door was shut.
void knock_everywhere(const std::shared_ptr<Store>& store, int peer, uint16_t store_port) {
  const auto deadline = Clock::now() + 60s;
  std::string addr = store->get_str("shoal/c0/addr/" + std::to_string(peer));
  std::string host = addr.substr(0, addr.find(' '));
  uint16_t port = static_cast<uint16_t>(std::atoi(addr.substr(addr.find(' ') + 1).c_str()));
  uint64_t job = std::stoull(store->get_str("shoal/c0/uid"));
  auth::Secret wrong = auth::Secret::from_hex(kKeyB);

  // TCP: junk, a hello with the wrong secret, a stale job's hello.
  auto tcp = [&](const void* p, size_t n) {
    net::Fd s = net::connect_tcp(host, port, deadline);
    net::write_full(s.get(), p, n, deadline);
    SHOAL_CHECK(closed_by_peer(s.get(), deadline));
  };
  const char junk[] = "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 (a TLS client hello)";
  tcp(junk, sizeof(junk));
  transport::handshake::Identity as_rank0{job, 0, 2, &wrong};
  transport::handshake::Hello h = transport::handshake::make_hello(as_rank0, peer);
  tcp(&h, sizeof(h));
  transport::handshake::Identity stale{job ^ 0x1000, 0, 2, &wrong};
  h = transport::handshake::make_hello(stale, peer);
  tcp(&h, sizeof(h));

  // Shared memory: a hello with the wrong secret on the rank's Unix socket.
  std::string name = transport::shm::ShmTransport::socket_name(job, peer);
  net::Fd u(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  if (::connect(u.get(), reinterpret_cast<sockaddr*>(&a),
                static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())) == 0) {
    transport::handshake::Identity as_shm0{job, 0, 2, &wrong, auth::Link::kShm};
    transport::handshake::Hello sh = transport::handshake::make_hello(as_shm0, peer);
    SHOAL_CHECK(::send(u.get(), &sh, sizeof(sh), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(sh)));
    SHOAL_CHECK(closed_by_peer(u.get(), deadline));
  } else {
    const char* mode = std::getenv("SHOAL_SHM");
    SHOAL_CHECK_MSG(mode && std::string(mode) == "0", "no shared-memory socket @" << name);
  }

  // The store: without the secret, and with the wrong one.
  for (const char* secret : {"", kKeyB}) {
    net::Fd s = net::connect_tcp("127.0.0.1", store_port, deadline);
    auth::Nonce nonce;
    auth::Secret k = *secret ? auth::Secret::from_hex(secret) : auth::Secret();
    Bytes hello = store_proto::client_hello(k, &nonce);
    net::write_full(s.get(), hello.data(), hello.size(), deadline);
    uint8_t answer[store_proto::kAnswerBytes];
    SHOAL_CHECK(net::read_full(s.get(), answer, sizeof(answer), deadline));
    Bytes proof;
    std::string bad = store_proto::check_answer(answer, k, nonce, &proof);
    SHOAL_CHECK_MSG(!bad.empty(), "the store proved a secret it should not have");
    if (*secret) {  // go on regardless, with a forged proof
      Bytes forged(store_proto::kProofBytes, 1);
      net::write_full(s.get(), forged.data(), forged.size(), deadline);
    }
    SHOAL_CHECK(closed_by_peer(s.get(), deadline));
  }
}

// Returns rank 1's output.
std::string strangers_job(const std::string& shm) {
  ScopedSecret secret(kKeyA);  // the job's: the store process and every rank
  test::JobOptions jo;
  jo.env["SHOAL_SHM"] = shm;
  // The doors are answered while the transport makes progress, which the
  // shared-arena algorithms never drive (the arena has no door: it is
  // joined through the store with a proof of the secret).
  jo.env["SHOAL_SHM_ARENA_BYTES"] = "0";
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    auto* ts = dynamic_cast<TcpStore*>(store.get());
    SHOAL_CHECK(ts != nullptr);
    float x = static_cast<float>(me + 1);
    c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum)->wait();
    SHOAL_CHECK(x == 3.0f);
    // Rank 0 knocks from a thread while both ranks keep reducing; they stop
    // together once it is done (the loop's condition is itself reduced).
    std::atomic<bool> done{me != 0};
    std::thread stranger;
    if (me == 0) {
      stranger = std::thread([&] {
        knock_everywhere(store, 1, ts->port());
        done = true;
      });
    }
    int rounds = 0;
    for (;;) {
      float y[2] = {static_cast<float>(me + 1), done ? 1.0f : 0.0f};
      c->allreduce(y, y, 2, DataType::kFloat32, ReduceOp::kMin)->wait();
      SHOAL_CHECK(y[0] == 1.0f);
      float z = 2.0f;
      c->allreduce(&z, &z, 1, DataType::kFloat32, ReduceOp::kSum)->wait();
      SHOAL_CHECK(z == 4.0f);
      ++rounds;
      if (y[1] == 1.0f) break;
    }
    if (stranger.joinable()) stranger.join();
    std::vector<int32_t> big(1 << 16, me);
    c->allreduce(big.data(), big.data(), big.size(), DataType::kInt32, ReduceOp::kSum)->wait();
    SHOAL_CHECK(big.front() == 1 && big.back() == 1);
    std::fprintf(stderr, "rank %d: %d rounds while the strangers knocked\n", me, rounds);
  }, jo);
  EXPECT_EQ(test::failures(res), "");
  const std::string& log = res[1].output;
  EXPECT_TRUE(contains(log, "rank 1: rejected a connection from 127.0.0.1:")) << log;
  EXPECT_TRUE(contains(log, "not a shoal hello (bad magic)")) << log;
  EXPECT_TRUE(contains(log, "did not prove the job's secret")) << log;
  EXPECT_TRUE(contains(log, "it belongs to another job or communicator")) << log;
  return log;
}

TEST(Security, StrangersAtEveryDoorAreRejectedAndTheJobGoesOn) {
  std::string log = strangers_job("1");
  EXPECT_TRUE(contains(log, "rank 1: rejected a shared-memory connection from pid")) << log;
}

TEST(Security, StrangersAtEveryDoorAreRejectedAndTheJobGoesOnOverTcp) {
  std::string log = strangers_job("0");
  EXPECT_FALSE(contains(log, "shared-memory")) << log;
}

// A rank may send, see its send complete (into the kernel or the shared
// ring) and exit before its peer has run at all: the peer must still hear
// it, although its answer to the hello finds nobody.
void sent_and_left(const std::string& shm) {
  ScopedSecret secret(kKeyA);
  test::JobOptions jo;
  jo.env["SHOAL_SHM"] = shm;
  auto res = run_ranks(
      2,
      [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
        std::vector<int32_t> v(300, 17);
        if (me == 0) {
          c->send(v.data(), v.size(), DataType::kInt32, 1, 5)->wait();
          c.reset();  // every socket of rank 0 closes
          store->set_str("left", "1");
        } else {
          store->get("left");
          std::vector<int32_t> got(300, 0);
          c->recv(got.data(), got.size(), DataType::kInt32, 0, 5)->wait();
          SHOAL_CHECK(got == v);
        }
      },
      jo);
  EXPECT_EQ(test::failures(res), "");
}

TEST(Security, PeerThatSentAndLeftBeforeTheAnswerIsStillHeard) { sent_and_left("1"); }
TEST(Security, PeerThatSentAndLeftBeforeTheAnswerIsStillHeardOverTcp) { sent_and_left("0"); }

TEST(Security, RankWithAnotherSecretIsRefusedAndTheJobFailsNamingWhy) {
  ScopedSecret secret(kKeyA);
  test::JobOptions jo;
  jo.create_comm = false;
  jo.comm.timeout = 60s;
  auto res = run_ranks(
      2,
      [&](std::shared_ptr<Communicator>&, int me, int n, const auto& store) {
        // A rank of a stale or foreign job: same store, same communicator
        // id, but not the secret.
        if (me == 1) setenv("SHOAL_SECRET", kKeyB, 1);
        auto c = Communicator::create(store, me, n, jo.comm);
        float x = 1;
        try {
          c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum)->wait();
          SHOAL_CHECK_MSG(false, "an allreduce with a rank of another secret succeeded");
        } catch (const Error& e) {
          std::fprintf(stderr, "rank %d: error: %s\n", me, e.what());
        }
      },
      jo);
  EXPECT_EQ(test::failures(res), "");
  EXPECT_TRUE(contains(res[1].output, "did not prove the job's secret")) << res[1].output;
  EXPECT_TRUE(contains(res[0].output, "before it answered this rank's hello")) << res[0].output;
}

TEST(Security, WithoutSecretRankZeroSharesOnePerCommunicator) {
  auto res = run_ranks(3, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    int32_t x = me;
    c->allreduce(&x, &x, 1, DataType::kInt32, ReduceOp::kSum)->wait();
    SHOAL_CHECK(x == 3);
    std::string s = store->get_str("shoal/c0/secret");
    SHOAL_CHECK(auth::Secret::from_hex(s).size() == auth::kSecretBytes);
  });
  EXPECT_EQ(test::failures(res), "");
}

TEST(Security, SecretOnSomeRanksOnlyIsAClearError) {
  test::JobOptions jo;
  jo.create_comm = false;
  auto res = run_ranks(
      2,
      [&](std::shared_ptr<Communicator>&, int me, int n, const auto& store) {
        if (me == 1) setenv("SHOAL_SECRET", kKeyA, 1);
        try {
          // (The store's own connection was made before, without a secret.)
          auto c = Communicator::create(store, me, n, jo.comm);
          SHOAL_CHECK(me == 0);
        } catch (const InvalidArgument& e) {
          std::fprintf(stderr, "rank %d: error: %s\n", me, e.what());
          SHOAL_CHECK(me == 1);
        }
      },
      jo);
  EXPECT_EQ(test::failures(res), "");
  EXPECT_TRUE(contains(res[1].output, "SHOAL_SECRET: set on this rank but not on rank 0")) << res[1].output;
}

}  // namespace
}  // namespace shoal
