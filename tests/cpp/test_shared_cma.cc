// test_shared_cma.cc — the single-copy algorithms on the shared arena
// (allgather_shared_cma.cc, broadcast_shared_cma.cc; HostArena::read and
// write; the allreduce whose pieces the ranks claim,
// allreduce_shared_claim.cc: HostArena::claim), and allgather's choice
// between one copy and two (allgather_shared_timed.cc, copy_choice.h): who
// gets them, the ranks agreeing that the kernel allows them and on the way
// of each timed allgather, their results when their rounds interleave with
// the slot algorithms' on crowded CPUs, what a forced one says where they
// are off, a rank that runs another algorithm for the same operation, a
// rank killed while the others write into its memory, a failed rank's
// output closed to its peers' writes, a live peer's buffer gone (the cause
// reported is the operation's), the set-up's probe naming a member whose
// process has exited, and which allreduces claim pieces on a crowded host.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "collectives/arena/copy_choice.h"
#include "arena_util.h"
#include "errors_util.h"
#include "cpu_util.h"
#include "harness.h"
#include "kill_util.h"

namespace shoal {
namespace {

using test::capture;
using test::code;
using test::JobOptions;
using test::message;
using test::run_ranks;

constexpr DataType f32 = DataType::kFloat32;

OpOptions algo(const std::string& name) {
  OpOptions o;
  o.algorithm = name;
  return o;
}

// Element i of rank r's input in round k: exact in float32.
float v(int r, size_t i, int k) { return static_cast<float>((i * 5 + static_cast<size_t>(r) * 7 + k) % 1001); }

// Allgather and broadcast of `count` elements per rank, forced onto `name`
// ("": the table's choice), checked element by element; round k changes
// every input, so that a read of a stale buffer or of the previous round's
// shows.
void allgather(Communicator& c, int me, int n, size_t count, int k, const std::string& name) {
  std::vector<float> in(count), all(count * static_cast<size_t>(n), -1);
  for (size_t i = 0; i < count; ++i) in[i] = v(me, i, k);
  c.allgather(in.data(), all.data(), count, f32, algo(name))->wait();
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) {
      if (all[static_cast<size_t>(r) * count + i] != v(r, i, k)) {
        SHOAL_CHECK_MSG(false, "allgather round " << k << " block " << r << " i=" << i);
        return;
      }
    }
  }
}

void broadcast(Communicator& c, int me, size_t count, int k, const std::string& name) {
  const int root = k % c.size();
  std::vector<float> b(count, -1);
  for (size_t i = 0; me == root && i < count; ++i) b[i] = v(me, i, k);
  c.broadcast(b.data(), count, f32, root, algo(name))->wait();
  for (size_t i = 0; i < count; ++i) {
    if (b[i] != v(root, i, k)) {
      SHOAL_CHECK_MSG(false, "broadcast round " << k << " root " << root << " i=" << i);
      return;
    }
  }
}

void gather_and_broadcast(Communicator& c, int me, int n, size_t count, int k, const std::string& name) {
  allgather(c, me, n, count, k, name);
  broadcast(c, me, count, k, name);
}

// Two ranks with a core each: the ranks agree that reads work, and the
// table picks the single-copy broadcast and the timed allgather (one copy
// or two, copy_choice.h) at mid sizes (the slot algorithms for a small one).
TEST(SharedCma, ChosenByDefaultWhereReadsWork) {
  JobOptions jo;
  jo.env["SHOAL_DEBUG"] = "INFO";
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    gather_and_broadcast(*c, me, 2, 16384, 1, "");  // 64 KiB a block (what the log names), 128 KiB of output
    gather_and_broadcast(*c, me, 2, 16, 2, "");
    for (size_t count : {size_t{32768}, size_t{16384}}) {  // 128 KiB: pieces claimed; 64 KiB: the slots
      std::vector<float> x(count, static_cast<float>(me + 1));
      c->allreduce(x.data(), x.data(), count, f32, ReduceOp::kSum)->wait();
      SHOAL_CHECK_MSG(x[0] == 3.0f && x[count - 1] == 3.0f, "allreduce of " << count);
    }
  }, jo);
  EXPECT_EQ(test::failures(res), "");
  for (int r = 0; r < 2; ++r) {
    const std::string& out = res[r].output;
    EXPECT_NE(out.find("single-copy reads on"), std::string::npos) << out;
    EXPECT_NE(out.find("allgather of 65536 B, size class [64 KiB, 128 KiB): algorithm shared_timed\n"),
              std::string::npos) << out;
    EXPECT_NE(out.find("broadcast of 65536 B, size class [64 KiB, 128 KiB): algorithm shared_cma\n"),
              std::string::npos) << out;
    EXPECT_NE(out.find("allgather of 64 B, size class [64 B, 128 B): algorithm shared\n"), std::string::npos)
        << out;
    EXPECT_NE(out.find("allreduce of 131072 B, size class [128 KiB, 256 KiB): algorithm shared_claim\n"),
              std::string::npos) << out;
    EXPECT_NE(out.find("allreduce of 65536 B, size class [64 KiB, 128 KiB): algorithm shared\n"),
              std::string::npos) << out;
  }
}

// More ranks than the host has cores: no single-copy allgather or small
// claimed allreduce (a second arrival waits for a rank that is not
// running), but claimed pieces from 4 MiB, where the slot rounds would wait
// for every rank's fixed share.
TEST(SharedCma, CrowdedHostClaimsOnlyLargeAllreduces) {
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores < 1 || cores > 7) GTEST_SKIP() << cores << " cores: too many ranks to crowd them";
  const int n = static_cast<int>(cores) + 1;
  JobOptions jo;
  jo.env["SHOAL_DEBUG"] = "INFO";
  auto res = run_ranks(n, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    for (size_t count : {size_t{1} << 20, size_t{1} << 19, size_t{32768}}) {  // 4 MiB, 2 MiB, 128 KiB
      std::vector<float> x(count);
      for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>((i + static_cast<size_t>(me)) % 7);
      c->allreduce(x.data(), x.data(), count, f32, ReduceOp::kSum)->wait();
      for (size_t i = 0; i < count; i += 4099) {
        float want = 0;
        for (int r = 0; r < n; ++r) want += static_cast<float>((i + static_cast<size_t>(r)) % 7);
        SHOAL_CHECK_MSG(x[i] == want, "allreduce of " << count << " at " << i << ": " << x[i] << " != " << want);
      }
    }
  }, jo);
  EXPECT_EQ(test::failures(res), "");
  for (int r = 0; r < n; ++r) {
    const std::string& out = res[r].output;
    if (out.find("single-copy reads on") == std::string::npos) GTEST_SKIP() << "no single-copy reads here: " << out;
    EXPECT_NE(out.find("allreduce of 4194304 B, size class [4 MiB, 8 MiB): algorithm shared_claim\n"),
              std::string::npos) << out;
    EXPECT_NE(out.find("allreduce of 2097152 B, size class [2 MiB, 4 MiB): algorithm shared\n"),
              std::string::npos) << out;
    EXPECT_NE(out.find("allreduce of 131072 B, size class [128 KiB, 256 KiB): algorithm shared\n"),
              std::string::npos) << out;
  }
}

// Rank 0's choice between one copy and two, fed with call times: single
// copy first; once kLearn of its calls were timed (call kFirstProbe) a
// probe of the slots until kLearn of theirs were; then the faster of the
// two, probing the other way for two calls kProbeEvery on and twice as far
// on each time (kProbeEvery, 2x, 4x, ... up to kProbeMax); back when the
// other turns faster, probing again kProbeEvery on; each size class on its
// own.
TEST(SharedCma, CopyChoiceTakesTheFasterWayAndProbesTheOther) {
  using coll::arena::CopyChoice;
  const uint64_t f = CopyChoice::kFirstProbe, e = CopyChoice::kProbeEvery, m = CopyChoice::kProbeMax;
  const size_t learn = CopyChoice::kLearn + 1;  // the first call of a way is not timed
  const size_t block = 64 << 10, other_block = 4 << 20;
  CopyChoice ch;
  std::vector<int> ways;
  auto run = [&](uint64_t calls, double slots_ns, double single_ns) {
    for (uint64_t k = 0; k < calls; ++k) {
      const bool single = CopyChoice::single(ch.proposals(), block);
      ways.push_back(single);
      ch.note(block, single, static_cast<double>(block) * (single ? single_ns : slots_ns));
    }
  };
  auto calls_of = [&](int way, size_t from, size_t to) {
    std::vector<size_t> at;
    for (size_t k = from; k < to; ++k) {
      if (ways[k] == way) at.push_back(k);
    }
    return at;
  };
  // Single copy faster: the slots at f .. f+learn-1, then at f+e, f+3e,
  // f+7e, ... (gaps e, 2e, 4e, ... up to m), two calls each.
  std::vector<size_t> probes;
  for (size_t i = 0; i < learn; ++i) probes.push_back(f + i);
  for (uint64_t at = f, gap = e; at + gap < 5 * m; gap = gap * 2 < m ? gap * 2 : m) {
    at += gap;
    probes.push_back(at);
    probes.push_back(at + 1);
  }
  run(5 * m, 2.0, 1.0);
  EXPECT_EQ(calls_of(0, 0, 5 * m), probes);
  EXPECT_TRUE(CopyChoice::single(ch.proposals(), other_block));  // another class: single copy first too
  const size_t turn = ways.size();
  run(4 * e, 2.0, 4.0);  // single copy turns slower
  const std::vector<size_t> singles = calls_of(1, turn + CopyChoice::kWindow + 2, ways.size());
  ASSERT_EQ(singles.size(), 4u);  // back to the slots within a window, probing single copy e and 3e on
  EXPECT_EQ(singles[1], singles[0] + 1);
  EXPECT_EQ(singles[2] - singles[0], 2 * e);
  EXPECT_EQ(singles[3], singles[2] + 1);

  // The slots faster: taken after their first probe. They must be kSwitch
  // faster to be taken: a little faster is not enough.
  for (const double slots_ns : {0.5, 0.95}) {
    CopyChoice fresh;
    for (uint64_t k = 0; k < f + learn + 4; ++k) {
      const bool single = CopyChoice::single(fresh.proposals(), block);
      fresh.note(block, single, static_cast<double>(block) * (single ? 1.0 : slots_ns));
    }
    EXPECT_EQ(CopyChoice::single(fresh.proposals(), block), slots_ns > CopyChoice::kSwitch) << slots_ns;
  }

  // The ranks follow the proposals one call late while allgathers come back
  // to back, and at once when another operation runs between them: a change
  // of that lag during the first probe must not leave the slots with fewer
  // than kLearn timed calls (they are faster here: taken after the probe).
  CopyChoice lagged;
  uint32_t before = lagged.proposals();
  std::vector<int> followed;
  for (uint64_t k = 0; k < f + 16; ++k) {
    const uint32_t now = lagged.proposals();
    const bool single = CopyChoice::single(k < f + 2 ? before : now, block);
    before = now;
    followed.push_back(single);
    lagged.note(block, single, static_cast<double>(block) * (single ? 2.0 : 1.0));
  }
  for (uint64_t k = f + 8; k < f + 16; ++k) EXPECT_EQ(followed[k], 0) << "call " << k;
}

// On a busy machine calls run slow by accident, often, and never fast: a
// choice that averaged them would flip to the way it runs less. Single copy
// takes 1 ns a byte and the slots 2, but a burst makes a call take 10x:
// first every one of single copy's learning calls (the choice goes to the
// slots after their probe, and must come back at single copy's first
// clean probe), then every other call of single copy, the way that runs
// (the probes of the slots run clean: the choice must stay on single copy).
TEST(SharedCma, CopyChoiceIsNotMovedByBursts) {
  using coll::arena::CopyChoice;
  const uint64_t e = CopyChoice::kProbeEvery;
  CopyChoice ch;
  const size_t block = 1 << 20;
  std::vector<int> ways;
  // One call; `burst(single)`: whether a burst hits it.
  auto call_if = [&](auto burst) {
    const bool single = CopyChoice::single(ch.proposals(), block);
    ways.push_back(single);
    const double ns = static_cast<double>(block) * (single ? 1.0 : 2.0) * (burst(single) ? 10.0 : 1.0);
    ch.note(block, single, ns);
    return single;
  };
  for (uint64_t k = 0; k < e; ++k) call_if([](bool single) { return single; });  // single copy hit
  for (uint64_t k = 0; k < 3 * e; ++k) call_if([](bool) { return false; });     // then all clean
  size_t slots = 0;
  for (size_t k = e; k < ways.size(); ++k) slots += !ways[k];
  EXPECT_LE(slots, e + 8) << "single copy taken back at its first probe";
  EXPECT_TRUE(CopyChoice::single(ch.proposals(), block));
  // Every other call of single copy hit: the slots run only as probes,
  // two calls at a time.
  const size_t from = ways.size();
  for (uint64_t k = 0; k < 16 * e; ++k) {
    call_if([k](bool single) { return single && k % 2 == 0; });
  }
  size_t probes = 0;
  for (size_t k = from; k < ways.size(); ++k) {
    if (ways[k] || (k > from && !ways[k - 1])) continue;
    ++probes;  // the first call of a run through the slots
    EXPECT_TRUE(k + 2 < ways.size() && !ways[k + 1] && ways[k + 2]) << "a run through the slots at call " << k;
  }
  EXPECT_GE(probes, 2u);
  EXPECT_TRUE(CopyChoice::single(ch.proposals(), block));
}

// The timed allgather (the table's on two ranks with a core each, forced
// here so that it cannot quietly be another) runs one copy or two as rank 0
// proposes, probes included: every rank must follow rank 0 (one on
// the other way would read a stale slot or address: a wrong result, a
// mismatch or a timeout here). First each allgather comes right after a
// broadcast rooted at rank 1, whose root waits for rank 0's second phase
// only; then two size classes and a small allreduce between them.
TEST(SharedCma, TimedAllgatherRanksFollowRankZero) {
  JobOptions jo;
  jo.env["SHOAL_TIMEOUT_S"] = "20";
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    for (int k = 0; k < 160 && test::check_failures() == 0; ++k) {
      allgather(*c, me, 2, 16384, k, "shared_timed");     // 64 KiB blocks
      broadcast(*c, me, 16384, 2 * k + 1, "shared_cma");  // root 1
    }
    for (int k = 0; k < 100 && test::check_failures() == 0; ++k) {
      allgather(*c, me, 2, 16384, k, "shared_timed");
      allgather(*c, me, 2, 65536 + 1024, k, "shared_timed");  // 260 KiB blocks
      float x = static_cast<float>(me);
      c->allreduce(&x, &x, 1, f32, ReduceOp::kSum)->wait();
      SHOAL_CHECK_MSG(x == 1.0f, "allreduce in round " << k);
    }
  }, jo);
  EXPECT_EQ(test::failures(res), "");
}

// SHOAL_SHM=copy: no reads; the table keeps to the slots, and a forced
// single-copy algorithm is an argument error on every rank, saying why.
TEST(SharedCma, CopyModeTurnsThemOff) {
  JobOptions jo;
  jo.env["SHOAL_DEBUG"] = "INFO";
  jo.env["SHOAL_SHM"] = "copy";
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    gather_and_broadcast(*c, me, 2, 16384, 1, "");
    std::vector<float> in(16, 1), all(32);
    auto err = capture([&] { c->allgather(in.data(), all.data(), 16, f32, algo("shared_cma"))->wait(); });
    SHOAL_CHECK_MSG(err != nullptr, "rank " << me << ": forced shared_cma ran without reads");
    if (!err) return;
    SHOAL_CHECK_MSG(code(err) == ErrorCode::kInvalidArgument, message(err));
    SHOAL_CHECK_MSG(message(err).find("algorithm 'shared_cma' needs single-copy reads") != std::string::npos,
                    message(err));
    SHOAL_CHECK_MSG(message(err).find("shoal rank " + std::to_string(me)) != std::string::npos, message(err));
  }, jo);
  EXPECT_EQ(test::failures(res), "");
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(res[r].output.find("single-copy reads off (SHOAL_SHM=copy)"), std::string::npos) << res[r].output;
    EXPECT_EQ(res[r].output.find("algorithm shared_cma\n"), std::string::npos) << res[r].output;  // but forced
  }
}

// No arena at all: the same error as for 'shared', naming this algorithm.
TEST(SharedCma, ForcedWithoutArenaNamesTheAlgorithm) {
  JobOptions jo;
  jo.env["SHOAL_SHM_ARENA_BYTES"] = "0";
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    float x = 1;
    auto err = capture([&] { c->broadcast(&x, 1, f32, 0, algo("shared_cma"))->wait(); });
    SHOAL_CHECK_MSG(err != nullptr, "rank " << me << ": forced shared_cma ran without an arena");
    if (!err) return;
    SHOAL_CHECK_MSG(code(err) == ErrorCode::kInvalidArgument, message(err));
    SHOAL_CHECK_MSG(message(err).find("algorithm 'shared_cma' needs every rank") != std::string::npos,
                    message(err));
  }, jo);
  EXPECT_EQ(test::failures(res), "");
}

// Four ranks taking turns on one CPU, the single-copy rounds after a slot
// algorithm's (a small allreduce, whose round has one phase): a rank that
// ran two rounds ahead while a peer was still in the allreduce's would
// overwrite a line that peer has yet to read (a Mismatch or a wrong
// result here).
TEST(SharedCma, InterleavedWithSlotRoundsOnOneCpu) {
  test::OnOneCpu pinned;
  ASSERT_TRUE(pinned.ok());
  const int n = 4;
  auto res = run_ranks(n, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    for (int k = 0; k < 400 && test::check_failures() == 0; ++k) {
      float x = static_cast<float>(me);
      c->allreduce(&x, &x, 1, f32, ReduceOp::kSum, algo("shared"))->wait();
      SHOAL_CHECK_MSG(x == 6.0f, "allreduce before round " << k);
      broadcast(*c, me, 1024 + static_cast<size_t>(k), k, "shared_cma");
      allgather(*c, me, n, 1024 + static_cast<size_t>(k), k, "shared_cma");
    }
  });
  EXPECT_EQ(test::failures(res), "");
}

// A rank copies its own block in pieces while a peer it writes to has not
// arrived, and the rest piece by piece with its writes: with one rank late
// in each round (a delay before the call, so that the others wait for it;
// the result must be exact whatever the timing), a block that is not a
// whole number of either piece, three ranks so that a rank waits for a
// second peer after the first, and in place.
TEST(SharedCma, OwnBlockCopiedWhileWaitingForALatePeer) {
  const int n = 3;
  auto res = run_ranks(n, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    const size_t count = 262144 + 7;  // 1048604 bytes: 2 pieces of 512 KiB (16 of 64 KiB) and a part
    for (int k = 0; k < 6 && test::check_failures() == 0; ++k) {
      if (me == (k + 1) % n) std::this_thread::sleep_for(std::chrono::milliseconds(30));
      allgather(*c, me, n, count, k, "shared_cma");
      std::vector<float> all(count * n, -1);
      for (size_t i = 0; i < count; ++i) all[static_cast<size_t>(me) * count + i] = v(me, i, k);
      if (me == (k + 2) % n) std::this_thread::sleep_for(std::chrono::milliseconds(30));
      c->allgather(all.data() + static_cast<size_t>(me) * count, all.data(), count, f32, algo("shared_cma"))->wait();
      for (size_t i = 0; i < all.size(); ++i) {
        if (all[i] != v(static_cast<int>(i / count), i % count, k)) {
          SHOAL_CHECK_MSG(false, "in-place allgather round " << k << " element " << i);
          break;
        }
      }
    }
  });
  EXPECT_EQ(test::failures(res), "");
}

// One rank forced onto another algorithm for the same allgather: a
// Mismatch naming both algorithms on the ranks that meet it, never a
// result made of the wrong buffers.
TEST(SharedCma, RanksOnDifferentAlgorithmsMeetAsAMismatch) {
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    std::vector<float> in(16384, static_cast<float>(me)), all(32768, -1);
    OpOptions o = algo(me == 0 ? "shared" : "shared_cma");
    o.timeout = std::chrono::seconds(20);
    auto err = capture([&] { c->allgather(in.data(), all.data(), in.size(), f32, o)->wait(); });
    SHOAL_CHECK_MSG(err != nullptr, "rank " << me << ": no error");
    if (!err) return;
    SHOAL_CHECK_MSG(code(err) == ErrorCode::kMismatch, message(err));
    SHOAL_CHECK_MSG(message(err).find("algorithm shared)") != std::string::npos, message(err));
    SHOAL_CHECK_MSG(message(err).find("algorithm shared_cma)") != std::string::npos, message(err));
  });
  EXPECT_EQ(test::failures(res), "");
}

// A rank whose operation fails (here it times out, its peer not there
// yet) takes no write into its output once the error has reached it, in
// the single-copy allgather and in the claimed allreduce: the peer, let in
// only after that, finds the output closed (HostArena::leave_writes) and
// fails too, and the failed rank's buffer, refilled after its error, keeps
// what it was refilled with.
TEST(SharedCma, NoWriteLandsInAFailedRanksOutput) {
  for (const std::string name : {"shared_cma", "shared_claim"}) {
    auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
      const size_t count = 65536;  // 256 KiB per rank: one piece to write, or a few claimed
      std::vector<float> in(count, static_cast<float>(me + 1)), out(2 * count, -1);
      OpOptions o = algo(name);
      auto call = [&] {
        if (name == "shared_cma") {
          c->allgather(in.data(), out.data(), count, f32, o)->wait();
        } else {
          c->allreduce(in.data(), out.data(), count, f32, ReduceOp::kSum, o)->wait();
        }
      };
      call();  // the arena up, single copy agreed
      if (me == 0) {
        o.timeout = std::chrono::milliseconds(300);
        auto err = capture(call);
        SHOAL_CHECK_MSG(err != nullptr, name << ", rank 0: the operation without its peer did not fail");
        std::fill(out.begin(), out.end(), -7.0f);
        store->set("failed", {1});
        store->wait({"peer done"}, std::chrono::seconds(60));
        size_t landed = 0;
        for (float x : out) landed += x != -7.0f;
        SHOAL_CHECK_MSG(landed == 0, name << ": " << landed << " elements written into rank 0's output after its error");
      } else {
        store->wait({"failed"}, std::chrono::seconds(60));
        o.timeout = std::chrono::seconds(5);
        auto err = capture(call);
        SHOAL_CHECK_MSG(err != nullptr, name << ", rank 1: the operation with a failed peer did not fail");
        store->set("peer done", {1});
      }
    });
    EXPECT_EQ(test::failures(res), "") << name;
  }
}

// A rank SIGKILLed while the others loop on single-copy allgathers that
// write into its memory: every survivor names it within 2 s.
TEST(SharedCma, KilledRankIsNamedByEverySurvivor) {
  const int n = 3;
  test::expect_killed_rank_named(n, 1, [](Communicator& c) {
    std::vector<float> in(16384, static_cast<float>(c.rank())), all(16384 * n);
    c.allgather(in.data(), all.data(), in.size(), f32, algo("shared_cma"))->wait();
  }, "rank 1");
}

// A rank SIGKILLed while the others loop on allreduces that claim pieces:
// every survivor names it within 2 s, whether it is waiting in the arena or
// reading and writing the killed rank's memory.
TEST(SharedCma, KilledRankIsNamedInClaimedAllreduces) {
  const int n = 3;
  test::expect_killed_rank_named(n, 2, [](Communicator& c) {
    std::vector<float> x(1 << 20, static_cast<float>(c.rank()));
    c.allreduce(x.data(), x.data(), x.size(), f32, ReduceOp::kSum, algo("shared_claim"))->wait();
  }, "rank 2");
}

// HostArena::claim, three ranks on threads, operation after operation with
// the protocol of allreduce_shared_claim (claim after phase 1, phase 2 when
// out of pieces, wait for every peer's): every piece of every operation is
// claimed by exactly one rank, with operations of no piece between, and the
// work is not cut into fixed shares: rank 2 holds its first piece until the
// others have taken every other one (ranks 0 and 1 start claiming after
// rank 2's first claim).
TEST(SharedCma, ClaimsGiveEveryPieceOnceAndNotInShares) {
  const int n = 3;
  std::string why;
  auto arenas = test::arenas(n, 78, &why);
  ASSERT_EQ(arenas.size(), static_cast<size_t>(n)) << why;
  const std::vector<uint64_t> totals = {5, 0, 1, 17, 2, 0, 0, 40, 3, 1, 64, 7};
  std::vector<std::vector<std::vector<uint64_t>>> got(n, std::vector<std::vector<uint64_t>>(totals.size()));
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> out_of_pieces(totals.size(), 0);  // ranks 0 and 1 that found none left
  std::vector<char> first_claimed(totals.size(), 0);  // rank 2 has made its first claim
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.emplace_back([&, r] {
      auto& a = *arenas[static_cast<size_t>(r)];
      transport::LazyDeadline deadline(std::chrono::seconds(20));
      for (size_t k = 0; k < totals.size(); ++k) {
        a.begin(k + 1, transport::Fingerprint{});
        a.arrive(1);
        a.wait_all(1, deadline);
        uint64_t piece = 0;
        if (r < 2) {  // rank 2 claims first
          std::unique_lock<std::mutex> l(mu);
          cv.wait(l, [&] { return first_claimed[k]; });
        }
        bool first = true;
        for (;;) {
          const bool any = a.claim(totals[k], &piece);
          if (any) got[static_cast<size_t>(r)][k].push_back(piece);
          if (r == 2 && first) {  // then holds its first piece until the others are out
            first = false;
            std::unique_lock<std::mutex> l(mu);
            first_claimed[k] = true;
            cv.notify_all();
            cv.wait(l, [&] { return out_of_pieces[k] == 2; });
          }
          if (!any) break;
        }
        if (r < 2) {
          std::lock_guard<std::mutex> g(mu);
          ++out_of_pieces[k];
          cv.notify_all();
        }
        a.arrive(2);
        a.wait_all(2, deadline);
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (size_t k = 0; k < totals.size(); ++k) {
    std::multiset<uint64_t> all;
    for (int r = 0; r < n; ++r) all.insert(got[static_cast<size_t>(r)][k].begin(), got[static_cast<size_t>(r)][k].end());
    std::multiset<uint64_t> want;
    for (uint64_t i = 0; i < totals[k]; ++i) want.insert(i);
    EXPECT_EQ(all, want) << "operation " << k << " of " << totals[k] << " pieces";
    EXPECT_EQ(got[2][k], totals[k] ? std::vector<uint64_t>{0} : std::vector<uint64_t>{})
        << "operation " << k << ": rank 2 held its first piece while the others took the rest";
  }
}

// HostArena::write into a peer's published output, and a peer that leaves
// the round (leave_writes(), as a rank that fails does): the write before
// lands, the one after does not and says so; a peer that published no
// output in a round: an error, and nothing lands where its line still
// points from an earlier round.
TEST(SharedCma, NoWriteLandsAfterTheOwnerLeft) {
  std::string why;
  auto both = test::arenas(2, 79, &why);
  ASSERT_EQ(both.size(), 2u) << why;
  auto& a0 = both[0];
  auto& a1 = both[1];
  a0->set_reads(true);
  a1->set_reads(true);
  std::vector<float> in0(64, 0), out0(64, -1), in1(64, 1), out1(64, -1), piece(8, 5);
  transport::LazyDeadline deadline(std::chrono::seconds(20));
  a0->begin(1, transport::Fingerprint{});
  a1->begin(1, transport::Fingerprint{});
  a0->publish(in0.data(), out0.data());
  a1->publish(in1.data(), out1.data());
  a0->arrive(1);
  a1->arrive(1);
  a1->wait_all(1, deadline);
  EXPECT_TRUE(a1->write(0, 8 * sizeof(float), piece.data(), piece.size() * sizeof(float)));
  EXPECT_EQ(out0[8], 5.0f);
  EXPECT_EQ(out0[15], 5.0f);
  EXPECT_EQ(out0[16], -1.0f);
  a0->leave_writes(std::chrono::seconds(1));
  piece.assign(8, 7);
  EXPECT_FALSE(a1->write(0, 16 * sizeof(float), piece.data(), piece.size() * sizeof(float)));
  EXPECT_EQ(out0[16], -1.0f);
  EXPECT_EQ(out0[23], -1.0f);
  // Round 3 uses round 1's lines again, and rank 0 publishes nothing in it
  // (as a rank running another way of the operation): its line still names
  // out0, live memory, but no write may land there.
  for (uint64_t seq : {2, 3}) {
    a0->begin(seq, transport::Fingerprint{});
    a1->begin(seq, transport::Fingerprint{});
    a0->arrive(1);
    a1->arrive(1);
    a1->wait_all(1, deadline);
  }
  auto err = test::capture([&] { a1->write(0, 24 * sizeof(float), piece.data(), piece.size() * sizeof(float)); });
  ASSERT_NE(err, nullptr);
  EXPECT_EQ(code(err), ErrorCode::kInternal) << message(err);
  EXPECT_NE(message(err).find("rank 0 published no output to write to for seq 3"), std::string::npos) << message(err);
  EXPECT_EQ(out0[24], -1.0f);
}

// The probe of single-copy reads at set-up, against a member whose process
// has exited since it joined (it attached and left): the probe names it as
// gone (no memory to read, ESRCH), which the set-up reports as a lost
// rank, not as reads the kernel refuses. A live member is not gone.
TEST(SharedCma, ProbeNamesAMemberWhoseProcessIsGone) {
  std::string why;
  auto a0 = coll::arena::HostArena::create(0, 2, 80, 4096, &why);
  ASSERT_TRUE(a0) << why;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::string w;
    auto a1 = coll::arena::HostArena::attach(1, 2, 80, a0->where(), &w);
    _exit(a1 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child could not attach";
  int gone = 7;
  const std::string failed = a0->probe_reads(&gone);
  EXPECT_EQ(gone, 1) << failed;
  EXPECT_NE(failed.find("process_vm_readv of rank 1"), std::string::npos) << failed;
  auto live = test::arenas(2, 81, &why);
  ASSERT_EQ(live.size(), 2u) << why;
  EXPECT_EQ(live[0]->probe_reads(&gone), "");
  EXPECT_EQ(gone, -1);
}

// A copy that fails because a live peer's buffer is gone (it left the
// operation, which it does only when the operation failed for it) reports
// the failure's cause, here another rank found dead, not the live peer;
// with no cause to be found it names the peer and says what failed.
TEST(SharedCma, ABufferGoneNamesTheCauseNotTheLivePeer) {
  struct Rank2Died : transport::Liveness {
    bool dead = true;
    std::exception_ptr peer_gone(int peer) override {
      if (peer != 2 || !dead) return nullptr;
      return std::make_exception_ptr(PeerLost("peer lost: rank 2: its process has exited", 2));
    }
  } live;
  std::string why;
  auto arenas = test::arenas(3, 80, &why);
  ASSERT_EQ(arenas.size(), 3u) << why;
  for (auto& a : arenas) a->set_reads(true);
  arenas[0]->set_liveness(&live, 10);
  // What rank 1 published is no longer readable: a page it took back
  // (PROT_NONE, kept reserved so that nothing else is mapped there).
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* gone = mmap(nullptr, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(gone, MAP_FAILED);
  for (auto& a : arenas) a->begin(1, transport::Fingerprint{});
  arenas[1]->publish(gone);
  std::vector<char> dst(64);
  auto err = test::capture([&] { arenas[0]->read(1, dst.data(), dst.size()); });
  ASSERT_NE(err, nullptr) << "a read of a PROT_NONE page succeeded";
  EXPECT_EQ(test::code(err), ErrorCode::kPeerLost) << test::message(err);
  EXPECT_NE(test::message(err).find("peer lost: rank 2"), std::string::npos) << test::message(err);
  live.dead = false;  // no cause anywhere: the error names rank 1 and the copy
  err = test::capture([&] { arenas[0]->read(1, dst.data(), dst.size()); });
  ASSERT_NE(err, nullptr);
  EXPECT_NE(test::message(err).find("reading rank 1's buffer (process_vm_readv"), std::string::npos)
      << test::message(err);
  EXPECT_NE(test::message(err).find("Bad address"), std::string::npos) << test::message(err);
  munmap(gone, page);
}

}  // namespace
}  // namespace shoal
