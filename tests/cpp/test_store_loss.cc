// tests/cpp/test_store_loss.cc — the store's host is lost while every rank
// is blocked in shoal (docs/errors.md, rule 2): every rank fails within 5 s
// with an error that names the store, instead of waiting out its timeout.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>

#include "errors_util.h"
#include "harness.h"

namespace shoal {
namespace {

using test::JobOptions;
using test::run_ranks;

// A communicator on `store` (a 60 s timeout) whose first collectives have
// made every connection they need.
std::shared_ptr<Communicator> connected(const std::shared_ptr<Store>& store, int me, int n) {
  Options o;
  o.timeout = std::chrono::seconds(60);
  auto c = Communicator::create(store, me, n, o);
  float x = 1;
  c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum)->wait();
  c->barrier()->wait();
  return c;
}

TEST(StoreLoss, EveryBlockedRankFailsNamingTheStoreWithin5s) {
  // The job's store lives in a process of its own (as the launcher's does);
  // the ranks' bodies get its pid and port through the environment.
  int keepalive = -1;
  auto [pid, port] = test::start_store_process(&keepalive);
  JobOptions jo;
  jo.create_comm = false;
  jo.env = {{"STORE_PID", std::to_string(pid)}, {"STORE_PORT", std::to_string(port)}};
  auto res = run_ranks(3, [&](std::shared_ptr<Communicator>&, int me, int n, const auto&) {
    TcpStoreOptions so;
    so.port = static_cast<uint16_t>(std::atoi(std::getenv("STORE_PORT")));
    so.timeout = std::chrono::seconds(60);
    auto store = std::make_shared<TcpStore>(so);
    auto c = connected(store, me, n);
    float x = 1;
    if (me == 2) kill(static_cast<pid_t>(std::atoi(std::getenv("STORE_PID"))), SIGKILL);
    const int64_t t0 = test::mono_ns();
    // Ranks 0 and 1 wait for rank 2 in an allreduce; rank 2 for a message
    // nobody sends: all blocked in shoal, none able to finish.
    std::exception_ptr e;
    if (me == 2) {
      e = test::capture([&] { c->recv(&x, 1, DataType::kFloat32, 0, 7)->wait(); });
    } else {
      e = test::capture([&] { c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum)->wait(); });
    }
    const double s = static_cast<double>(test::mono_ns() - t0) / 1e9;
    SHOAL_CHECK_MSG(e != nullptr, "rank " << me << ": no error");
    const std::string m = test::message(e);
    SHOAL_CHECK_MSG(s < 5.0, "rank " << me << " failed after " << s << " s: " << m);
    SHOAL_CHECK_MSG(m.find("store") != std::string::npos && m.find(std::to_string(so.port)) != std::string::npos,
                    "rank " << me << ": the error does not name the store (port " << so.port << "): " << m);
  }, jo);
  ::close(keepalive);
  waitpid(pid, nullptr, 0);
  EXPECT_EQ(test::failures(res), "");
}

// A store the caller made, hosted by one of the ranks without shoal being
// told which (torchft's quorum stores): that rank exits while the others
// wait for it in an allreduce over shared memory. Whichever they notice
// first, the store gone or the process gone, the error names the rank.
TEST(StoreLoss, AStoreHostedByAnUndeclaredMemberNamesItWhenItExits) {
  auto res = run_ranks(3, [&](std::shared_ptr<Communicator>&, int me, int n, const std::shared_ptr<Store>& job) {
    TcpStoreOptions so;
    so.timeout = std::chrono::seconds(60);
    std::shared_ptr<TcpStore> store;
    if (me == 2) {
      so.is_server = true;
      store = std::make_shared<TcpStore>(so);
      job->set_str("member_store_port", std::to_string(store->port()));
    } else {
      so.port = static_cast<uint16_t>(std::stoi(job->get_str("member_store_port")));
      store = std::make_shared<TcpStore>(so);
    }
    auto c = connected(store, me, n);
    float x = 1;
    if (me == 2) test::leave(0);  // its store goes with it
    const int64_t t0 = test::mono_ns();
    auto e = test::capture([&] { c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum)->wait(); });
    const double s = static_cast<double>(test::mono_ns() - t0) / 1e9;
    SHOAL_CHECK_MSG(e != nullptr, "rank " << me << ": no error");
    const std::string m = test::message(e);
    std::printf("ERROR %s\n", m.c_str());
    SHOAL_CHECK_MSG(s < 5.0, "rank " << me << " failed after " << s << " s: " << m);
    SHOAL_CHECK_MSG(test::code(e) == ErrorCode::kPeerLost && m.find("peer lost: rank 2") != std::string::npos,
                    "rank " << me << ": the error does not name rank 2: " << m);
    // Neither survivor exits before both have their error (the other's exit
    // would be a second process gone).
    job->set_str("failed/" + std::to_string(me), "1");
    job->get_str("failed/" + std::to_string(1 - me));  // waits for it
  });
  EXPECT_EQ(test::failures(res), "");
}

}  // namespace
}  // namespace shoal
