// tests/cpp/kill_util.h — a rank SIGKILLed while the others loop on an
// operation: every survivor must fail with PeerLost naming it within 2 s.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <functional>
#include <regex>
#include <string>

#include "errors_util.h"
#include "harness.h"

namespace shoal::test {

// `n` ranks run `op` once (setting up what it needs), then `victim` kills
// itself and the others run `op` until it throws. Each survivor's error
// must be PeerLost and contain `names` ("rank <victim>" in some form), and
// come within 2 s of the kill.
inline void expect_killed_rank_named(int n, int victim, const std::function<void(Communicator&)>& op,
                                     const std::string& names) {
  auto res = run_ranks(n, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    op(*c);
    if (me == victim) {
      std::printf("KILLED_AT %lld\n", static_cast<long long>(mono_ns()));
      std::fflush(stdout);
      raise(SIGKILL);
    }
    std::exception_ptr err;
    for (int i = 0; i < 1000000 && !err; ++i) err = capture([&] { op(*c); });
    std::printf("ERROR_AT %lld\n", static_cast<long long>(mono_ns()));
    SHOAL_CHECK_MSG(err != nullptr, "no error after the victim died");
    if (!err) return;
    SHOAL_CHECK_MSG(code(err) == ErrorCode::kPeerLost, message(err));
    SHOAL_CHECK_MSG(message(err).find(names) != std::string::npos, message(err));
  });
  ASSERT_EQ(res[victim].signal, SIGKILL) << res[victim].output;
  std::smatch k;
  ASSERT_TRUE(std::regex_search(res[victim].output, k, std::regex("KILLED_AT (\\d+)")));
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    EXPECT_EQ(res[r].exit_code, 0) << res[r].output;
    std::smatch e;
    ASSERT_TRUE(std::regex_search(res[r].output, e, std::regex("ERROR_AT (\\d+)"))) << res[r].output;
    EXPECT_LT(std::stoll(e[1]) - std::stoll(k[1]), 2000000000) << res[r].output;
  }
}

}  // namespace shoal::test
