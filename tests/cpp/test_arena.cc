// test_arena.cc — the *_shared algorithms and the segment they share
// (collectives/arena/host_arena.h): results over many rounds and through the
// sleeping path, the wake of a rank asleep on its peer, who gets them by
// default, and their failures: a timeout and an abort inside a round, a
// forced algorithm without an arena, and a rank killed mid-round (named by
// every survivor within 2 s, nothing left in /dev/shm); and how a rank
// writes its slots (SlotStores).
#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "arena_util.h"
#include "errors_util.h"
#include "common/copy.h"
#include "common/process.h"
#include "common/yield_gauge.h"
#include "collectives/arena/host_arena.h"
#include "cpu_util.h"
#include "harness.h"
#include "kill_util.h"

namespace shoal {
namespace {

using test::JobOptions;
using test::run_ranks;

constexpr DataType f32 = DataType::kFloat32;
constexpr DataType f64 = DataType::kFloat64;

using test::capture;
using test::code;
using test::message;
using test::mono_ns;


OpOptions shared() {
  OpOptions o;
  o.algorithm = "shared";
  return o;
}

// Value of element i at rank r (small integers: exact in float64).
double v(int r, size_t i) { return static_cast<double>((i * 7 + static_cast<size_t>(r) * 3) % 13); }

// All five collectives, forced onto the arena, at `count` elements of T
// (`dt`) per block: element i of rank r's input is val(r, i), small
// integers, so that sums are exact. The root of reduce and broadcast is
// `root`.
template <class T, class Val>
void check_every_collective(Communicator& c, int me, int n, size_t count, DataType dt, int root, Val val) {
  auto sum = [&](size_t i) {
    T s = 0;
    for (int r = 0; r < n; ++r) s += val(r, i);
    return s;
  };
  std::vector<T> in(count), out(count, -1), all(count * static_cast<size_t>(n), -1);
  for (size_t i = 0; i < count; ++i) in[i] = val(me, i);
  c.allreduce(in.data(), out.data(), count, dt, ReduceOp::kSum, shared())->wait();
  for (size_t i = 0; i < count; ++i) SHOAL_CHECK_MSG(out[i] == sum(i), "allreduce " << count << " i=" << i);

  std::vector<T> red(count, -1);
  c.reduce(in.data(), red.data(), count, dt, ReduceOp::kSum, root, shared())->wait();
  if (me == root) {
    for (size_t i = 0; i < count; ++i) SHOAL_CHECK_MSG(red[i] == sum(i), "reduce " << count << " i=" << i);
  }

  std::vector<T> b = me == root ? in : std::vector<T>(count, -1);
  c.broadcast(b.data(), count, dt, root, shared())->wait();
  for (size_t i = 0; i < count; ++i) SHOAL_CHECK_MSG(b[i] == val(root, i), "broadcast " << count << " i=" << i);

  c.allgather(in.data(), all.data(), count, dt, shared())->wait();
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) {
      SHOAL_CHECK_MSG(all[static_cast<size_t>(r) * count + i] == val(r, i), "allgather " << count << " r=" << r);
    }
  }

  // reduce_scatter: element j of the full vector is val(rank, j).
  std::vector<T> full(count * static_cast<size_t>(n)), mine(count, -1);
  for (size_t j = 0; j < full.size(); ++j) full[j] = val(me, j);
  c.reduce_scatter(full.data(), mine.data(), count, dt, ReduceOp::kSum, shared())->wait();
  for (size_t i = 0; i < count; ++i) {
    SHOAL_CHECK_MSG(mine[i] == sum(static_cast<size_t>(me) * count + i), "reduce_scatter " << count << " i=" << i);
  }
}

// All five collectives with slots of 4 KiB, so that every call runs many
// rounds, at counts that do not divide evenly.
void every_collective_in_many_rounds(int n, const std::map<std::string, std::string>& env) {
  JobOptions jo;
  jo.env = env;
  jo.env["SHOAL_SHM_ARENA_BYTES"] = "4096";
  auto res = run_ranks(n, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    for (size_t count : {size_t{1}, size_t{511}, size_t{3001}, size_t{20011}}) {
      check_every_collective<double>(*c, me, n, count, f64, static_cast<int>(count % static_cast<size_t>(n)), v);
    }
  }, jo);
  EXPECT_EQ(test::failures(res), "");
}

TEST(Arena, EveryCollectiveInManyRounds) { every_collective_in_many_rounds(3, {}); }

// Rounds of at most HostArena::kInlineBytes per rank keep their data in the
// rank's control line, and of at most kNearBytes in the line after it,
// instead of its slot: every collective at float32 counts that straddle
// both sizes (4 to 80 bytes per rank; reduce_scatter puts n times as much
// in a slot), up and then down, so that rounds in the control line, the
// line after and the slots follow each other on both round parities.
TEST(Arena, SmallRoundsAroundTheInlineSizes) {
  constexpr int n = 3;
  static_assert(coll::arena::HostArena::kNearBytes < 20 * sizeof(float));
  auto res = run_ranks(n, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    std::vector<size_t> counts;
    for (size_t k = 1; k <= 20; ++k) counts.push_back(k);
    for (size_t k = 20; k >= 1; --k) counts.push_back(k);
    int step = 0;
    for (size_t count : counts) {
      ++step;
      auto val = [&](int r, size_t i) { return static_cast<float>((i * 5 + static_cast<size_t>(r) * 7 + step) % 11); };
      check_every_collective<float>(*c, me, n, count, f32, step % n, val);
    }
  });
  EXPECT_EQ(test::failures(res), "");
}

// With no spinning every wait goes to sleep on the peer's counter and is
// woken by its arrival: the futex path, over many operations.
// Rounds of a full 1 MiB slot (more than SlotStores::kMinBytes per rank),
// with the slots always streamed, and with the choice measured (rounds
// through the cache and streamed probes mixed), at counts that cut the slot
// into uneven slices.
void every_collective_in_large_rounds(const char* stream) {
  JobOptions jo;
  jo.env["SHOAL_SHM_STREAM"] = stream;
  auto res = run_ranks(3, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    for (size_t count : {size_t{131072 * 2 + 4099}, size_t{65536 + 11}, size_t{131072 * 3 + 7}}) {
      check_every_collective<double>(*c, me, 3, count, f64, static_cast<int>(count % 3), v);
    }
  }, jo);
  EXPECT_EQ(test::failures(res), "");
}

TEST(Arena, EveryCollectiveInLargeStreamedRounds) { every_collective_in_large_rounds("1"); }
TEST(Arena, EveryCollectiveInLargeMeasuredRounds) { every_collective_in_large_rounds("auto"); }

TEST(Arena, EveryCollectiveThroughTheSleepingPath) { every_collective_in_many_rounds(4, {{"SHOAL_SPIN_US", "0"}}); }

// Every rank on one CPU: each wait finds its peer on its own CPU, yields it
// and then sleeps (host_arena.cc), where the others spin.
TEST(Arena, EveryCollectiveWithAllRanksOnOneCpu) {
  test::OnOneCpu pinned;
  ASSERT_TRUE(pinned.ok());
  every_collective_in_many_rounds(3, {});
}

// What a rank does when the scheduler keeps it on its peer's CPU: it leaves
// for another CPU of its mask, which it then has back whole; with a mask of
// one CPU it stays.
TEST(Arena, MovingOffACpuKeepsTheAffinityMask) {
  cpu_set_t old_mask;
  ASSERT_EQ(sched_getaffinity(0, sizeof(old_mask), &old_mask), 0);
  if (CPU_COUNT(&old_mask) < 2) GTEST_SKIP() << "needs two CPUs in the affinity mask";
  int first = 0;
  while (!CPU_ISSET(first, &old_mask)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  ASSERT_EQ(sched_getcpu(), first);
  EXPECT_FALSE(proc::move_off_cpu(first));  // nowhere to go
  EXPECT_EQ(sched_getcpu(), first);
  ASSERT_EQ(sched_setaffinity(0, sizeof(old_mask), &old_mask), 0);
  const int here = sched_getcpu();
  EXPECT_TRUE(proc::move_off_cpu(here));
  EXPECT_NE(sched_getcpu(), here);
  cpu_set_t now;
  ASSERT_EQ(sched_getaffinity(0, sizeof(now), &now), 0);
  EXPECT_TRUE(CPU_EQUAL(&now, &old_mask));
}

// When a rank beside its peer moves: at the second wait in a row; then, while
// the scheduler keeps putting it back, after a hold-off that doubles; at once
// again after a move that held. It never moves when it may not, and after a
// failed move it does not ask again soon.
TEST(Arena, CpuSharingMovesAgainWhileMovesAreUndone) {
  using S = proc::CpuSharing;
  int moves = 0;
  bool can_move = true;
  auto move = [&] {
    moves += can_move;
    return can_move;
  };
  // Beside waits until the next move; -1 if none within `limit`.
  auto waits_to_move = [&](S& s, int limit) {
    for (int i = 1; i <= limit; ++i) {
      if (s.beside(true, move)) return i;
    }
    return -1;
  };
  S s;
  EXPECT_EQ(waits_to_move(s, 10), S::kMoveAfter);
  // Undone at once: each hold-off twice the last, up to the most.
  int holdoff = S::kFirstHoldoff;
  for (int k = 0; k < 12; ++k) {
    EXPECT_EQ(waits_to_move(s, 2 * S::kMaxHoldoff), holdoff + S::kMoveAfter) << "move " << k;
    holdoff = std::min(2 * holdoff, S::kMaxHoldoff);
  }
  EXPECT_EQ(moves, 13);
  // A move that held: the next one comes without hold-off.
  for (int i = 0; i < S::kHeld; ++i) s.apart();
  EXPECT_EQ(waits_to_move(s, 10), S::kMoveAfter);
  EXPECT_EQ(s.next_holdoff(), 2 * S::kFirstHoldoff);
  // A wait apart breaks a run of waits beside.
  S t;
  EXPECT_FALSE(t.beside(true, move));
  t.apart();
  EXPECT_FALSE(t.beside(true, move));
  EXPECT_TRUE(t.beside(true, move));
  // Not allowed to move: never does.
  S u;
  for (int i = 0; i < 3 * S::kMaxHoldoff; ++i) EXPECT_FALSE(u.beside(false, move));
  // Nowhere to go: asks again only after the longest hold-off.
  can_move = false;
  const int before = moves;
  S v;
  EXPECT_EQ(waits_to_move(v, S::kMoveAfter), -1);  // tried, and failed
  can_move = true;
  EXPECT_EQ(waits_to_move(v, 3 * S::kMaxHoldoff), S::kMaxHoldoff + S::kMoveAfter);
  EXPECT_EQ(moves, before + 1);
}

// A wait that holds its core (Spin::kHold) gives it away only while the
// thread that runs its peer's rounds is queued on it: here rank 1's thread
// begins a round on this thread's CPU (both pinned to one) and spins, then
// sleeps, then is gone.
TEST(Arena, WaitSeesItsPeerQueuedOnItsCpu) {
  std::string why;
  auto both = test::arenas(2, 77, &why);
  ASSERT_EQ(both.size(), 2u) << why;
  auto& a0 = both[0];
  auto& a1 = both[1];
  proc::TaskWatch look;
  EXPECT_TRUE(a0->peer_queued_here(1, look));  // no round begun: it cannot tell
  test::OnOneCpu pinned;
  ASSERT_TRUE(pinned.ok());
  std::mutex mu;
  std::condition_variable cv;
  int stage = 0;
  std::atomic<bool> spin{true};
  std::thread peer([&] {
    a1->begin(1, transport::Fingerprint{});
    {
      std::lock_guard<std::mutex> g(mu);
      stage = 1;
    }
    cv.notify_all();
    while (spin.load(std::memory_order_relaxed)) {
    }
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return stage == 2; });
  });
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return stage == 1; });
  }
  EXPECT_TRUE(a0->peer_queued_here(1, look));  // it spins, behind this thread
  spin.store(false);
  bool away = false;  // it goes to sleep once it has the CPU to see `spin`
  for (int i = 0; i < 1000000 && !away; ++i) {
    sched_yield();
    away = !a0->peer_queued_here(1, look);
  }
  EXPECT_TRUE(away);
  {
    std::lock_guard<std::mutex> g(mu);
    stage = 2;
  }
  cv.notify_all();
  const int tid = proc::this_tid();
  peer.join();
  proc::TaskWatch gone;
  EXPECT_FALSE(gone.watch(getpid(), tid + 1000000));  // no such thread
  EXPECT_EQ(gone.runnable_on(sched_getcpu()), -1);
  proc::TaskWatch self;
  ASSERT_TRUE(self.watch(getpid(), tid));
  EXPECT_EQ(self.runnable_on(sched_getcpu()), 1);  // running here
  // Running on another CPU: not queued here.
  int other = -1;
  for (int c = 0; c < CPU_SETSIZE && other < 0; ++c) {
    if (CPU_ISSET(c, &pinned.old_mask()) && c != sched_getcpu()) other = c;
  }
  if (other < 0) return;
  std::atomic<int> there{0};
  std::thread elsewhere([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(other, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) return there.store(-1);
    there.store(proc::this_tid());
    while (there.load(std::memory_order_relaxed) > 0) {
    }
  });
  while (there.load() == 0) sched_yield();
  const int there_tid = there.load();
  ASSERT_GT(there_tid, 0);
  proc::TaskWatch w;
  ASSERT_TRUE(w.watch(getpid(), there_tid));
  EXPECT_EQ(w.runnable_on(sched_getcpu()), 0);
  EXPECT_EQ(w.runnable_on(other), 1);
  there.store(0);
  elsewhere.join();
}

// A rank asleep on its peer's counter is woken by the peer's arrival, not
// by the end of its sleep's slice: rank 1 waits with no spin, on both round
// parities; rank 0 arrives once rank 1 is registered and blocked (its
// thread sleeping, read from /proc), so that the wake is the only way out
// of the futex before the slice ends.
TEST(Arena, ArrivalWakesAPeerAsleepOnIt) {
  using coll::arena::HostArena;
  std::string why;
  auto both = test::arenas(2, 81, &why);
  ASSERT_EQ(both.size(), 2u) << why;
  both[1]->set_spin(0, HostArena::Spin::kYield);
  for (uint64_t round = 1; round <= 4; ++round) {
    for (auto& a : both) a->begin(round, transport::Fingerprint{});
    std::atomic<int> tid{0};
    std::thread sleeper([&] {
      tid.store(proc::this_tid());
      transport::LazyDeadline deadline(std::chrono::seconds(20));
      both[1]->wait_one(0, 1, deadline);
    });
    while (tid.load() == 0) sched_yield();
    const std::string stat = "/proc/self/task/" + std::to_string(tid.load()) + "/stat";
    auto blocked = [&] {
      std::ifstream f(stat);
      std::string line;
      std::getline(f, line);
      char state = 0;
      int cpu = -1;
      return proc::parse_task_stat(line, &state, &cpu) && state == 'S';
    };
    bool asleep = false;
    for (int i = 0; i < 10000000 && !asleep; ++i) {
      asleep = both[0]->asleep_on(0) == 1 && blocked();
      if (!asleep) sched_yield();
    }
    both[0]->arrive(1);
    sleeper.join();
    ASSERT_TRUE(asleep) << "round " << round << ": rank 1 never went to sleep";
    // A futex wait returns 0 only when woken (a slice that ran out while this
    // thread was descheduled shows in slices_out, and is not a failure).
    EXPECT_EQ(both[1]->sleeps().woken, round)
        << "round " << round << ": the arrival did not wake it (" << both[1]->sleeps().slices_out << " slices out)";
    EXPECT_EQ(both[0]->asleep_on(0), 0u);
  }
}

// On a crowded host, a wait whose thread's last yield took another task's
// time slice sleeps at once rather than spin (YieldGauge): here with a spin
// of a minute, it is asleep on the peer's counter within 10 s, without a
// yield (which, when long, would have set a longer skip); whether the two
// ranks begin their round on different CPUs or on one (wait_beside).
TEST(Arena, CrowdedWaitSleepsAtOnceAfterALongYield) {
  using coll::arena::HostArena;
  test::OnOneCpu pin;
  ASSERT_TRUE(pin.ok());
  cpu_set_t others = pin.old_mask();
  CPU_CLR(sched_getcpu(), &others);
  for (const bool apart : {true, false}) {
    SCOPED_TRACE(apart ? "apart" : "on one CPU");
    if (apart && CPU_COUNT(&others) == 0) continue;  // one CPU only
    std::string why;
    auto both = test::arenas(2, apart ? 83 : 84, &why);
    ASSERT_EQ(both.size(), 2u) << why;
    both[1]->set_spin(60'000'000, HostArena::Spin::kYield);
    both[0]->begin(1, transport::Fingerprint{});
    std::atomic<bool> started{false};
    int skipping = -1;
    std::thread waiter([&] {
      if (apart) {
        ASSERT_EQ(sched_setaffinity(0, sizeof(others), &others), 0);
      }
      both[1]->begin(1, transport::Fingerprint{});
      YieldGauge& gauge = YieldGauge::here();
      gauge.yielded(YieldGauge::kLongYield);
      started = true;
      transport::LazyDeadline deadline(std::chrono::seconds(120));
      both[1]->wait_one(0, 1, deadline);
      skipping = gauge.skipping();
    });
    while (!started) sched_yield();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (both[0]->asleep_on(0) == 0 && std::chrono::steady_clock::now() < until) sched_yield();
    const bool asleep = both[0]->asleep_on(0) == 1;
    both[0]->arrive(1);
    waiter.join();
    EXPECT_TRUE(asleep) << "it spun";
    EXPECT_EQ(skipping, YieldGauge::kFirstSkip - 1);
  }
}

// The barrier in the arena: no rank leaves one before every rank has
// entered it, over barriers in a row. Each rank counts in the store the
// barriers it has entered; after barrier k every rank must read at least
// k + 1 from every rank. Each barrier has a late rank (store round trips
// before it enters), so one that let ranks through early fails here.
TEST(Arena, BarrierLetsNoRankLeaveBeforeAllEntered) {
  constexpr int n = 3;
  JobOptions jo;
  jo.env["SHOAL_DEBUG"] = "INFO";
  auto res = run_ranks(n, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    for (int k = 0; k < 24; ++k) {
      if (me == k % n) {
        for (int i = 0; i < 5; ++i) store->add("late", 1);
      }
      store->add("entered/" + std::to_string(me), 1);
      c->barrier()->wait();
      for (int q = 0; q < n; ++q) {
        const int64_t seen = store->add("entered/" + std::to_string(q), 0);
        SHOAL_CHECK_MSG(seen >= k + 1, "barrier " << k << ": rank " << q << " had entered " << seen);
      }
    }
  }, jo);
  EXPECT_EQ(test::failures(res), "");
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(res[r].output.find("barrier of 0 B, size class [0 B]: algorithm shared\n"), std::string::npos)
        << res[r].output;
  }
}

// One host: the arena is what a small and a large allreduce choose.
TEST(Arena, ChosenByDefaultOnOneHost) {
  JobOptions jo;
  jo.env["SHOAL_DEBUG"] = "INFO";
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    std::vector<float> x(1 << 20, static_cast<float>(me + 1));
    c->allreduce(x.data(), x.data(), 2, f32, ReduceOp::kSum)->wait();
    c->allreduce(x.data(), x.data(), x.size(), f32, ReduceOp::kSum)->wait();
    SHOAL_CHECK(x[0] == 6.0f && x[5] == 3.0f);
  }, jo);
  EXPECT_EQ(test::failures(res), "");
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(res[r].output.find("shared-memory arena of 2 ranks"), std::string::npos) << res[r].output;
    EXPECT_NE(res[r].output.find("allreduce of 8 B, size class [8 B, 16 B): algorithm shared"), std::string::npos)
        << res[r].output;
    EXPECT_NE(res[r].output.find("allreduce of 4194304 B"), std::string::npos) << res[r].output;
    EXPECT_EQ(res[r].output.find("algorithm ring"), std::string::npos) << res[r].output;
  }
}

// Forced onto the arena where there is none (ranks on two "hosts", or the
// arena turned off): an argument error on every rank, naming the reason.
void forced_without_arena(const std::string& knob, const std::string& value0, const std::string& value1) {
  JobOptions jo;
  jo.create_comm = false;
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>&, int me, int, const std::shared_ptr<Store>& store) {
    setenv(knob.c_str(), (me == 0 ? value0 : value1).c_str(), 1);
    auto c = Communicator::create(store, me, 2, Options{});
    float x = 1;
    c->allreduce(&x, &x, 1, f32, ReduceOp::kSum)->wait();  // the table's choice: works
    SHOAL_CHECK(x == 2.0f);
    auto err = capture([&] { c->allreduce(&x, &x, 1, f32, ReduceOp::kSum, shared())->wait(); });
    SHOAL_CHECK_MSG(err != nullptr, "rank " << me << ": forced shared ran without an arena");
    if (err) {
      SHOAL_CHECK_MSG(code(err) == ErrorCode::kInvalidArgument, message(err));
      SHOAL_CHECK_MSG(message(err).find("algorithm 'shared' needs every rank") != std::string::npos, message(err));
      SHOAL_CHECK_MSG(message(err).find("shoal rank " + std::to_string(me)) != std::string::npos, message(err));
    }
  }, jo);
  EXPECT_EQ(test::failures(res), "");
}

TEST(Arena, ForcedWithoutArenaFailsOnEveryRank) {
  forced_without_arena("SHOAL_SHM_ARENA_BYTES", "0", "0");
  forced_without_arena("SHOAL_HOST_ID", "host-a", "host-b");
}

// A rank that stops taking part after the arena is set up: the other's
// wait inside a round times out, naming it and what it waited for.
TEST(Arena, TimeoutInsideARoundNamesTheRank) {
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    float x = 1;
    c->allreduce(&x, &x, 1, f32, ReduceOp::kSum)->wait();
    if (me == 1) {
      store->get("rank0_done");  // never joins the second allreduce
      return;
    }
    OpOptions o = shared();
    o.timeout = std::chrono::milliseconds(300);
    auto t0 = mono_ns();
    auto err = capture([&] { c->allreduce(&x, &x, 1, f32, ReduceOp::kSum, o)->wait(); });
    double ms = (mono_ns() - t0) / 1e6;
    SHOAL_CHECK(err != nullptr);
    if (err) {
      SHOAL_CHECK_MSG(code(err) == ErrorCode::kTimeout, message(err));
      SHOAL_CHECK_MSG(message(err).find("rank 1") != std::string::npos, message(err));
      SHOAL_CHECK_MSG(message(err).find("shared-memory round of seq 2") != std::string::npos, message(err));
      SHOAL_CHECK_MSG(ms >= 290 && ms < 5000, "took " << ms << " ms");
    }
    store->set_str("rank0_done", "1");
  });
  EXPECT_EQ(test::failures(res), "");
}

// abort() from another thread ends a wait inside a round at once.
TEST(Arena, AbortEndsAWaitInsideARound) {
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    float x = 1;
    c->allreduce(&x, &x, 1, f32, ReduceOp::kSum)->wait();
    if (me == 1) {
      store->get("aborted");
      return;
    }
    auto w = c->allreduce(&x, &x, 1, f32, ReduceOp::kSum, shared());
    SHOAL_CHECK(!w->wait_for(std::chrono::milliseconds(50)));  // rank 1 is not there
    auto t0 = mono_ns();
    c->abort("test says stop");
    auto err = capture([&] { w->wait(); });
    double ms = (mono_ns() - t0) / 1e6;
    SHOAL_CHECK(err && code(err) == ErrorCode::kAborted);
    SHOAL_CHECK(err && message(err).find("test says stop") != std::string::npos);
    SHOAL_CHECK_MSG(ms < 1000, "abort took " << ms << " ms");
    store->set_str("aborted", "1");
  });
  EXPECT_EQ(test::failures(res), "");
}

std::vector<std::string> dev_shm() {
  std::vector<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) out.emplace_back(e->d_name);
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A rank SIGKILLed while the others loop on small arena allreduces (which
// never touch a socket): every survivor names it within 2 s.
TEST(Arena, KilledRankIsNamedByEverySurvivor) {
  const auto shm_before = dev_shm();
  test::expect_killed_rank_named(3, 1, [](Communicator& c) {
    float x = 1;
    c.allreduce(&x, &x, 1, f32, ReduceOp::kMax, shared())->wait();
  }, "peer lost: rank 1");
  EXPECT_EQ(dev_shm(), shm_before) << "files left in /dev/shm";
}

// SlotStores (slot_stores.h): which rounds probe which way, and how the
// rounds' times move the choice, one slow round not enough, each size class
// on its own.
TEST(SlotStores, ProbesBothWaysAndFollowsTheCheaper) {
  using coll::arena::SlotStores;
  constexpr size_t big = SlotStores::kMinBytes, bigger = 4 * big;
  constexpr uint64_t P = SlotStores::kProbeEvery;
  SlotStores s;
  std::vector<int> streamed;  // the rounds written streamed, of the first 3 probe periods
  for (uint64_t k = 0; k < 3 * P; ++k) {
    EXPECT_FALSE(s.begin(big - 1));  // small rounds: never streamed, never counted
    if (s.begin(big)) streamed.push_back(static_cast<int>(k));
    s.note(big, false, 0.03, false);  // (cheaper through the cache: probes only)
  }
  EXPECT_EQ(streamed, (std::vector<int>{3, 5, P / 2, P + P / 2, 2 * P + P / 2}));

  auto cheaper_cache = [&](int rounds) {  // the cores share a cache
    for (int i = 0; i < rounds; ++i) s.note(big, false, 0.03, false);
  };
  s.note(big, true, 0.05, true);
  EXPECT_FALSE(s.streaming(big));
  s.note(big, true, 0.05, true);  // (two samples of each way from here on)
  cheaper_cache(20);
  EXPECT_FALSE(s.streaming(big));
  s.note(big, false, 0.45, false);  // one slow round (preempted)
  EXPECT_FALSE(s.streaming(big));
  cheaper_cache(20);
  int rounds = 0;
  while (!s.streaming(big) && rounds < 40) {  // the cores drift apart: every round dearer
    s.note(big, false, 0.45, false);
    ++rounds;
  }
  EXPECT_TRUE(s.streaming(big));
  EXPECT_GE(rounds, 2);
  EXPECT_LE(rounds, 4);
  EXPECT_FALSE(s.begin(big));  // (round 3P of the class: a probe through the cache)
  EXPECT_TRUE(s.begin(big));
  EXPECT_FALSE(s.streaming(big - 1));
  EXPECT_FALSE(s.streaming(bigger));  // another class keeps its own estimates
  EXPECT_FALSE(s.begin(bigger));
  s.note(big, false, 0.03, true);  // one probe finds them close again: half way back
  EXPECT_TRUE(s.streaming(big));
  s.note(big, false, 0.03, true);
  s.note(big, false, 0.03, true);
  EXPECT_FALSE(s.streaming(big));

  SlotStores fresh;  // a first probe that ran slow does not decide alone,
  fresh.note(big, false, 0.25, true);  // however slow
  fresh.note(big, true, 0.05, true);
  fresh.note(big, false, 0.03, true);
  fresh.note(big, true, 0.05, true);
  EXPECT_FALSE(fresh.streaming(big));
  SlotStores apart;  // while two of each way that agree do
  apart.note(big, false, 0.25, true);
  apart.note(big, true, 0.05, true);
  apart.note(big, false, 0.20, true);
  apart.note(big, true, 0.06, true);
  EXPECT_TRUE(apart.streaming(big));

  // A round abandoned (a rank that wrote nothing in it) counts, untimed.
  SlotStores bcast;
  for (int k = 0; k < 3; ++k) {
    bcast.begin(big);
    bcast.abandon();
  }
  bcast.note(big, false, 0.09, true);
  bcast.note(big, false, 0.09, true);
  bcast.note(big, true, 0.05, true);
  bcast.note(big, true, 0.05, true);  // 1.8x: not yet
  EXPECT_TRUE(bcast.begin(big));      // round 3: a streamed probe, very fast
  bcast.abandon();
  bcast.end();
  EXPECT_FALSE(bcast.streaming(big));
  EXPECT_FALSE(bcast.begin(big));  // round 4
  bcast.abandon();
  EXPECT_TRUE(bcast.begin(big));  // round 5, timed this time
  bcast.end();
  EXPECT_TRUE(bcast.streaming(big));

  SlotStores fixed;
  fixed.set_mode(SlotStores::Mode::kStreamed);
  EXPECT_TRUE(fixed.begin(big));
  EXPECT_FALSE(fixed.begin(big - 1));
  fixed.set_mode(SlotStores::Mode::kCached);
  for (uint64_t k = 0; k < P; ++k) EXPECT_FALSE(fixed.begin(big));
}

// shoal::copy, which every slot copy goes through, copies exactly like
// memcpy at every gap between destination and source modulo a page (its
// own loop for gaps 1-63, memcpy otherwise) and every size around its
// thresholds, without touching a byte outside the destination.
TEST(Copy, EqualsMemcpyAtEveryGapAndSize) {
  std::vector<uint8_t> src(3 * 4096 + 300), dst(src.size() + 2 * 4096), want;
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  int own_loop = 0;
  for (size_t gap : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{63}, size_t{64}, size_t{2048}}) {
    for (size_t n : {size_t{0}, size_t{63}, size_t{2048}, size_t{2049}, size_t{4096 + 37}, src.size()}) {
      // Destination `gap` bytes after the source modulo 4 KiB.
      const uintptr_t s = reinterpret_cast<uintptr_t>(src.data());
      const uintptr_t base = (reinterpret_cast<uintptr_t>(dst.data()) + 4095) & ~uintptr_t{4095};
      uint8_t* d = reinterpret_cast<uint8_t*>(base + ((s + gap) & 4095));
      ASSERT_LE(d + n + 1, dst.data() + dst.size());
      std::fill(dst.begin(), dst.end(), 0xAB);
      want = dst;
      std::memcpy(want.data() + (d - dst.data()), src.data(), n);
      own_loop += copy_avoids_rep_movsb(d, src.data(), n);
      copy(d, src.data(), n);
      EXPECT_EQ(dst, want) << "gap " << gap << " bytes " << n;
    }
  }
  EXPECT_EQ(own_loop, 12);  // gaps 1, 15, 16 and 63 at the three sizes above 2048
}

// shoal::copy_stream (non-temporal stores, for large outputs) copies
// exactly like memcpy at every alignment of the destination and every size
// around its thresholds, without touching a byte outside the destination.
TEST(Copy, StreamEqualsMemcpyAtEveryAlignmentAndSize) {
  std::vector<uint8_t> src(3 * 4096 + 300), dst(src.size() + 128), want;
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 151 + 3);
  for (size_t skew : {size_t{0}, size_t{1}, size_t{8}, size_t{15}, size_t{16}, size_t{33}}) {
    for (size_t n : {size_t{0}, size_t{17}, size_t{4095}, size_t{4096}, size_t{4096 + 63}, src.size() - 5}) {
      std::fill(dst.begin(), dst.end(), 0xCD);
      uint8_t* d = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(dst.data()) + 63) & ~uintptr_t{63}) + skew;
      ASSERT_LE(d + n, dst.data() + dst.size());
      want = dst;
      std::memcpy(want.data() + (d - dst.data()), src.data() + 5, n);
      copy_stream(d, src.data() + 5, n);
      EXPECT_EQ(dst, want) << "skew " << skew << " bytes " << n;
    }
  }
}

}  // namespace
}  // namespace shoal
