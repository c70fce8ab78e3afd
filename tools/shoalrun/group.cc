// shoalrun/group.cc — see group.h.
#include "group.h"

#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>

#include "log.h"

namespace shoalrun {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kDrainTimeout = std::chrono::seconds(2);

Clock::time_point after_seconds(double s) {
  return Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(std::llround(s * 1000.0)));
}

struct Live {
  WorkerSpec spec;
  pid_t pid = -1;
  bool running = false;
  int incarnation = 0;  // 0; n for the n-th replacement of this rank
  bool fenced = false;  // SIGKILLed because the store says it was excluded
};

class GroupRun {
 public:
  explicit GroupRun(const GroupConfig& cfg) : cfg_(cfg), mux_(cfg.output) {}

  GroupResult run() {
    start_all();
    loop();
    finish();
    return result_;
  }

 private:
  void start_all() {
    for (const auto& w : cfg_.workers) {
      if (tearing_down_) break;  // a worker could not start: do not start the rest
      Live l;
      l.spec = w;
      start(&l);
      live_.push_back(l);
    }
  }

  // Starts one worker (a failure to start counts as its failure).
  void start(Live* l) {
    const WorkerSpec& w = l->spec;
    ::unlink(w.error_file.c_str());
    try {
      SpawnedWorker s = spawn_worker(w.exec);
      l->pid = s.pid;
      l->running = true;
      cfg_.guardian->track(s.pid);
      mux_.add(w.rank, s.out_fd, s.err_fd, w.route);
      vlog("started rank " + std::to_string(w.rank) + " (local rank " + std::to_string(w.local_rank) + ") as pid " +
           std::to_string(s.pid) + (l->incarnation > 0 ? ", replacement " + std::to_string(l->incarnation) : ""));
      ++running_;
    } catch (const std::exception& e) {
      log("cannot start rank " + std::to_string(w.rank) + ": " + e.what());
      WorkerExit x{w.rank, w.local_rank, 0, 1, 0};
      note_exit(x);
      return;
    }
    if (cfg_.ledger) {
      try {
        cfg_.ledger->record_start(w.rank, l->incarnation);
      } catch (const std::exception& e) {
        ledger_trouble(e);
      }
    }
  }

  void ledger_trouble(const std::exception& e) {
    if (!ledger_warned_) log(std::string("warning: the workers' store: ") + e.what());
    ledger_warned_ = true;
  }

  void loop() {
    std::optional<Clock::time_point> drain_deadline;
    while (true) {
      if (running_ == 0) {
        if (!mux_.any_open()) break;
        if (!drain_deadline) {
          // Orphaned descendants may still hold the pipes: they go now.
          sweep_stray_children(cfg_.guardian->pid(), {});
          drain_deadline = Clock::now() + kDrainTimeout;
        }
        if (Clock::now() >= *drain_deadline) break;
      }
      const auto now = Clock::now();
      if (kill_deadline_ && now >= *kill_deadline_) {
        kill_deadline_.reset();
        for (auto& l : live_) {
          if (l.running) {
            log("rank " + std::to_string(l.spec.rank) + " (pid " + std::to_string(l.pid) +
                ") is still running after the grace period; sending SIGKILL");
            signal_worker(l.pid, SIGKILL);
          }
        }
      }
      int timeout_ms = 1000;
      auto clamp_to = [&](Clock::time_point t) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count() + 1;
        timeout_ms = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(timeout_ms, ms)));
      };
      if (kill_deadline_) clamp_to(*kill_deadline_);
      if (drain_deadline) clamp_to(*drain_deadline);
      if (cfg_.ledger && running_ > 0 && !tearing_down_) {
        if (now >= next_fence_) {
          fence_excluded();
          next_fence_ = after_seconds(cfg_.fence_interval_s);
        }
        clamp_to(next_fence_);
      }

      std::vector<pollfd> fds;
      fds.push_back(pollfd{cfg_.signal_fd, POLLIN, 0});
      if (cfg_.remote) fds.push_back(pollfd{cfg_.remote->fd(), POLLIN, 0});
      const size_t first_output = fds.size();
      mux_.append_pollfds(&fds);
      const int n = ::poll(fds.data(), fds.size(), timeout_ms);
      if (n < 0 && errno != EINTR) {
        log(std::string("poll failed: ") + std::strerror(errno));
        break;
      }
      if (n <= 0) continue;
      for (size_t i = first_output; i < fds.size(); ++i) {
        if (fds[i].revents != 0) mux_.handle(fds[i].fd);
      }
      if (cfg_.remote && fds[1].revents != 0) on_remote();
      if (fds[0].revents != 0) on_signals();
    }
  }

  void finish() {
    mux_.close_all();
    // Anything that escaped its worker's process group and is still around.
    const int stray = sweep_stray_children(cfg_.guardian->pid(), {});
    if (stray > 0) vlog("killed " + std::to_string(stray) + " leftover process(es) of the workers");
    if (result_.first_failure) {
      result_.failure_tail = mux_.tail(result_.first_failure->rank);
      for (const auto& l : live_) {
        if (l.spec.rank == result_.first_failure->rank) result_.failure_error_file = l.spec.error_file;
      }
    }
  }

  void on_signals() {
    signalfd_siginfo si;
    while (true) {
      const ssize_t n = ::read(cfg_.signal_fd, &si, sizeof(si));
      if (n != static_cast<ssize_t>(sizeof(si))) break;
      const int sig = static_cast<int>(si.ssi_signo);
      if (sig == SIGCHLD) {
        reap();
        continue;
      }
      on_forwarded(sig);
    }
    reap();  // SIGCHLD coalesces: look anyway
  }

  void on_forwarded(int sig) {
    for (auto& l : live_) {
      if (l.running) signal_worker(l.pid, sig);
    }
    log("received " + signal_name(sig) + "; forwarded it to " + std::to_string(running_) + " worker(s)");
    if (!is_terminating_signal(sig)) return;
    if (stopping_by_signal_ || tearing_down_) {
      if (stopping_by_signal_) {
        log("second " + signal_name(sig) + ": killing the workers now");
        for (auto& l : live_) {
          if (l.running) signal_worker(l.pid, SIGKILL);
        }
      } else {
        kill_deadline_ = Clock::now();  // already stopping after a failure: do not wait out the grace
      }
      if (result_.stop_signal == 0) result_.stop_signal = sig;
      stopping_by_signal_ = true;
      return;
    }
    stopping_by_signal_ = true;
    tearing_down_ = true;
    result_.stop_signal = sig;
    kill_deadline_ = after_seconds(cfg_.term_timeout_s);
    if (cfg_.on_stop_signal) cfg_.on_stop_signal(sig);
  }

  void on_remote() {
    auto ev = cfg_.remote->take();
    if (!ev) return;
    if (tearing_down_) {
      vlog("while stopping: " + ev->describe());
      if (!result_.remote) result_.remote = ev;
      return;
    }
    result_.remote = ev;
    log(ev->describe() + "; stopping this node's workers");
    begin_teardown(std::min(cfg_.term_timeout_s, cfg_.remote_term_timeout_s));
  }

  void begin_teardown(double grace_s) {
    tearing_down_ = true;
    for (auto& l : live_) {
      if (l.running) signal_worker(l.pid, SIGTERM);
    }
    kill_deadline_ = after_seconds(grace_s);
  }

  void reap() {
    while (true) {
      siginfo_t si;
      std::memset(&si, 0, sizeof(si));
      if (::waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) != 0) break;
      if (si.si_pid == 0) break;
      const pid_t pid = si.si_pid;
      Live* w = nullptr;
      for (auto& l : live_) {
        if (l.running && l.pid == pid) w = &l;
      }
      // Kill what is left of a worker's process group while its zombie
      // still pins the group id.
      if (w != nullptr) ::kill(-pid, SIGKILL);
      int status = 0;
      if (::waitpid(pid, &status, 0) < 0) continue;
      if (w == nullptr) {
        if (pid == cfg_.guardian->pid()) log("warning: the guardian process exited unexpectedly");
        continue;  // an orphaned descendant of a worker
      }
      w->running = false;
      --running_;
      cfg_.guardian->untrack(pid);
      WorkerExit x{w->spec.rank, w->spec.local_rank, pid, 0, 0};
      if (WIFEXITED(status)) {
        x.exit_code = WEXITSTATUS(status);
      } else if (WIFSIGNALED(status)) {
        x.signal = WTERMSIG(status);
        x.exit_code = 128 + x.signal;
      }
      vlog(describe_worker(x) + " " + describe_exit(x));
      on_exit(static_cast<size_t>(w - live_.data()), x);
    }
  }

  // Kills the running workers whose rank the survivors excluded (fault.h:
  // shoal/excluded/<rank> holds their incarnation or a later one).
  void fence_excluded() {
    for (auto& l : live_) {
      if (!l.running || l.fenced) continue;
      std::optional<int> ex;
      try {
        ex = cfg_.ledger->excluded(l.spec.rank);
      } catch (const std::exception& e) {
        ledger_trouble(e);
        return;
      }
      if (!ex || *ex < l.incarnation) continue;
      log("rank " + std::to_string(l.spec.rank) + " (pid " + std::to_string(l.pid) + ") was excluded by the " +
          "other ranks (shoal/excluded/" + std::to_string(l.spec.rank) + " = " + std::to_string(*ex) +
          ") and is still running: fencing it (SIGKILL)");
      l.fenced = true;
      signal_worker(l.pid, SIGKILL);
    }
  }

  // A worker ended: record a failure in the store, then stop the job, or
  // (fault tolerance) go on without it or replace it.
  void on_exit(size_t index, const WorkerExit& x) {
    const bool casualty = tearing_down_ || stopping_by_signal_ || result_.remote.has_value();
    bool recorded = false;
    if (x.failed() && !casualty && cfg_.ledger) {
      try {
        const int64_t seq =
            cfg_.ledger->record_death(x, live_[index].incarnation, live_[index].fenced, cfg_.node_rank, cfg_.host);
        vlog("recorded the death of rank " + std::to_string(x.rank) + " in the workers' store (shoal/death/" +
             std::to_string(seq) + ")");
        recorded = true;
      } catch (const std::exception& e) {
        ledger_trouble(e);
      }
    }
    if (cfg_.fault_tolerance == FaultTolerance::kNone || !x.failed() || casualty || !recorded) {
      note_exit(x);
      return;
    }
    log(failure_summary(x, cfg_.node_rank, cfg_.host, mux_.tail(x.rank), live_[index].spec.error_file,
                        "a worker failed"));
    if (cfg_.fault_tolerance == FaultTolerance::kReplace && result_.replaced < cfg_.max_replacements) {
      ++result_.replaced;
      Live r;
      r.spec = live_[index].spec;
      r.incarnation = live_[index].incarnation + 1;
      auto& env = r.spec.exec.env;
      env.erase(std::remove_if(env.begin(), env.end(),
                               [](const std::string& e) { return e.rfind("SHOAL_REPLACEMENT=", 0) == 0; }),
                env.end());
      env.push_back("SHOAL_REPLACEMENT=" + std::to_string(r.incarnation));
      log("starting a replacement for rank " + std::to_string(x.rank) + " (replacement " +
          std::to_string(result_.replaced) + " of at most " + std::to_string(cfg_.max_replacements) +
          " on this node)");
      start(&r);
      live_.push_back(r);
      return;
    }
    int64_t alive = 0;
    try {
      alive = cfg_.ledger->alive(cfg_.world_size);
    } catch (const std::exception& e) {
      ledger_trouble(e);
      note_exit(x);
      return;
    }
    const std::string left = std::to_string(alive) + " of " + std::to_string(cfg_.world_size) + " ranks";
    if (alive < cfg_.min_ranks) {
      log(left + " are left, fewer than --min-ranks " + std::to_string(cfg_.min_ranks) + ": stopping the job");
      note_exit(x);
      return;
    }
    ++result_.tolerated;
    log("going on without rank " + std::to_string(x.rank) + ": " + left + " are left (--fault-tolerance " +
        fault_tolerance_name(cfg_.fault_tolerance) + ", --min-ranks " + std::to_string(cfg_.min_ranks) + ")");
  }

  void note_exit(const WorkerExit& x) {
    if (!x.failed() || result_.first_failure) return;
    if (result_.remote && !stopping_by_signal_) return;  // casualties of another node's failure
    if (tearing_down_ && !stopping_by_signal_) return;
    result_.first_failure = x;
    if (stopping_by_signal_) return;  // already stopping; the signal is the cause
    log(describe_worker(x) + " " + describe_exit(x) + "; stopping the other workers");
    if (cfg_.on_failure) cfg_.on_failure(x);
    begin_teardown(cfg_.term_timeout_s);
  }

  const GroupConfig& cfg_;
  OutputMux mux_;
  std::vector<Live> live_;
  int running_ = 0;
  bool tearing_down_ = false;
  bool stopping_by_signal_ = false;
  std::optional<Clock::time_point> kill_deadline_;
  Clock::time_point next_fence_ = Clock::now();
  bool ledger_warned_ = false;
  GroupResult result_;
};

}  // namespace

std::string RemoteEvent::describe() const {
  std::string who = "node " + std::to_string(node) + (host.empty() ? "" : " (host " + host + ")");
  switch (kind) {
    case Kind::kNodeFailed:
      return who + " failed: " + message;
    case Kind::kNodeLost:
      return who + " is lost: " + message;
    case Kind::kMasterLost:
      return "lost the master " + who + ": " + message;
    case Kind::kAdmit:
      return message;
  }
  return who + ": " + message;
}

int GroupResult::exit_code() const {
  if (first_failure) return first_failure->exit_code;
  if (stop_signal != 0) return 128 + stop_signal;
  if (remote) return remote->exit_code;
  return 0;
}

GroupResult run_group(const GroupConfig& cfg) { return GroupRun(cfg).run(); }

}  // namespace shoalrun
