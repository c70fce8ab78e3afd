// tests/cpp/test_grow.cc — newcomers joining (Communicator::grow and join;
// docs/errors.md "Growing back"): a replacement of a killed rank joins the
// survivors at a step boundary, several newcomers join at once, an empty
// lobby changes nothing, and bad input and a lobby nobody grows from fail
// with errors that say so.
#include <gtest/gtest.h>
#include <signal.h>

#include "errors_util.h"
#include "harness.h"

namespace shoal {
namespace {

using test::JobOptions;
using test::run_ranks;
constexpr auto f32 = DataType::kFloat32;

std::shared_ptr<Store> lobby_of(const std::shared_ptr<Store>& store) {
  return std::make_shared<PrefixStore>("job/lobby", store);
}

void check_sum(Communicator& c) {
  float x = static_cast<float>(c.rank() + 1);
  c.allreduce(&x, &x, 1, f32, ReduceOp::kSum)->wait();
  const float want = static_cast<float>(c.size() * (c.size() + 1) / 2);
  SHOAL_CHECK_MSG(x == want, "allreduce over " << c.size() << " ranks: " << x << ", want " << want);
}

// Every rank of the grown communicator reports who it was: old ranks keep
// their numbers, newcomers (-1) come after them.
void check_places(Communicator& g, int was, int old_size) {
  std::vector<int32_t> who(static_cast<size_t>(g.size()));
  int32_t mine = was;
  g.allgather(&mine, who.data(), 1, DataType::kInt32)->wait();
  for (int r = 0; r < g.size(); ++r) {
    const int32_t want = r < old_size ? r : -1;
    SHOAL_CHECK_MSG(who[static_cast<size_t>(r)] == want,
                    "rank " << r << " of the grown communicator was " << who[static_cast<size_t>(r)]);
  }
}

// Four ranks; rank 2 is killed; the three survivors recover and go on,
// calling grow() at every step boundary; a replacement (process 4) joins
// whenever it gets there and becomes rank 3 of a communicator of 4 again.
TEST(Grow, ReplacementOfAKilledRankJoinsTheSurvivors) {
  JobOptions jo;
  jo.create_comm = false;
  auto res = run_ranks(5, [&](std::shared_ptr<Communicator>& unused, int me, int, const auto& store) {
    (void)unused;
    Options o;
    o.timeout = std::chrono::seconds(20);
    if (me == 4) {
      auto g = Communicator::join(lobby_of(store), o);
      SHOAL_CHECK_MSG(g->rank() == 3 && g->size() == 4, "joined as " << g->rank() << " of " << g->size());
      check_places(*g, -1, 3);
      check_sum(*g);
      return;
    }
    auto c = Communicator::create(store, me, 4, o);
    check_sum(*c);
    if (me == 2) raise(SIGKILL);
    std::exception_ptr err;
    while (!err) err = test::capture([&] { check_sum(*c); });
    auto s = c->recover();
    SHOAL_CHECK(s->size() == 3);
    const uint64_t shrunk_id = s->id();
    std::shared_ptr<Communicator> g;
    for (int step = 0; step < 20000 && !g; ++step) {
      check_sum(*s);
      g = s->grow(lobby_of(store));
    }
    SHOAL_CHECK_MSG(g != nullptr, "the replacement was never admitted");
    if (!g) return;
    SHOAL_CHECK(g->size() == 4 && g->rank() == s->rank() && g->id() != shrunk_id);
    SHOAL_CHECK(s->error() != nullptr);  // the shrunk one is aborted
    check_places(*g, s->rank(), 3);
    check_sum(*g);
  }, jo);
  ASSERT_EQ(res[2].signal, SIGKILL);
  for (int r : {0, 1, 3, 4}) EXPECT_EQ(res[r].exit_code, 0) << "rank " << r << ":\n" << res[r].output;
}

// Two newcomers at once, waited for (joiners = 2); then an empty lobby:
// grow() returns null on every rank and the communicator goes on.
TEST(Grow, SeveralNewcomersJoinInTheOrderTheyArrived) {
  JobOptions jo;
  jo.create_comm = false;
  auto res = run_ranks(5, [&](std::shared_ptr<Communicator>& unused, int me, int, const auto& store) {
    (void)unused;
    Options o;
    o.timeout = std::chrono::seconds(20);
    std::shared_ptr<Communicator> g;
    if (me >= 3) {
      if (me == 4) store->wait({"job/lobby/tickets"}, std::chrono::seconds(20));  // after process 3
      g = Communicator::join(lobby_of(store), o);
      SHOAL_CHECK_MSG(g->rank() == me && g->size() == 5, "process " << me << " joined as rank " << g->rank());
      check_places(*g, -1, 3);
    } else {
      auto c = Communicator::create(store, me, 3, o);
      check_sum(*c);
      GrowOptions go;
      go.joiners = 2;
      g = c->grow(lobby_of(store), go);
      SHOAL_CHECK(g && g->rank() == me && g->size() == 5);
      check_places(*g, me, 3);
    }
    check_sum(*g);
    SHOAL_CHECK(g->grow(lobby_of(store)) == nullptr);  // nobody waits
    SHOAL_CHECK(g->error() == nullptr);
    check_sum(*g);
  }, jo);
  EXPECT_EQ(test::failures(res), "");
}

TEST(Grow, BadInputAndALobbyNobodyGrowsFromFail) {
  JobOptions jo;
  jo.create_comm = false;
  auto res = run_ranks(1, [&](std::shared_ptr<Communicator>&, int, int, const auto& store) {
    auto c = Communicator::create(store, 0, 1);
    GrowOptions bad;
    bad.joiners = 0;
    auto e = test::capture([&] { c->grow(lobby_of(store), bad); });
    SHOAL_CHECK(test::code(e) == ErrorCode::kInvalidArgument && test::message(e).find("joiners: 0") != std::string::npos);
    e = test::capture([&] { c->grow(nullptr); });
    SHOAL_CHECK(test::code(e) == ErrorCode::kInvalidArgument && test::message(e).find("lobby: null") != std::string::npos);
    GrowOptions quick;
    quick.timeout = std::chrono::milliseconds(300);
    e = test::capture([&] { Communicator::join(std::make_shared<PrefixStore>("empty", store), {}, quick); });
    SHOAL_CHECK_MSG(test::code(e) == ErrorCode::kTimeout && test::message(e).find("not admitted") != std::string::npos,
                    test::message(e));
    quick.joiners = 1;
    e = test::capture([&] { c->grow(std::make_shared<PrefixStore>("empty2", store), quick); });
    SHOAL_CHECK_MSG(test::code(e) == ErrorCode::kTimeout && test::message(e).find("0 of the 1 newcomers") != std::string::npos,
                    test::message(e));
    SHOAL_CHECK(c->error() == nullptr);  // a grow that admitted nobody leaves the communicator as it was
  }, jo);
  EXPECT_EQ(test::failures(res), "");
}

}  // namespace
}  // namespace shoal
