// Tests of the rendezvous store: TcpStore (server + clients, threads and forked
// processes, timeouts, server loss, malformed input), PrefixStore, and
// MULTI_GET against shoalrun's workers' store.
// Synchronisation uses the store's own blocking calls or pipes, never sleeps.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "shoal/error.h"
#include "shoal/store.h"
#include "workers_store.h"

namespace {

using namespace std::chrono_literals;
using shoal::Bytes;
using shoal::PrefixStore;
using shoal::TcpStore;
using shoal::TcpStoreOptions;
using Clock = std::chrono::steady_clock;
namespace net = shoal::net;

std::unique_ptr<TcpStore> make_server(uint16_t port = 0, const std::string& host = "127.0.0.1") {
  TcpStoreOptions o;
  o.host = host;
  o.port = port;
  o.is_server = true;
  o.timeout = 60s;
  o.connect_timeout = 30s;
  return std::make_unique<TcpStore>(o);
}

std::unique_ptr<TcpStore> make_client(uint16_t port, std::chrono::milliseconds timeout = 60s,
                                      const std::string& host = "127.0.0.1") {
  TcpStoreOptions o;
  o.host = host;
  o.port = port;
  o.timeout = timeout;
  o.connect_timeout = 30s;
  return std::make_unique<TcpStore>(o);
}

Bytes pattern(size_t n, uint32_t seed) {
  Bytes b(n);
  std::mt19937 rng(seed);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(TcpStore, BasicOperations) {
  auto server = make_server();
  ASSERT_NE(server->port(), 0);
  auto client = make_client(server->port());
  EXPECT_EQ(client->port(), server->port());
  EXPECT_EQ(client->host(), "127.0.0.1");

  client->set_str("a", "alpha");
  EXPECT_EQ(server->get_str("a"), "alpha");
  server->set_str("a", "beta");  // overwrite
  EXPECT_EQ(client->get_str("a"), "beta");

  client->set("empty", Bytes{});
  EXPECT_TRUE(client->get("empty").empty());
  Bytes bin = {0, 1, 0, 255, 0};
  client->set("bin", bin);
  EXPECT_EQ(server->get("bin"), bin);
  client->set_str("", "empty key");
  EXPECT_EQ(server->get_str(""), "empty key");

  EXPECT_EQ(client->add("n", 5), 5);
  EXPECT_EQ(server->add("n", -7), -2);
  EXPECT_EQ(client->add("n", 0), -2);
  EXPECT_EQ(client->get_str("n"), "-2");  // counters are decimal text

  EXPECT_TRUE(client->check({"a", "bin", "n"}));
  EXPECT_FALSE(client->check({"a", "missing"}));
  EXPECT_TRUE(client->check({}));
  client->wait({"a", "n"}, 1s);  // present: returns at once

  EXPECT_TRUE(client->remove("a"));
  EXPECT_FALSE(client->remove("a"));
  EXPECT_FALSE(server->check({"a"}));
  EXPECT_EQ(client->add("a", 1), 1);  // a removed key counts from 0 again

  EXPECT_EQ(client->timeout(), 60s);
  client->set_timeout(5s);
  EXPECT_EQ(client->timeout(), 5s);
}

TEST(TcpStore, WildcardHostServerIsReachableOnLoopback) {
  auto server = make_server(0, "0.0.0.0");
  server->set_str("k", "v");
  EXPECT_EQ(make_client(server->port())->get_str("k"), "v");
}

TEST(TcpStore, Ipv6Server) {
  std::unique_ptr<TcpStore> server;
  try {
    server = make_server(0, "::1");
  } catch (const shoal::Error& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  auto client = make_client(server->port(), 60s, "::1");
  client->set_str("six", "6");
  EXPECT_EQ(server->get_str("six"), "6");
}

TEST(TcpStore, GetBlocksUntilAnotherThreadSets) {
  auto server = make_server();
  std::string got;
  std::thread t([&] {
    auto c = make_client(server->port());
    c->add("ready", 1);
    got = c->get_str("late");  // parks on the server until the set below
  });
  server->wait({"ready"}, 30s);
  server->set_str("late", "value");
  t.join();
  EXPECT_EQ(got, "value");
}

TEST(TcpStore, ManyWaitersOnOneKeyAllWake) {
  auto server = make_server();
  constexpr int kWaiters = 8;
  std::vector<std::string> got(kWaiters), ready;
  std::vector<std::thread> ts;
  for (int i = 0; i < kWaiters; ++i) {
    ready.push_back("ready/" + std::to_string(i));
    ts.emplace_back([&, i] {
      auto c = make_client(server->port());
      c->set_str("ready/" + std::to_string(i), "1");
      got[i] = c->get_str("bcast");
    });
  }
  server->wait(ready, 30s);
  server->set_str("bcast", "all");
  for (auto& t : ts) t.join();
  for (const auto& g : got) EXPECT_EQ(g, "all");
}

TEST(TcpStore, WaitBlocksUntilEveryKeyIsSet) {
  auto server = make_server();
  bool all_present = false;
  std::thread t([&] {
    auto c = make_client(server->port());
    c->set_str("w/ready", "1");
    c->wait({"w/a", "w/b", "w/c", "w/a"}, 30s);
    all_present = c->check({"w/a", "w/b", "w/c"});
  });
  server->wait({"w/ready"}, 30s);
  server->set_str("w/a", "1");
  server->add("w/b", 1);  // ADD also wakes waiters
  server->set_str("w/c", "1");
  t.join();
  EXPECT_TRUE(all_present);
}

TEST(TcpStore, MultiGetAnswersInTheKeysOrder) {
  auto server = make_server();
  auto client = make_client(server->port());
  server->set_str("mg/a", "alpha");
  server->set("mg/empty", {});
  server->add("mg/n", 7);
  const auto v = client->multi_get({"mg/n", "mg/a", "mg/empty", "mg/a"});
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(std::string(v[0].begin(), v[0].end()), "7");
  EXPECT_EQ(std::string(v[1].begin(), v[1].end()), "alpha");
  EXPECT_TRUE(v[2].empty());
  EXPECT_EQ(v[3], v[1]);
  EXPECT_TRUE(client->multi_get({}).empty());
}

// A MULTI_GET from another client of the store at `port`, answered once
// both its keys hold a value at the same time: whenever the request
// arrives, the first "a" is gone by then.
void multi_get_parks_until_every_key_holds_a_value(uint16_t port, shoal::Store& setter) {
  std::vector<Bytes> got;
  std::thread t([&] {
    auto c = make_client(port);
    c->set_str("mg/ready", "1");
    got = c->multi_get({"mg/a", "mg/b"});
  });
  setter.wait({"mg/ready"}, 30s);
  setter.set_str("mg/a", "first");
  setter.remove("mg/a");
  setter.set_str("mg/b", "b");
  setter.set_str("mg/a", "second");
  t.join();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(std::string(got[0].begin(), got[0].end()), "second");
  EXPECT_EQ(std::string(got[1].begin(), got[1].end()), "b");
}

TEST(TcpStore, MultiGetParksUntilEveryKeyHoldsAValue) {
  auto server = make_server();
  multi_get_parks_until_every_key_holds_a_value(server->port(), *server);
}

TEST(TcpStore, MultiGetTimesOutAndTheClientStaysUsable) {
  auto server = make_server();
  auto client = make_client(server->port(), 100ms);
  server->set_str("mg/here", "1");
  try {
    client->multi_get({"mg/here", "mg/never"});
    FAIL() << "no timeout";
  } catch (const shoal::TimeoutError& e) {
    EXPECT_TRUE(contains(e.what(), "mg/never")) << e.what();
  }
  EXPECT_EQ(client->multi_get({"mg/here"}).size(), 1u);
}

TEST(TcpStore, MultiGetOverTheReplyLimitIsAStoreError) {
  auto server = make_server();
  server->set("mg/big1", Bytes(33u << 20, 1));
  server->set("mg/big2", Bytes(33u << 20, 2));
  try {
    server->multi_get({"mg/big1", "mg/big2"});
    FAIL() << "no error";
  } catch (const shoal::StoreError& e) {
    EXPECT_TRUE(contains(e.what(), "fewer keys")) << e.what();
  }
  EXPECT_EQ(server->multi_get({"mg/big1"})[0].size(), 33u << 20);  // the connection survives
}

// shoalrun's workers' store speaks the same protocol (tools/shoalrun/workers_store.h).
TEST(LauncherStore, MultiGetAnswersInOrderAndParks) {
  shoalrun::WorkersStore ws("127.0.0.1", 0, shoal::auth::Secret());
  auto client = make_client(ws.port(), 100ms);
  client->set_str("mg/a", "alpha");
  client->set("mg/empty", {});
  const auto v = client->multi_get({"mg/a", "mg/empty", "mg/a"});
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(std::string(v[0].begin(), v[0].end()), "alpha");
  EXPECT_TRUE(v[1].empty());
  EXPECT_EQ(v[2], v[0]);
  EXPECT_THROW(client->multi_get({"mg/a", "mg/never"}), shoal::TimeoutError);
  client->set_timeout(30s);
  client->remove("mg/a");
  multi_get_parks_until_every_key_holds_a_value(ws.port(), *client);
}

TEST(TcpStore, WaitTimesOutAndTheClientStaysUsable) {
  auto server = make_server();
  auto client = make_client(server->port());
  const auto t0 = Clock::now();
  try {
    client->wait({"never"}, 200ms);
    FAIL() << "wait on a missing key returned";
  } catch (const shoal::TimeoutError& e) {
    const std::string m = e.what();
    EXPECT_TRUE(contains(m, "'never'")) << m;
    EXPECT_TRUE(contains(m, "127.0.0.1:" + std::to_string(server->port()))) << m;
    EXPECT_TRUE(contains(m, "200 ms")) << m;
  }
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, 200ms);
  EXPECT_LT(took, 5s);
  // The server dropped the parked request; setting the key later is harmless
  // and the client's next call gets its own reply, not the stale one.
  server->set_str("never", "now");
  client->set_str("next", "n");
  EXPECT_EQ(client->get_str("next"), "n");
  EXPECT_EQ(client->get_str("never"), "now");
}

TEST(TcpStore, GetTimesOutWithTheStoreTimeout) {
  auto server = make_server();
  auto client = make_client(server->port(), 150ms);
  const auto t0 = Clock::now();
  try {
    client->get("addr/3");
    FAIL() << "get of a missing key returned";
  } catch (const shoal::TimeoutError& e) {
    EXPECT_EQ(std::string(e.what()), "store: timed out after 150 ms waiting for key 'addr/3' at 127.0.0.1:" +
                                         std::to_string(server->port()));
  }
  EXPECT_LT(Clock::now() - t0, 5s);
  // A stale reply to the timed-out GET must never be read as a later reply.
  server->set_str("addr/3", "stale");
  server->set_str("other", "fresh");
  EXPECT_EQ(client->get_str("other"), "fresh");
}

TEST(TcpStore, ConcurrentClientsAddExactTotal) {
  auto server = make_server();
  constexpr int kThreads = 16, kAdds = 200;
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> ts;
  for (int i = 0; i < kThreads; ++i) {
    ts.emplace_back([&, i] {
      auto c = make_client(server->port());
      for (int j = 0; j < kAdds; ++j) seen[i].push_back(c->add("counter", 1));
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(server->add("counter", 0), kThreads * kAdds);
  std::set<int64_t> all;
  for (const auto& v : seen) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kAdds));  // every add saw a distinct value
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kAdds);
}

TEST(TcpStore, OneClientSharedByThreads) {
  auto server = make_server();
  auto shared = make_client(server->port());
  std::vector<std::thread> ts;
  for (int i = 0; i < 8; ++i) {
    ts.emplace_back([&, i] {
      const std::string key = std::string("t").append(std::to_string(i));
      for (int j = 0; j < 200; ++j) {
        shared->add("shared", 1);
        shared->set_str(key, std::to_string(j));
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(shared->add("shared", 0), 1600);
  EXPECT_EQ(server->get_str("t7"), "199");
}

TEST(TcpStore, ClientsInForkedProcesses) {
  // Fork first, while this process has a single thread; the children learn the
  // server's port through a pipe.
  constexpr int kChildren = 4, kAdds = 100;
  std::vector<pid_t> pids;
  std::vector<int> port_pipes;
  for (int i = 0; i < kChildren; ++i) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[1]);
      int code = 1;
      try {
        uint16_t port = 0;
        if (::read(fds[0], &port, sizeof(port)) == sizeof(port)) {
          auto c = make_client(port, 60s);
          for (int j = 0; j < kAdds; ++j) c->add("procs/counter", 1);
          c->set_str("procs/child/" + std::to_string(i), "hello " + std::to_string(i));
          // Blocks until the parent, another process, sets the key.
          code = c->get_str("procs/go") == "go" ? 0 : 2;
        }
      } catch (...) {
        code = 3;
      }
      ::_exit(code);
    }
    ::close(fds[0]);
    pids.push_back(pid);
    port_pipes.push_back(fds[1]);
  }
  auto server = make_server();
  const uint16_t port = server->port();
  for (int fd : port_pipes) {
    EXPECT_EQ(::write(fd, &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
    ::close(fd);
  }
  std::vector<std::string> keys;
  for (int i = 0; i < kChildren; ++i) keys.push_back("procs/child/" + std::to_string(i));
  server->wait(keys, 60s);
  EXPECT_EQ(server->add("procs/counter", 0), kChildren * kAdds);
  for (int i = 0; i < kChildren; ++i) EXPECT_EQ(server->get_str(keys[i]), "hello " + std::to_string(i));
  server->set_str("procs/go", "go");
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status)) << "child " << pid;
    EXPECT_EQ(WEXITSTATUS(status), 0) << "child " << pid;
  }
}

TEST(TcpStore, ForkedChildMayDropItsCopyOfTheServer) {
  auto server = make_server();
  const uint16_t port = server->port();
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = 1;
    try {
      server.reset();  // the child's copy: must neither hang nor stop the parent's server
      make_client(port)->set_str("fork/child", "alive");
      code = 0;
    } catch (...) {
      code = 2;
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(server->get_str("fork/child"), "alive");
  EXPECT_EQ(make_client(port)->add("fork/n", 1), 1);
}

TEST(PrefixStore, IsolatesNamespaces) {
  std::shared_ptr<TcpStore> base = make_server();
  PrefixStore a("a", base), b("b", base);
  a.set_str("k", "1");
  b.set_str("k", "2");
  EXPECT_EQ(a.get_str("k"), "1");
  EXPECT_EQ(b.get_str("k"), "2");
  EXPECT_EQ(base->get_str("a/k"), "1");
  EXPECT_FALSE(base->check({"k"}));
  EXPECT_EQ(a.add("n", 3), 3);
  EXPECT_EQ(b.add("n", 10), 10);
  EXPECT_TRUE(a.check({"k", "n"}));
  EXPECT_TRUE(a.remove("k"));
  EXPECT_FALSE(a.check({"k"}));
  EXPECT_TRUE(b.check({"k"}));
  b.wait({"k", "n"}, 1s);
  const auto kn = b.multi_get({"k", "n"});
  ASSERT_EQ(kn.size(), 2u);
  EXPECT_EQ(std::string(kn[0].begin(), kn[0].end()), "2");
  EXPECT_EQ(std::string(kn[1].begin(), kn[1].end()), "10");
  EXPECT_THROW(a.wait({"k"}, 50ms), shoal::TimeoutError);

  auto inner = std::make_shared<PrefixStore>("y", base);
  PrefixStore nested("x", inner);
  nested.set_str("k", "deep");
  EXPECT_EQ(base->get_str("y/x/k"), "deep");
  EXPECT_EQ(nested.base(), inner);

  nested.set_timeout(7s);
  EXPECT_EQ(base->timeout(), 7s);
  EXPECT_EQ(a.timeout(), 7s);
  EXPECT_THROW(PrefixStore("p", nullptr), shoal::InvalidArgument);
}

TEST(TcpStore, ServerDestroyedWhileAClientWaits) {
  auto server = make_server();
  auto client = make_client(server->port());
  std::string error;
  bool timed_out = false;
  const auto t0 = Clock::now();
  std::thread t([&] {
    try {
      client->set_str("ready", "1");
      client->get("never");
    } catch (const shoal::StoreError& e) {
      error = e.what();
    } catch (const shoal::TimeoutError&) {
      timed_out = true;
    }
  });
  server->wait({"ready"}, 30s);
  server.reset();
  t.join();
  EXPECT_FALSE(timed_out);
  EXPECT_TRUE(contains(error, "127.0.0.1:")) << error;
  EXPECT_LT(Clock::now() - t0, 20s);
  // A lost connection is final: later calls fail fast with the same cause.
  EXPECT_THROW(client->set_str("x", "y"), shoal::StoreError);
}

// Sends raw bytes to the server and reports whether the server then closed the
// connection (read_full hitting EOF).
bool server_closes_after(uint16_t port, const Bytes& bytes) {
  net::Fd s = net::connect_tcp("127.0.0.1", port, net::Clock::now() + 10s);
  if (!net::write_full(s.get(), bytes.data(), bytes.size(), net::Clock::now() + 10s)) return true;
  uint8_t b;
  return !net::read_full(s.get(), &b, 1, net::Clock::now() + 10s);
}

Bytes frame(std::initializer_list<uint8_t> body) {
  const uint32_t n = static_cast<uint32_t>(body.size());
  Bytes f;
  for (int i = 0; i < 4; ++i) f.push_back(static_cast<uint8_t>(n >> (8 * i)));
  for (uint8_t b : body) f.push_back(b);
  return f;
}

TEST(TcpStore, GarbageDoesNotDisturbTheServer) {
  auto server = make_server();
  const uint16_t port = server->port();
  auto client = make_client(port);
  client->set_str("before", "1");

  EXPECT_TRUE(server_closes_after(port, {0xff, 0xff, 0xff, 0xff}));          // oversized length
  EXPECT_TRUE(server_closes_after(port, {0, 0, 0, 0}));                      // empty frame
  EXPECT_TRUE(server_closes_after(port, frame({0x7f, 1, 2, 3})));            // unknown command
  EXPECT_TRUE(server_closes_after(port, frame({2, 9, 0, 0, 0, 'k'})));       // GET, key shorter than said
  EXPECT_TRUE(server_closes_after(port, frame({2, 1, 0, 0, 0, 'k', 'x'})));  // GET, trailing byte
  EXPECT_TRUE(server_closes_after(port, frame({4, 0xff, 0xff, 0xff, 0xff})));  // CHECK of 4G keys
  {
    Bytes big_key = {0, 0, 0, 0, 1, 0x89, 0x13, 0, 0};  // SET, key length 5001
    big_key.resize(big_key.size() + 5001 + 4, 'k');
    const uint32_t n = static_cast<uint32_t>(big_key.size() - 4);
    for (int i = 0; i < 4; ++i) big_key[i] = static_cast<uint8_t>(n >> (8 * i));
    EXPECT_TRUE(server_closes_after(port, big_key));
  }
  {
    std::mt19937 rng(1234);
    for (int round = 0; round < 20; ++round) {  // random junk; the server may wait for more or close
      net::Fd s = net::connect_tcp("127.0.0.1", port, net::Clock::now() + 10s);
      Bytes junk = pattern(1 + rng() % 70000, rng());
      net::write_full(s.get(), junk.data(), junk.size(), net::Clock::now() + 10s);
    }
  }
  {
    // A parked GET whose client vanishes, and a frame cut short.
    net::Fd s = net::connect_tcp("127.0.0.1", port, net::Clock::now() + 10s);
    Bytes get = frame({2, 6, 0, 0, 0, 'o', 'r', 'p', 'h', 'a', 'n'});
    ASSERT_TRUE(net::write_full(s.get(), get.data(), get.size(), net::Clock::now() + 10s));
    net::Fd cut = net::connect_tcp("127.0.0.1", port, net::Clock::now() + 10s);
    ASSERT_TRUE(net::write_full(cut.get(), get.data(), 7, net::Clock::now() + 10s));
  }
  server->set_str("orphan", "o");
  EXPECT_EQ(client->get_str("before"), "1");
  client->set_str("after", "2");
  EXPECT_EQ(make_client(port)->get_str("after"), "2");
  EXPECT_EQ(make_client(port)->get_str("orphan"), "o");
}

TEST(TcpStore, LimitsAreCheckedOnTheClient) {
  auto server = make_server();
  EXPECT_THROW(server->set_str(std::string(4097, 'k'), "v"), shoal::InvalidArgument);
  EXPECT_THROW(server->get(std::string(5000, 'k')), shoal::InvalidArgument);
  EXPECT_THROW(server->set("big", Bytes((64u << 20) + 1)), shoal::InvalidArgument);
  server->set_str(std::string(4096, 'k'), "max key");
  EXPECT_EQ(server->get_str(std::string(4096, 'k')), "max key");
}

TEST(TcpStore, LargeValueRoundTrip) {
  auto server = make_server();
  const Bytes big = pattern(8 << 20, 99);
  Bytes parked;
  std::thread t([&] {
    auto c = make_client(server->port());
    c->set_str("big/ready", "1");
    parked = c->get("big");  // answered from the parked state with 8 MiB
  });
  server->wait({"big/ready"}, 30s);
  make_client(server->port())->set("big", big);
  t.join();
  EXPECT_TRUE(parked == big);
  EXPECT_TRUE(make_client(server->port())->get("big") == big);
}

TEST(TcpStore, MaximalValueRoundTrip) {
  auto server = make_server();
  const Bytes big = pattern(64 << 20, 5);
  server->set("max", big);
  EXPECT_TRUE(make_client(server->port())->get("max") == big);
}

TEST(TcpStore, AddOnTextIsAStoreErrorAndTheConnectionSurvives) {
  auto server = make_server();
  auto client = make_client(server->port());
  client->set_str("s", "abc");
  try {
    client->add("s", 1);
    FAIL() << "ADD on text succeeded";
  } catch (const shoal::StoreError& e) {
    EXPECT_TRUE(contains(e.what(), "'s'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "127.0.0.1:" + std::to_string(server->port()))) << e.what();
  }
  client->set_str("max", std::to_string(INT64_MAX));
  EXPECT_THROW(client->add("max", 1), shoal::StoreError);
  EXPECT_EQ(client->get_str("s"), "abc");
  EXPECT_EQ(client->add("fine", 2), 2);
}

TEST(TcpStore, ClientConnectsBeforeTheServerExists) {
  uint16_t port;
  {
    net::Fd l = net::listen_tcp("127.0.0.1", 0);
    port = net::bound_port(l.get());
  }
  int started[2];
  ASSERT_EQ(::pipe(started), 0);
  std::string error;
  std::thread t([&] {
    char x = 'x';
    EXPECT_EQ(::write(started[1], &x, 1), 1);
    try {
      make_client(port)->set_str("early", "bird");
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  char x;
  ASSERT_EQ(::read(started[0], &x, 1), 1);
  auto server = make_server(port);
  EXPECT_EQ(server->get_str("early"), "bird");
  t.join();
  ::close(started[0]);
  ::close(started[1]);
  EXPECT_EQ(error, "");
}

TEST(TcpStore, ConnectTimeoutAndBadOptions) {
  uint16_t port;
  {
    net::Fd l = net::listen_tcp("127.0.0.1", 0);
    port = net::bound_port(l.get());
  }
  TcpStoreOptions o;
  o.port = port;
  o.connect_timeout = 200ms;
  const auto t0 = Clock::now();
  try {
    TcpStore s(o);
    FAIL() << "connected to nobody";
  } catch (const shoal::TimeoutError& e) {
    EXPECT_TRUE(contains(e.what(), "127.0.0.1:" + std::to_string(port))) << e.what();
  }
  EXPECT_LT(Clock::now() - t0, 5s);

  o.port = 0;
  EXPECT_THROW(TcpStore{o}, shoal::InvalidArgument);

  auto server = make_server();
  try {
    make_server(server->port());
    FAIL() << "two servers on one port";
  } catch (const shoal::StoreError& e) {
    EXPECT_TRUE(contains(e.what(), std::to_string(server->port()))) << e.what();
  }
}

}  // namespace
