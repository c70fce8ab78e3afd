// tests/cpp/test_recovery.cc — surviving a lost rank (Communicator::agree,
// shrink, recover; docs/errors.md "Recovery"): the store's compare-and-set,
// the survivors' one membership (a killed rank, a killed leader, a stopped
// leader voted out, a late rank refused), the shrunk communicator's results
// byte for byte against a fresh one, fresh keys for a reused name, and
// groups with connections of their own that outlive a rank outside them.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "collectives/registry.h"
#include "errors_util.h"
#include "harness.h"

namespace shoal {
namespace {

using test::JobOptions;
using test::run_ranks;
constexpr auto f32 = DataType::kFloat32;

std::string text(const Bytes& b) { return std::string(b.begin(), b.end()); }
Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

TEST(Store, CompareSetSwapsOnlyWhatItExpects) {
  TcpStoreOptions so;
  so.is_server = true;
  so.timeout = std::chrono::seconds(5);
  TcpStore s(so);
  EXPECT_EQ(text(s.compare_set("k", {}, bytes("a"))), "a");          // absent, expected empty: set
  EXPECT_EQ(text(s.compare_set("k", {}, bytes("b"))), "a");          // present: stays
  EXPECT_EQ(text(s.compare_set("k", bytes("x"), bytes("b"))), "a");  // another value: stays
  EXPECT_EQ(text(s.compare_set("k", bytes("a"), bytes("c"))), "c");  // the expected one: swapped
  EXPECT_EQ(s.get_str("k"), "c");
  EXPECT_EQ(text(s.compare_set("none", bytes("x"), bytes("y"))), "");  // absent, expected something
  EXPECT_FALSE(s.check({"none"}));
  PrefixStore p("pre", std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", s.port()}));
  EXPECT_EQ(text(p.compare_set("k", {}, bytes("z"))), "z");
  EXPECT_EQ(s.get_str("pre/k"), "z");
}

// Every rank but the `dead` ones exited 0 with no failed check.
std::string survivors_failures(const std::vector<test::RankResult>& res, std::vector<int> dead) {
  std::string out;
  for (size_t r = 0; r < res.size(); ++r) {
    if (std::find(dead.begin(), dead.end(), static_cast<int>(r)) != dead.end()) continue;
    if (res[r].exit_code != 0 || res[r].output.find("CHECK FAILED") != std::string::npos) {
      out += "rank " + std::to_string(r) + ": exit " + std::to_string(res[r].exit_code) + "\n" + res[r].output;
    }
  }
  return out;
}

// Runs until an allreduce fails; returns its error.
std::exception_ptr until_error(Communicator& c) {
  std::exception_ptr err;
  for (int i = 0; i < 1000000 && !err; ++i) {
    err = test::capture([&] {
      float x = 1;
      c.allreduce(&x, &x, 1, f32, ReduceOp::kSum)->wait();
    });
  }
  return err;
}

void check_sum(Communicator& c) {
  float x = static_cast<float>(c.rank() + 1);
  c.allreduce(&x, &x, 1, f32, ReduceOp::kSum)->wait();
  const float want = static_cast<float>(c.size() * (c.size() + 1) / 2);
  SHOAL_CHECK_MSG(x == want, "allreduce on the shrunk communicator: " << x << ", want " << want);
}

// A killed rank (a worker, then the leader): every survivor's error names it
// among its suspects, recover() gives every survivor the same communicator
// of the others, renumbered in order, with a new id, and it works.
void killed_rank_is_shrunk_away(int n, int victim) {
  JobOptions jo;
  jo.comm.timeout = std::chrono::seconds(20);
  auto res = run_ranks(n, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    check_sum(*c);
    if (me == victim) raise(SIGKILL);
    auto err = until_error(*c);
    SHOAL_CHECK(err != nullptr);
    try {
      std::rethrow_exception(err);
    } catch (const Error& e) {
      SHOAL_CHECK_MSG(std::find(e.suspects().begin(), e.suspects().end(), victim) != e.suspects().end(),
                      "suspects do not name rank " << victim << ": " << e.what());
    }
    const uint64_t old_id = c->id();
    auto m = c->agree();
    std::vector<int> want;
    for (int r = 0; r < n; ++r) {
      if (r != victim) want.push_back(r);
    }
    SHOAL_CHECK_MSG(m.members == want, "membership of " << m.members.size() << " ranks");
    auto s = c->shrink(m);
    SHOAL_CHECK(s->size() == n - 1);
    SHOAL_CHECK(s->rank() == (me < victim ? me : me - 1));
    SHOAL_CHECK(s->id() != old_id);
    SHOAL_CHECK(c->error() != nullptr);  // the old one is aborted
    check_sum(*s);
    // Every survivor saw the same membership: the id of the new communicator
    // is drawn once, by its rank 0, and agreed through the store.
    uint64_t id = s->id(), root_id = id;
    s->broadcast(&root_id, 1, DataType::kInt64, 0)->wait();
    SHOAL_CHECK(id == root_id);
  }, jo);
  ASSERT_EQ(res[victim].signal, SIGKILL);
  EXPECT_EQ(survivors_failures(res, {victim}), "");
}

TEST(Recovery, KilledWorkerIsShrunkAway) { killed_rank_is_shrunk_away(4, 2); }
TEST(Recovery, KilledLeaderIsShrunkAway) { killed_rank_is_shrunk_away(3, 0); }

// The leader of the agreement checks in, then dies before deciding: the
// others see its process gone, the next lowest rank leads, and the dead one
// is left out though it checked in.
TEST(Recovery, LeaderThatDiesDuringTheAgreementIsReplaced) {
  auto res = run_ranks(4, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    check_sum(*c);
    if (me == 3) raise(SIGKILL);
    auto err = until_error(*c);
    SHOAL_CHECK(err != nullptr);
    if (me == 0) {
      store->set_str("shoal/c0/recover/1/in/0", "3");  // its check-in, as agree() writes it
      raise(SIGKILL);
    }
    auto s = c->recover();
    SHOAL_CHECK(s->size() == 2);
    check_sum(*s);
  });
  EXPECT_EQ(survivors_failures(res, {0, 3}), "");
}

// A leader that stops (SIGSTOP) after checking in is voted out after the
// window: the epoch is closed, the next one decides without it. Resumed, it
// finds itself left out (Aborted), and the shrunk communicator goes on.
TEST(Recovery, StoppedLeaderIsVotedOutAndRefusedWhenResumed) {
  auto res = run_ranks(3, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    check_sum(*c);
    AgreeOptions o;
    o.window = std::chrono::milliseconds(300);
    o.suspects = {2};
    if (me == 0) {
      store->set_str("pid0", std::to_string(getpid()));
      store->set_str("shoal/c0/recover/1/in/0", "2");
      raise(SIGSTOP);
      // Resumed: the others went on without it.
      auto err = test::capture([&] { c->agree(o); });
      SHOAL_CHECK_MSG(test::code(err) == ErrorCode::kAborted, test::message(err));
      SHOAL_CHECK_MSG(test::message(err).find("not in the membership") != std::string::npos, test::message(err));
      store->set_str("refused0", "1");
      return;
    }
    if (me == 2) {
      std::this_thread::sleep_for(std::chrono::seconds(3));  // late: suspected by all, decided without
      auto err = test::capture([&] { c->agree(o); });
      SHOAL_CHECK_MSG(test::code(err) == ErrorCode::kAborted, test::message(err));
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto m = c->agree(o);
    const auto took = std::chrono::steady_clock::now() - t0;
    SHOAL_CHECK_MSG(m.epoch == 2 && m.members == std::vector<int>{1}, "epoch " << m.epoch);
    SHOAL_CHECK(took < std::chrono::seconds(2));
    auto s = c->shrink(m);
    check_sum(*s);
    kill(std::stoi(store->get_str("pid0")), SIGCONT);
    store->get_str("refused0");
  });
  EXPECT_EQ(test::failures(res), "");
}

// Every collective, on a shrunk communicator and on one made afresh over the
// same processes, with every algorithm forced (and none), in several dtypes:
// byte-identical results.
TEST(Recovery, ShrunkAndFreshCommunicatorsGiveIdenticalBytes) {
  auto res = run_ranks(4, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    if (me == 3) test::leave(0);
    AgreeOptions o;
    o.suspects = {3};
    auto s = c->recover(o);
    Options fo;
    fo.name = "fresh";
    auto f = Communicator::create(store, s->rank(), s->size(), fo);
    const int n = s->size(), r = s->rank();
    const size_t count = 1000;
    int checked = 0;
    for (DataType dt : {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat16, DataType::kInt32}) {
      const size_t es = dtype_size(dt);
      std::vector<uint8_t> in(count * n * es);
      for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>((i * 131 + r * 17 + 7) % 61);
      for (coll::Coll k : {coll::Coll::kAllreduce, coll::Coll::kBroadcast, coll::Coll::kReduce, coll::Coll::kAllgather,
                           coll::Coll::kReduceScatter, coll::Coll::kAlltoall, coll::Coll::kGather,
                           coll::Coll::kScatter}) {
        std::vector<std::string> algos{""};
        for (const auto* a : coll::algorithms(k)) algos.emplace_back(a->name);
        for (const auto& algo : algos) {
          auto run = [&](Communicator& comm) {
            OpOptions oo;
            oo.algorithm = algo;
            std::vector<uint8_t> out(count * n * es, 0), buf = in;
            switch (k) {
              case coll::Coll::kAllreduce: comm.allreduce(in.data(), out.data(), count, dt, ReduceOp::kSum, oo)->wait(); break;
              case coll::Coll::kBroadcast: comm.broadcast(buf.data(), count, dt, 1, oo)->wait(); out = buf; break;
              case coll::Coll::kReduce: comm.reduce(in.data(), out.data(), count, dt, ReduceOp::kMax, 2, oo)->wait(); break;
              case coll::Coll::kAllgather: comm.allgather(in.data(), out.data(), count, dt, oo)->wait(); break;
              case coll::Coll::kReduceScatter: comm.reduce_scatter(in.data(), out.data(), count, dt, ReduceOp::kSum, oo)->wait(); break;
              case coll::Coll::kAlltoall: comm.alltoall(in.data(), out.data(), count, dt, oo)->wait(); break;
              case coll::Coll::kGather: comm.gather(in.data(), out.data(), count, dt, 0, oo)->wait(); break;
              case coll::Coll::kScatter: comm.scatter(in.data(), out.data(), count, dt, 0, oo)->wait(); break;
              default: break;
            }
            return out;
          };
          auto a = run(*s), b = run(*f);
          SHOAL_CHECK_MSG(a == b, coll::coll_name(k) << " " << dtype_name(dt) << " algorithm '" << algo
                                                     << "': the shrunk communicator's bytes differ from a fresh one's");
          ++checked;
        }
      }
    }
    SHOAL_CHECK(checked > 40);
  });
  EXPECT_EQ(test::failures(res), "");
}

// A group's collectives with values that depend on `round`: allreduce,
// allgather and broadcast (from each of its ranks in turn), each checked.
// `jobs` are its members as the job numbers them.
void check_group(Communicator& g, const std::vector<int64_t>& jobs, int round) {
  const int n = g.size(), r = g.rank();
  std::vector<float> x(1000, static_cast<float>(r + 1 + round));
  g.allreduce(x.data(), x.data(), x.size(), f32, ReduceOp::kSum)->wait();
  const float sum = static_cast<float>(n * (n + 1) / 2 + n * round);
  SHOAL_CHECK_MSG(x[0] == sum && x.back() == sum, "round " << round << ": allreduce " << x[0] << ", want " << sum);
  const int64_t mine[2] = {jobs[static_cast<size_t>(r)] * 1000 + round, -round};
  std::vector<int64_t> all(2 * jobs.size(), -1);
  g.allgather(mine, all.data(), 2, DataType::kInt64)->wait();
  for (size_t i = 0; i < jobs.size(); ++i) {
    SHOAL_CHECK_MSG(all[2 * i] == jobs[i] * 1000 + round && all[2 * i + 1] == -round,
                    "round " << round << ": allgather block " << i << ": " << all[2 * i]);
  }
  const int root = round % n;
  int64_t b = r == root ? int64_t{7} * round + root : -1;
  g.broadcast(&b, 1, DataType::kInt64, root)->wait();
  SHOAL_CHECK_MSG(b == int64_t{7} * round + root, "round " << round << ": broadcast from " << root << ": " << b);
}

bool names_rank(std::exception_ptr err, int rank) {
  return test::code(err) == ErrorCode::kPeerLost &&
         test::message(err).find("rank " + std::to_string(rank)) != std::string::npos;
}

// Four ranks make the world and the groups {0,1} and {2,3} through
// create_or_split (as torch's new_group does), then rank 3 is killed and
// the survivors use the world until it fails naming rank 3. With
// connections of their own (Options::own_connections), the group {0,1}
// goes on giving correct results, also after the world has been recovered
// without rank 3; the group {2,3} fails naming rank 3. Sharing the world's
// connections (the default), both groups break with the world.
void lost_rank_breaks_only_its_groups(bool own, const std::string& shm) {
  JobOptions jo;
  jo.create_comm = false;
  jo.env["SHOAL_SHM"] = shm;
  auto res = run_ranks(4, [&](std::shared_ptr<Communicator>&, int me, int n, const auto& store) {
    Options o;
    o.timeout = std::chrono::seconds(20);
    auto world = Communicator::create_or_split(std::make_shared<PrefixStore>("world", store), me, n, {}, o);
    o.own_connections = own;
    const std::vector<int64_t> pair = me < 2 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{2, 3};
    auto group = Communicator::create_or_split(std::make_shared<PrefixStore>(me < 2 ? "g01" : "g23", store), me % 2,
                                               2, pair, o);
    check_sum(*world);
    check_group(*group, pair, 0);
    if (me == 3) raise(SIGKILL);
    auto err = until_error(*world);
    SHOAL_CHECK_MSG(names_rank(err, 3), "the world's error: " << test::message(err));
    if (me == 2 || !own) {
      auto gerr = test::capture([&] { check_group(*group, pair, 1); });
      SHOAL_CHECK_MSG(names_rank(gerr, 3), "group {" << pair[0] << "," << pair[1] << "}'s error: "
                                                     << (gerr ? test::message(gerr) : "none"));
    } else {
      for (int round = 1; round <= 300; ++round) check_group(*group, pair, round);
      SHOAL_CHECK(test::capture([&] { check_sum(*world); }) != nullptr);  // the world stays broken
    }
    auto s = world->recover();
    SHOAL_CHECK(s->size() == 3);
    check_sum(*s);
    if (own && me < 2) {
      for (int round = 301; round <= 320; ++round) check_group(*group, pair, round);
    }
  }, jo);
  ASSERT_EQ(res[3].signal, SIGKILL) << res[3].output;
  EXPECT_EQ(survivors_failures(res, {3}), "");
}

TEST(Recovery, GroupsWithOwnConnectionsOutliveALostRankOutsideThem) {
  lost_rank_breaks_only_its_groups(true, "1");
}
TEST(Recovery, GroupsWithOwnConnectionsOutliveALostRankOutsideThemOverTcp) {
  lost_rank_breaks_only_its_groups(true, "0");
}
TEST(Recovery, GroupsSharingConnectionsBreakWithTheirParent) { lost_rank_breaks_only_its_groups(false, "1"); }

// A name used again (torch reuses a group's name, so its store prefix, after
// destroy_process_group) gets keys of its own: no abort record or id of
// the earlier communicator comes back.
TEST(Recovery, ReusedNameStartsFromFreshKeys) {
  auto res = run_ranks(3, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    (void)c;
    Options o;
    o.name = "reused";
    o.timeout = std::chrono::seconds(20);
    auto a = Communicator::create(store, me, 3, o);
    check_sum(*a);
    const uint64_t first = a->id();
    a->barrier()->wait();
    a.reset();
    if (me == 0) store->set_str("shoal/reused/abort", "2|1|1|1|peer lost: a stale record");
    store->add("stale-written", 1);
    store->wait({"stale-written"}, std::chrono::seconds(10));
    auto b = Communicator::create(store, me, 3, o);
    SHOAL_CHECK(b->id() != first);
    check_sum(*b);  // the stale record is not read
    SHOAL_CHECK(b->error() == nullptr);
  });
  EXPECT_EQ(test::failures(res), "");
}

}  // namespace
}  // namespace shoal
