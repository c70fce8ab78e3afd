// shoal-fault — the fault-injection harness (tests/fault/README.md).
//
//   shoal-fault --trials 50 --seed 1            # the CI mode (ctest: fault.ci)
//   shoal-fault --trials 1000 --seed 7          # the soak
//
// Each trial forks a job of N ranks (a store process plus N rank processes,
// as tests/cpp/harness.h does). Every rank runs the same seeded random
// sequence of operations — every collective, send/recv, random sizes up to
// --max-bytes, every dtype, every reduce op valid for it, a forced algorithm
// drawn from the registry or none — and checks every result against a
// reference it computes itself (inputs are a function of the seed, the
// operation and the rank, so every rank knows every other rank's input). At
// a random moment (after the victim finished a random number of operations,
// plus a random delay) the parent injects one fault into a random rank:
//
//   kill  SIGKILL;
//   stop  SIGSTOP (the trial runs with a short --stop-timeout-ms);
//   cut   SIGUSR2, on which a thread of the victim shuts down every socket it
//         owns (the store's first, so that it cannot tell anyone): its
//         connections are cut while the process lives on.
//
// The bar: every survivor fails within its detection bound (--bound-ms, 2 s,
// for a death or a cut; for a stop, and for a fault before the victim
// finished its first operation — it may have connected to nobody — the
// operation timeout plus --stop-slack; measured from the fault to the error
// on CLOCK_MONOTONIC, which all processes share), with an error that names
// the victim (PeerLost whose peer() is the victim, or a timeout naming
// "rank V"; with --lenient-culprit, stops and early faults, found by
// timeouts, may name any rank, and the summary counts who named the victim),
// destroys its communicator and exits; no operation that completed
// — before or after the fault — produced a wrong result; no process is left.
// A trial that breaks the bar prints what every rank said (and keeps the
// ranks' flight-recorder dumps). The summary gives the worst detection time
// per fault kind.
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
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

int64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// ---- configuration ----------------------------------------------------------

enum class Fault { kKill, kStop, kCut };
const char* fault_name(Fault f) {
  switch (f) {
    case Fault::kKill: return "kill";
    case Fault::kStop: return "stop";
    case Fault::kCut: return "cut";
  }
  return "?";
}

struct Config {
  int trials = 50;
  uint64_t seed = 1;
  int min_ranks = 2, max_ranks = 4;
  size_t max_bytes = 1 << 20;           // per rank and operation
  std::vector<std::string> transports = {"1", "0"};  // SHOAL_SHM per trial, in turn
  std::vector<Fault> faults = {Fault::kKill, Fault::kStop, Fault::kCut};
  int max_ops_before = 40;              // the victim finishes 0..this many operations first
  int max_delay_us = 4000;              // then this much more, at most
  int bound_ms = 2000;                  // death or cut: every survivor fails within this
  int stop_timeout_ms = 2000;           // the operation timeout of stop trials
  int stop_slack_ms = 1000;             // stop: bound = timeout + slack (a new op may start late)
  int timeout_ms = 20000;               // the operation timeout of kill and cut trials
  int early_timeout_ms = 3000;          // ... of those that fault before the victim's first op
  int only_trial = -1;                  // --trial K: run just trial K of the sequence
  // A stopped rank, and one that died before anyone connected to it, are
  // found by the operation timeout only; the roll call a timed-out rank makes
  // (core/roll_call.h) names them. --lenient-culprit accepts an error naming
  // any rank for those trials (the rule before the roll call existed).
  bool strict_culprit = true;
  bool verbose = false;
  std::string trace_dir;  // flight-recorder dumps of the ranks go under here (per trial)
};

struct Trial {
  int index = 0;
  uint64_t seed = 0;
  int n = 2;
  std::string shm = "1";
  Fault fault = Fault::kKill;
  int victim = 0;
  int after_ops = 0;
  int delay_us = 0;
  int timeout_ms = 0;
};

Trial plan(const Config& cfg, int index) {
  std::mt19937_64 g(mix(cfg.seed * 1000003 + static_cast<uint64_t>(index)));
  Trial t;
  t.index = index;
  t.seed = g();
  t.n = cfg.min_ranks + static_cast<int>(g() % static_cast<uint64_t>(cfg.max_ranks - cfg.min_ranks + 1));
  t.shm = cfg.transports[static_cast<size_t>(index) % cfg.transports.size()];
  t.fault = cfg.faults[(static_cast<size_t>(index) / cfg.transports.size()) % cfg.faults.size()];
  t.victim = static_cast<int>(g() % static_cast<uint64_t>(t.n));
  // One trial in eight faults before the victim finished any operation (it
  // may have connected to nobody yet).
  t.after_ops = g() % 8 == 0 ? 0 : static_cast<int>(g() % static_cast<uint64_t>(cfg.max_ops_before + 1));
  t.delay_us = static_cast<int>(g() % static_cast<uint64_t>(cfg.max_delay_us + 1));
  // A rank that dies before it ever connected to anyone may be found only by
  // the timeout (docs/errors.md, limits): those trials run with a short one.
  t.timeout_ms = t.fault == Fault::kStop ? cfg.stop_timeout_ms
                 : t.after_ops == 0      ? cfg.early_timeout_ms
                                         : cfg.timeout_ms;
  return t;
}

// ---- a rank -----------------------------------------------------------------

// Status lines a rank writes to its parent (one write() each):
//   R                      the communicator exists
//   D <op>                 operation <op> completed and was right
//   W <op> <what>          operation <op> completed with a wrong result
//   E <ns> <code> <peer> <message>   the first error, when it was raised
//   X                      the communicator was destroyed; the rank exits
//   C <ns>                 (victim of a cut) every socket was shut down
//   F                      ran out of operations without an error
int g_status_fd = -1;

// One word per error type, for the status line.
const char* code_word(ErrorCode c) {
  switch (c) {
    case ErrorCode::kInvalidArgument: return "InvalidArgument";
    case ErrorCode::kTimeout: return "Timeout";
    case ErrorCode::kPeerLost: return "PeerLost";
    case ErrorCode::kMismatch: return "Mismatch";
    case ErrorCode::kAborted: return "Aborted";
    case ErrorCode::kStore: return "StoreError";
    case ErrorCode::kInternal: return "Internal";
  }
  return "Error";
}

void status(const std::string& line) {
  std::string l = line;
  for (char& ch : l) {
    if (ch == '\n') ch = ' ';
  }
  if (l.size() > 3000) l.resize(3000);  // one atomic write (PIPE_BUF)
  l += '\n';
  if (::write(g_status_fd, l.data(), l.size()) < 0) _exit(7);
}

// The cut: shuts down every socket this process owns, the store's first.
void cut_sockets(uint16_t store_port) {
  std::vector<int> store_fds, other_fds;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      int fd = std::atoi(e->d_name);
      if (e->d_name[0] == '.' || fd == dirfd(d)) continue;
      struct stat st;
      if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      bool to_store = false;
      if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0 && ss.ss_family == AF_INET) {
        to_store = ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port) == store_port;
      }
      (to_store ? store_fds : other_fds).push_back(fd);
    }
    closedir(d);
  }
  for (int fd : store_fds) ::shutdown(fd, SHUT_RDWR);
  for (int fd : other_fds) ::shutdown(fd, SHUT_RDWR);
}

[[noreturn]] void rank_main(const Trial& t, const Config& cfg, int rank, uint16_t store_port) {
  setenv("SHOAL_SHM", t.shm.c_str(), 1);
  // Failing ranks dump their flight recorder: into the trial's own directory.
  setenv("SHOAL_TRACE_DIR", (cfg.trace_dir + "/trial-" + std::to_string(t.index)).c_str(), 1);
  // SIGUSR2 is taken by a thread of its own (sigwait): block it everywhere
  // first, so that every thread the library starts inherits the mask.
  sigset_t usr2;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &usr2, nullptr);
  std::thread([usr2, store_port] {
    int sig = 0;
    if (sigwait(&usr2, &sig) == 0) {
      cut_sockets(store_port);
      status("C " + std::to_string(mono_ns()));
    }
  }).detach();

  std::shared_ptr<Communicator> comm;
  try {
    TcpStoreOptions so;
    so.host = "127.0.0.1";
    so.port = store_port;
    so.timeout = std::chrono::milliseconds(t.timeout_ms);  // as from_env does
    auto store = std::make_shared<TcpStore>(so);
    Options opts;
    opts.timeout = std::chrono::milliseconds(t.timeout_ms);
    comm = Communicator::create(store, rank, t.n, opts);
  } catch (const std::exception& e) {
    status(std::string("E ") + std::to_string(mono_ns()) + " setup -1 " + e.what());
    _exit(3);
  }
  status("R");
  Sequence seq(t.seed, t.n, cfg.max_bytes);
  const uint64_t kMaxOps = 200000;
  for (uint64_t i = 0; i < kMaxOps; ++i) {
    Spec s = seq.next();
    std::string bad;
    try {
      bad = run_op(*comm, s, t.seed);
    } catch (const Error& e) {
      const int64_t at = mono_ns();
      const auto* lost = dynamic_cast<const PeerLost*>(&e);
      status("E " + std::to_string(at) + " " + code_word(e.code()) + " " +
             std::to_string(lost ? lost->peer() : -1) + " " + e.what() + " [during " + s.describe() + "]");
      comm.reset();  // must not wait for anyone
      status("X");
      _exit(0);
    } catch (const std::exception& e) {
      status("E " + std::to_string(mono_ns()) + " non-shoal -1 " + e.what());
      _exit(4);
    }
    if (!bad.empty()) status("W " + std::to_string(i) + " " + s.describe() + ": " + bad);
    status("D " + std::to_string(i));
  }
  status("F");
  _exit(0);
}

// ---- the parent ---------------------------------------------------------------

struct RankState {
  pid_t pid = -1;
  int status_fd = -1, out_fd = -1;
  std::string status_buf, output;
  bool ready = false, errored = false, destroyed = false, exited = false, finished = false;
  bool cut_done = false;
  int64_t done_ops = -1;
  int64_t error_ns = 0;
  std::string error_code, error_text;
  int error_peer = -1;
  std::vector<std::string> wrong;
  int wait_status = 0;
};

struct Outcome {
  bool ok = true;
  std::vector<std::string> problems;
  double worst_ms = -1;   // over survivors
  bool early = false;     // the victim had not finished an operation
  std::map<std::string, int> codes;
  int survivors = 0, named = 0;  // survivors whose error named the victim
};

bool names_any_other_rank(const std::string& msg) {
  size_t from = msg.rfind("shoal rank ", 0) == 0 ? msg.find(':') : 0;
  size_t p = msg.find("rank ", from);
  return p != std::string::npos && p + 5 < msg.size() && std::isdigit(static_cast<unsigned char>(msg[p + 5]));
}

bool names_rank(const std::string& msg, int v) {
  // "rank V" as a whole number, outside this rank's own "shoal rank R:" prefix.
  const std::string needle = "rank " + std::to_string(v);
  size_t from = 0;
  if (msg.rfind("shoal rank ", 0) == 0) from = msg.find(':');
  for (size_t p = msg.find(needle, from); p != std::string::npos; p = msg.find(needle, p + 1)) {
    size_t end = p + needle.size();
    if (end >= msg.size() || !std::isdigit(static_cast<unsigned char>(msg[end]))) return true;
  }
  return false;
}

Outcome run_trial(const Trial& t, const Config& cfg) {
  Outcome out;
  int keepalive = -1;
  auto [store_pid, port] = test::start_store_process(&keepalive);
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<RankState> rs(static_cast<size_t>(t.n));
  for (int r = 0; r < t.n; ++r) {
    int sp[2], op[2];
    if (pipe(sp) != 0 || pipe(op) != 0) throw std::runtime_error("pipe");
    pid_t pid = fork();
    if (pid == 0) {
      ::close(sp[0]);
      ::close(op[0]);
      ::close(keepalive);
      for (int q = 0; q < r; ++q) {
        ::close(rs[q].status_fd);
        ::close(rs[q].out_fd);
      }
      dup2(op[1], 1);
      dup2(op[1], 2);
      ::close(op[1]);
      g_status_fd = sp[1];
      rank_main(t, cfg, r, port);
    }
    ::close(sp[1]);
    ::close(op[1]);
    rs[r].pid = pid;
    rs[r].status_fd = sp[0];
    rs[r].out_fd = op[0];
  }

  RankState& victim = rs[t.victim];
  const int64_t start = mono_ns();
  int64_t fault_at = -1;        // when the fault is due (after the trigger)
  int64_t fault_ns = -1;        // when it was injected
  int64_t victim_ops_at_fault = -1;
  const int64_t setup_deadline = start + 60'000'000'000LL;
  int bound_ms = t.fault == Fault::kStop ? t.timeout_ms + cfg.stop_slack_ms : cfg.bound_ms;
  // After the fault everyone has until then to be gone; past it, a hang.
  auto hard_deadline = [&] { return fault_ns + (static_cast<int64_t>(t.timeout_ms) + 10000) * 1000000; };
  bool killed_all = false;

  auto survivors_done = [&] {
    for (int r = 0; r < t.n; ++r) {
      if (r != t.victim && !rs[r].exited) return false;
    }
    return true;
  };
  auto parse = [&](RankState& s, const std::string& line) {
    if (line.empty()) return;
    std::istringstream in(line);
    std::string tag;
    in >> tag;
    if (tag == "R") {
      s.ready = true;
    } else if (tag == "D") {
      in >> s.done_ops;
    } else if (tag == "W") {
      s.wrong.push_back(line.substr(2));
    } else if (tag == "E") {
      s.errored = true;
      in >> s.error_ns >> s.error_code >> s.error_peer;
      std::getline(in, s.error_text);
      if (!s.error_text.empty() && s.error_text[0] == ' ') s.error_text.erase(0, 1);
    } else if (tag == "X") {
      s.destroyed = true;
    } else if (tag == "C") {
      s.cut_done = true;
    } else if (tag == "F") {
      s.finished = true;
    }
  };

  for (;;) {
    // Reap what exited.
    for (auto& s : rs) {
      if (s.exited) continue;
      int st = 0;
      if (waitpid(s.pid, &st, WNOHANG) == s.pid) {
        s.exited = true;
        s.wait_status = st;
      }
    }
    const int64_t now = mono_ns();
    // Inject the fault when it is due.
    if (fault_ns < 0) {
      bool all_ready = std::all_of(rs.begin(), rs.end(), [](const RankState& s) { return s.ready; });
      bool anyone_failed = std::any_of(rs.begin(), rs.end(), [](const RankState& s) {
        return s.errored || s.exited || !s.wrong.empty();
      });
      if (anyone_failed) {
        out.problems.push_back("a rank failed before the fault was injected");
        break;
      }
      if (fault_at < 0 && all_ready && victim.done_ops + 1 >= t.after_ops) {
        fault_at = now + static_cast<int64_t>(t.delay_us) * 1000;
      }
      if (fault_at >= 0 && now >= fault_at) {
        victim_ops_at_fault = victim.done_ops + 1;
        fault_ns = mono_ns();
        int sig = t.fault == Fault::kKill ? SIGKILL : t.fault == Fault::kStop ? SIGSTOP : SIGUSR2;
        kill(victim.pid, sig);
      } else if (now > setup_deadline) {
        out.problems.push_back("the fault's trigger never came (victim finished " +
                               std::to_string(victim.done_ops + 1) + " operations)");
        break;
      }
    } else {
      if (survivors_done()) {
        if (t.fault == Fault::kStop && !victim.exited) kill(victim.pid, SIGKILL);
        if (victim.exited || t.fault == Fault::kStop) {
          if (!victim.exited) {
            int st = 0;
            waitpid(victim.pid, &st, 0);
            victim.exited = true;
            victim.wait_status = st;
          }
          break;
        }
      }
      if (now > hard_deadline() && !killed_all) {
        out.problems.push_back("HANG: processes still running " +
                               std::to_string((now - fault_ns) / 1000000) + " ms after the fault");
        for (auto& s : rs) {
          if (!s.exited) kill(s.pid, SIGKILL);
        }
        killed_all = true;
      }
    }
    // Read whatever the ranks said (status and output).
    std::vector<pollfd> pf;
    std::vector<std::pair<int, bool>> who;  // rank, is status
    for (int r = 0; r < t.n; ++r) {
      if (rs[r].status_fd >= 0) {
        pf.push_back({rs[r].status_fd, POLLIN, 0});
        who.push_back({r, true});
      }
      if (rs[r].out_fd >= 0) {
        pf.push_back({rs[r].out_fd, POLLIN, 0});
        who.push_back({r, false});
      }
    }
    int wait_ms = 5;
    if (fault_ns < 0 && fault_at >= 0) wait_ms = static_cast<int>(std::clamp<int64_t>((fault_at - now) / 1000000, 0, 5));
    if (pf.empty()) {
      // Every pipe is closed, so every rank has exited (a stopped victim
      // holds its pipes open): only the reaping is left.
      for (auto& s : rs) {
        if (!s.exited) {
          waitpid(s.pid, &s.wait_status, 0);
          s.exited = true;
        }
      }
      continue;
    }
    ::poll(pf.data(), pf.size(), wait_ms);
    for (size_t i = 0; i < pf.size(); ++i) {
      if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      auto [r, is_status] = who[i];
      RankState& s = rs[r];
      char buf[8192];
      ssize_t k = ::read(pf[i].fd, buf, sizeof(buf));
      if (k <= 0) {
        ::close(pf[i].fd);
        (is_status ? s.status_fd : s.out_fd) = -1;
        continue;
      }
      if (!is_status) {
        s.output.append(buf, static_cast<size_t>(k));
        if (s.output.size() > (1 << 20)) s.output.erase(0, s.output.size() - (1 << 19));
        continue;
      }
      s.status_buf.append(buf, static_cast<size_t>(k));
      size_t nl;
      while ((nl = s.status_buf.find('\n')) != std::string::npos) {
        parse(s, s.status_buf.substr(0, nl));
        s.status_buf.erase(0, nl + 1);
      }
    }
  }
  // Whatever is left is stopped and reaped; its pipes drained.
  for (auto& s : rs) {
    if (!s.exited) {
      kill(s.pid, SIGKILL);
      waitpid(s.pid, &s.wait_status, 0);
      s.exited = true;
    }
    for (int* fd : {&s.status_fd, &s.out_fd}) {
      if (*fd < 0) continue;
      char buf[8192];
      ssize_t k;
      while ((k = ::read(*fd, buf, sizeof(buf))) > 0) {
        if (fd == &s.status_fd) {
          s.status_buf.append(buf, static_cast<size_t>(k));
        } else {
          s.output.append(buf, static_cast<size_t>(k));
        }
      }
      ::close(*fd);
      *fd = -1;
    }
    size_t nl;
    while ((nl = s.status_buf.find('\n')) != std::string::npos) {
      parse(s, s.status_buf.substr(0, nl));
      s.status_buf.erase(0, nl + 1);
    }
  }
  ::close(keepalive);
  waitpid(store_pid, nullptr, 0);

  // ---- judge
  out.early = victim_ops_at_fault == 0;
  if (out.early) bound_ms = std::max(bound_ms, t.timeout_ms + cfg.stop_slack_ms);
  for (int r = 0; r < t.n; ++r) {
    RankState& s = rs[r];
    for (auto& w : s.wrong) out.problems.push_back("rank " + std::to_string(r) + ": WRONG RESULT: " + w);
    if (r == t.victim) {
      if (t.fault == Fault::kCut && fault_ns >= 0 && !killed_all && !(WIFEXITED(s.wait_status))) {
        out.problems.push_back("victim (cut) did not exit by itself");
      }
      continue;
    }
    if (fault_ns < 0) continue;
    const std::string who = "rank " + std::to_string(r) + ": ";
    if (!s.errored) {
      out.problems.push_back(who + (s.finished ? "ran out of operations without an error"
                                               : "never reported an error"));
      continue;
    }
    out.codes[s.error_code]++;
    const double ms = static_cast<double>(s.error_ns - fault_ns) / 1e6;
    out.worst_ms = std::max(out.worst_ms, ms);
    if (ms < 0) out.problems.push_back(who + "failed before the fault: " + s.error_text);
    if (ms > bound_ms) {
      out.problems.push_back(who + "detected after " + std::to_string(ms) + " ms (bound " +
                             std::to_string(bound_ms) + " ms): " + s.error_text);
    }
    bool named = s.error_code == "PeerLost" ? s.error_peer == t.victim : names_rank(s.error_text, t.victim);
    if (s.error_code != "PeerLost" && s.error_code != "Timeout") named = false;
    out.survivors++;
    out.named += named;
    const bool lenient = (t.fault == Fault::kStop || out.early) && !cfg.strict_culprit;
    if (lenient && !named && (s.error_code == "PeerLost" || s.error_code == "Timeout") &&
        names_any_other_rank(s.error_text)) {
      // Accepted (see strict_culprit); counted in the summary.
    } else if (!named) {
      out.problems.push_back(who + "error does not name the culprit rank " + std::to_string(t.victim) +
                             " (" + s.error_code + ", peer " + std::to_string(s.error_peer) + "): " +
                             s.error_text);
    }
    if (!s.destroyed) out.problems.push_back(who + "did not get through destroying its communicator");
    if (!WIFEXITED(s.wait_status) || WEXITSTATUS(s.wait_status) != 0) {
      out.problems.push_back(who + "did not exit cleanly (wait status " + std::to_string(s.wait_status) + ")");
    }
  }
  out.ok = out.problems.empty();
  if (!out.ok || cfg.verbose) {
    for (int r = 0; r < t.n; ++r) {
      const RankState& s = rs[r];
      std::printf("  rank %d%s: ops %lld, %s%s\n", r, r == t.victim ? " (victim)" : "",
                  static_cast<long long>(s.done_ops + 1), s.errored ? "error " : "no error",
                  s.errored ? (s.error_code + " at +" + std::to_string((s.error_ns - fault_ns) / 1000000) +
                               " ms: " + s.error_text).c_str()
                            : "");
      if (!out.ok && !s.output.empty()) {
        std::printf("  --- rank %d output ---\n%s\n", r, s.output.substr(0, 3000).c_str());
      }
    }
  }
  return out;
}

struct Stats {
  int trials = 0, failures = 0;
  double worst = -1, worst_ok = -1;  // over all trials; over those that passed
  int worst_trial = -1;
  std::vector<double> all;
  std::map<std::string, int> codes;
  int survivors = 0, named = 0;
};

// Removes a directory of plain files.
void remove_dir(const std::string& path) {
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') unlink((path + "/" + e->d_name).c_str());
    }
    closedir(d);
  }
  rmdir(path.c_str());
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--trials N] [--seed S] [--trial K] [--ranks MIN-MAX] [--max-bytes B]\n"
               "          [--faults kill,stop,cut] [--transports 1,0,copy] [--bound-ms MS]\n"
               "          [--stop-timeout-ms MS] [--stop-slack-ms MS] [--timeout-ms MS] [--early-timeout-ms MS]\n"
               "          [--lenient-culprit] [--verbose]\n",
               argv0);
  return 2;
}

}  // namespace
}  // namespace shoal::fault

namespace shoal::fault {
int recover_main(int argc, char** argv);  // fault_recover.cc
}

int main(int argc, char** argv) {
  using namespace shoal::fault;
  if (argc > 1 && std::string(argv[1]) == "--recover") return recover_main(argc, argv);
  Config cfg;
  auto split = [](const std::string& s) {
    std::vector<std::string> v;
    std::stringstream ss(s);
    std::string x;
    while (std::getline(ss, x, ',')) v.push_back(x);
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "shoal-fault: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--trials") cfg.trials = std::atoi(val().c_str());
    else if (a == "--seed") cfg.seed = std::strtoull(val().c_str(), nullptr, 10);
    else if (a == "--trial") cfg.only_trial = std::atoi(val().c_str());
    else if (a == "--ranks") {
      std::string v = val();
      auto dash = v.find('-');
      cfg.min_ranks = std::atoi(v.substr(0, dash).c_str());
      cfg.max_ranks = dash == std::string::npos ? cfg.min_ranks : std::atoi(v.substr(dash + 1).c_str());
    } else if (a == "--max-bytes") cfg.max_bytes = std::strtoull(val().c_str(), nullptr, 10);
    else if (a == "--bound-ms") cfg.bound_ms = std::atoi(val().c_str());
    else if (a == "--stop-timeout-ms") cfg.stop_timeout_ms = std::atoi(val().c_str());
    else if (a == "--stop-slack-ms") cfg.stop_slack_ms = std::atoi(val().c_str());
    else if (a == "--timeout-ms") cfg.timeout_ms = std::atoi(val().c_str());
    else if (a == "--early-timeout-ms") cfg.early_timeout_ms = std::atoi(val().c_str());
    else if (a == "--transports") cfg.transports = split(val());
    else if (a == "--faults") {
      cfg.faults.clear();
      for (auto& f : split(val())) {
        if (f == "kill") cfg.faults.push_back(Fault::kKill);
        else if (f == "stop") cfg.faults.push_back(Fault::kStop);
        else if (f == "cut") cfg.faults.push_back(Fault::kCut);
        else return usage(argv[0]);
      }
    } else if (a == "--strict-culprit") {
      cfg.strict_culprit = true;  // the default; kept for old command lines
    } else if (a == "--lenient-culprit") {
      cfg.strict_culprit = false;
    } else if (a == "--verbose" || a == "-v") cfg.verbose = true;
    else return usage(argv[0]);
  }
  if (cfg.trials < 1 || cfg.min_ranks < 2 || cfg.max_ranks < cfg.min_ranks || cfg.max_ranks > 6 ||
      cfg.faults.empty() || cfg.transports.empty() || cfg.max_bytes < 1) {
    return usage(argv[0]);
  }
  signal(SIGPIPE, SIG_IGN);
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/shoal-fault-XXXXXX";
  if (!mkdtemp(tmpl.data())) {
    std::perror("shoal-fault: mkdtemp");
    return 1;
  }
  cfg.trace_dir = tmpl;
  setvbuf(stdout, nullptr, _IOLBF, 0);

  std::map<std::string, Stats> stats;  // "kill", "kill (early)", ...
  int failures = 0;
  const int64_t t0 = mono_ns();
  for (int i = 0; i < cfg.trials; ++i) {
    if (cfg.only_trial >= 0 && i != cfg.only_trial) continue;
    Trial t = plan(cfg, i);
    const std::string dumps = cfg.trace_dir + "/trial-" + std::to_string(i);
    mkdir(dumps.c_str(), 0755);
    Outcome o = run_trial(t, cfg);
    if (o.ok) remove_dir(dumps);
    std::string key = std::string(fault_name(t.fault)) + (o.early ? " (before any op)" : "");
    Stats& s = stats[key];
    s.trials++;
    if (o.worst_ms >= 0) s.all.push_back(o.worst_ms);
    if (o.worst_ms > s.worst) {
      s.worst = o.worst_ms;
      s.worst_trial = i;
    }
    if (o.ok) s.worst_ok = std::max(s.worst_ok, o.worst_ms);
    for (auto& [c, k] : o.codes) s.codes[c] += k;
    s.survivors += o.survivors;
    s.named += o.named;
    if (!o.ok) {
      s.failures++;
      failures++;
    }
    if (!o.ok || cfg.verbose) {
      std::printf("trial %d: %s n=%d SHOAL_SHM=%s victim %d after %d ops +%d us: %s, worst %.1f ms\n", i,
                  fault_name(t.fault), t.n, t.shm.c_str(), t.victim, t.after_ops, t.delay_us,
                  o.ok ? "ok" : "FAILED", o.worst_ms);
      for (auto& p : o.problems) std::printf("  %s\n", p.c_str());
    }
  }
  const double secs = static_cast<double>(mono_ns() - t0) / 1e9;
  std::printf("shoal-fault: %d trials, seed %llu, ranks %d-%d, max %zu bytes, %.1f s: %d failed\n",
              cfg.only_trial >= 0 ? 1 : cfg.trials, static_cast<unsigned long long>(cfg.seed), cfg.min_ranks,
              cfg.max_ranks, cfg.max_bytes, secs, failures);
  std::printf("%-22s %7s %7s %10s %10s %12s %9s  %s\n", "fault", "trials", "failed", "median ms", "worst ms",
              "worst ok ms", "culprit", "errors seen by survivors");
  for (auto& [k, s] : stats) {
    std::vector<double> v = s.all;
    std::sort(v.begin(), v.end());
    double med = v.empty() ? -1 : v[v.size() / 2];
    std::string codes;
    for (auto& [c, n] : s.codes) codes += c + " " + std::to_string(n) + "  ";
    std::string named = std::to_string(s.named) + "/" + std::to_string(s.survivors);
    std::printf("%-22s %7d %7d %10.1f %10.1f %12.1f %9s  %s(worst: trial %d)\n", k.c_str(), s.trials,
                s.failures, med, s.worst, s.worst_ok, named.c_str(), codes.c_str(), s.worst_trial);
  }
  if (failures) {
    std::printf("flight-recorder dumps of the failed trials: %s/trial-*\n", cfg.trace_dir.c_str());
  } else {
    rmdir(cfg.trace_dir.c_str());
  }
  return failures ? 1 : 0;
}
