// test_peer_watch.cc — how a rank that waits while holding its core looks at
// its peer: the two fields it reads of the peer's thread in /proc, the pid
// of a peer's process on this machine (proc::local_pid), and the look of a
// wait for messages (transport::peer_queued_on) at a peer process queued on
// its CPU, and what such a wait makes of its looks (transport::BesideLooks);
// on a crowded host, when a wait stops giving its core away and sleeps at
// once (YieldGauge). The arena's own look is in test_arena.cc.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "common/process.h"
#include "common/yield_gauge.h"
#include "core/wait_spins.h"
#include "cpu_util.h"
#include "transport/hybrid_transport.h"

namespace shoal {
namespace {

// The two fields a waiting rank reads of its peer's thread
// (/proc/<pid>/task/<tid>/stat), whatever the command name holds.
TEST(PeerWatch, TaskStatGivesStateAndCpu) {
  auto line = [](const std::string& comm, const std::string& state, const std::string& cpu) {
    // Appended piece by piece: GCC 12 warns (-Wrestrict, wrongly) on "..." + std::string.
    std::string s = "4242 (";
    s += comm;
    s += ") ";
    s += state;
    for (int f = 4; f <= 38; ++f) {
      s += ' ';
      s += std::to_string(f * 3);
    }
    s += ' ';
    s += cpu;
    s += " 0 0 0 0\n";
    return s;
  };
  char state = 0;
  int cpu = -1;
  ASSERT_TRUE(proc::parse_task_stat(line("shoal-perf", "R", "1"), &state, &cpu));
  EXPECT_EQ(state, 'R');
  EXPECT_EQ(cpu, 1);
  ASSERT_TRUE(proc::parse_task_stat(line("a) S 9 (b c", "S", "13"), &state, &cpu));
  EXPECT_EQ(state, 'S');
  EXPECT_EQ(cpu, 13);
  const std::string last = line("x", "D", "5");
  ASSERT_TRUE(proc::parse_task_stat(last.substr(0, last.find(" 0 0 0 0")), &state, &cpu));  // the CPU ends it
  EXPECT_EQ(cpu, 5);
  for (const std::string& bad : {line("x", "RS", "1"), line("x", "R", "-1"), line("x", "R", "1a"),
                                 std::string("4242 (x) R 1 2 3"), std::string("4242 x R 1 2 3")}) {
    state = 0;
    cpu = -1;
    EXPECT_FALSE(proc::parse_task_stat(bad, &state, &cpu)) << bad;
    EXPECT_EQ(cpu, -1) << bad;
  }
}

// The pid a wait for messages watches its peer's main thread by: only a
// process of this machine and pid namespace has one.
TEST(PeerWatch, LocalPidOnlyForThisMachine) {
  const std::string me = proc::self_token();
  if (me.empty()) GTEST_SKIP() << "/proc does not tell this process's token";
  EXPECT_EQ(proc::local_pid(me), static_cast<int64_t>(getpid()));
  const size_t boot_end = me.find('/');
  const std::string elsewhere = "00000000-0000-0000-0000-000000000000" + me.substr(boot_end);
  EXPECT_EQ(proc::local_pid(elsewhere), 0) << elsewhere;  // another machine's boot id
  const size_t pid_at = me.find('/', boot_end + 1) + 1;
  const size_t pid_end = me.find('/', pid_at);
  for (const std::string& bad : {std::string(), std::string("-"), me.substr(0, pid_end),
                                 me.substr(0, pid_at) + "12x" + me.substr(pid_end),
                                 me.substr(0, pid_at) + "0" + me.substr(pid_end)}) {
    EXPECT_EQ(proc::local_pid(bad), 0) << bad;
  }
}

// A wait for messages that holds its core gives it away while the main
// thread of its peer's process is queued on it (peer_queued_on): here a
// child process, pinned with this one to one CPU, spins, then sleeps.
TEST(PeerWatch, MessageWaitSeesItsPeerProcessQueuedOnItsCpu) {
  test::OnOneCpu pinned;
  ASSERT_TRUE(pinned.ok());
  int go[2], ready[2];
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // spins until a byte comes, then sleeps in read() until the pipe closes
    close(go[1]);
    close(ready[0]);
    char c = 'r';
    if (write(ready[1], &c, 1) != 1) _exit(1);
    const int flags = fcntl(go[0], F_GETFL);
    fcntl(go[0], F_SETFL, flags | O_NONBLOCK);
    while (read(go[0], &c, 1) != 1) {
    }
    fcntl(go[0], F_SETFL, flags);
    while (read(go[0], &c, 1) > 0) {
    }
    _exit(0);
  }
  close(go[0]);
  close(ready[1]);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  struct PeerOne : transport::Liveness {
    int64_t pid = 0;
    int64_t local_pid(int peer) override { return peer == 1 ? pid : 0; }
  } live;
  live.pid = child;
  transport::Request r;
  r.peer = 1;
  transport::Request* rs[1] = {&r};
  std::vector<int64_t> pids;
  proc::TaskWatch watch;
  const int cpu = sched_getcpu();
  EXPECT_EQ(transport::peer_queued_on(cpu, rs, 1, live, pids, watch), 1);  // it spins, behind this process
  r.complete = true;
  EXPECT_EQ(transport::peer_queued_on(cpu, rs, 1, live, pids, watch), -1);  // nothing to wait for
  r.complete = false;
  r.peer = 0;
  EXPECT_EQ(transport::peer_queued_on(cpu, rs, 1, live, pids, watch), -1);  // a peer elsewhere
  r.peer = 1;
  c = 'g';
  ASSERT_EQ(write(go[1], &c, 1), 1);
  bool away = false;  // it goes to sleep once it has the CPU to read the byte
  for (int i = 0; i < 1000000 && !away; ++i) {
    sched_yield();
    away = transport::peer_queued_on(cpu, rs, 1, live, pids, watch) < 0;
  }
  EXPECT_TRUE(away);
  close(go[1]);
  close(ready[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// What a wait that holds its core makes of its looks for a peer queued on
// its CPU (BesideLooks): only the first look of a wait counts as that wait's
// finding; a wait that ends before any look breaks no run of waits that
// found the peer beside; the higher rank moves, at the second such wait, and
// spins on after a move; after a wait that found its peer beside, the next
// looks at once.
TEST(PeerWatch, WaitsBesideTheirPeerMoveTheHigherRank) {
  using L = transport::BesideLooks;
  int moves = 0;
  auto move = [&] {
    ++moves;
    return true;
  };
  const transport::Clock::time_point t0{};
  L hi;
  EXPECT_EQ(hi.begin(t0), t0 + L::kFirstLook);
  EXPECT_TRUE(hi.found(1, 0, move));   // beside: give the core away
  EXPECT_TRUE(hi.found(1, 0, move));   // the same wait, still beside: not a second finding
  EXPECT_EQ(moves, 0);
  EXPECT_EQ(hi.begin(t0), t0);         // the last wait found the peer beside: look at once
  EXPECT_EQ(hi.begin(t0), t0);         // this one ended before a look
  EXPECT_FALSE(hi.found(1, 0, move));  // the second wait in a row beside: moved, spins on
  EXPECT_EQ(moves, 1);
  hi.begin(t0);
  EXPECT_FALSE(hi.found(1, -1, move));  // apart now
  EXPECT_EQ(hi.begin(t0), t0 + L::kFirstLook);
  // The lower rank of the two never moves; it gives the core away.
  L lo;
  for (int i = 0; i < 3 * proc::CpuSharing::kMaxHoldoff; ++i) {
    lo.begin(t0);
    EXPECT_TRUE(lo.found(0, 1, move));
  }
  EXPECT_EQ(moves, 1);
  // A look apart between two beside breaks the run.
  L mid;
  mid.begin(t0);
  EXPECT_TRUE(mid.found(2, 1, move));
  mid.begin(t0);
  EXPECT_FALSE(mid.found(2, -1, move));
  mid.begin(t0);
  EXPECT_TRUE(mid.found(2, 1, move));
  EXPECT_EQ(moves, 1);
}

// A crowded host's waits give the core away between polls until a yield
// takes a time slice of other work: then the next kFirstSkip waits sleep at
// once, one spins again, and while its yields stay long the number skipped
// doubles, up to kMaxSkip; a spun wait whose yields were all short (and
// not one without a yield) brings it back to kFirstSkip.
TEST(PeerWatch, CrowdedWaitsSleepAtOnceWhileYieldsAreLong) {
  using G = YieldGauge;
  const auto brief = std::chrono::microseconds(20);
  const auto slice = std::chrono::milliseconds(3);
  // Waits that sleep at once before the next that spins.
  auto skipped = [](G& g) {
    int n = 0;
    while (!g.spin()) ++n;
    return n;
  };
  G g;
  EXPECT_TRUE(g.spin());
  EXPECT_TRUE(g.yielded(brief));
  EXPECT_TRUE(g.yielded(G::kLongYield - std::chrono::microseconds(1)));
  EXPECT_EQ(skipped(g), 0);
  EXPECT_FALSE(g.yielded(G::kLongYield));
  EXPECT_EQ(skipped(g), G::kFirstSkip);
  int expect = G::kFirstSkip;
  for (int k = 0; k < 12; ++k) {  // busy still at each look
    EXPECT_FALSE(g.yielded(slice));
    expect = std::min(2 * expect, G::kMaxSkip);
    EXPECT_EQ(skipped(g), expect) << "look " << k;
  }
  EXPECT_EQ(expect, G::kMaxSkip);
  g.quiet();  // a wait that came to its end without a yield says nothing
  EXPECT_FALSE(g.yielded(slice));
  EXPECT_EQ(skipped(g), G::kMaxSkip);
  EXPECT_TRUE(g.yielded(brief));  // quiet again
  g.quiet();
  EXPECT_EQ(skipped(g), 0);
  EXPECT_FALSE(g.yielded(slice));
  EXPECT_EQ(skipped(g), G::kFirstSkip);
  // Each thread has its own.
  G* mine = &G::here();
  G* other = nullptr;
  std::thread([&] { other = &G::here(); }).join();
  EXPECT_NE(mine, other);
  EXPECT_EQ(mine, &G::here());
}

// Which waits of a collective hold their core for the hold budget: the
// caller's own, with the budget derived, up to 4 MiB per rank for messages
// and 8 MiB in the arena; never the executor's message waits.
TEST(PeerWatch, CollectiveWaitsHoldUpToTheirSizeBounds) {
  using core::kHoldUs;
  using core::wait_spins;
  using Spin = coll::arena::HostArena::Spin;
  constexpr size_t MiB = size_t{1} << 20;
  auto w = wait_spins(true, false, true, 200, 4 * MiB);
  EXPECT_EQ(w.message_us, kHoldUs);
  EXPECT_EQ(w.arena_us, kHoldUs);
  EXPECT_EQ(w.arena, Spin::kHold);
  w = wait_spins(true, false, true, 200, 4 * MiB + 1);  // messages spin the budget, the arena holds on
  EXPECT_EQ(w.message_us, 200);
  EXPECT_EQ(w.arena_us, kHoldUs);
  EXPECT_EQ(w.arena, Spin::kHold);
  w = wait_spins(true, false, true, 200, 8 * MiB + 1);
  EXPECT_EQ(w.message_us, 200);
  EXPECT_EQ(w.arena_us, 200);
  EXPECT_EQ(w.arena, Spin::kShare);
  w = wait_spins(false, false, true, 200, 8);  // the executor
  EXPECT_EQ(w.message_us, 0);
  EXPECT_EQ(w.arena_us, 200);
  EXPECT_EQ(w.arena, Spin::kShare);
  w = wait_spins(true, false, false, 300, 8);  // an explicit SHOAL_SPIN_US is every wait's spin
  EXPECT_EQ(w.message_us, 300);
  EXPECT_EQ(w.arena_us, 300);
  EXPECT_EQ(w.arena, Spin::kHold);
  w = wait_spins(true, true, true, 200, 8);  // more ranks than cores: every wait yields
  EXPECT_EQ(w.message_us, 200);
  EXPECT_EQ(w.arena_us, 200);
  EXPECT_EQ(w.arena, Spin::kYield);
}

}  // namespace
}  // namespace shoal
