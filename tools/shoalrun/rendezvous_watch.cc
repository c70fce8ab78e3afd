// shoalrun/rendezvous_watch.cc — the launchers watching each other while
// the workers run, and agreeing on how a round ended (see rendezvous.h).
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <map>
#include <set>

#include "log.h"
#include "process.h"
#include "rendezvous.h"
#include "rendezvous_json.h"
#include "shoal/error.h"

namespace shoalrun {

using rdzv::json;
using rdzv::parse_or_empty;
using std::chrono::milliseconds;

namespace {

milliseconds ms(double s) { return milliseconds(static_cast<int64_t>(s * 1000.0)); }

std::string to_text(const shoal::Bytes& b) { return std::string(b.begin(), b.end()); }

// The first terminating signal waiting on `signal_fd` (others are dropped:
// there are no workers to forward them to), or 0.
int pending_stop_signal(int signal_fd, int wait_ms) {
  pollfd p{signal_fd, POLLIN, 0};
  if (::poll(&p, 1, wait_ms) <= 0) return 0;
  signalfd_siginfo si;
  while (::read(signal_fd, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
    if (is_terminating_signal(static_cast<int>(si.ssi_signo))) return static_cast<int>(si.ssi_signo);
  }
  return 0;
}

}  // namespace

void LauncherRendezvous::start_monitor(int round) {
  stop_monitor();
  shoal::TcpStoreOptions so;
  so.host = cluster_.store_host;
  so.port = static_cast<uint16_t>(cluster_.rdzv_port);
  so.timeout = ms(opts_.rdzv_conf.heartbeat_timeout);
  so.connect_timeout = ms(opts_.rdzv_conf.heartbeat_timeout);
  so.secret = user_secret_ ? secret_.hex() : std::string();
  {
    // Events of an earlier round are stale now.
    std::lock_guard<std::mutex> lock(mu_);
    events_.clear();
    char buf[64];
    while (::read(event_pipe_[0], buf, sizeof(buf)) > 0) {
    }
  }
  try {
    mon_store_ = std::make_unique<shoal::TcpStore>(so);
  } catch (const shoal::Error& e) {
    post(RemoteEvent{RemoteEvent::Kind::kMasterLost, 0, hosts_.empty() ? "" : hosts_[0],
                     std::string("cannot reach the launchers' rendezvous store at ") + addr_ + ": " + e.what(), 1,
                     false});
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = false;
  }
  monitor_ = std::thread([this, round] { monitor_loop(round); });
}

void LauncherRendezvous::stop_monitor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (monitor_.joinable()) monitor_.join();
  mon_store_.reset();
}

void LauncherRendezvous::post(const RemoteEvent& ev) {
  if (ev.kind == RemoteEvent::Kind::kMasterLost) master_lost_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(ev);
  }
  const char b = 1;
  (void)!::write(event_pipe_[1], &b, 1);
}

std::optional<RemoteEvent> LauncherRendezvous::take() {
  char buf[64];
  while (::read(event_pipe_[0], buf, sizeof(buf)) > 0) {
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.empty()) return std::nullopt;
  RemoteEvent ev = events_.front();
  events_.pop_front();
  if (!events_.empty()) {
    const char b = 1;
    (void)!::write(event_pipe_[1], &b, 1);
  }
  return ev;
}

std::optional<RemoteEvent> LauncherRendezvous::read_first_failure(shoal::Store& s, int round, int64_t count) {
  for (int64_t k = 1; k <= count; ++k) {
    const std::string fk = key(round, "failure/" + std::to_string(k));
    if (!s.check({fk})) continue;
    const json j = parse_or_empty(to_text(s.get(fk)));
    RemoteEvent ev;
    const std::string kind = j.value("kind", std::string());
    ev.kind = kind == "lost"    ? RemoteEvent::Kind::kNodeLost
              : kind == "admit" ? RemoteEvent::Kind::kAdmit
                                : RemoteEvent::Kind::kNodeFailed;
    ev.node = j.value("node", -1);
    ev.host = j.value("host", std::string());
    ev.message = j.value("message", std::string());
    ev.exit_code = j.value("code", 1);
    ev.restartable = j.value("restartable", false);
    return ev;
  }
  return std::nullopt;
}

void LauncherRendezvous::monitor_loop(int round) {
  shoal::TcpStore& s = *mon_store_;
  const int me = cluster_.node_rank;
  const int nnodes = cluster_.nnodes;
  const bool master = coordinator_;
  const auto tick = ms(opts_.monitor_interval_s);
  const auto heartbeat_every = ms(opts_.rdzv_conf.keep_alive_interval);
  // Missed heartbeats before a node counts as lost (node 0: before the store does).
  const auto lost_after = heartbeat_every * opts_.rdzv_conf.keep_alive_max_attempt;
  auto next_hb = Clock::now();
  auto next_scan = Clock::now();  // the failure counter, and node 0's look at the heartbeats
  bool admit_posted = false;
  vlog("watching the other nodes every " + rdzv::seconds_text(opts_.monitor_interval_s) + " (heartbeat every " +
       rdzv::seconds_text(opts_.rdzv_conf.keep_alive_interval) + ", a node is lost after " +
       std::to_string(opts_.rdzv_conf.keep_alive_max_attempt) + " missed)");
  auto last_ok = Clock::now();
  bool failure_posted = false;
  std::map<int, int64_t> last_beat;
  std::map<int, Clock::time_point> last_change;
  std::set<int> gone;  // settled or declared lost
  for (int n = 0; n < nnodes; ++n) last_change[n] = Clock::now();

  auto declare_lost = [&](int n, const Clock::time_point& now) {
    gone.insert(n);
    if (s.add(key(round, "settled/" + std::to_string(n)), 1) != 1) return;  // it reported meanwhile
    const auto silent = std::chrono::duration_cast<milliseconds>(now - last_change[n]).count();
    const std::string msg = "its launcher sent no heartbeat for " + std::to_string(silent / 1000) + "." +
                            std::to_string(silent % 1000 / 100) + " s (killed, or its host is down)";
    s.set_str(key(round, "dead/" + std::to_string(n)), json{{"message", msg}}.dump());
    const int64_t k = s.add(key(round, "nfailed"), 1);
    s.set_str(key(round, "failure/" + std::to_string(k)),
              json{{"node", n},
                   {"host", n < static_cast<int>(hosts_.size()) ? hosts_[n] : ""},
                   {"kind", "lost"},
                   {"code", 1},
                   {"message", msg},
                   {"restartable", cluster_.c10d()}}  // the others go on without it
                  .dump());
    s.add(key(round, "nsettled"), 1);
    vlog("declared " + node_name(n) + " lost: " + msg);
  };

  while (true) {
    const auto now = Clock::now();
    try {
      if (now >= next_hb) {
        s.add(key(round, "hb/" + std::to_string(me)), 1);
        next_hb = now + heartbeat_every;
      }
      const bool look = now >= next_scan;
      if (look) next_scan = now + tick;
      const int64_t nfailed = look ? s.add(key(round, "nfailed"), 0) : 0;
      if (!failure_posted && nfailed > 0) {
        // (A failure announced but not yet written is seen on a later look.)
        if (auto ev = read_first_failure(s, round, nfailed)) {
          failure_posted = true;
          if (ev->node != me) post(*ev);
        }
      }
      if (master && look) {
        for (int n = 1; n < nnodes; ++n) {
          if (gone.count(n)) continue;
          if (s.check({key(round, "settled/" + std::to_string(n))})) {
            gone.insert(n);
            continue;
          }
          const int64_t beat = s.add(key(round, "hb/" + std::to_string(n)), 0);
          if (beat != last_beat[n]) {
            last_beat[n] = beat;
            last_change[n] = now;
          } else if (now - last_change[n] > lost_after) {
            declare_lost(n, now);
          }
        }
        // Launchers that came too late for this round: restart to admit them.
        if (!admit_posted && cluster_.c10d() && nnodes < cluster_.max_nnodes &&
            s.add(key(round, "waiting"), 0) > 0) {
          admit_posted = true;
          const int64_t k = s.add(key(round, "nfailed"), 1);
          s.set_str(key(round, "failure/" + std::to_string(k)),
                    json{{"node", -1},
                         {"kind", "admit"},
                         {"code", 1},
                         {"message", "a launcher waits to join this " + std::to_string(nnodes) +
                                         "-node job (at most " + std::to_string(cluster_.max_nnodes) +
                                         "): restarting the workers of every node to admit it"},
                         {"restartable", true}}
                        .dump());
        }
      }
      last_ok = now;
    } catch (const shoal::StoreError& e) {
      if (!master) {
        post(RemoteEvent{RemoteEvent::Kind::kMasterLost, 0, hosts_.empty() ? "" : hosts_[0],
                         "the launchers' rendezvous store at " + addr_ +
                             " is gone (node 0's launcher exited or was killed)",
                         1, false});
      } else {
        log(std::string("monitor: ") + e.what());
      }
      return;
    } catch (const shoal::TimeoutError& e) {
      if (!master && Clock::now() - last_ok > lost_after) {
        post(RemoteEvent{RemoteEvent::Kind::kMasterLost, 0, hosts_.empty() ? "" : hosts_[0],
                         "the launchers' rendezvous store at " + addr_ + " stopped answering (" + e.what() + ")", 1,
                         false});
        return;
      }
    }
    std::unique_lock<std::mutex> lock(mu_);
    const auto wake = std::min(next_hb, next_scan);
    if (cv_.wait_until(lock, wake, [this] { return stop_; })) return;
  }
}

void LauncherRendezvous::publish_failure(int round, const std::string& kind, int exit_code,
                                         const std::string& message, bool restartable) {
  if (!store_) return;
  try {
    const int64_t k = store_->add(key(round, "nfailed"), 1);
    store_->set_str(key(round, "failure/" + std::to_string(k)),
                    json{{"node", cluster_.node_rank},
                         {"host", cluster_.node_name},
                         {"kind", kind},
                         {"code", exit_code},
                         {"message", message},
                         {"restartable", restartable}}
                        .dump());
  } catch (const shoal::Error& e) {
    log(std::string("could not tell the other nodes about the failure: ") + e.what());
  }
}

Outcome LauncherRendezvous::settle(int round, const NodeReport& mine, int signal_fd) {
  Outcome out = settle_once(round, mine, signal_fd);
  stop_monitor();  // its round is over (and the next join must not race with it)
  return out;
}

Outcome LauncherRendezvous::settle_once(int round, const NodeReport& mine, int signal_fd) {
  shoal::TcpStore& s = *store_;
  const int me = cluster_.node_rank;
  const int nnodes = cluster_.nnodes;
  Outcome out;
  if (master_lost_) {
    out.message = "lost the master " + node_name(0) + ": the launchers' rendezvous store at " + addr_ +
                  " does not answer";
    out.node = 0;
    return out;
  }
  try {
    s.set_str(key(round, "done/" + std::to_string(me)),
              json{{"ok", mine.ok}, {"restartable", mine.restartable}, {"code", mine.exit_code},
                   {"message", mine.message}}
                  .dump());
    if (s.add(key(round, "settled/" + std::to_string(me)), 1) == 1) s.add(key(round, "nsettled"), 1);
    bool said = false;
    while (s.add(key(round, "nsettled"), 0) < nnodes) {
      if (!said && mine.ok) {
        vlog("this node's workers finished; waiting for the other nodes");
        said = true;
      }
      if (const int sig = pending_stop_signal(signal_fd, 100)) {
        out.exit_code = 128 + sig;
        out.message = "interrupted by " + signal_name(sig) + " while waiting for the other nodes";
        publish_failure(round, "signal", out.exit_code, "its launcher received " + signal_name(sig), false);
        return out;
      }
    }
    const auto failure = read_first_failure(s, round, s.add(key(round, "nfailed"), 0));
    bool all_ok = true, all_restartable = true;
    std::string first_bad;
    int first_bad_code = 1;
    for (int n = 0; n < nnodes; ++n) {
      if (s.check({key(round, "dead/" + std::to_string(n))})) {
        // A static job cannot go on without one of its node ranks; an
        // elastic (c10d) one restarts with the others.
        all_ok = false;
        if (!cluster_.c10d()) all_restartable = false;
        if (first_bad.empty()) {
          first_bad = node_name(n) + " is lost: " +
                      parse_or_empty(s.get_str(key(round, "dead/" + std::to_string(n)))).value("message", "");
        }
        continue;
      }
      const json d = parse_or_empty(s.get_str(key(round, "done/" + std::to_string(n))));
      if (!d.value("ok", false)) {
        all_ok = false;
        if (first_bad.empty()) {
          first_bad = node_name(n) + " failed: " + d.value("message", std::string("?"));
          first_bad_code = d.value("code", 1);
        }
      }
      if (!d.value("restartable", false)) all_restartable = false;
    }
    out.ok = all_ok && !failure;
    if (out.ok) {
      out.exit_code = 0;
      return out;
    }
    if (failure) {
      RemoteEvent ev = *failure;
      out.message = ev.describe();
      out.exit_code = ev.exit_code;
      out.node = ev.node;
      out.counted = ev.kind != RemoteEvent::Kind::kAdmit;
      all_restartable = all_restartable && ev.restartable;
    } else {
      out.message = first_bad;
      out.exit_code = first_bad_code;
    }
    if (out.exit_code == 0) out.exit_code = 1;
    // Every node decides alike: restarts_used_ came from the verdict.
    out.restartable = all_restartable && (!out.counted || restarts_used_ < opts_.max_restarts);
    if (out.restartable && out.counted) ++restarts_used_;
    return out;
  } catch (const shoal::Error& e) {
    out.ok = false;
    out.restartable = false;
    out.exit_code = 1;
    out.message = "lost the master " + node_name(0) + ": the launchers' rendezvous store at " + addr_ +
                  " is gone (node 0's launcher exited or was killed)";
    out.node = 0;
    return out;
  }
}

void LauncherRendezvous::leave(int round, int exit_code) {
  stop_monitor();
  if (!store_ || master_lost_) return;
  try {
    if (!coordinator_) {
      store_->add(key(round, "left"), 1);
      return;
    }
    // Launchers still waiting to be admitted learn that the job is over.
    store_->set_str(job_key("final"), std::to_string(exit_code));
    int dead = 0;
    for (int n = 1; n < cluster_.nnodes; ++n) {
      if (store_->check({key(round, "dead/" + std::to_string(n))})) ++dead;
    }
    const auto until = Clock::now() + ms(opts_.rdzv_conf.close_timeout);
    while ((store_->add(key(round, "left"), 0) < cluster_.nnodes - 1 - dead || store_->add(job_key("waiters"), 0) > 0) &&
           Clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(20));
    }
  } catch (const shoal::Error&) {
    // Nothing left to coordinate.
  }
}

}  // namespace shoalrun
