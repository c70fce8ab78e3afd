// test_observability.cc — what a communicator tells about itself: the flight
// recorder and its dumps (on a timeout, on SIGUSR1), shoal-trace reading
// them, the timeline, SHOAL_DEBUG and the stall inspector.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "common/env.h"
#include "core/debug_log.h"
#include "core/flight_recorder.h"
#include "core/stall_inspector.h"
#include "core/timeline.h"
#include "harness.h"

namespace shoal {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::JobOptions;
using test::run_ranks;

// A fresh directory, removed with its files at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "shoal-obs-XXXXXX").string();
    if (!mkdtemp(t.data())) throw std::runtime_error("mkdtemp");
    path_ = t;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The dumps in `dir`, by file name.
std::vector<std::string> dumps_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n.rfind("shoal-trace-", 0) == 0 && n.size() > 6 && n.substr(n.size() - 6) == ".jsonl") {
      out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Waits (with a deadline) for a dump of `rank` to appear in `dir`.
std::string wait_for_dump(const std::string& dir, int rank, std::chrono::seconds limit = std::chrono::seconds(20)) {
  const std::string suffix = "-rank" + std::to_string(rank) + ".jsonl";
  auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    for (const auto& p : dumps_in(dir)) {
      if (p.size() > suffix.size() && p.substr(p.size() - suffix.size()) == suffix) return p;
    }
    if (std::chrono::steady_clock::now() >= deadline) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::vector<json> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(json::parse(line));
  }
  return out;
}

// Waits for `keys` by polling: a blocking get() would hold the store object
// that the communicator shares (its progress record could not be written).
void await_keys(const std::shared_ptr<Store>& store, const std::vector<std::string>& keys) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!store->check(keys) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// shoal-trace sits beside this test's executable (build/bin).
std::string shoal_trace_bin() {
  return (fs::read_symlink("/proc/self/exe").parent_path() / "shoal-trace").string();
}

// Runs shoal-trace with `args`; returns its stdout and stderr, and its exit status.
std::string run_shoal_trace(const std::string& args, int* status) {
  std::string cmd = shoal_trace_bin() + " " + args + " 2>&1";
  std::FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "popen failed";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int st = pclose(p);
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// ---- the pieces, alone --------------------------------------------------------

// A capacity that is not a power of two too: the ring is larger, and the
// snapshot still holds the last `n` only.
TEST(Observability, RecorderKeepsTheLastN) {
  for (const size_t n : {size_t{4}, size_t{3}}) {
    SCOPED_TRACE("capacity " + std::to_string(n));
    core::FlightRecorder rec(n);
    std::vector<uint64_t> ids;
    for (int i = 1; i <= 10; ++i) {
      core::TraceEntry e;
      e.seq = static_cast<uint64_t>(i);
      e.coll = 1;
      e.count = static_cast<uint64_t>(i) * 10;
      e.enqueued_us = i;
      ids.push_back(rec.enqueued(e));
      rec.started(ids.back(), 100 + i, "ring");
    }
    // Ending an entry that left the ring is ignored; the held ones end.
    core::TraceEntry gone;
    gone.id = ids[0];
    gone.state = core::OpState::kDone;
    rec.ended(gone);
    core::TraceEntry last;
    last.id = ids[9];
    last.state = core::OpState::kFailed;
    last.started_us = 110;
    last.ended_us = 120;
    last.error = "boom";
    last.peers = {1, 3};
    rec.ended(last);

    auto snap = rec.snapshot();
    ASSERT_EQ(snap.size(), n);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(snap[i].seq, 11 - n + i) << "oldest first, the last n";
      EXPECT_EQ(snap[i].count, (11 - n + i) * 10);
    }
    EXPECT_EQ(snap[0].state, core::OpState::kRunning);
    EXPECT_EQ(snap[n - 1].state, core::OpState::kFailed);
    EXPECT_EQ(snap[n - 1].error, "boom");
    EXPECT_EQ(snap[n - 1].peers, (std::vector<int>{1, 3}));
    auto j = json::parse(core::trace_entry_json(snap[n - 1]));
    EXPECT_EQ(j["seq"], 10);
    EXPECT_EQ(j["op"], "allreduce");
    EXPECT_EQ(j["state"], "failed");
    EXPECT_EQ(j["error"], "boom");
  }

  core::FlightRecorder off(0);
  EXPECT_EQ(off.enqueued(core::TraceEntry{}), 0u);
  EXPECT_TRUE(off.snapshot().empty());
}

TEST(Observability, StallReportNamesRanksThatHaveNotJoined) {
  using P = core::Progress;
  std::vector<std::optional<P>> all(5);
  all[0] = P{2, 2, 1, 1};  // this rank, in allreduce seq 2
  all[1] = P{1, 1, 1, 12};  // idle after seq 1
  all[2] = P{2, 2, 1, 1};  // joined
  all[3] = P{2, 1, 0, 12};  // still in the barrier, seq 2 queued
  std::string s = core::stall_report(0, 1, 2, 61.25, all);
  EXPECT_NE(s.find("shoal rank 0: allreduce seq 2 has waited 61.2 s; ranks not joined: [1, 3]"), std::string::npos) << s;
  EXPECT_NE(s.find("rank 1: idle after seq 1"), std::string::npos) << s;
  EXPECT_NE(s.find("rank 3: in barrier seq 1, seq 2 queued behind it"), std::string::npos) << s;
  EXPECT_NE(s.find("no progress record from ranks [4]"), std::string::npos) << s;

  EXPECT_EQ(P::decode(P{3, 2, 1, 4}.encode()), (P{3, 2, 1, 4}));
  EXPECT_FALSE(P::decode("garbage"));
  EXPECT_EQ(core::parse_stall_warn(env::get("SHOAL_STALL_WARN").value()), std::chrono::seconds(60));  // the table's default
  EXPECT_EQ(core::parse_stall_warn(std::string("0.25")), std::chrono::milliseconds(250));
  EXPECT_NE(message_of([] { core::parse_stall_warn(std::string("soon")); }).find("SHOAL_STALL_WARN"), std::string::npos);
  EXPECT_NE(message_of([] { core::parse_debug_level(std::string("LOUD")); }).find("SHOAL_DEBUG"), std::string::npos);
  EXPECT_EQ(core::parse_debug_level(std::string("info")), core::DebugLevel::kInfo);
}

TEST(Observability, TimelinePathHasTheRank) {
  EXPECT_EQ(core::timeline_path("/tmp/tl-%r.json", 3, 4, "c0", 77), "/tmp/tl-3.json");
  EXPECT_EQ(core::timeline_path("/tmp/tl.json", 3, 4, "c0", 77), "/tmp/tl-rank3.json");
  EXPECT_EQ(core::timeline_path("/tmp/tl.json", 0, 1, "c0", 77), "/tmp/tl.json");
  EXPECT_EQ(core::timeline_path("/tmp/x.d/%c-%p", 1, 2, "c2", 77), "/tmp/x.d/c2-77-rank1");
}

// ---- the flight recorder in a job ---------------------------------------------

// Rank 1 skips the allreduce (seq 2) that ranks 0 and 2 run: they time out
// and dump their recorders. shoal-trace names rank 1, first from the progress
// record it left in the store, then from its own dump (SIGUSR1).
TEST(Observability, TimeoutDumpsAndShoalTraceNamesTheRankThatDidNotJoin) {
  TempDir dir;
  JobOptions jo;
  jo.env = {{"SHOAL_TRACE_DIR", dir.path()}, {"SHOAL_STALL_WARN", "0.2"}};
  auto res = run_ranks(3, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    c->barrier()->wait();  // seq 1
    if (me == 1) {
      await_keys(store, {"failed/0", "failed/2"});
      raise(SIGUSR1);  // the observer's thread writes the dump
      SHOAL_CHECK_MSG(!wait_for_dump(dir.path(), 1).empty(), "no dump after SIGUSR1");
      return;
    }
    float x = 1;
    OpOptions o;
    o.timeout = std::chrono::milliseconds(800);
    std::string err = message_of([&] { c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, o)->wait(); });
    SHOAL_CHECK_MSG(err.find("timed out") != std::string::npos, err);
    // The dump is written before the failing operation completes.
    SHOAL_CHECK_MSG(!wait_for_dump(dir.path(), me, std::chrono::seconds(0)).empty(), "no dump when the timeout is reported");
    store->set_str("failed/" + std::to_string(me), "1");
  }, jo);
  ASSERT_EQ(test::failures(res), "");
  EXPECT_NE(res[0].output.find("flight recorder written to"), std::string::npos) << res[0].output;

  auto files = dumps_in(dir.path());
  ASSERT_EQ(files.size(), 3u);
  // Rank 0's dump: a header naming the cause, then both collectives.
  auto lines = read_lines(files[0]);
  ASSERT_GE(lines.size(), 3u);
  EXPECT_EQ(lines[0]["rank"], 0);
  EXPECT_EQ(lines[0]["size"], 3);
  EXPECT_EQ(lines[0]["reason"], "timeout");
  EXPECT_EQ(lines[1]["op"], "barrier");
  EXPECT_EQ(lines[1]["state"], "done");
  EXPECT_EQ(lines[2]["op"], "allreduce");
  EXPECT_EQ(lines[2]["seq"], 2);
  EXPECT_EQ(lines[2]["state"], "failed");
  EXPECT_EQ(lines[2]["dtype"], "float32");
  EXPECT_FALSE(lines[2]["algo"].get<std::string>().empty());
  EXPECT_FALSE(lines[2]["peers"].empty()) << lines[2].dump();
  EXPECT_EQ(read_lines(files[1])[0]["reason"], "signal");

  // Without rank 1's dump: named from its progress record.
  int status = 0;
  std::string out = run_shoal_trace(files[0] + " " + files[2], &status);
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("no dump from ranks [1]"), std::string::npos) << out;
  EXPECT_NE(out.find("seq 2 allreduce(count=1, float32, sum): not joined by ranks [1]"), std::string::npos) << out;
  EXPECT_NE(out.find("first collective not completed everywhere: seq 2"), std::string::npos) << out;
  // With every dump.
  out = run_shoal_trace(dir.path(), &status);
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("not joined by ranks [1] (rank 1: last issued seq 1, idle after seq 1)"), std::string::npos)
      << out;
  EXPECT_NE(out.find("failed on ranks [0, 2]"), std::string::npos) << out;
  EXPECT_NE(out.find("ranks that did not join it: [1]"), std::string::npos) << out;
  EXPECT_EQ(out.find("seq 1 barrier"), std::string::npos) << "completed collectives are not listed\n" << out;
  out = run_shoal_trace("--all " + dir.path(), &status);
  EXPECT_NE(out.find("seq 1 barrier(count=0, uint8): done on ranks [0-2]"), std::string::npos) << out;
}

// A rank that runs a different collective at the same sequence number shows
// up as a mismatch.
TEST(Observability, ShoalTraceReportsMismatchedCollectives) {
  TempDir dir;
  auto write = [&](int rank, const std::string& op, const std::string& state) {
    std::ofstream f(dir.file("shoal-trace-00000000000000ab-rank" + std::to_string(rank) + ".jsonl"));
    f << R"({"shoal_trace":1,"comm":"00000000000000ab","name":"c0","rank":)" << rank
      << R"(,"size":2,"reason":"mismatch","host":"h","issued":1,"started":1,"ended":1})" << "\n";
    f << R"({"id":1,"seq":1,"op":")" << op << R"(","count":4,"bytes":16,"dtype":"float32","peers":[],"state":")"
      << state << R"(","enqueued_us":1,"started_us":2,"ended_us":3})" << "\n";
  };
  write(0, "allreduce", "failed");
  write(1, "broadcast", "failed");
  int status = 0;
  std::string out = run_shoal_trace(dir.path(), &status);
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("MISMATCH: ranks [0] run allreduce(count=4, float32), ranks [1] run broadcast(count=4, float32)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("the ranks disagree about what it is"), std::string::npos) << out;
  // No dumps at all is an error of its own.
  TempDir empty;
  out = run_shoal_trace(empty.path(), &status);
  EXPECT_EQ(status, 2) << out;
}

bool g_previous_handler_ran = false;

// SIGUSR1 dumps every rank's recorder, and the handler installed before
// shoal's still runs.
TEST(Observability, SigusrDumpsTheRecorder) {
  TempDir dir;
  JobOptions jo;
  jo.env = {{"SHOAL_TRACE_DIR", dir.path()}, {"SHOAL_TRACE_BUFFER", "3"}};
  jo.create_comm = false;
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>&, int me, int n, const auto& store) {
    struct sigaction sa {};
    sa.sa_handler = [](int) { g_previous_handler_ran = true; };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, nullptr);
    auto c = Communicator::create(store, me, n);
    std::vector<float> v(100, 1.0f);
    for (int i = 0; i < 5; ++i) c->allreduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum)->wait();
    kill(getpid(), SIGUSR1);
    std::string path = wait_for_dump(dir.path(), me);
    SHOAL_CHECK_MSG(!path.empty(), "no dump after SIGUSR1");
    SHOAL_CHECK(g_previous_handler_ran);
    if (!path.empty()) {
      auto lines = read_lines(path);  // the header and the last three operations
      SHOAL_CHECK_MSG(lines.size() == 4, lines.size() << " lines");
      if (lines.size() == 4) {
        SHOAL_CHECK(lines[0]["reason"] == "signal");
        SHOAL_CHECK(lines[0]["ended"] == 5);
        for (int i = 1; i < 4; ++i) {
          SHOAL_CHECK_MSG(lines[i]["seq"] == 2 + i && lines[i]["state"] == "done" && lines[i]["count"] == 100,
                          lines[i].dump());
        }
      }
    }
    c->barrier()->wait();
  }, jo);
  EXPECT_EQ(test::failures(res), "");
}

// ---- the timeline ---------------------------------------------------------------

TEST(Observability, TimelineIsJsonWithOneEventPerCollective) {
  TempDir dir;
  JobOptions jo;
  jo.env = {{"SHOAL_TIMELINE", dir.file("tl-%r.json")}};
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    std::vector<float> v(1000, 1.0f);
    for (int i = 0; i < 4; ++i) c->allreduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum)->wait();
    c->broadcast(v.data(), v.size(), DataType::kFloat32, 1)->wait();
    if (me == 0) {
      c->send(v.data(), 10, DataType::kFloat32, 1, 7)->wait();
    } else {
      c->recv(v.data(), 10, DataType::kFloat32, 0, 7)->wait();
    }
    c->barrier()->wait();
  }, jo);
  ASSERT_EQ(test::failures(res), "");
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(dir.file("tl-" + std::to_string(r) + ".json"));
    ASSERT_TRUE(in) << "no timeline of rank " << r;
    json events;
    ASSERT_NO_THROW(events = json::parse(in)) << "rank " << r << ": not JSON";
    ASSERT_TRUE(events.is_array());
    std::vector<json> colls;
    int p2p = 0, queued = 0;
    for (const auto& e : events) {
      EXPECT_EQ(e["pid"], r);
      if (e["ph"] == "X" && e["cat"] == "collective") colls.push_back(e);
      if (e["cat"] == "p2p") ++p2p;
      if (e["cat"] == "queued") ++queued;
    }
    ASSERT_EQ(colls.size(), 6u) << events.dump(1);
    const char* names[] = {"allreduce", "allreduce", "allreduce", "allreduce", "broadcast", "barrier"};
    for (size_t i = 0; i < colls.size(); ++i) {
      EXPECT_EQ(colls[i]["name"], names[i]);
      EXPECT_EQ(colls[i]["args"]["seq"], i + 1);
      EXPECT_GE(colls[i]["dur"].get<int64_t>(), 0);
      EXPECT_GT(colls[i]["ts"].get<int64_t>(), 0);
      EXPECT_EQ(colls[i]["args"]["state"], "done");
      if (i > 0) {
        EXPECT_GE(colls[i]["ts"].get<int64_t>(), colls[i - 1]["ts"].get<int64_t>());
      }
    }
    EXPECT_EQ(colls[0]["args"]["count"], 1000);
    EXPECT_EQ(colls[0]["args"]["dtype"], "float32");
    EXPECT_EQ(colls[0]["args"]["peers"], json::array({1 - r}));
    EXPECT_FALSE(colls[0]["args"]["algo"].get<std::string>().empty());
    EXPECT_EQ(p2p, 2) << "a begin and an end for the send (or the receive)";
    EXPECT_EQ(queued % 2, 0);
  }
}

// ---- SHOAL_DEBUG ----------------------------------------------------------------

// Ranks 0 and 1 share a "host", rank 2 is on another: INFO names the hosts
// and the transport to each peer; TRACE adds a line per operation.
TEST(Observability, DebugInfoNamesHostsAndTransports) {
  for (const char* level : {"INFO", "TRACE"}) {
    JobOptions jo;
    jo.env = {{"SHOAL_DEBUG", level}, {"SHOAL_SHM", "1"}};
    jo.create_comm = false;
    auto res = run_ranks(3, [&](std::shared_ptr<Communicator>&, int me, int n, const auto& store) {
      setenv("SHOAL_HOST_ID", me < 2 ? "host-a" : "host-b", 1);
      auto c = Communicator::create(store, me, n);
      float x = 1;
      c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum)->wait();
      c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum)->wait();
      c->barrier()->wait();
    }, jo);
    ASSERT_EQ(test::failures(res), "") << level;
    const std::string& out = res[0].output;
    auto count = [&](const std::string& what) {
      size_t n = 0;
      for (size_t p = out.find(what); p != std::string::npos; p = out.find(what, p + 1)) ++n;
      return n;
    };
    EXPECT_EQ(count("shoal rank 0: INFO: communicator c0 (id "), 1u) << out;
    EXPECT_NE(out.find("2 hosts: host 0 = ranks [0-1], host 1 = ranks [2]"), std::string::npos) << out;
    EXPECT_EQ(count("shoal rank 0: INFO: transports: shared memory to [1], TCP to [2]"), 1u) << out;
    EXPECT_EQ(count("shoal rank 0: INFO: allreduce of 4 B, size class [4 B, 8 B): algorithm "), 1u)
        << "once per collective and size class\n" << out;
    EXPECT_NE(res[2].output.find("transports: shared memory to [], TCP to [0-1]"), std::string::npos) << res[2].output;
    if (std::string(level) == "TRACE") {
      EXPECT_EQ(count("shoal rank 0: TRACE: allreduce seq "), 2u) << out;
      EXPECT_NE(out.find("shoal rank 0: TRACE: barrier seq 3 "), std::string::npos) << out;
    } else {
      EXPECT_EQ(count("TRACE"), 0u) << out;
    }
  }
}

// ---- the stall inspector ----------------------------------------------------------

TEST(Observability, StallInspectorNamesTheMissingRank) {
  TempDir dir;
  JobOptions jo;
  jo.env = {{"SHOAL_STALL_WARN", "0.3"}, {"SHOAL_TRACE_DIR", dir.path()}};
  auto res = run_ranks(3, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    c->barrier()->wait();  // seq 1
    if (me == 1) {
      await_keys(store, {"failed/0", "failed/2"});
      return;
    }
    float x = 1;
    OpOptions o;
    o.timeout = std::chrono::seconds(3);
    std::string err = message_of([&] { c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, o)->wait(); });
    SHOAL_CHECK_MSG(!err.empty(), "the allreduce did not fail");
    store->set_str("failed/" + std::to_string(me), "1");
  }, jo);
  ASSERT_EQ(test::failures(res), "");
  for (int r : {0, 2}) {
    const std::string& out = res[static_cast<size_t>(r)].output;
    const std::string line = "shoal rank " + std::to_string(r) + ": allreduce seq 2 has waited ";
    EXPECT_NE(out.find(line), std::string::npos) << out;
    EXPECT_NE(out.find("ranks not joined: [1] (rank 1: idle after seq 1)"), std::string::npos) << out;
    // It keeps telling until the collective ends: several warnings in 3 s.
    size_t n = 0;
    for (size_t p = out.find(line); p != std::string::npos; p = out.find(line, p + 1)) ++n;
    EXPECT_GE(n, 3u) << out;
  }
  EXPECT_EQ(res[1].output.find("has waited"), std::string::npos) << "rank 1 waits for nothing\n" << res[1].output;
}

// Every rank in the operation and its data not coming: the wait itself
// tells what it holds open, with the connection's state (the stall
// inspector above can only say that no rank is missing).
TEST(Observability, BlockedWaitTellsWhatItHoldsOpen) {
  JobOptions jo;
  jo.env = {{"SHOAL_STALL_WARN", "0.3"}, {"SHOAL_SHM", "0"}};
  auto res = run_ranks(2, [&](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    c->barrier()->wait();  // seq 1
    if (me == 1) {
      await_keys(store, {"failed/0"});
      return;
    }
    float x = 1;
    OpOptions o;
    o.timeout = std::chrono::seconds(2);
    std::string err = message_of([&] { c->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, o)->wait(); });
    SHOAL_CHECK_MSG(!err.empty(), "the allreduce did not fail");
    store->set_str("failed/0", "1");
  }, jo);
  ASSERT_EQ(test::failures(res), "");
  const std::string& out = res[0].output;
  const size_t at = out.find("shoal rank 0: a wait in the transport has lasted ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string line = out.substr(at, out.find('\n', at) - at);
  EXPECT_NE(line.find("receive from rank 1"), std::string::npos) << line;
  EXPECT_NE(line.find("[conn: open, "), std::string::npos) << line;
  EXPECT_EQ(res[1].output.find("a wait in the transport"), std::string::npos) << res[1].output;
}

}  // namespace
}  // namespace shoal
