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
#include <set>
#include <thread>

#include "cli.h"
#include "cluster.h"
#include "command.h"
#include "fault.h"
#include "group.h"
#include "log.h"
#include "process.h"
#include "rendezvous.h"
#include "summary.h"
#include "workers_store.h"

namespace shoalrun {
namespace {

using Clock = std::chrono::steady_clock;

// SIGCHLD and the signals forwarded to the workers (by default all of
// forwarded_signals(); --signals-to-handle picks some).
sigset_t launcher_signals(const std::set<int>& handled) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int s : forwarded_signals()) {
    if (handled.count(s)) sigaddset(&set, s);
  }
  return set;
}

std::string join_hosts(const std::vector<std::string>& hosts) {
  std::string s;
  for (const auto& h : hosts) s += (s.empty() ? "" : ",") + h;
  return s;
}

std::string stream_spec_text(const StreamSpec& s) {
  if (s.per_rank.empty()) return std::to_string(s.all);
  std::string t;
  for (const auto& [rank, mask] : s.per_rank) {
    if (!t.empty()) t += ',';
    t.append(std::to_string(rank)).append(":").append(std::to_string(mask));
  }
  return t;
}

template <class C>
std::string join_list(const C& items, const char* sep = ",") {
  std::string s;
  for (const auto& i : items) {
    if (!s.empty()) s += sep;
    s += i;
  }
  return s;
}

// The plan, one key=value a line (tests read it; --dry-run).
void print_dry_run(const Options& o, const Cluster& c, const WorkerCommand& cmd) {
  std::vector<std::string> sigs, ranks;
  for (int s : o.signals) sigs.push_back(signal_name(s));
  if (o.local_ranks_filter) {
    for (int r : *o.local_ranks_filter) ranks.push_back(std::to_string(r));
  }
  const auto num = [](double v) {
    char b[32];
    std::snprintf(b, sizeof(b), "%g", v);
    return std::string(b);
  };
  const std::vector<std::pair<std::string, std::string>> lines = {
      {"source", c.source},
      {"source_detail", c.source_detail},
      {"nnodes", std::to_string(c.nnodes)},
      {"max_nnodes", std::to_string(c.max_nnodes)},
      {"node_rank", c.node_rank < 0 ? "assigned at the rendezvous" : std::to_string(c.node_rank)},
      {"nproc_per_node", std::to_string(c.nproc_per_node)},
      {"nproc_detail", c.nproc_detail},
      {"world_size", c.c10d() && c.multi_node() ? "assigned at the rendezvous" : std::to_string(c.world_size())},
      {"master_addr", c.master_addr},
      {"master_port", c.c10d() && c.multi_node() && !c.master_port_given ? "a free port of node 0"
                                                                          : std::to_string(c.master_port)},
      {"rdzv_backend", c.backend},
      {"rdzv_host", c.store_host},
      {"rdzv_port", std::to_string(c.rdzv_port)},
      {"rdzv_hosted_here", c.multi_node() ? (c.host_store ? "yes" : "no") : ""},
      {"rdzv_id", o.rdzv_id},
      {"join_timeout", num(o.rdzv_timeout_s)},
      {"last_call_timeout", num(o.rdzv_conf.last_call_timeout)},
      {"close_timeout", num(o.rdzv_conf.close_timeout)},
      {"heartbeat_timeout", num(o.rdzv_conf.heartbeat_timeout)},
      {"keep_alive_interval", num(o.rdzv_conf.keep_alive_interval)},
      {"keep_alive_max_attempt", std::to_string(o.rdzv_conf.keep_alive_max_attempt)},
      {"read_timeout", num(o.rdzv_conf.read_timeout)},
      {"monitor_interval", num(o.monitor_interval_s)},
      {"max_restarts", std::to_string(o.max_restarts)},
      {"shutdown_timeout", num(o.term_timeout_s)},
      {"signals_to_handle", join_list(sigs)},
      {"start_method", o.start_method},
      {"role", o.role},
      {"local_addr", o.local_addr},
      {"virtual_local_rank", o.virtual_local_rank ? "1" : "0"},
      {"workers_store", o.workers_store},
      {"fault_tolerance", o.fault_tolerance},
      {"min_ranks", std::to_string(o.min_ranks)},
      {"max_replacements", std::to_string(o.max_replacements)},
      {"log_dir", o.log_dir},
      {"redirects", stream_spec_text(o.redirects)},
      {"tee", stream_spec_text(o.tee)},
      {"local_ranks_filter", join_list(ranks)},
      {"duplicate_stdout_filters", join_list(o.duplicate_stdout_filters, "|")},
      {"duplicate_stderr_filters", join_list(o.duplicate_stderr_filters, "|")},
      {"verbose", o.verbose ? "1" : "0"},
      {"hosts", join_hosts(c.hosts)},
      {"node_name", c.node_name},
      {"command", cmd.describe},
  };
  for (const auto& [k, v] : lines) std::printf("%s=%s\n", k.c_str(), v.c_str());
}

// Where one local rank's streams go: torchrun's --tee wins over --redirects;
// --local-ranks-filter keeps others off the console.
OutputMux::Route route_of(const Options& o, int local_rank) {
  const int red = o.redirects.of(local_rank), tee = o.tee.of(local_rank);
  OutputMux::Route r;
  r.out_file = ((red | tee) & StreamSpec::kOut) != 0;
  r.err_file = ((red | tee) & StreamSpec::kErr) != 0;
  r.out_console = (tee & StreamSpec::kOut) != 0 || (red & StreamSpec::kOut) == 0;
  r.err_console = (tee & StreamSpec::kErr) != 0 || (red & StreamSpec::kErr) == 0;
  if (o.local_ranks_filter && o.local_ranks_filter->count(local_rank) == 0) r.out_console = r.err_console = false;
  return r;
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
    const sigset_t set = launcher_signals(o_.signals);
    sigfd_ = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    const int code = run_rounds();
    rdzv_.reset();
    ledger_.reset();
    store_.reset();  // after the workers: they may use it to the end
    guardian_.stop();  // removes the scratch directory
    return code;
  }

 private:
  int run_rounds() {
    // The job's secret (docs/security.md): the user's, else made here for
    // one node; several nodes get node 0's in the rendezvous.
    const bool given = !secret_.empty();
    if (c_.multi_node()) {
      rdzv_ = std::make_unique<LauncherRendezvous>(c_, o_, secret_);
    } else if (!given) {
      secret_ = shoal::auth::Secret::random();
    }
    if (given) {
      vlog("the job's secret: from " + (o_.secret_file.empty() ? std::string("SHOAL_SECRET") : o_.secret_file));
    } else if (!c_.multi_node()) {
      vlog("the job's secret: made for this job");
    } else {
      vlog(std::string("the job's secret: ") +
           (c_.c10d() ? "made by the launcher hosting the rendezvous, handed to the others sealed to their keys"
            : c_.host_store ? "made here, to be handed to each node sealed to its key"
                            : "node 0's, handed over sealed to this launcher's key") +
           "; without --secret-file the launchers' store itself is not authenticated (docs/security.md)");
    }
    const std::string omp = default_omp_threads(c_);
    if (!omp.empty()) {
      log("OMP_NUM_THREADS is not set: setting it to " + omp + " for each worker (" + std::to_string(cpu_count()) +
          " cores / " + std::to_string(c_.nproc_per_node) + " workers on this node)");
    }
    int restarts_used = 0;  // one node; several nodes count in the rendezvous
    for (int round = 0;; ++round) {
      if (rdzv_) {
        int code = 0;
        if (!join(&round, &code)) return code;
        restarts_used = rdzv_->restarts_used();
      }
      if (!host_workers_store()) return 1;
      const GroupResult r = run_once(round, restarts_used, omp);
      if (r.first_failure && !r.remote) {
        log(failure_summary(*r.first_failure, c_.node_rank, c_.node_name, r.failure_tail, r.failure_error_file));
      } else if (r.stop_signal != 0) {
        log("stopped by " + signal_name(r.stop_signal));
      }

      if (r.tolerated > 0 || r.replaced > 0) {
        log("the workers went on after " + std::to_string(r.tolerated + r.replaced) + " failure(s) on this node (" +
            std::to_string(r.replaced) + " replaced)");
      }
      if (!rdzv_) {
        if (r.ok()) return 0;
        if (r.stop_signal == 0 && restarts_used < o_.max_restarts) {
          ++restarts_used;
          log("restarting the workers (restart " + std::to_string(restarts_used) + " of " +
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
      const Outcome out = rdzv_->settle(round, rep, sigfd_);
      if (out.ok) {
        rdzv_->leave(round, 0);
        return 0;
      }
      if (out.restartable && !out.counted) {
        log("restarting the workers on every node (not counted as a restart): " + out.message);
        continue;
      }
      if (out.restartable) {
        log("restarting the workers on every node (restart " + std::to_string(rdzv_->restarts_used()) + " of " +
            std::to_string(o_.max_restarts) + ") after: " + out.message);
        continue;
      }
      // The node that failed first has printed its own summary already.
      if (out.node != c_.node_rank || !r.first_failure) log("job failed: " + out.message);
      rdzv_->leave(round, out.exit_code);
      return out.exit_code;
    }
  }

  // The rendezvous runs on a helper thread so that signals are still handled.
  // `round`: the round to join; a c10d launcher may be admitted to a later one.
  bool join(int* round, int* code) {
    NodeInfo me;
    me.node = c_.c10d() ? -1 : c_.node_rank;
    me.host = c_.node_name;
    me.nnodes = c_.c10d() ? min_nnodes_ : c_.nnodes;
    me.max_nnodes = c_.max_nnodes;
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
    Assignment a;
    const int want = *round;
    std::thread t([&] {
      try {
        a = rdzv_->join(want, me, deadline);
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
      log((err->exit_code() == 0 ? "" : "error: ") + std::string(err->what()));
      *code = err->exit_code();
      return false;
    }
    *round = a.round;
    c_.node_rank = a.node_rank;
    c_.nnodes = a.nnodes;
    c_.master_addr = a.master_addr;
    c_.master_port = a.master_port;
    c_.hosts = a.hosts;
    vlog("rendezvous complete (round " + std::to_string(a.round) + "): node " + std::to_string(c_.node_rank) +
         " of " + std::to_string(c_.nnodes) + ", world size " + std::to_string(c_.world_size()) + ", master " +
         c_.master_addr + ":" + std::to_string(c_.master_port));
    secret_ = rdzv_->secret();
    return true;
  }

  // Node 0's launcher hosts the workers' store (--workers-store launcher) for
  // the whole job; each round starts without the last one's records.
  bool host_workers_store() {
    if (!o_.launcher_store() || c_.node_rank != 0) return true;
    if (store_ && store_->port() == c_.master_port) {
      store_->erase_prefix("shoal/");
      return true;
    }
    ledger_.reset();
    store_.reset();
    const std::string host = c_.multi_node() ? "" : c_.master_addr;
    try {
      store_ = std::make_unique<WorkersStore>(host, static_cast<uint16_t>(c_.master_port), secret_);
    } catch (const std::exception& e) {
      if (c_.multi_node() || c_.master_port_given) {
        log(std::string("error: ") + e.what());
        return false;
      }
      // The free port chosen for this one-node job was taken since: another one.
      store_ = std::make_unique<WorkersStore>(host, 0, secret_);
      c_.master_port = store_->port();
    }
    vlog("hosting the workers' store on port " + std::to_string(c_.master_port) +
         " (TORCHELASTIC_USE_AGENT_STORE=True)");
    return true;
  }

  // This launcher's client of the workers' store (fault.h), or null when
  // there is none. Throws when it is needed (fault tolerance) and unreachable.
  Ledger* ledger() {
    if (!o_.launcher_store()) return nullptr;
    if (ledger_ && ledger_port_ == c_.master_port) return ledger_.get();
    ledger_.reset();
    const std::string host = c_.node_rank == 0 ? "127.0.0.1" : c_.master_addr;
    try {
      ledger_ = std::make_unique<Ledger>(host, c_.master_port, secret_.hex(), o_.rdzv_conf.read_timeout,
                                         o_.rdzv_conf.heartbeat_timeout);
      ledger_port_ = c_.master_port;
    } catch (const std::exception& e) {
      const std::string why = "cannot reach the workers' store at " + host + ":" + std::to_string(c_.master_port) +
                              ": " + e.what();
      if (o_.fault_tolerance != "none") throw std::runtime_error(why);
      log("warning: " + why + "; worker deaths are not recorded there");
    }
    return ledger_.get();
  }

  GroupResult run_once(int round, int restarts_used, const std::string& omp) {
    GroupConfig gc;
    gc.ledger = ledger();
    gc.fence_interval_s = o_.monitor_interval_s;
    gc.node_rank = c_.node_rank;
    gc.host = c_.node_name;
    gc.fault_tolerance = o_.fault_tolerance == "shrink"    ? FaultTolerance::kShrink
                         : o_.fault_tolerance == "replace" ? FaultTolerance::kReplace
                                                           : FaultTolerance::kNone;
    gc.min_ranks = o_.min_ranks;
    gc.max_replacements = o_.max_replacements;
    gc.world_size = c_.world_size();
    const std::string error_dir = o_.log_dir.empty() ? scratch_ : o_.log_dir;
    for (int l = 0; l < c_.nproc_per_node; ++l) {
      WorkerPlace p;
      p.local_rank = l;
      p.rank = c_.node_rank * c_.nproc_per_node + l;
      p.restart_count = restarts_used;
      p.error_file = error_dir + "/error_rank" + std::to_string(p.rank) + ".json";
      WorkerSpec w;
      w.rank = p.rank;
      w.local_rank = l;
      w.error_file = p.error_file;
      w.exec.path = cmd_.path;
      w.exec.argv = cmd_.argv;
      w.exec.env = worker_env(c_, o_, p, omp, secret_.hex());
      w.route = route_of(o_, l);
      gc.workers.push_back(std::move(w));
    }
    gc.term_timeout_s = o_.term_timeout_s;
    gc.output.log_dir = o_.log_dir;
    gc.output.restart_count = round;
    gc.output.stdout_filters = o_.duplicate_stdout_filters;
    gc.output.stderr_filters = o_.duplicate_stderr_filters;
    gc.signal_fd = sigfd_;
    gc.guardian = &guardian_;
    if (rdzv_) {
      gc.remote = rdzv_.get();
      rdzv_->start_monitor(round);
      gc.on_failure = [this, round](const WorkerExit& x) {
        std::string msg = describe_worker(x) + " " + describe_exit(x);
        rdzv_->publish_failure(round, "workers", x.exit_code, msg, true);
      };
      gc.on_stop_signal = [this, round](int sig) {
        rdzv_->publish_failure(round, "signal", 128 + sig, "its launcher received " + signal_name(sig), false);
      };
    }
    vlog("starting " + std::to_string(c_.nproc_per_node) + " worker(s), ranks " +
         std::to_string(c_.node_rank * c_.nproc_per_node) + " .. " +
         std::to_string((c_.node_rank + 1) * c_.nproc_per_node - 1) + " (round " + std::to_string(round) +
         ", restart " + std::to_string(restarts_used) + "): " + cmd_.describe);
    return run_group(gc);
  }

  Options o_;
  Cluster c_;
  const int min_nnodes_ = c_.nnodes;  // c10d: MIN of --nnodes (c_.nnodes follows the rendezvous)
  WorkerCommand cmd_;
  shoal::auth::Secret secret_;  // the job's; SHOAL_SECRET of every worker
  std::string scratch_;
  Guardian guardian_;
  int sigfd_ = -1;
  std::unique_ptr<LauncherRendezvous> rdzv_;
  std::unique_ptr<WorkersStore> store_;  // node 0, --workers-store launcher
  std::unique_ptr<Ledger> ledger_;
  int ledger_port_ = 0;
};

// Where the log files go: --log-dir (made if missing), else, when a stream is
// redirected or filtered, a new directory (as torchrun does), said once.
void prepare_log_dir(Options* o) {
  const bool needed = o->redirects.any() || o->tee.any() || !o->duplicate_stdout_filters.empty() ||
                      !o->duplicate_stderr_filters.empty();
  if (o->log_dir.empty() && needed) {
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/shoalrun-logs-XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr) throw UsageError("cannot create a log directory " + dir);
    o->log_dir = dir;
    log("the workers' logs go to " + dir + " (no --log-dir given)");
  }
  if (!o->log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o->log_dir, ec);
    if (ec) throw UsageError(o->named("log_dir") + " " + o->log_dir + ": " + ec.message());
  }
}

}  // namespace
}  // namespace shoalrun

int main(int argc, char** argv) {
  using namespace shoalrun;
  // Before any thread exists: the launcher's signals are read from a
  // signalfd. Those --signals-to-handle leaves out are unblocked again below
  // (their default action applies).
  const std::set<int> all(forwarded_signals().begin(), forwarded_signals().end());
  const sigset_t set = launcher_signals(all);
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
    if (o.virtual_local_rank) {
      for (int l = 0; l < c.nproc_per_node; ++l) virtual_device(l);
    }
    if (!o.dry_run) prepare_log_dir(&o);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "shoalrun: error: %s\n", e.what());
    return 2;
  }
  for (const auto& n : c.notes) log("note: " + n);
  if (o.fault_tolerance == "none") {
    for (const char* name : {"min_ranks", "max_replacements"}) {
      if (o.given(name)) log("note: " + o.named(name) + " has no effect without --fault-tolerance");
    }
  } else if (!(c.c10d() && c.multi_node()) && o.min_ranks > c.world_size()) {
    std::fprintf(stderr, "shoalrun: error: --min-ranks %d is more than the world size %d\n", o.min_ranks,
                 c.world_size());
    return 2;
  }
  if (o.dry_run) {
    print_dry_run(o, c, cmd);
    return 0;
  }
  sigset_t unhandled;
  sigemptyset(&unhandled);
  for (int s : forwarded_signals()) {
    if (!o.signals.count(s)) sigaddset(&unhandled, s);
  }
  ::pthread_sigmask(SIG_UNBLOCK, &unhandled, nullptr);
  if (c.c10d() && c.multi_node()) {
    vlog("cluster description from " + c.source + " (" + c.source_detail + "): " + std::to_string(c.nnodes) +
         (c.max_nnodes != c.nnodes ? " to " + std::to_string(c.max_nnodes) : "") + " nodes meeting at " +
         c.store_host + ":" + std::to_string(c.rdzv_port) + " (c10d, job " + o.rdzv_id + "; " +
         (c.host_store ? "hosted here" : "hosted by the launcher on " + c.store_host) + "), " +
         std::to_string(c.nproc_per_node) + " worker(s) per node (" + c.nproc_detail + ")");
  } else {
    vlog("cluster description from " + c.source + " (" + c.source_detail + "): node " + std::to_string(c.node_rank) +
         " of " + std::to_string(c.nnodes) + ", " + std::to_string(c.nproc_per_node) + " worker(s) per node (" +
         c.nproc_detail + "), world size " + std::to_string(c.world_size()) + ", master " + c.master_addr + ":" +
         std::to_string(c.master_port) + " (" + c.master_port_detail + ")" +
         (c.multi_node() ? ", launcher rendezvous on " + c.store_host + ":" + std::to_string(c.rdzv_port) : ""));
  }
  try {
    return Launcher(o, c, cmd, std::move(secret)).run();
  } catch (const std::exception& e) {
    log(std::string("error: ") + e.what());
    return 1;
  }
}
