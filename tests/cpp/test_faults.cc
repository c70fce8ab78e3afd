// test_faults.cc — failures are detected, named, and never hang:
// a rank SIGKILLed in the middle of a 256 MiB allreduce, mismatched
// collectives, timeouts, aborts, and the broken state that follows.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <regex>
#include <thread>

#include "common/net.h"
#include "core/errors.h"
#include "errors_util.h"
#include "harness.h"

namespace shoal {
namespace {

using test::JobOptions;
using test::run_ranks;

using test::capture;
using test::code;
using test::message;
using test::mono_ns;

bool quick() { return std::getenv("SHOAL_TEST_QUICK") != nullptr; }

// A zero timeout fails without waiting for anything; the bound covers the
// roll call a timeout makes (kAnswerTime) and scheduling noise.
constexpr double kZeroTimeoutMs = 800;

// ---- a rank dies mid-collective ---------------------------------------------

// What /dev/shm holds: a killed rank must not leave anything there.
std::vector<std::string> dev_shm() {
  std::vector<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) out.emplace_back(e->d_name);
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void kill_mid_allreduce(int n, int victim, size_t bytes) {
  const size_t count = bytes / sizeof(float);
  const auto shm_before = dev_shm();
  auto res = run_ranks(n, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    std::vector<float> in(count, 1.0f), out(count);
    c->barrier()->wait();  // every connection the ring needs is made below
    if (me == victim) {
      // Die while the first big allreduce is in flight: a thread of this rank
      // SIGKILLs the whole process shortly after it started.
      std::thread killer([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(150));  // fault timing, not synchronisation
        std::printf("KILLED_AT %lld\n", static_cast<long long>(mono_ns()));
        std::fflush(stdout);
        raise(SIGKILL);
      });
      for (;;) c->allreduce(in.data(), out.data(), count, DataType::kFloat32, ReduceOp::kSum)->wait();
    }
    // Survivors repeat the allreduce until the fault surfaces.
    std::exception_ptr err;
    for (int i = 0; i < 1000 && !err; ++i) {
      err = capture([&] { c->allreduce(in.data(), out.data(), count, DataType::kFloat32, ReduceOp::kSum)->wait(); });
    }
    std::printf("ERROR_AT %lld\n", static_cast<long long>(mono_ns()));
    SHOAL_CHECK_MSG(err != nullptr, "no error after the victim died");
    if (!err) return;
    std::printf("ERROR %s\n", message(err).c_str());
    SHOAL_CHECK_MSG(code(err) == ErrorCode::kPeerLost, "wrong type: " << message(err));
    SHOAL_CHECK_MSG(message(err).find("peer lost: rank " + std::to_string(victim)) != std::string::npos,
                    "does not name rank " << victim << ": " << message(err));
    // The communicator is broken: the next operation fails fast, same cause.
    auto t0 = mono_ns();
    auto again = capture([&] { c->barrier()->wait(); });
    SHOAL_CHECK(again != nullptr && code(again) == ErrorCode::kPeerLost);
    SHOAL_CHECK_MSG(mono_ns() - t0 < 100000000, "a later operation did not fail fast");
  });
  ASSERT_EQ(res[victim].signal, SIGKILL) << res[victim].output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(res[victim].output, m, std::regex("KILLED_AT (\\d+)")));
  const int64_t killed = std::stoll(m[1]);
  int64_t worst = 0;
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    EXPECT_EQ(res[r].exit_code, 0) << "rank " << r << ":\n" << res[r].output;
    EXPECT_TRUE(res[r].finished) << "rank " << r << ":\n" << res[r].output;
    std::smatch e;
    ASSERT_TRUE(std::regex_search(res[r].output, e, std::regex("ERROR_AT (\\d+)"))) << res[r].output;
    int64_t dt = std::stoll(e[1]) - killed;
    worst = std::max(worst, dt);
    EXPECT_LT(dt, 2000000000) << "rank " << r << " took " << dt / 1e6 << " ms to fail:\n" << res[r].output;
  }
  std::printf("[ detection ] %d ranks, victim %d: worst %.1f ms after the kill\n", n, victim, worst / 1e6);
  EXPECT_EQ(dev_shm(), shm_before) << "files left in /dev/shm";
}

TEST(Faults, SigkillMidAllreduce4Ranks) { kill_mid_allreduce(4, 2, quick() ? (32u << 20) : (256u << 20)); }
TEST(Faults, SigkillMidAllreduce3RanksRank0) { kill_mid_allreduce(3, 0, 64u << 20); }

// ---- mismatched collectives -------------------------------------------------

// Every rank must fail with Mismatch (never hang, never write out of bounds).
void expect_mismatch_everywhere(int n, const std::function<WorkPtr(Communicator&, int, std::vector<uint8_t>&)>& issue) {
  JobOptions jo;
  jo.comm.timeout = std::chrono::seconds(20);
  auto res = run_ranks(n, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    // A guard zone after the buffer catches out-of-bounds writes.
    std::vector<uint8_t> buf(1 << 16, 0);
    auto err = capture([&] { issue(*c, me, buf)->wait(); });
    SHOAL_CHECK_MSG(err != nullptr, "rank " << me << " completed a mismatched collective");
    if (err) {
      std::printf("ERROR %s\n", message(err).c_str());
      SHOAL_CHECK_MSG(code(err) == ErrorCode::kMismatch, "rank " << me << ": " << message(err));
      SHOAL_CHECK_MSG(message(err).find("mismatch") != std::string::npos, message(err));
    }
    for (size_t i = 32 << 10; i < buf.size(); ++i) SHOAL_CHECK_MSG(buf[i] == 0, "write past the buffer at " << i);
  }, jo);
  EXPECT_EQ(test::failures(res), "");
}

TEST(Faults, MismatchedCounts) {
  // Rank 1 allreduces fewer elements than the others; the buffers hold 8 KiB.
  expect_mismatch_everywhere(3, [](Communicator& c, int me, std::vector<uint8_t>& b) {
    return c.allreduce(b.data(), b.data(), me == 1 ? 1000 : 2000, DataType::kFloat32, ReduceOp::kSum);
  });
}

TEST(Faults, MismatchedDtypesSameBytes) {
  expect_mismatch_everywhere(2, [](Communicator& c, int me, std::vector<uint8_t>& b) {
    return c.allreduce(b.data(), b.data(), 64, me == 0 ? DataType::kFloat32 : DataType::kInt32, ReduceOp::kSum);
  });
}

TEST(Faults, MismatchedCollectiveKinds) {
  expect_mismatch_everywhere(2, [](Communicator& c, int me, std::vector<uint8_t>& b) {
    if (me == 0) return c.allreduce(b.data(), b.data(), 64, DataType::kFloat32, ReduceOp::kSum);
    return c.broadcast(b.data(), 64, DataType::kFloat32, 0);
  });
}

TEST(Faults, MismatchedAllgatherCountsNoOverflow) {
  // Rank 0 believes each block has 4096 elements, rank 1 sends 8192.
  expect_mismatch_everywhere(2, [](Communicator& c, int me, std::vector<uint8_t>& b) {
    return c.allgather(b.data(), b.data(), me == 0 ? 2048 : 4096, DataType::kUInt8);
  });
}

// ---- timeouts, abort, destruction -------------------------------------------

// A one-float allreduce under a timeout of `timeout_ms` that a peer never
// joins: it must fail with a TimeoutError that says `says`, after lo_ms to
// hi_ms.
void allreduce_times_out(Communicator& c, int timeout_ms, const std::string& says, double lo_ms, double hi_ms) {
  float x = 1;
  OpOptions o;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  auto t0 = mono_ns();
  auto err = capture([&] { c.allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, o)->wait(); });
  double ms = (mono_ns() - t0) / 1e6;
  SHOAL_CHECK(err != nullptr);
  if (err) {
    SHOAL_CHECK_MSG(code(err) == ErrorCode::kTimeout, message(err));
    SHOAL_CHECK_MSG(message(err).find(says) != std::string::npos, message(err));
  }
  SHOAL_CHECK_MSG(ms >= lo_ms && ms < hi_ms, "took " << ms << " ms under a timeout of " << timeout_ms << " ms");
}

TEST(Faults, TimeoutNamesTheMissingRank) {
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    if (me == 1) {
      store->get("rank0_done");  // never joins the allreduce
      return;
    }
    allreduce_times_out(*c, 300, "rank 1", 290, 5000);
    store->set_str("rank0_done", "1");
  });
  EXPECT_EQ(test::failures(res), "");
}

TEST(Faults, RecvTimesOutNamingThePeer) {
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    if (me == 1) {
      store->get("rank0_done");  // never sends
      return;
    }
    float x = 0;
    OpOptions o;
    o.timeout = std::chrono::milliseconds(300);
    auto t0 = mono_ns();
    auto err = capture([&] { c->recv(&x, 1, DataType::kFloat32, 1, 5, o)->wait(); });
    double ms = (mono_ns() - t0) / 1e6;
    SHOAL_CHECK(err != nullptr);
    if (err) {
      SHOAL_CHECK_MSG(code(err) == ErrorCode::kTimeout, message(err));
      SHOAL_CHECK_MSG(message(err).find("rank 1") != std::string::npos, message(err));
      SHOAL_CHECK_MSG(message(err).find("tag 5") != std::string::npos, message(err));
      SHOAL_CHECK_MSG(ms >= 290 && ms < 5000, "took " << ms << " ms");
    }
    // The communicator is broken now: later operations fail at once.
    SHOAL_CHECK(capture([&] { c->barrier()->wait(); }) != nullptr);
    store->set_str("rank0_done", "1");
  });
  EXPECT_EQ(test::failures(res), "");
}

// The roll call that names the missing rank fits inside the operation's
// timeout (it is opened ahead of the deadline, core/roll_call.h), so a 1 s
// timeout fails after 1 s plus scheduling noise, not 1 s plus the roll call.
TEST(Faults, TimeoutKeepsItsDeadlineAndNamesTheMissingRank) {
  auto res = run_ranks(3, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    float x = 1;
    c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum)->wait();  // connected, arena set up
    if (me == 2) {
      store->get("survivors_done");  // never joins the second allreduce
      return;
    }
    allreduce_times_out(*c, 1000, "rank 2 has not answered a roll call", 990, 1300);
    if (store->add("survivors", 1) == 2) store->set_str("survivors_done", "1");
  });
  EXPECT_EQ(test::failures(res), "");
}

// A zero timeout is a timeout of zero (as in PyTorch, where "unset" is a
// separate value): an operation that must wait for a peer fails at once. A
// negative timeout is an argument error, before anything is sent.
TEST(Faults, ZeroTimeoutFailsAtOnceAndNegativeIsRefused) {
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    float x = 1;
    c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum)->wait();  // connected, arena set up
    OpOptions bad;
    bad.timeout = std::chrono::milliseconds(-5);
    auto neg = capture([&] { c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, bad); });
    SHOAL_CHECK(neg != nullptr && code(neg) == ErrorCode::kInvalidArgument);
    if (neg) SHOAL_CHECK_MSG(message(neg).find("allreduce: timeout: must be >= 0 ms") != std::string::npos, message(neg));
    OpOptions zero;
    zero.timeout = std::chrono::milliseconds(0);
    if (me == 1) {
      store->get("rank0_done");  // never joins the allreduce
      return;
    }
    allreduce_times_out(*c, 0, "timed out", 0, kZeroTimeoutMs);
    store->set_str("rank0_done", "1");
  });
  EXPECT_EQ(test::failures(res), "");
}

// A stopped rank (SIGSTOP: its sockets stay open, nothing is ever closed) is
// found by the timeout only; every survivor must name it, not the neighbour
// it happened to wait for (the roll call, core/roll_call.h).
void stopped_rank_is_named(int n, int victim, size_t count) {
  auto res = run_ranks(n, [&](std::shared_ptr<Communicator>& c, int me, int size, const auto& store) {
    std::vector<float> in(count, 1.0f), out(count);
    c->barrier()->wait();
    if (me == victim) {
      store->set_str("victim_pid", std::to_string(getpid()));
      raise(SIGSTOP);  // killed below by rank `first survivor` once every survivor has checked
      return;
    }
    OpOptions o;
    o.timeout = std::chrono::milliseconds(1500);
    std::exception_ptr err;
    for (int i = 0; i < 100 && !err; ++i) {
      err = capture([&] {
        c->allreduce(in.data(), out.data(), count, DataType::kFloat32, ReduceOp::kSum, o)->wait();
      });
    }
    SHOAL_CHECK(err != nullptr);
    if (err) {
      const std::string m = message(err);
      std::printf("ERROR %s\n", m.c_str());
      SHOAL_CHECK_MSG(code(err) == ErrorCode::kTimeout, m);
      SHOAL_CHECK_MSG(m.find("rank " + std::to_string(victim) + " has not answered a roll call") !=
                          std::string::npos,
                      m);
    }
    store->set_str("checked/" + std::to_string(me), "1");
    if (me == (victim == 0 ? 1 : 0)) {
      std::vector<std::string> keys{"victim_pid"};
      for (int r = 0; r < size; ++r) {
        if (r != victim) keys.push_back("checked/" + std::to_string(r));
      }
      store->wait(keys, std::chrono::seconds(60));
      kill(std::stoi(store->get_str("victim_pid")), SIGKILL);
    }
  });
  EXPECT_EQ(res[victim].signal, SIGKILL) << res[victim].output;
  res[victim].exit_code = 0;
  res[victim].signal = 0;
  res[victim].finished = true;
  EXPECT_EQ(test::failures(res), "");
  for (int r = 0; r < n; ++r) {
    if (r != victim) std::printf("[ rank %d ] %s", r, res[r].output.substr(0, 600).c_str());
  }
}

TEST(Faults, StoppedRankIsNamedByEverySurvivor) { stopped_rank_is_named(4, 2, 1 << 16); }
TEST(Faults, StoppedRankIsNamedByEverySurvivorSmall) { stopped_rank_is_named(5, 1, 1); }

// Two live ranks each waiting for the other (both receive first): both are in
// shoal, so both answer the roll call, and the error says so instead of
// blaming a rank.
TEST(Faults, DeadlockOfLiveRanksSaysEveryRankAnswered) {
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    float x = 0;
    OpOptions o;
    o.timeout = std::chrono::milliseconds(800);
    auto err = capture([&] { c->recv(&x, 1, DataType::kFloat32, 1 - me, 7, o)->wait(); });
    SHOAL_CHECK(err != nullptr);
    if (err) {
      SHOAL_CHECK_MSG(code(err) == ErrorCode::kTimeout, message(err));
      SHOAL_CHECK_MSG(message(err).find("every rank answered a roll call") != std::string::npos ||
                          message(err).find("rank " + std::to_string(1 - me) + " reports: ") != std::string::npos,
                      message(err));
      SHOAL_CHECK_MSG(message(err).find("has not answered") == std::string::npos, message(err));
    }
  });
  EXPECT_EQ(test::failures(res), "");
}

// A cause re-raised from another rank's abort record says whose words they
// are, without that rank's own "shoal rank D: " prefix, and keeps the type
// and the lost peer.
TEST(Faults, AbortRecordIsRaisedAsTheDetectorsReport) {
  core::AbortRecord lost = core::AbortRecord::from(
      std::make_exception_ptr(PeerLost("peer lost: rank 1 (vm, shared memory): connection closed", 1)), 3);
  auto back = core::AbortRecord::decode(lost.encode());
  ASSERT_TRUE(back.has_value());
  auto e = back->to_error();
  EXPECT_EQ(code(e), ErrorCode::kPeerLost);
  EXPECT_EQ(message(e), "rank 3 reports: peer lost: rank 1 (vm, shared memory): connection closed");
  try {
    std::rethrow_exception(e);
  } catch (const PeerLost& x) {
    EXPECT_EQ(x.peer(), 1);
  }

  core::AbortRecord timeout = core::AbortRecord::from(
      std::make_exception_ptr(TimeoutError("shoal rank 3: recv (tag 5): timed out waiting for receive from rank 2")),
      3);
  auto t = core::AbortRecord::decode(timeout.encode())->to_error();
  EXPECT_EQ(code(t), ErrorCode::kTimeout);
  EXPECT_EQ(message(t), "rank 3 reports: recv (tag 5): timed out waiting for receive from rank 2");
}

// An operation failed by another operation's cause says "shoal rank R: "
// once, and keeps the type (and the lost peer).
TEST(Faults, ContextIsNotRepeatedForACauseFromTheSameRank) {
  auto e = core::with_context(
      std::make_exception_ptr(TimeoutError("shoal rank 0: recv (tag 3): timed out waiting for rank 1")),
      "shoal rank 0: send: ");
  EXPECT_EQ(code(e), ErrorCode::kTimeout);
  EXPECT_EQ(message(e), "shoal rank 0: send: recv (tag 3): timed out waiting for rank 1");
  auto g = core::with_context(std::make_exception_ptr(PeerLost("shoal rank 3 (group 1 rank 0): peer lost: rank 2", 2)),
                              "shoal rank 3 (group 1 rank 0): allreduce seq 4: ");
  EXPECT_EQ(message(g), "shoal rank 3 (group 1 rank 0): allreduce seq 4: peer lost: rank 2");
  // Another rank's words keep their own.
  auto o = core::with_context(std::make_exception_ptr(PeerLost("rank 2 reports: peer lost: rank 1", 1)),
                              "shoal rank 0: allreduce seq 2: ");
  EXPECT_EQ(message(o), "shoal rank 0: allreduce seq 2: rank 2 reports: peer lost: rank 1");
  try {
    std::rethrow_exception(o);
  } catch (const PeerLost& x) {
    EXPECT_EQ(x.peer(), 1);
  }
}

// A peer that has gone before anyone connected to it: the first connection
// to it is refused, which must fail at once (not be retried until the
// operation's timeout) and name it.
TEST(Faults, ConnectToAnExitedPeerFailsAtOnce) {
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    if (me == 1) {
      c.reset();  // closes its listeners
      store->set_str("rank1_gone", "1");
      return;
    }
    store->get("rank1_gone");
    float x = 1;
    OpOptions o;
    o.timeout = std::chrono::seconds(60);
    auto t0 = mono_ns();
    auto err = capture([&] { c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, o)->wait(); });
    double ms = (mono_ns() - t0) / 1e6;
    SHOAL_CHECK(err != nullptr);
    if (err) {
      SHOAL_CHECK_MSG(code(err) == ErrorCode::kPeerLost, message(err));
      SHOAL_CHECK_MSG(message(err).find("rank 1") != std::string::npos, message(err));
      SHOAL_CHECK_MSG(ms < 2000, "took " << ms << " ms: " << message(err));
    }
  });
  EXPECT_EQ(test::failures(res), "");
}

// A peer on this machine that dies before it ever connected: no socket can
// say so, but its process is gone, and a receive that waits for it fails
// within the 2 s bar naming it.
TEST(Faults, DeathBeforeConnectingIsSeenWithinTwoSeconds) {
  auto res = run_ranks(3, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    if (me == 1) {
      store->get("rank2_waiting");
      std::printf("KILLED_AT %lld\n", static_cast<long long>(mono_ns()));
      std::fflush(stdout);
      raise(SIGKILL);
    }
    if (me == 0) {
      store->get("rank2_done");  // rank 0 hosts the store
      return;
    }
    float x = 0;
    OpOptions o;
    o.timeout = std::chrono::seconds(60);
    auto w = c->recv(&x, 1, DataType::kFloat32, 1, 7, o);
    store->set_str("rank2_waiting", "1");
    auto err = capture([&] { w->wait(); });
    std::printf("ERROR_AT %lld\n", static_cast<long long>(mono_ns()));
    SHOAL_CHECK(err != nullptr);
    if (err) {
      SHOAL_CHECK_MSG(code(err) == ErrorCode::kPeerLost, message(err));
      SHOAL_CHECK_MSG(message(err).find("peer lost: rank 1") != std::string::npos, message(err));
      SHOAL_CHECK_MSG(message(err).find("has exited") != std::string::npos, message(err));
    }
    store->set_str("rank2_done", "1");
  });
  ASSERT_EQ(res[1].signal, SIGKILL) << res[1].output;
  EXPECT_EQ(res[0].exit_code, 0) << res[0].output;
  EXPECT_EQ(res[2].exit_code, 0) << res[2].output;
  EXPECT_TRUE(res[0].finished && res[2].finished) << res[0].output << res[2].output;
  std::smatch k, e;
  ASSERT_TRUE(std::regex_search(res[1].output, k, std::regex("KILLED_AT (\\d+)"))) << res[1].output;
  ASSERT_TRUE(std::regex_search(res[2].output, e, std::regex("ERROR_AT (\\d+)"))) << res[2].output;
  EXPECT_LT(std::stoll(e[1]) - std::stoll(k[1]), 2000000000) << res[2].output;
}

TEST(Faults, AbortFailsPendingAndLaterOperations) {
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    if (me == 1) {
      store->get("aborted");
      return;
    }
    float x = 1;
    auto w = c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum);
    SHOAL_CHECK(!w->wait_for(std::chrono::milliseconds(50)));  // rank 1 is not there
    c->abort("test says stop");
    auto err = capture([&] { w->wait(); });
    SHOAL_CHECK(err && code(err) == ErrorCode::kAborted);
    SHOAL_CHECK(err && message(err).find("test says stop") != std::string::npos);
    auto later = capture([&] { c->barrier()->wait(); });
    SHOAL_CHECK(later && code(later) == ErrorCode::kAborted);
    store->set_str("aborted", "1");
  });
  EXPECT_EQ(test::failures(res), "");
}

TEST(Faults, DestroyWithPendingOperationReturns) {
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    if (me == 1) {
      store->get("destroyed");
      return;
    }
    float x = 1;
    auto w = c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum);
    c.reset();  // must not hang waiting for rank 1
    auto err = capture([&] { w->wait(); });
    SHOAL_CHECK(err && code(err) == ErrorCode::kAborted);
    store->set_str("destroyed", "1");
  });
  EXPECT_EQ(test::failures(res), "");
}

// The *_shared algorithms never drive the transport; this test needs
// operations that do (rank 1 sees the stranger while making progress).
test::JobOptions no_arena() {
  test::JobOptions jo;
  jo.env["SHOAL_SHM_ARENA_BYTES"] = "0";
  return jo;
}

TEST(Faults, StrangerConnectionIsRefusedAndJobGoesOn) {
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    float x = static_cast<float>(me + 1);
    c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum)->wait();
    net::Fd stranger;
    if (me == 0) {
      // Connect to rank 1's data port and send garbage.
      std::string addr = store->get_str("shoal/c0/addr/1");
      std::string host = addr.substr(0, addr.find(' '));
      int port = std::atoi(addr.substr(addr.find(' ') + 1).c_str());
      stranger = net::connect_tcp(host, static_cast<uint16_t>(port),
                                  std::chrono::steady_clock::now() + std::chrono::seconds(5));
      const char junk[] = "GET / HTTP/1.0\r\n\r\nnot a shoal peer at all.....";
      net::write_full(stranger.get(), junk, sizeof(junk),
                      std::chrono::steady_clock::now() + std::chrono::seconds(5));
    }
    // Rank 1 sees the stranger whenever its transport makes progress, which
    // only operations drive: keep the job working (and checking its results)
    // until rank 0 sees rank 1 close the stranger's socket. Rank 1 logs the
    // rejection before it closes.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (int i = 0;; ++i) {
      float closed = 0;
      if (me == 0) {
        char b;
        ssize_t n = ::recv(stranger.get(), &b, 1, MSG_DONTWAIT);
        closed = (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) ? 1.0f : 0.0f;
      }
      float y[2] = {static_cast<float>(me + 1), closed};
      c->allreduce(y, y, 2, DataType::kFloat32, ReduceOp::kSum)->wait();
      SHOAL_CHECK(y[0] == 3.0f);
      if (y[1] > 0 && i >= 10) break;
      SHOAL_CHECK(std::chrono::steady_clock::now() < give_up);  // rank 1 never rejected it
    }
  }, no_arena());
  EXPECT_EQ(test::failures(res), "");
  EXPECT_NE(res[1].output.find("rejected a connection"), std::string::npos) << res[1].output;
}

}  // namespace
}  // namespace shoal
