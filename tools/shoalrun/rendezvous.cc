// shoalrun/rendezvous.cc — see rendezvous.h for the protocol.
#include "rendezvous.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "log.h"
#include "process.h"
#include "shoal/error.h"

namespace shoalrun {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr auto kJoinPoll = milliseconds(50);
constexpr auto kMonitorTick = milliseconds(250);
constexpr auto kHeartbeatEvery = seconds(1);
constexpr auto kScanEvery = milliseconds(250);
constexpr auto kLostAfter = seconds(3);
constexpr auto kMonitorOpTimeout = seconds(2);  // one monitor call to the store
constexpr auto kMasterSilence = seconds(3);      // no answer from node 0's store for this long: it is lost
constexpr auto kLeaveWait = seconds(10);
constexpr auto kOpTimeout = seconds(10);

std::string to_text(const shoal::Bytes& b) { return std::string(b.begin(), b.end()); }

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", s);
  return buf;
}

json info_json(const NodeInfo& i) {
  return json{{"node", i.node}, {"host", i.host}, {"nnodes", i.nnodes}, {"nproc", i.nproc},
              {"max_restarts", i.max_restarts}, {"pid", i.pid}, {"key", i.key}};
}

NodeInfo info_from(const json& j) {
  NodeInfo i;
  i.node = j.value("node", -1);
  i.host = j.value("host", std::string());
  i.nnodes = j.value("nnodes", 0);
  i.nproc = j.value("nproc", 0);
  i.max_restarts = j.value("max_restarts", 0);
  i.pid = j.value("pid", 0);
  i.key = j.value("key", std::string());
  return i;
}

std::string who(const NodeInfo& i) {
  return "node " + std::to_string(i.node) + " (host " + i.host + ", pid " + std::to_string(i.pid) + ")";
}

json parse_or_empty(const std::string& text) {
  try {
    return json::parse(text);
  } catch (const json::exception&) {
    return json::object();
  }
}

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

LauncherRendezvous::LauncherRendezvous(const Cluster& c, const Options& o, shoal::auth::Secret secret)
    : cluster_(c), opts_(o), secret_(std::move(secret)), user_secret_(!secret_.empty()) {
  const bool v6 = c.master_addr.find(':') != std::string::npos;
  addr_ = (v6 ? "[" + c.master_addr + "]" : c.master_addr) + ":" + std::to_string(c.rdzv_port);
  if (secret_.empty() && c.node_rank == 0) secret_ = shoal::auth::Secret::random();
  if (::pipe2(event_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error("pipe failed");
}

LauncherRendezvous::~LauncherRendezvous() {
  stop_monitor();
  ::close(event_pipe_[0]);
  ::close(event_pipe_[1]);
}

std::string LauncherRendezvous::key(int round, const std::string& k) const {
  return "shoalrun/" + std::to_string(round) + "/" + k;
}

// What a sealed secret is bound to: this job's store and the node it is for.
std::string LauncherRendezvous::seal_context(int node) const {
  return "shoalrun " + addr_ + " node " + std::to_string(node);
}

std::string LauncherRendezvous::node_name(int n) const {
  std::string s = "node " + std::to_string(n);
  if (n >= 0 && n < static_cast<int>(hosts_.size()) && !hosts_[n].empty()) s += " (host " + hosts_[n] + ")";
  return s;
}

void LauncherRendezvous::connect(Clock::time_point deadline) {
  if (store_) return;
  shoal::TcpStoreOptions so;
  so.host = cluster_.master_addr;
  so.port = static_cast<uint16_t>(cluster_.rdzv_port);
  so.timeout = kOpTimeout;
  so.secret = user_secret_ ? secret_.hex() : std::string();
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
  so.connect_timeout = std::max(left, milliseconds(1));
  if (cluster_.node_rank == 0) {
    so.is_server = true;
    so.expected_clients = cluster_.nnodes * 2;
    try {
      store_ = std::make_unique<shoal::TcpStore>(so);
    } catch (const shoal::Error& e) {
      throw RendezvousError(1, "cannot host the launchers' rendezvous store on " + addr_ + ": " + e.what() +
                                   " (another job on this port? choose --master-port/--rdzv-port)");
    }
    vlog("hosting the launchers' rendezvous store on " + addr_);
    return;
  }
  try {
    store_ = std::make_unique<shoal::TcpStore>(so);
  } catch (const shoal::TimeoutError& e) {
    throw RendezvousError(1, "rendezvous timed out after " + seconds_text(opts_.rdzv_timeout_s) +
                                 ": node 0 never arrived (no launcher rendezvous store at " + addr_ + ")");
  } catch (const shoal::Error& e) {
    throw RendezvousError(1, std::string("cannot reach the launchers' rendezvous store on node 0 at ") + addr_ +
                                 ": " + e.what());
  }
  vlog("connected to the launchers' rendezvous store at " + addr_);
}

void LauncherRendezvous::join(int round, const NodeInfo& me_in, Clock::time_point deadline) {
  connect(deadline);
  NodeInfo me = me_in;
  if (secret_.empty()) {  // node 0 seals the job's secret to this key
    if (!recipient_) recipient_ = std::make_unique<shoal::auth::Recipient>();
    me.key = recipient_->public_hex();
  }
  shoal::TcpStore& s = *store_;
  const int nnodes = cluster_.nnodes;
  const std::string rdzv_timeout = seconds_text(opts_.rdzv_timeout_s);
  try {
    if (s.add(key(round, "claim/" + std::to_string(me.node)), 1) > 1) {
      std::string other = "another launcher";
      if (s.check({key(round, "node/" + std::to_string(me.node))})) {
        other = who(info_from(parse_or_empty(s.get_str(key(round, "node/" + std::to_string(me.node))))));
      }
      const std::string msg = "node rank " + std::to_string(me.node) + " was given to two launchers: " + other +
                              " and host " + me.host + ", pid " + std::to_string(me.pid) +
                              " (check --node-rank on every node)";
      if (!s.check({key(round, "verdict")})) {
        s.set_str(key(round, "verdict"), json{{"ok", false}, {"code", 2}, {"message", msg}}.dump());
      }
      throw RendezvousError(2, msg);
    }
    s.set_str(key(round, "node/" + std::to_string(me.node)), info_json(me).dump());
    const int64_t idx = s.add(key(round, "njoined"), 1) - 1;
    s.set_str(key(round, "joined/" + std::to_string(idx)), std::to_string(me.node));
    vlog("joined the rendezvous at " + addr_ + " as node " + std::to_string(me.node) + " (round " +
         std::to_string(round) + ")");

    if (cluster_.node_rank == 0) {
      int64_t count = 0;
      while ((count = s.add(key(round, "njoined"), 0)) < nnodes && Clock::now() < deadline &&
             !s.check({key(round, "verdict")})) {
        std::this_thread::sleep_for(kJoinPoll);
      }
      json verdict;
      if (s.check({key(round, "verdict")})) {
        // A duplicate node rank already decided.
      } else if (count < nnodes) {
        std::string missing, arrived;
        int n_missing = 0;
        for (int n = 0; n < nnodes; ++n) {
          const bool here = s.check({key(round, "node/" + std::to_string(n))});
          std::string& list = here ? arrived : missing;
          list += (list.empty() ? "" : ", ") + std::to_string(n);
          if (!here) ++n_missing;
        }
        verdict = json{{"ok", false},
                       {"code", 1},
                       {"message", "rendezvous timed out after " + rdzv_timeout + ": node" +
                                       (n_missing == 1 ? " " : "s ") + missing + " of " + std::to_string(nnodes) +
                                       " never arrived at " + addr_ + " (arrived: " + arrived + ")"}};
      } else {
        std::vector<NodeInfo> infos;
        for (int64_t i = 0; i < count; ++i) {
          const int n = std::stoi(s.get_str(key(round, "joined/" + std::to_string(i))));
          infos.push_back(info_from(parse_or_empty(s.get_str(key(round, "node/" + std::to_string(n))))));
        }
        std::string problem;
        for (const auto& i : infos) {
          if (!problem.empty()) break;
          if (i.nnodes != me.nnodes || i.node >= nnodes) {
            problem = who(i) + " was started for " + std::to_string(i.nnodes) + " nodes but " + who(me) + " for " +
                      std::to_string(me.nnodes) + " (check --nnodes / the cluster description on every node)";
          } else if (i.nproc != me.nproc) {
            problem = who(i) + " has --nproc-per-node " + std::to_string(i.nproc) + " but " + who(me) + " has " +
                      std::to_string(me.nproc) + "; every node must run the same number of workers";
          } else if (i.max_restarts != me.max_restarts) {
            problem = who(i) + " has --max-restarts " + std::to_string(i.max_restarts) + " but " + who(me) +
                      " has " + std::to_string(me.max_restarts) + "; every node must use the same value";
          }
        }
        json sealed = json::object();
        for (const auto& i : infos) {
          if (!problem.empty() || i.key.empty()) continue;
          try {
            sealed[std::to_string(i.node)] = shoal::auth::seal(secret_, i.key, seal_context(i.node));
          } catch (const shoal::Error& e) {
            problem = who(i) + " sent no usable key for the job's secret: " + e.what();
          }
        }
        if (!problem.empty()) {
          verdict = json{{"ok", false}, {"code", 2}, {"message", problem}};
        } else {
          std::vector<std::string> hosts(nnodes);
          for (const auto& i : infos) hosts[i.node] = i.host;
          verdict = json{{"ok", true}, {"nnodes", nnodes}, {"nproc", me.nproc}, {"hosts", hosts},
                         {"secrets", sealed}};
        }
      }
      if (!verdict.is_null()) s.set_str(key(round, "verdict"), verdict.dump());
    }

    // Everyone (node 0 included) reads the verdict. Non-masters allow node 0
    // a little longer, so that its message (naming the missing nodes) wins.
    const auto my_deadline = cluster_.node_rank == 0 ? deadline + seconds(1) : deadline + seconds(5);
    while (!s.check({key(round, "verdict")})) {
      if (Clock::now() >= my_deadline) {
        throw RendezvousError(1, "rendezvous timed out after " + rdzv_timeout + " waiting for node 0 at " + addr_ +
                                     " to admit every node");
      }
      std::this_thread::sleep_for(kJoinPoll);
    }
    const json v = parse_or_empty(s.get_str(key(round, "verdict")));
    if (cluster_.node_rank != 0) {
      s.add(key(round, "verdict_seen"), 1);
    } else if (!v.value("ok", false)) {
      // Keep the store up until the others have read why.
      const int64_t joined = s.add(key(round, "njoined"), 0);
      const auto until = Clock::now() + seconds(5);
      while (s.add(key(round, "verdict_seen"), 0) < joined - 1 && Clock::now() < until) {
        std::this_thread::sleep_for(kJoinPoll);
      }
    }
    if (!v.value("ok", false)) {
      throw RendezvousError(v.value("code", 1), v.value("message", std::string("the rendezvous failed")));
    }
    if (v.value("nnodes", 0) != me.nnodes) {
      throw RendezvousError(2, who(me) + " was started for " + std::to_string(me.nnodes) + " nodes but node 0 for " +
                                   std::to_string(v.value("nnodes", 0)));
    }
    hosts_ = v.value("hosts", std::vector<std::string>());
    if (secret_.empty()) {
      const json sealed = v.value("secrets", json::object());
      const std::string mine = std::to_string(me.node);
      if (!sealed.is_object() || !sealed.contains(mine) || !sealed[mine].is_string()) {
        throw RendezvousError(2, "node 0 did not hand this node the job's secret (does node 0 have a "
                                 "--secret-file or SHOAL_SECRET that this node lacks?)");
      }
      try {
        secret_ = recipient_->open(sealed[mine].get<std::string>(), seal_context(me.node));
      } catch (const shoal::Error& e) {
        throw RendezvousError(1, std::string("the job's secret from node 0 cannot be opened: ") + e.what());
      }
      recipient_.reset();
      vlog("received the job's secret from node 0 (sealed to this launcher's key)");
    }
  } catch (const shoal::StoreError& e) {
    throw RendezvousError(1, "lost the launchers' rendezvous store on node 0 at " + addr_ + " during the rendezvous: " +
                                 e.what());
  } catch (const shoal::TimeoutError& e) {
    throw RendezvousError(1, std::string("the launchers' rendezvous store on node 0 stopped answering: ") + e.what());
  }
}

void LauncherRendezvous::start_monitor(int round) {
  stop_monitor();
  shoal::TcpStoreOptions so;
  so.host = cluster_.master_addr;
  so.port = static_cast<uint16_t>(cluster_.rdzv_port);
  so.timeout = kMonitorOpTimeout;
  so.connect_timeout = kMonitorOpTimeout;
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
    ev.kind = j.value("kind", std::string()) == "lost" ? RemoteEvent::Kind::kNodeLost : RemoteEvent::Kind::kNodeFailed;
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
  const bool master = me == 0;
  auto next_hb = Clock::now();
  auto next_scan = Clock::now() + kScanEvery;
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
                   {"restartable", false}}
                  .dump());
    s.add(key(round, "nsettled"), 1);
    vlog("declared " + node_name(n) + " lost: " + msg);
  };

  while (true) {
    const auto now = Clock::now();
    try {
      if (now >= next_hb) {
        s.add(key(round, "hb/" + std::to_string(me)), 1);
        next_hb = now + kHeartbeatEvery;
      }
      const int64_t nfailed = s.add(key(round, "nfailed"), 0);
      if (!failure_posted && nfailed > 0) {
        // (A failure announced but not yet written is seen on a later tick.)
        if (auto ev = read_first_failure(s, round, nfailed)) {
          failure_posted = true;
          if (ev->node != me) post(*ev);
        }
      }
      if (master && now >= next_scan) {
        next_scan = now + kScanEvery;
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
          } else if (now - last_change[n] > kLostAfter) {
            declare_lost(n, now);
          }
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
      if (!master && Clock::now() - last_ok > kMasterSilence) {
        post(RemoteEvent{RemoteEvent::Kind::kMasterLost, 0, hosts_.empty() ? "" : hosts_[0],
                         "the launchers' rendezvous store at " + addr_ + " stopped answering (" + e.what() + ")", 1,
                         false});
        return;
      }
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, kMonitorTick, [this] { return stop_; })) return;
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
        all_ok = all_restartable = false;
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
      all_restartable = all_restartable && ev.restartable;
    } else {
      out.message = first_bad;
      out.exit_code = first_bad_code;
    }
    if (out.exit_code == 0) out.exit_code = 1;
    out.restartable = all_restartable && round < opts_.max_restarts;
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

void LauncherRendezvous::leave(int round) {
  stop_monitor();
  if (!store_) return;
  try {
    if (cluster_.node_rank != 0) {
      store_->add(key(round, "left"), 1);
      return;
    }
    int dead = 0;
    for (int n = 1; n < cluster_.nnodes; ++n) {
      if (store_->check({key(round, "dead/" + std::to_string(n))})) ++dead;
    }
    const auto until = Clock::now() + kLeaveWait;
    while (store_->add(key(round, "left"), 0) < cluster_.nnodes - 1 - dead && Clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(20));
    }
  } catch (const shoal::Error&) {
    // Nothing left to coordinate.
  }
}

}  // namespace shoalrun
