// shoal-fault --recover: training that survives a lost rank (README.md here).
//
//   shoal-fault --recover --trials 20 --seed 1 --ranks 2-8 --faults kill,kill2,stop
//
// Each trial forks a store process and N ranks (N drawn from --ranks). Every
// rank runs the seeded random operations of fault_ops.h (each result
// checked) until one fails; after a random 5-150 ms the parent injects the
// trial's fault (cycling through --faults):
//   kill   SIGKILL of a random rank;
//   kill2  that, and a second death during the agreement: another rank (half
//          the time the lowest survivor, the agreement's leader) kills itself
//          0-20 ms after it enters recover() (if recover() returns first, it
//          waits there to be killed); with N < 3 a plain kill;
//   stop   SIGSTOP of a random rank (operation timeout 2 s): the survivors
//          find it by their timeout's roll call; once they are done the
//          parent resumes it (SIGCONT), and it must be refused.
// Each survivor then calls Communicator::recover() and runs one allreduce on
// the shrunk communicator, checking its result and that the membership is
// the others (a survivor whose next allreduce fails because a member died
// after the decision recovers again). The bar: no hang (every survivor done
// within 10 s of the last fault), no wrong result, every survivor in the
// same membership; a stopped rank excluded within the timeout + 1.5 s and,
// resumed, refused. The summary gives p50/p99 of the time from the (first)
// fault to each trial's last survivor completing its next collective
// (CLOCK_MONOTONIC), per fault.
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fault_ops.h"
#include "harness.h"
#include "shoal/communicator.h"
#include "shoal/error.h"
#include "shoal/store.h"

namespace shoal::fault {
namespace {

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void say(int fd, const std::string& line) {
  const std::string l = line + "\n";
  if (::write(fd, l.data(), l.size()) < 0) _exit(7);
}

// `die_after_ms` >= 0: this rank dies that long after it enters recover().
[[noreturn]] void rank_main(int fd, uint16_t port, int rank, int n, uint64_t seed, const std::string& shm,
                           std::chrono::milliseconds timeout, int die_after_ms) {
  setenv("SHOAL_SHM", shm.c_str(), 1);
  try {
    TcpStoreOptions so;
    so.port = port;
    so.timeout = std::chrono::seconds(20);
    auto store = std::make_shared<TcpStore>(so);
    Options o;
    o.timeout = timeout;
    auto comm = Communicator::create(store, rank, n, o);
    say(fd, "R");
    Sequence seq(seed, n, 1 << 16);
    for (;;) {
      Spec s = seq.next();
      std::string bad;
      try {
        bad = run_op(*comm, s, seed);
      } catch (const Error&) {
        break;
      }
      if (!bad.empty()) say(fd, "W " + s.describe() + ": " + bad);
    }
    // A member that dies after the decision breaks the shrunk communicator:
    // recover from that one too.
    std::shared_ptr<Communicator> from = comm;
    if (die_after_ms >= 0) {
      std::thread([die_after_ms] {
        std::this_thread::sleep_for(std::chrono::milliseconds(die_after_ms));  // the injected fault's moment
        raise(SIGKILL);
      }).detach();
      from->recover();
      for (;;) pause();  // in the new membership or not: it dies before it takes part
    }
    for (int attempt = 1;; ++attempt) {
      auto fresh = from->recover();
      float x = static_cast<float>(rank + 1);  // old rank: the sum tells who is in
      try {
        fresh->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum)->wait();
      } catch (const Error&) {
        if (attempt == 3) throw;
        from = fresh;
        continue;
      }
      say(fd, "D " + std::to_string(now_ns()) + " " + std::to_string(fresh->size()) + " " +
                  std::to_string(static_cast<int64_t>(x)) + " " + std::to_string(fresh->id()));
      break;
    }
  } catch (const std::exception& e) {
    say(fd, std::string("E ") + e.what());
  }
  _exit(0);
}

enum class Fault { kKill, kKill2, kStop };

const char* fault_name(Fault f) { return f == Fault::kKill ? "kill" : f == Fault::kKill2 ? "kill2" : "stop"; }

struct Result {
  bool ok = true;
  std::string why;
  double ms = -1;  // the (first) fault to the last survivor's next completed collective
};

constexpr std::chrono::milliseconds kStopTimeout{2000};  // the operation timeout of a stop trial

// `second`: kill2's second victim (-1: none), dying `second_delay_ms` into its recover().
Result trial(uint64_t seed, int n, Fault fault, int victim, int second, int delay_ms, int second_delay_ms,
             const std::string& shm) {
  Result res;
  int keepalive = -1;
  auto [store_pid, port] = test::start_store_process(&keepalive);
  std::vector<pid_t> pids(n);
  std::vector<int> fds(n);
  for (int r = 0; r < n; ++r) {
    int p[2];
    if (pipe(p) != 0) throw std::runtime_error("pipe");
    pid_t pid = fork();
    if (pid == 0) {
      ::close(p[0]);
      ::close(keepalive);
      rank_main(p[1], port, r, n, seed, shm,
                fault == Fault::kStop ? kStopTimeout : std::chrono::milliseconds(20000),
                r == second ? second_delay_ms : -1);
    }
    ::close(p[1]);
    pids[r] = pid;
    fds[r] = p[0];
  }
  std::vector<std::string> buf(n), lines(n);
  auto pump = [&](int64_t until) {
    for (;;) {
      std::vector<pollfd> pf;
      for (int r = 0; r < n; ++r) {
        if (fds[r] >= 0) pf.push_back({fds[r], POLLIN, 0});
      }
      const int64_t left = (until - now_ns()) / 1000000;
      if (pf.empty() || left <= 0) return;
      ::poll(pf.data(), pf.size(), static_cast<int>(std::min<int64_t>(left, 50)));
      for (int r = 0; r < n; ++r) {
        if (fds[r] < 0) continue;
        pollfd q{fds[r], POLLIN, 0};
        if (::poll(&q, 1, 0) <= 0) continue;
        char b[4096];
        ssize_t k = ::read(fds[r], b, sizeof(b));
        if (k <= 0) {
          ::close(fds[r]);
          fds[r] = -1;
        } else {
          lines[r].append(b, static_cast<size_t>(k));
        }
      }
    }
  };
  // Ready, then the kill.
  const int64_t ready_by = now_ns() + 30'000'000'000LL;
  while (now_ns() < ready_by) {
    pump(now_ns() + 20'000'000);
    if (std::all_of(lines.begin(), lines.end(), [](const std::string& l) { return l.find("R\n") != std::string::npos; })) break;
  }
  struct timespec d{0, static_cast<long>(delay_ms) * 1000000};
  nanosleep(&d, nullptr);
  const int64_t fault_ns = now_ns();
  kill(pids[victim], fault == Fault::kStop ? SIGSTOP : SIGKILL);
  auto out = [&](int r) { return r == victim || r == second; };
  // Until every survivor is done (or 10 s past the bound).
  const int64_t bound_ns = (fault == Fault::kStop ? kStopTimeout.count() + 1500 : 2000) * 1000000LL;
  const int64_t give_up = fault_ns + bound_ns + 10'000'000'000LL;
  auto all_done = [&] {
    for (int r = 0; r < n; ++r) {
      if (!out(r) && lines[r].find("\nD ") == std::string::npos && lines[r].find("E ") == std::string::npos) {
        return false;
      }
    }
    return true;
  };
  while (now_ns() < give_up && !all_done()) pump(now_ns() + 20'000'000);
  if (fault == Fault::kStop) {
    // Resumed, the stopped rank must be refused: its operation fails, and
    // its recover() finds a membership without it.
    kill(pids[victim], SIGCONT);
    const int64_t until = now_ns() + 10'000'000'000LL;
    while (now_ns() < until && lines[victim].find("E ") == std::string::npos &&
           lines[victim].find("\nD ") == std::string::npos) {
      pump(now_ns() + 20'000'000);
    }
    if (lines[victim].find("not in the membership") == std::string::npos) {
      res.ok = false;
      res.why += "the resumed rank " + std::to_string(victim) + " was not refused [" + lines[victim] + "]; ";
    }
  }
  int expect_sum = 0;
  for (int r = 0; r < n; ++r) expect_sum += out(r) ? 0 : r + 1;
  const int expect_size = n - 1 - (second >= 0 ? 1 : 0);
  std::string id;
  for (int r = 0; r < n; ++r) {
    if (out(r)) continue;
    const std::string& l = lines[r];
    size_t at = l.find("\nD ");
    if (l.find("W ") != std::string::npos) {
      res.ok = false;
      res.why += "rank " + std::to_string(r) + ": WRONG RESULT " + l + "; ";
    }
    if (at == std::string::npos) {
      res.ok = false;
      res.why += "rank " + std::to_string(r) + (fds[r] >= 0 ? ": HANG" : ": no next collective") + " [" + l + "]; ";
      continue;
    }
    std::istringstream in(l.substr(at + 3));
    int64_t ns = 0, size = 0, sum = 0;
    std::string this_id;
    in >> ns >> size >> sum >> this_id;
    if (size != expect_size || sum != expect_sum) {
      res.ok = false;
      res.why += "rank " + std::to_string(r) + ": shrunk to " + std::to_string(size) + " ranks, sum " +
                 std::to_string(sum) + " (want " + std::to_string(expect_size) + ", " + std::to_string(expect_sum) +
                 "); ";
    }
    if (static_cast<double>(ns - fault_ns) > static_cast<double>(bound_ns) + 8e9) {
      res.ok = false;
      res.why += "rank " + std::to_string(r) + ": HANG-like delay; ";
    }
    if (!id.empty() && id != this_id) {
      res.ok = false;
      res.why += "two memberships; ";
    }
    id = this_id;
    res.ms = std::max(res.ms, static_cast<double>(ns - fault_ns) / 1e6);
  }
  if (fault == Fault::kStop && res.ok && res.ms > static_cast<double>(bound_ns) / 1e6) {
    res.ok = false;
    res.why += "the stopped rank was excluded after " + std::to_string(res.ms) + " ms (bound: timeout + 1.5 s); ";
  }
  for (int r = 0; r < n; ++r) {
    kill(pids[r], SIGKILL);
    waitpid(pids[r], nullptr, 0);
    if (fds[r] >= 0) ::close(fds[r]);
  }
  ::close(keepalive);
  waitpid(store_pid, nullptr, 0);
  return res;
}

}  // namespace

int recover_main(int argc, char** argv) {
  int trials = 20, min_ranks = 2, max_ranks = 8;
  uint64_t seed = 1;
  bool verbose = false;
  std::vector<Fault> faults = {Fault::kKill};
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--trials") trials = std::atoi(val().c_str());
    else if (a == "--seed") seed = std::strtoull(val().c_str(), nullptr, 10);
    else if (a == "--ranks") {
      std::string v = val();
      auto dash = v.find('-');
      min_ranks = std::atoi(v.substr(0, dash).c_str());
      max_ranks = dash == std::string::npos ? min_ranks : std::atoi(v.substr(dash + 1).c_str());
    } else if (a == "--faults") {
      faults.clear();
      std::string v = val() + ",";
      for (size_t at = 0, c; (c = v.find(',', at)) != std::string::npos; at = c + 1) {
        const std::string f = v.substr(at, c - at);
        if (f == "kill") faults.push_back(Fault::kKill);
        else if (f == "kill2") faults.push_back(Fault::kKill2);
        else if (f == "stop") faults.push_back(Fault::kStop);
        else {
          std::fprintf(stderr, "--faults: '%s' is not one of kill, kill2, stop\n", f.c_str());
          return 2;
        }
      }
    } else if (a == "--verbose") verbose = true;
    else {
      std::fprintf(stderr,
                   "usage: %s --recover [--trials N] [--seed S] [--ranks MIN-MAX] [--faults kill,kill2,stop] "
                   "[--verbose]\n",
                   argv[0]);
      return 2;
    }
  }
  if (trials < 1 || min_ranks < 2 || max_ranks < min_ranks) return 2;
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  // The ranks' flight-recorder dumps (every survivor of a kill writes one).
  const char* tmp = std::getenv("TMPDIR");
  std::string dumps = std::string(tmp && *tmp ? tmp : "/tmp") + "/shoal-fault-recover-XXXXXX";
  if (!mkdtemp(dumps.data())) return 1;
  setenv("SHOAL_TRACE_DIR", dumps.c_str(), 1);
  std::vector<std::vector<double>> ms(3);
  int failures = 0;
  const int64_t t0 = now_ns();
  for (int i = 0; i < trials; ++i) {
    std::mt19937_64 g(mix(seed * 1000003 + static_cast<uint64_t>(i)));
    const int n = min_ranks + static_cast<int>(g() % static_cast<uint64_t>(max_ranks - min_ranks + 1));
    const int victim = static_cast<int>(g() % static_cast<uint64_t>(n));
    const int delay = 5 + static_cast<int>(g() % 146);
    const std::string shm = i % 2 ? "0" : "1";
    const uint64_t s = g();
    Fault f = faults[static_cast<size_t>(i) % faults.size()];
    if (f == Fault::kKill2 && n < 3) f = Fault::kKill;
    int second = -1;
    const int second_delay = static_cast<int>(g() % 21);
    if (f == Fault::kKill2) {
      const int lowest = victim == 0 ? 1 : 0;  // the agreement's leader
      second = g() % 2 ? lowest : static_cast<int>(g() % static_cast<uint64_t>(n));
      if (second == victim) second = (victim + 1) % n;
    }
    Result r = trial(s, n, f, victim, second, delay, second_delay, shm);
    if (r.ok) ms[static_cast<size_t>(f)].push_back(r.ms);
    else ++failures;
    if (!r.ok || verbose) {
      std::printf("trial %d: n=%d SHOAL_SHM=%s %s of rank %d after %d ms%s: %s, %.1f ms %s\n", i, n, shm.c_str(),
                  fault_name(f), victim, delay,
                  second >= 0 ? (", rank " + std::to_string(second) + " dying " + std::to_string(second_delay) +
                                 " ms into its recovery").c_str()
                              : "",
                  r.ok ? "ok" : "FAILED", r.ms, r.why.c_str());
    }
  }
  if (DIR* d = opendir(dumps.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') unlink((dumps + "/" + e->d_name).c_str());
    }
    closedir(d);
  }
  rmdir(dumps.c_str());
  std::printf("shoal-fault --recover: %d trials, seed %llu, ranks %d-%d, %.1f s: %d failed\n", trials,
              static_cast<unsigned long long>(seed), min_ranks, max_ranks, (now_ns() - t0) / 1e9, failures);
  for (Fault f : {Fault::kKill, Fault::kKill2, Fault::kStop}) {
    auto& v = ms[static_cast<size_t>(f)];
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    auto pct = [&](double p) { return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))]; };
    std::printf("  %-5s %4zu trials: fault to every survivor's next collective: p50 %.1f ms, p99 %.1f ms, worst "
                "%.1f ms\n",
                fault_name(f), v.size(), pct(0.5), pct(0.99), v.back());
  }
  return failures ? 1 : 0;
}

}  // namespace shoal::fault
