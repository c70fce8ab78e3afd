// shoalrun — the launcher: starts one worker per device on this node, meets
// the launchers of the other nodes, and never leaves a process behind.
//
//   shoalrun [options] train.py [script args]
//
// main() parses the command line and the cluster description (bad input: one
// line on stderr, exit 2), then Launcher::run() loops over runs of the worker
// group: rendezvous with the other nodes (multi-node), run the group
// (group.h), agree on the outcome (rendezvous.h), restart or exit.
// Exit code: 0; the first failed worker's code (128 + signal for a signal);
// 128 + signal when shoalrun itself was stopped by one; 1 for launcher-level
// failures (lost node, rendezvous timeout); 2 for bad input.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "cli.h"
#include "cluster.h"
#include "command.h"
#include "group.h"
#include "log.h"
#include "process.h"
#include "rendezvous.h"
#include "summary.h"

namespace shoalrun {
namespace {

using Clock = std::chrono::steady_clock;

sigset_t launcher_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int s : forwarded_signals()) sigaddset(&set, s);
  return set;
}

std::string join_hosts(const std::vector<std::string>& hosts) {
  std::string s;
  for (const auto& h : hosts) s += (s.empty() ? "" : ",") + h;
  return s;
}

void print_dry_run(const Cluster& c, const WorkerCommand& cmd) {
  std::printf("source=%s\nsource_detail=%s\nnnodes=%d\nnode_rank=%d\nnproc_per_node=%d\nnproc_detail=%s\n"
              "world_size=%d\nmaster_addr=%s\nmaster_port=%d\nrdzv_port=%d\nhosts=%s\nnode_name=%s\ncommand=%s\n",
              c.source.c_str(), c.source_detail.c_str(), c.nnodes, c.node_rank, c.nproc_per_node,
              c.nproc_detail.c_str(), c.world_size(), c.master_addr.c_str(), c.master_port, c.rdzv_port,
              join_hosts(c.hosts).c_str(), c.node_name.c_str(), cmd.describe.c_str());
}

class Launcher {
 public:
  Launcher(const Options& o, const Cluster& c, const WorkerCommand& cmd, shoal::auth::Secret secret)
      : o_(o), c_(c), cmd_(cmd), secret_(std::move(secret)) {}

  int run() {
    ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    const char* tmp = std::getenv("TMPDIR");
    std::string scratch = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/shoalrun-XXXXXX";
    if (::mkdtemp(scratch.data()) == nullptr) {
      log("error: cannot create a scratch directory " + scratch);
      return 1;
    }
    scratch_ = scratch;
    guardian_.start(scratch_);
    const sigset_t set = launcher_signals();
    sigfd_ = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    const int code = run_rounds();
    rdzv_.reset();
    guardian_.stop();  // removes the scratch directory
    return code;
  }

 private:
  int run_rounds() {
    // The job's secret (docs/security.md): the user's, else made here for
    // one node; several nodes get node 0's in the rendezvous.
    const bool given = !secret_.empty();
    if (c_.nnodes > 1) {
      rdzv_ = std::make_unique<LauncherRendezvous>(c_, o_, secret_);
    } else if (!given) {
      secret_ = shoal::auth::Secret::random();
    }
    if (given) {
      vlog("the job's secret: from " + (o_.secret_file.empty() ? std::string("SHOAL_SECRET") : o_.secret_file));
    } else if (c_.nnodes == 1) {
      vlog("the job's secret: made for this job");
    } else {
      vlog(std::string("the job's secret: ") +
           (c_.node_rank == 0 ? "made here, to be handed to each node sealed to its key"
                              : "node 0's, handed over sealed to this launcher's key") +
           "; without --secret-file the launchers' store itself is not authenticated (docs/security.md)");
    }
    const std::string omp = default_omp_threads(c_);
    if (!omp.empty()) {
      log("OMP_NUM_THREADS is not set: setting it to " + omp + " for each worker (" + std::to_string(cpu_count()) +
          " cores / " + std::to_string(c_.nproc_per_node) + " workers on this node)");
    }
    for (int restart = 0;; ++restart) {
      if (rdzv_) {
        int code = 0;
        if (!join(restart, &code)) return code;
      }
      const GroupResult r = run_once(restart, omp);
      if (r.first_failure && !r.remote) {
        log(failure_summary(*r.first_failure, c_.node_rank, c_.node_name, r.failure_tail, r.failure_error_file));
      } else if (r.stop_signal != 0) {
        log("stopped by " + signal_name(r.stop_signal));
      }

      if (!rdzv_) {
        if (r.ok()) return 0;
        if (r.stop_signal == 0 && restart < o_.max_restarts) {
          log("restarting the workers (restart " + std::to_string(restart + 1) + " of " +
              std::to_string(o_.max_restarts) + ")");
          continue;
        }
        return r.exit_code();
      }

      NodeReport rep;
      rep.ok = r.ok();
      rep.exit_code = r.exit_code();
      rep.restartable = r.stop_signal == 0 && (!r.remote || r.remote->restartable);
      if (r.first_failure) {
        rep.message = describe_worker(*r.first_failure) + " " + describe_exit(*r.first_failure);
      } else if (r.stop_signal != 0) {
        rep.message = "its launcher received " + signal_name(r.stop_signal);
      } else if (r.remote) {
        rep.message = "stopped because " + r.remote->describe();
      }
      const Outcome out = rdzv_->settle(restart, rep, sigfd_);
      if (out.ok) {
        rdzv_->leave(restart);
        return 0;
      }
      if (out.restartable) {
        log("restarting the workers on every node (restart " + std::to_string(restart + 1) + " of " +
            std::to_string(o_.max_restarts) + ") after: " + out.message);
        continue;
      }
      // The node that failed first has printed its own summary already.
      if (out.node != c_.node_rank || !r.first_failure) log("job failed: " + out.message);
      rdzv_->leave(restart);
      return out.exit_code;
    }
  }

  // The rendezvous runs on a helper thread so that signals are still handled.
  bool join(int round, int* code) {
    NodeInfo me;
    me.node = c_.node_rank;
    me.host = c_.node_name;
    me.nnodes = c_.nnodes;
    me.nproc = c_.nproc_per_node;
    me.max_restarts = o_.max_restarts;
    me.pid = static_cast<int>(::getpid());
    const auto deadline =
        Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o_.rdzv_timeout_s * 1000.0));
    int done[2];
    if (::pipe2(done, O_CLOEXEC) != 0) {
      log("error: pipe failed");
      *code = 1;
      return false;
    }
    std::optional<RendezvousError> err;
    std::thread t([&] {
      try {
        rdzv_->join(round, me, deadline);
      } catch (const RendezvousError& e) {
        err = e;
      } catch (const std::exception& e) {
        err = RendezvousError(1, e.what());
      }
      const char b = 1;
      (void)!::write(done[1], &b, 1);
    });
    while (true) {
      pollfd fds[2] = {{sigfd_, POLLIN, 0}, {done[0], POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) continue;
      if (fds[1].revents != 0) break;
      signalfd_siginfo si;
      while (::read(sigfd_, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
        const int sig = static_cast<int>(si.ssi_signo);
        if (is_terminating_signal(sig)) {
          log("interrupted by " + signal_name(sig) + " during the rendezvous");
          // The helper may be blocked in the store: leave at once (the
          // guardian removes the scratch directory).
          ::_exit(128 + sig);
        }
      }
    }
    t.join();
    ::close(done[0]);
    ::close(done[1]);
    if (err) {
      log("error: " + std::string(err->what()));
      *code = err->exit_code();
      return false;
    }
    vlog("rendezvous complete: " + std::to_string(c_.nnodes) + " nodes, world size " +
         std::to_string(c_.world_size()));
    secret_ = rdzv_->secret();
    return true;
  }

  GroupResult run_once(int restart, const std::string& omp) {
    GroupConfig gc;
    for (int l = 0; l < c_.nproc_per_node; ++l) {
      WorkerPlace p;
      p.local_rank = l;
      p.rank = c_.node_rank * c_.nproc_per_node + l;
      p.restart_count = restart;
      p.error_file = scratch_ + "/error_rank" + std::to_string(p.rank) + ".json";
      WorkerSpec w;
      w.rank = p.rank;
      w.local_rank = l;
      w.error_file = p.error_file;
      w.exec.path = cmd_.path;
      w.exec.argv = cmd_.argv;
      w.exec.env = worker_env(c_, p, omp, secret_.hex());
      gc.workers.push_back(std::move(w));
    }
    gc.term_timeout_s = o_.term_timeout_s;
    gc.output.console = o_.log_dir.empty() || o_.tee;
    gc.output.log_dir = o_.log_dir;
    gc.output.restart_count = restart;
    gc.signal_fd = sigfd_;
    gc.guardian = &guardian_;
    if (rdzv_) {
      gc.remote = rdzv_.get();
      rdzv_->start_monitor(restart);
      gc.on_failure = [this, restart](const WorkerExit& x) {
        std::string msg = describe_worker(x) + " " + describe_exit(x);
        rdzv_->publish_failure(restart, "workers", x.exit_code, msg, true);
      };
      gc.on_stop_signal = [this, restart](int sig) {
        rdzv_->publish_failure(restart, "signal", 128 + sig, "its launcher received " + signal_name(sig), false);
      };
    }
    vlog("starting " + std::to_string(c_.nproc_per_node) + " worker(s), ranks " +
         std::to_string(c_.node_rank * c_.nproc_per_node) + " .. " +
         std::to_string((c_.node_rank + 1) * c_.nproc_per_node - 1) + " (restart " + std::to_string(restart) +
         "): " + cmd_.describe);
    return run_group(gc);
  }

  Options o_;
  Cluster c_;
  WorkerCommand cmd_;
  shoal::auth::Secret secret_;  // the job's; SHOAL_SECRET of every worker
  std::string scratch_;
  Guardian guardian_;
  int sigfd_ = -1;
  std::unique_ptr<LauncherRendezvous> rdzv_;
};

}  // namespace
}  // namespace shoalrun

int main(int argc, char** argv) {
  using namespace shoalrun;
  // Before any thread exists: the launcher's signals are read from a signalfd.
  const sigset_t set = launcher_signals();
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  Options o;
  Cluster c;
  WorkerCommand cmd;
  shoal::auth::Secret secret;
  try {
    ParsedCommandLine p = parse_command_line(argc, argv);
    if (p.exit_now) return *p.exit_now;
    o = p.options;
    set_verbose(o.verbose);
    c = resolve_cluster(o);
    cmd = build_command(o, argv[0]);
    secret = given_secret(o);
    if (!o.log_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(o.log_dir, ec);
      if (ec) throw UsageError("--log-dir " + o.log_dir + ": " + ec.message());
    }
  } catch (const UsageError& e) {
    std::fprintf(stderr, "shoalrun: error: %s\n", e.what());
    return 2;
  }
  if (o.dry_run) {
    print_dry_run(c, cmd);
    return 0;
  }
  vlog("cluster description from " + c.source + " (" + c.source_detail + "): node " + std::to_string(c.node_rank) +
       " of " + std::to_string(c.nnodes) + ", " + std::to_string(c.nproc_per_node) + " worker(s) per node (" +
       c.nproc_detail + "), world size " + std::to_string(c.world_size()) + ", master " + c.master_addr + ":" +
       std::to_string(c.master_port) + " (" + (c.master_port_detail.empty() ? "" : c.master_port_detail) + ")" +
       (c.nnodes > 1 ? ", launcher rendezvous on port " + std::to_string(c.rdzv_port) : ""));
  try {
    return Launcher(o, c, cmd, std::move(secret)).run();
  } catch (const std::exception& e) {
    log(std::string("error: ") + e.what());
    return 1;
  }
}
