// test_api.cc — the public API's contract: bad input is rejected by the call
// itself with a message naming the argument and the rank (and nothing is sent:
// the communicator still works afterwards), creation from the environment,
// algorithm overrides, and work handles.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "harness.h"

namespace shoal {
namespace {

using test::JobOptions;
using test::run_ranks;

struct BadCall {
  const char* name;
  const char* expect;  // substring of the message: names the argument
  std::function<void(Communicator&, std::vector<float>&)> call;
};

std::vector<BadCall> bad_calls() {
  const DataType f32 = DataType::kFloat32;
  return {
      {"null send", "send: null pointer",
       [&](Communicator& c, auto& b) { c.allreduce(nullptr, b.data(), 4, f32, ReduceOp::kSum); }},
      {"null recv", "recv: null pointer",
       [&](Communicator& c, auto& b) { c.allreduce(b.data(), nullptr, 4, f32, ReduceOp::kSum); }},
      {"bitwise on float", "op:",
       [&](Communicator& c, auto& b) { c.allreduce(b.data(), b.data(), 4, f32, ReduceOp::kBand); }},
      {"premul on int", "op: premul_sum needs a floating dtype",
       [&](Communicator& c, auto& b) { c.allreduce(b.data(), b.data(), 4, DataType::kInt32, ReduceOp::kPremulSum); }},
      {"avg on bool", "op:",
       [&](Communicator& c, auto& b) { c.allreduce(b.data(), b.data(), 4, DataType::kBool, ReduceOp::kAvg); }},
      {"unknown dtype", "dtype: unknown value",
       [&](Communicator& c, auto& b) { c.allreduce(b.data(), b.data(), 4, static_cast<DataType>(42), ReduceOp::kSum); }},
      {"partial overlap", "recv: overlaps send",
       [&](Communicator& c, auto& b) { c.allreduce(b.data(), b.data() + 1, 4, f32, ReduceOp::kSum); }},
      {"broadcast root high", "root: 2 is out of range for 2 ranks",
       [&](Communicator& c, auto& b) { c.broadcast(b.data(), 4, f32, 2); }},
      {"reduce root negative", "root: -1 is out of range",
       [&](Communicator& c, auto& b) { c.reduce(b.data(), b.data(), 4, f32, ReduceOp::kSum, -1); }},
      {"gather root high", "root: 5",
       [&](Communicator& c, auto& b) { c.gather(b.data(), b.data(), 1, f32, 5); }},
      {"allgatherv short counts", "recv_counts: has 1 entries, expected one per rank (2)",
       [&](Communicator& c, auto& b) { c.allgatherv(b.data(), b.data(), {1}, {}, f32); }},
      {"alltoallv bad displs", "recv_displs: has 3 entries",
       [&](Communicator& c, auto& b) { c.alltoallv(b.data(), {1, 1}, {}, b.data() + 8, {1, 1}, {0, 1, 2}, f32); }},
      {"alltoallv self mismatch", "send_counts: this rank sends itself",
       [&](Communicator& c, auto& b) {
         std::vector<size_t> sc = {1, 1}, rc = {1, 1};
         sc[c.rank()] = 2;
         c.alltoallv(b.data(), sc, {}, b.data() + 8, rc, {}, f32);
       }},
      {"reduce_scatter in place", "reduce_scatter cannot run in place",
       [&](Communicator& c, auto& b) { c.reduce_scatter(b.data(), b.data(), 2, f32, ReduceOp::kSum); }},
      {"send to self", "peer:",
       [&](Communicator& c, auto& b) { c.send(b.data(), 1, f32, c.rank()); }},
      {"recv peer high", "peer: 9",
       [&](Communicator& c, auto& b) { c.recv(b.data(), 1, f32, 9); }},
      {"negative tag", "tag: must be >= 0",
       [&](Communicator& c, auto& b) { c.send(b.data(), 1, f32, 1 - c.rank(), -3); }},
      {"unknown algorithm", "algorithm: unknown algorithm 'bogus'",
       [&](Communicator& c, auto& b) {
         OpOptions o;
         o.algorithm = "bogus";
         c.allreduce(b.data(), b.data(), 4, f32, ReduceOp::kSum, o);
       }},
  };
}

TEST(Api, BadInputIsRejectedBeforeAnythingIsSent) {
  auto res = run_ranks(2, [](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    std::vector<float> buf(64, 1.0f);
    for (const auto& bc : bad_calls()) {
      std::string msg;
      try {
        bc.call(*c, buf);
      } catch (const InvalidArgument& e) {
        msg = e.what();
      }
      SHOAL_CHECK_MSG(msg.find(bc.expect) != std::string::npos,
                      bc.name << ": expected '" << bc.expect << "', got '" << msg << "'");
      SHOAL_CHECK_MSG(msg.find("shoal rank " + std::to_string(me)) != std::string::npos,
                      bc.name << ": message does not name the rank: " << msg);
    }
    // Nothing was sent: the ranks are still in step.
    float x = static_cast<float>(me + 1);
    c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum)->wait();
    SHOAL_CHECK(x == 3.0f);
    SHOAL_CHECK(c->error() == nullptr);
  });
  EXPECT_EQ(test::failures(res), "");
}

TEST(Api, FromEnvironment) {
  // Pick a port the parent knows is free at this moment; rank 0 hosts the store.
  auto probe = net::listen_tcp("127.0.0.1", 0);
  const uint16_t port = net::bound_port(probe.get());
  probe.reset();
  JobOptions jo;
  jo.create_comm = false;
  auto res = run_ranks(3, [&](std::shared_ptr<Communicator>&, int me, int n, const auto&) {
    setenv("RANK", std::to_string(me).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    auto c = Communicator::from_env();
    SHOAL_CHECK(c->rank() == me && c->size() == n);
    int64_t v = me;
    c->allreduce(&v, &v, 1, DataType::kInt64, ReduceOp::kSum)->wait();
    SHOAL_CHECK(v == 3);
  }, jo);
  EXPECT_EQ(test::failures(res), "");
}

TEST(Api, FromEnvironmentNamesMissingVariables) {
  unsetenv("RANK");
  try {
    Communicator::from_env();
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("RANK: not set"), std::string::npos) << e.what();
  }
  setenv("RANK", "x", 1);
  setenv("WORLD_SIZE", "2", 1);
  try {
    Communicator::from_env();
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("RANK: 'x'"), std::string::npos) << e.what();
  }
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
}

TEST(Api, CreateRejectsBadRankAndSize) {
  TcpStoreOptions so;
  so.is_server = true;
  auto store = std::make_shared<TcpStore>(so);
  EXPECT_THROW(Communicator::create(store, 2, 2), InvalidArgument);
  EXPECT_THROW(Communicator::create(store, 0, 0), InvalidArgument);
  EXPECT_THROW(Communicator::create(nullptr, 0, 1), InvalidArgument);
}

TEST(Api, SingleRankAndCountZero) {
  TcpStoreOptions so;
  so.is_server = true;
  auto store = std::make_shared<TcpStore>(so);
  auto c = Communicator::create(store, 0, 1);
  std::vector<double> a = {1, 2, 3}, b(3);
  c->allreduce(a.data(), b.data(), 3, DataType::kFloat64, ReduceOp::kAvg)->wait();
  EXPECT_EQ(b, a);
  c->allreduce(nullptr, nullptr, 0, DataType::kFloat64, ReduceOp::kSum)->wait();
  c->allgather(a.data(), b.data(), 3, DataType::kFloat64)->wait();
  EXPECT_EQ(b, a);
  c->barrier()->wait();
  auto w = c->broadcast(a.data(), 3, DataType::kFloat64, 0);
  w->wait();
  EXPECT_TRUE(w->test());
  EXPECT_EQ(w->seq(), 5u);  // collectives are numbered in issue order from 1
}

TEST(Api, AlgorithmOverridesAreChecked) {
  TcpStoreOptions so;
  so.is_server = true;
  auto store = std::make_shared<TcpStore>(so);
  Options o;
  o.algorithms = "allreduce=nonsense";
  EXPECT_THROW(Communicator::create(store, 0, 1, o), InvalidArgument);
  o.algorithms = "frobnicate=ring";
  EXPECT_THROW(Communicator::create(store, 0, 1, o), InvalidArgument);
  o.algorithms = "allreduce=ring,broadcast=chain";
  EXPECT_NO_THROW(Communicator::create(store, 0, 1, o));
}

TEST(Api, CompletionCallbacksRunOnce) {
  auto res = run_ranks(2, [](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    std::atomic<int> calls{0};
    std::vector<int32_t> v(1000, me);
    auto w = c->allreduce(v.data(), v.data(), v.size(), DataType::kInt32, ReduceOp::kMax);
    w->on_complete([&] { calls++; });
    w->wait();
    w->on_complete([&] { calls++; });  // after completion: runs at once
    SHOAL_CHECK(calls.load() == 2);
    SHOAL_CHECK(v[999] == 1);
  });
  EXPECT_EQ(test::failures(res), "");
}

// A blocking call returns with its Work complete, after the operations queued
// ahead of it (which it may have run itself), with the same results.
TEST(Api, BlockingCallsReturnCompletedAndInOrder) {
  auto res = run_ranks(3, [](std::shared_ptr<Communicator>& c, int me, int n, const auto&) {
    OpOptions blocking;
    blocking.blocking = true;
    for (int round = 0; round < 50; ++round) {
      std::vector<int32_t> big(1 << 16, me + round), small = {me, 10 * me};
      auto queued = c->allreduce(big.data(), big.data(), big.size(), DataType::kInt32, ReduceOp::kSum);
      auto w = c->allreduce(small.data(), small.data(), 2, DataType::kInt32, ReduceOp::kMax, blocking);
      SHOAL_CHECK(w->test());
      SHOAL_CHECK(queued->test());  // ahead of it in the queue: done first
      SHOAL_CHECK(w->seq() == queued->seq() + 1);
      SHOAL_CHECK(small[0] == n - 1 && small[1] == 10 * (n - 1));
      SHOAL_CHECK(big[12345] == n * round + n * (n - 1) / 2);
      double x = me == round % n ? 2.5 + round : -1;
      auto b = c->broadcast(&x, 1, DataType::kFloat64, round % n, blocking);
      SHOAL_CHECK(b->test());
      SHOAL_CHECK(x == 2.5 + round);
    }
    c->barrier(blocking)->wait();
  });
  EXPECT_EQ(test::failures(res), "");
}

// A blocking call of an idle communicator runs without the queue and may
// hand back the Work of an earlier call that its caller let go of: a Work
// the caller still holds keeps its own seq, state and error, and every
// handle says the seq of its own call.
TEST(Api, BlockingCallsKeepTheirOwnWork) {
  auto res = run_ranks(2, [](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    OpOptions blocking;
    blocking.blocking = true;
    int32_t x = me + 1;
    WorkPtr held = c->allreduce(&x, &x, 1, DataType::kInt32, ReduceOp::kSum, blocking);
    const uint64_t first = held->seq();
    for (uint64_t i = 1; i <= 100; ++i) {
      x = me + 1;
      WorkPtr w = c->allreduce(&x, &x, 1, DataType::kInt32, ReduceOp::kSum, blocking);
      SHOAL_CHECK(w != held);
      SHOAL_CHECK(w->test() && w->error() == nullptr);
      SHOAL_CHECK_MSG(w->seq() == first + i, "seq " << w->seq() << " after " << first << " + " << i);
      SHOAL_CHECK(x == 3);
    }
    SHOAL_CHECK(held->seq() == first && held->test() && held->error() == nullptr);
    // A failed one keeps its error while later calls succeed.
    std::vector<float> v(me == 0 ? 4 : 5, 1.0f);  // counts differ: a mismatch
    WorkPtr bad = c->allreduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum, blocking);
    SHOAL_CHECK(bad->error() != nullptr);
    bool threw = false;
    try {
      c->allreduce(&x, &x, 1, DataType::kInt32, ReduceOp::kSum, blocking)->wait();
    } catch (const Error&) {
      threw = true;  // the communicator is broken after a mismatch
    }
    SHOAL_CHECK(threw);
    SHOAL_CHECK(bad->error() != nullptr && bad->seq() == first + 101);
  });
  EXPECT_EQ(test::failures(res), "");
}

// A blocking call's failure is the Work's, as for a queued one: the call
// itself throws only for bad arguments.
TEST(Api, BlockingCallKeepsItsErrorInTheWork) {
  auto res = run_ranks(2, [](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    OpOptions blocking;
    blocking.blocking = true;
    std::vector<float> v(me == 0 ? 4 : 5, 1.0f);  // counts differ: a mismatch
    WorkPtr w = c->allreduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum, blocking);
    SHOAL_CHECK(w->test());
    SHOAL_CHECK(w->error() != nullptr);
    bool threw = false;
    try {
      w->wait();
    } catch (const Mismatch& e) {
      threw = std::string(e.what()).find("count") != std::string::npos;
    }
    SHOAL_CHECK(threw);
  });
  EXPECT_EQ(test::failures(res), "");
}

// `blocking` does not apply to point-to-point: both ranks post their receive
// first, then send; a receive that waited would deadlock.
TEST(Api, BlockingIsIgnoredBySendAndReceive) {
  JobOptions jo;
  jo.comm.timeout = std::chrono::seconds(20);
  auto res = run_ranks(2, [](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    OpOptions blocking;
    blocking.blocking = true;
    std::vector<float> out(4 << 20, static_cast<float>(me + 1)), in(4 << 20, 0.0f);
    auto r = c->recv(in.data(), in.size(), DataType::kFloat32, 1 - me, 7, blocking);
    auto s = c->send(out.data(), out.size(), DataType::kFloat32, 1 - me, 7, blocking);
    s->wait();
    r->wait();
    SHOAL_CHECK(in[0] == static_cast<float>(2 - me) && in.back() == static_cast<float>(2 - me));
  }, jo);
  EXPECT_EQ(test::failures(res), "");
}

// A thread waiting for a receive drives the transport itself for a while;
// operations another thread queues meanwhile still run, in order, and the
// receive completes once its sender gets to it.
TEST(Api, WaitingForAReceiveLetsOtherThreadsOperationsRun) {
  auto res = run_ranks(2, [](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    for (int round = 0; round < 20; ++round) {
      int32_t got = -1, token = 100 + round;
      if (me == 0) {
        std::thread waiter([&] { c->recv(&got, 1, DataType::kInt32, 1, 1)->wait(); });
        std::vector<int64_t> v(1000, 1);
        for (int i = 0; i < 10; ++i) {
          c->allreduce(v.data(), v.data(), v.size(), DataType::kInt64, ReduceOp::kSum)->wait();
        }
        SHOAL_CHECK(v[999] == 1024);
        c->send(&token, 1, DataType::kInt32, 1, 2)->wait();
        waiter.join();
        SHOAL_CHECK(got == 200 + round);
      } else {
        std::vector<int64_t> v(1000, 1);
        for (int i = 0; i < 10; ++i) {
          c->allreduce(v.data(), v.data(), v.size(), DataType::kInt64, ReduceOp::kSum)->wait();
        }
        c->recv(&got, 1, DataType::kInt32, 0, 2)->wait();
        SHOAL_CHECK(got == token);
        int32_t reply = 200 + round;
        c->send(&reply, 1, DataType::kInt32, 0, 1)->wait();
      }
    }
  });
  EXPECT_EQ(test::failures(res), "");
}

}  // namespace
}  // namespace shoal
