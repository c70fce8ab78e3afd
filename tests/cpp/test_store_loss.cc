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
    Options o;
    o.timeout = std::chrono::seconds(60);
    auto c = Communicator::create(store, me, n, o);
    float x = 1;
    c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum)->wait();  // connected
    c->barrier()->wait();
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

}  // namespace
}  // namespace shoal
