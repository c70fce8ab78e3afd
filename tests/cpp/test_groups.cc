// test_groups.cc — Communicator::split: groups that reuse their parent's
// connections. Results against the arithmetic, no new file descriptors
// (sockets, shared-memory segments, event fds) for a group, ranks and any-source
// senders in the group's numbering, interleaving with the parent, nested
// groups, argument errors, and an order that differs across ranks failing
// with a message instead of hanging.
#include <dirent.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <set>
#include <string>
#include <vector>

#include "harness.h"

namespace shoal {
namespace {

using test::JobOptions;
using test::run_ranks;

constexpr DataType f32 = DataType::kFloat32;

// What this process has open: "fd -> target" ("socket:[123]", "anon_inode:[eventfd]", ...).
std::set<std::string> open_fds() {
  std::set<std::string> out;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[256] = {};
    std::string path = std::string("/proc/self/fd/") + e->d_name;
    ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
    if (n > 0 && std::string(target, static_cast<size_t>(n)).rfind("/proc/", 0) != 0)  // (the listing's own fd)
      out.insert(std::string(e->d_name) + " -> " + std::string(target, static_cast<size_t>(n)));
  }
  closedir(d);
  return out;
}

// Entries of `after` not in `before`.
std::string opened_since(const std::set<std::string>& before, const std::set<std::string>& after) {
  std::string s;
  for (const auto& f : after) {
    if (!before.count(f)) s += (s.empty() ? "" : ", ") + f;
  }
  return s;
}

std::shared_ptr<Store> group_store(const std::shared_ptr<Store>& s, const std::string& name) {
  return std::make_shared<PrefixStore>("test-group/" + name, s);
}

TEST(Groups, SplitComputesInItsOwnNumberingOverTheParentsConnections) {
  auto res = run_ranks(4, [](std::shared_ptr<Communicator>& c, int me, int n, const auto& store) {
    // Connect every pair on the parent first.
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    c->alltoall(a.data(), b.data(), 1, f32)->wait();
    const auto fds = open_fds();

    // Evens and odds, and everyone in reverse order.
    std::vector<int> half = me % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    auto g = c->split(half, group_store(store, me % 2 ? "odd" : "even"));
    std::vector<int> rev{3, 2, 1, 0};
    auto r = c->split(rev, group_store(store, "rev"));
    SHOAL_CHECK(g->size() == 2 && g->rank() == me / 2);
    SHOAL_CHECK(r->size() == 4 && r->rank() == 3 - me);

    // allreduce on the half, 1 KiB and 1 MiB (small and large paths).
    for (size_t count : {size_t{256}, size_t{1} << 18}) {
      std::vector<float> x(count, static_cast<float>(me + 1));
      g->allreduce(x.data(), x.data(), count, f32, ReduceOp::kSum)->wait();
      const float want = me % 2 == 0 ? 1 + 3 : 2 + 4;
      SHOAL_CHECK_MSG(x.front() == want && x.back() == want, "count " << count << ": got " << x.front());
    }
    // The parent in between, then the reversed group: allgather gives the
    // parent ranks in reverse (group rank i is parent rank 3 - i).
    float s = static_cast<float>(me);
    c->allreduce(&s, &s, 1, f32, ReduceOp::kSum)->wait();
    SHOAL_CHECK(s == 6.0f);
    float mine = static_cast<float>(me);
    std::vector<float> all(4);
    r->allgather(&mine, all.data(), 1, f32)->wait();
    SHOAL_CHECK_MSG(all == (std::vector<float>{3, 2, 1, 0}), "allgather " << all[0] << all[1] << all[2] << all[3]);
    // Broadcast from group rank 1 (parent rank 2).
    float v = me == 2 ? 42.0f : 0.0f;
    r->broadcast(&v, 1, f32, 1)->wait();
    SHOAL_CHECK(v == 42.0f);
    // Point to point in the group's numbering; any-source reports the group rank.
    if (g->rank() == 0) {
      float got = 0;
      auto w = g->recv(&got, 1, f32, kAnySource, 7);
      w->wait();
      SHOAL_CHECK_MSG(w->source() == 1, "source " << w->source());
      SHOAL_CHECK(got == static_cast<float>(me + 2));
    } else {
      float out = static_cast<float>(me);
      g->send(&out, 1, f32, 0, 7)->wait();
    }
    // A p2p message of the parent with the same tag does not match the group's.
    if (me == 0) {
      float p = 0, q = 0;
      auto wg = g->recv(&q, 1, f32, 1, 9);   // parent rank 2
      auto wp = c->recv(&p, 1, f32, 2, 9);   // parent rank 2 too
      wp->wait();
      wg->wait();
      SHOAL_CHECK_MSG(p == 100.0f && q == 200.0f, "parent got " << p << ", group got " << q);
    } else if (me == 2) {
      float p = 100.0f, q = 200.0f;
      c->send(&p, 1, f32, 0, 9)->wait();
      g->send(&q, 1, f32, 0, 9)->wait();
    }
    g->barrier()->wait();
    r->barrier()->wait();
    // Nothing new was opened: the groups use the parent's sockets and segments.
    const std::string opened = opened_since(fds, open_fds());
    SHOAL_CHECK_MSG(opened.empty(), "opened since the split: " << opened);
  });
  EXPECT_EQ(test::failures(res), "");
}

// Operations issued without waiting, alternating between the parent and a
// group: each rank's parent executor would drain its queue (parent ops
// back to back) unless the family order makes it wait for the group's
// earlier op, so the ranks would run them in different orders.
TEST(Groups, AsyncOperationsOnParentAndGroupRunInIssueOrder) {
  auto res = run_ranks(3, [](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    auto g = c->split({0, 1, 2}, group_store(store, "all"));
    constexpr int kIters = 40;
    constexpr size_t kBig = 1 << 16;
    std::vector<std::vector<float>> big(kIters, std::vector<float>(kBig));
    std::vector<float> small_g(kIters), small_c(kIters);
    std::vector<WorkPtr> works;
    for (int i = 0; i < kIters; ++i) {
      std::fill(big[static_cast<size_t>(i)].begin(), big[static_cast<size_t>(i)].end(), static_cast<float>(me + i));
      small_g[static_cast<size_t>(i)] = static_cast<float>(me * i);
      small_c[static_cast<size_t>(i)] = 1.0f;
      works.push_back(c->allreduce(big[static_cast<size_t>(i)].data(), big[static_cast<size_t>(i)].data(), kBig, f32,
                                   ReduceOp::kSum));
      works.push_back(g->allreduce(&small_g[static_cast<size_t>(i)], &small_g[static_cast<size_t>(i)], 1, f32,
                                   ReduceOp::kSum));
      works.push_back(c->allreduce(&small_c[static_cast<size_t>(i)], &small_c[static_cast<size_t>(i)], 1, f32,
                                   ReduceOp::kSum));
    }
    for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
    for (int i = 0; i < kIters; ++i) {
      const auto& b = big[static_cast<size_t>(i)];
      SHOAL_CHECK_MSG(b.front() == static_cast<float>(3 + 3 * i) && b.back() == b.front(), "iteration " << i);
      SHOAL_CHECK(small_g[static_cast<size_t>(i)] == static_cast<float>(3 * i));
      SHOAL_CHECK(small_c[static_cast<size_t>(i)] == 3.0f);
    }
  });
  EXPECT_EQ(test::failures(res), "");
}

TEST(Groups, NestedGroupsAndAGroupOutlivingItsParentsHandle) {
  auto res = run_ranks(4, [](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    if (me == 3) {
      float x = 1;
      c->allreduce(&x, &x, 1, f32, ReduceOp::kSum, {})->wait();  // with the others' last one
      return;
    }
    auto g = c->split({2, 1, 0}, group_store(store, "g"));  // group rank = 2 - me
    std::shared_ptr<Communicator> h;
    if (me != 1) {
      h = g->split({0, 2}, group_store(store, "h"));  // group ranks 0 and 2: parent ranks 2 and 0
      SHOAL_CHECK(h->rank() == (me == 2 ? 0 : 1));
      std::vector<float> out(2);
      float mine = static_cast<float>(me);
      h->allgather(&mine, out.data(), 1, f32)->wait();
      SHOAL_CHECK_MSG(out == (std::vector<float>{2, 0}), "got " << out[0] << ", " << out[1]);
    }
    // The user drops the parent handle; the group keeps the parent alive.
    auto parent = c;
    c.reset();
    double d = me;
    g->allreduce(&d, &d, 1, DataType::kFloat64, ReduceOp::kMax)->wait();
    SHOAL_CHECK(d == 2.0);
    h.reset();
    g.reset();
    float x = 1;
    parent->allreduce(&x, &x, 1, f32, ReduceOp::kSum)->wait();
    SHOAL_CHECK(x == 4.0f);
  });
  EXPECT_EQ(test::failures(res), "");
}

TEST(Groups, BadSplitsAreRejectedNamingTheArgument) {
  auto res = run_ranks(3, [](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    auto expect = [&](const std::vector<int>& ranks, const std::string& what) {
      std::string msg;
      try {
        c->split(ranks, group_store(store, "bad"));
      } catch (const InvalidArgument& e) {
        msg = e.what();
      }
      SHOAL_CHECK_MSG(msg.find(what) != std::string::npos && msg.find("shoal rank " + std::to_string(me)) == 0,
                      "expected '" << what << "', got '" << msg << "'");
    };
    expect({}, "split: ranks: empty");
    expect({0, 1, 3}, "ranks: 3 is out of range for size 3");
    expect({me, me}, "appears twice");
    expect({(me + 1) % 3}, "this rank (" + std::to_string(me) + ") is not among them");
    // Members that disagree on the list: the group's rank 0 publishes its
    // list with the group's id, the others compare.
    std::string msg;
    try {
      c->split(me == 1 ? std::vector<int>{0, 2, 1} : std::vector<int>{0, 1, 2}, group_store(store, "disagree"));
    } catch (const InvalidArgument& e) {
      msg = e.what();
    }
    if (me == 1) {
      SHOAL_CHECK_MSG(msg.find("ranks: this rank has [0,2,1], the group's rank 0 has [0,1,2]") != std::string::npos,
                      "got '" << msg << "'");
    } else {
      SHOAL_CHECK_MSG(msg.empty(), msg);
    }
    // Nothing was sent: still in step.
    float x = 1;
    c->allreduce(&x, &x, 1, f32, ReduceOp::kSum)->wait();
    SHOAL_CHECK(x == 3.0f);
  });
  EXPECT_EQ(test::failures(res), "");
}

TEST(Groups, CollectivesIssuedInAnotherOrderFailNamingBothInsteadOfHanging) {
  JobOptions jo;
  jo.comm.timeout = std::chrono::seconds(30);
  auto res = run_ranks(2, [](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    auto g = c->split({0, 1}, group_store(store, "g"));
    float x = 1, y = 1;
    std::string msg;
    try {
      if (me == 0) {
        c->allreduce(&x, &x, 1, f32, ReduceOp::kSum)->wait();
        g->allreduce(&y, &y, 1, f32, ReduceOp::kSum)->wait();
      } else {
        g->allreduce(&y, &y, 1, f32, ReduceOp::kSum)->wait();
        c->allreduce(&x, &x, 1, f32, ReduceOp::kSum)->wait();
      }
    } catch (const Error& e) {
      msg = e.what();
    }
    // Each rank receives the other's first message while it waits for its
    // own communicator's: both say so, naming both (the second to notice
    // may learn it from the first's published record).
    SHOAL_CHECK_MSG(msg.find("collective order mismatch") != std::string::npos &&
                        msg.find("group 1 seq 1") != std::string::npos &&
                        msg.find("SHOAL_GROUP_CONNECTIONS") != std::string::npos,
                    "got '" << msg << "'");
    // Both communicators are broken now: they share the connections.
    SHOAL_CHECK(c->error() != nullptr && g->error() != nullptr);
  }, jo);
  EXPECT_EQ(test::failures(res), "");
}

// The same once both communicators run in the shared arena, with the
// parent's side message-based (a barrier) and the group's in the arena,
// which no message reaches: the rank that waits in the arena sees, in the
// store, that its peer is blocked in an operation it has not started.
TEST(Groups, OrderMismatchBetweenArenaAndMessagesFailsNamingBoth) {
  JobOptions jo;
  jo.comm.timeout = std::chrono::seconds(30);
  auto res = run_ranks(2, [](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    auto g = c->split({0, 1}, group_store(store, "g"));
    float x = 1, y = 1;
    c->allreduce(&x, &x, 1, f32, ReduceOp::kSum)->wait();
    g->allreduce(&y, &y, 1, f32, ReduceOp::kSum)->wait();
    SHOAL_CHECK(x == 2.0f && y == 2.0f);
    std::string msg;
    try {
      OpOptions messages;  // (the arena's barrier would be "shared")
      messages.algorithm = "dissemination";
      if (me == 0) {
        c->barrier(messages)->wait();
        g->allreduce(&y, &y, 1, f32, ReduceOp::kSum)->wait();
      } else {
        g->allreduce(&y, &y, 1, f32, ReduceOp::kSum)->wait();
        c->barrier(messages)->wait();
      }
    } catch (const Error& e) {
      msg = e.what();
    }
    SHOAL_CHECK_MSG(msg.find("collective order mismatch") != std::string::npos &&
                        msg.find("group 1 seq 2") != std::string::npos &&
                        msg.find("SHOAL_GROUP_CONNECTIONS") != std::string::npos,
                    "got '" << msg << "'");
  }, jo);
  EXPECT_EQ(test::failures(res), "");
}

}  // namespace
}  // namespace shoal
