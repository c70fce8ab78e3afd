// shoalrun/rendezvous_join.cc — opening the launchers' store and joining a
// round, static or c10d (see rendezvous.h for the protocol).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <map>

#include "address.h"
#include "log.h"
#include "rendezvous.h"
#include "rendezvous_json.h"
#include "shoal/error.h"

namespace shoalrun {

using rdzv::info_from;
using rdzv::info_json;
using rdzv::json;
using rdzv::parse_or_empty;
using rdzv::seconds_text;
using rdzv::who;
using std::chrono::milliseconds;
using std::chrono::seconds;

namespace {

constexpr auto kJoinPoll = milliseconds(50);
// How long a launcher that found the endpoint's port taken waits as a client
// before it tries again to host the store itself.
constexpr auto kHostRetry = milliseconds(500);

milliseconds ms(double s) { return milliseconds(static_cast<int64_t>(s * 1000.0)); }

// The job's secret sealed (under `context`) for the launcher in `slot`, with
// the key it sent, or why that cannot be done, in `*problem`. A launcher
// without a key gets none.
void seal_for(const shoal::auth::Secret& secret, const std::string& context, int64_t slot, const NodeInfo& info,
              json* sealed, std::string* problem) {
  if (info.key.empty()) return;
  try {
    (*sealed)[std::to_string(slot)] = shoal::auth::seal(secret, info.key, context);
  } catch (const shoal::Error& e) {
    *problem = who(info) + " sent no usable key for the job's secret: " + e.what();
  }
}

}  // namespace

LauncherRendezvous::LauncherRendezvous(const Cluster& c, const Options& o, shoal::auth::Secret secret)
    : cluster_(c), opts_(o), min_nnodes_(c.nnodes), secret_(std::move(secret)), user_secret_(!secret_.empty()) {
  addr_ = join_endpoint(c.store_host, c.rdzv_port);
  if (::pipe2(event_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error("pipe failed");
}

LauncherRendezvous::~LauncherRendezvous() {
  stop_monitor();
  ::close(event_pipe_[0]);
  ::close(event_pipe_[1]);
}

std::string LauncherRendezvous::job_key(const std::string& k) const { return "shoalrun/" + opts_.rdzv_id + "/" + k; }

std::string LauncherRendezvous::key(int round, const std::string& k) const {
  return job_key(std::to_string(round) + "/" + k);
}

// What a sealed secret is bound to: this job's store, the round and the slot
// the launcher it is for took in it.
std::string LauncherRendezvous::seal_context(int round, int64_t slot) const {
  return "shoalrun " + addr_ + " job " + opts_.rdzv_id + " round " + std::to_string(round) + " slot " +
         std::to_string(slot);
}

std::string LauncherRendezvous::node_name(int n) const {
  std::string s = "node " + std::to_string(n);
  if (n >= 0 && n < static_cast<int>(hosts_.size()) && !hosts_[n].empty()) s += " (host " + hosts_[n] + ")";
  return s;
}

void LauncherRendezvous::connect(Clock::time_point deadline) {
  if (store_) return;
  open_store(deadline);
  if (coordinator_) {
    store_->set_str("shoalrun/job", opts_.rdzv_id);
    if (secret_.empty()) secret_ = shoal::auth::Secret::random();
    master_port_ = cluster_.master_port_given ? cluster_.master_port : free_port_any();
    if (master_port_ == 0) throw RendezvousError(1, "no free TCP port on this node for the workers' store");
  } else {
    check_job(deadline);
  }
}

void LauncherRendezvous::open_store(Clock::time_point deadline) {
  shoal::TcpStoreOptions so;
  so.host = cluster_.store_host;
  so.port = static_cast<uint16_t>(cluster_.rdzv_port);
  so.timeout = ms(opts_.rdzv_conf.read_timeout);
  so.secret = user_secret_ ? secret_.hex() : std::string();
  so.expected_clients = cluster_.max_nnodes * 2;
  auto left = [&] {
    return std::max(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()), milliseconds(1));
  };
  // Hosting: true once this launcher listens on the endpoint.
  auto host = [&]() -> bool {
    so.is_server = true;
    try {
      store_ = std::make_unique<shoal::TcpStore>(so);
    } catch (const shoal::Error& e) {
      if (!cluster_.host_by_guess) {
        throw RendezvousError(1, "cannot host the launchers' rendezvous store on " + addr_ + ": " + e.what() +
                                     " (another job on this port? choose another port)");
      }
      if (!told_taken_) {
        vlog("the rendezvous port " + addr_ + " is taken on this machine: joining as a client (" + e.what() + ")");
        told_taken_ = true;
      }
      return false;
    }
    coordinator_ = true;
    vlog("hosting the launchers' rendezvous store on " + addr_ + " (job " + opts_.rdzv_id + ")");
    return true;
  };
  if (cluster_.host_store && host()) return;
  so.is_server = false;
  try {
    if (cluster_.host_store) {
      // As torchrun: another launcher on this machine hosts it already. But
      // the port may be held by something that does not listen (a socket of
      // another process bound to it for a moment): while no one answers, try
      // again to host it, so that the launchers here never all wait as clients.
      for (;;) {
        so.connect_timeout = std::min(left(), kHostRetry);
        try {
          store_ = std::make_unique<shoal::TcpStore>(so);
          break;
        } catch (const shoal::TimeoutError&) {
          if (Clock::now() >= deadline) throw;
        }
        if (host()) return;
        so.is_server = false;
      }
    } else {
      so.connect_timeout = left();
      store_ = std::make_unique<shoal::TcpStore>(so);
    }
  } catch (const shoal::TimeoutError& e) {
    throw RendezvousError(1, "rendezvous timed out after " + seconds_text(opts_.rdzv_timeout_s) +
                                 ": no launcher hosts the rendezvous store at " + addr_ + " (" +
                                 (cluster_.c10d() ? "the launcher on the host of " + cluster_.store_origin
                                                  : std::string("node 0")) +
                                 " never arrived" +
                                 (told_taken_ ? "; something on this machine holds the port but does not answer"
                                              : std::string()) +
                                 ")");
  } catch (const shoal::Error& e) {
    throw RendezvousError(1, std::string("cannot reach the launchers' rendezvous store at ") + addr_ + ": " +
                                 e.what());
  }
  vlog("connected to the launchers' rendezvous store at " + addr_);
}

void LauncherRendezvous::check_job(Clock::time_point deadline) {
  // The host writes its job id right after opening the store.
  while (!store_->check({"shoalrun/job"})) {
    if (Clock::now() >= deadline) {
      throw RendezvousError(1, "the store at " + addr_ + " never said which job it serves (is it a shoalrun's?)");
    }
    std::this_thread::sleep_for(kJoinPoll);
  }
  const std::string theirs = store_->get_str("shoalrun/job");
  if (theirs != opts_.rdzv_id) {
    throw RendezvousError(2, "the rendezvous store at " + addr_ + " serves job '" + theirs +
                                 "', but this launcher was started for job '" + opts_.rdzv_id + "' (" +
                                 opts_.named("rdzv_id") + "); two jobs cannot share an endpoint: give each its own port");
  }
}

Assignment LauncherRendezvous::join(int round, const NodeInfo& me_in, Clock::time_point deadline) {
  try {
    connect(deadline);
    NodeInfo me = me_in;
    if (secret_.empty()) {  // the coordinator seals the job's secret to this key
      if (!recipient_) recipient_ = std::make_unique<shoal::auth::Recipient>();
      me.key = recipient_->public_hex();
    }
    Assignment a;
    if (!cluster_.c10d()) {
      join_static(round, me, deadline, &a);
    } else {
      int r = (coordinator_ || joined_once_) ? round : wait_for_open_round(-1, deadline);
      while (!join_c10d(r, me, deadline, &a)) r = wait_for_open_round(r, deadline);
    }
    joined_once_ = true;
    hosts_ = a.hosts;
    restarts_used_ = a.restarts_used;
    cluster_.node_rank = a.node_rank;
    cluster_.nnodes = a.nnodes;
    cluster_.master_addr = a.master_addr;
    cluster_.master_port = a.master_port;
    cluster_.hosts = a.hosts;
    return a;
  } catch (const shoal::StoreError& e) {
    throw RendezvousError(1, "lost the launchers' rendezvous store at " + addr_ + " during the rendezvous: " +
                                 e.what());
  } catch (const shoal::TimeoutError& e) {
    throw RendezvousError(1, std::string("the launchers' rendezvous store at " + addr_ + " stopped answering: ") +
                                 e.what());
  }
}

std::string LauncherRendezvous::agreement_problem(const std::vector<NodeInfo>& infos, const NodeInfo& me) const {
  for (const auto& i : infos) {
    if (i.nnodes != me.nnodes || i.max_nnodes != me.max_nnodes || (!cluster_.c10d() && i.node >= me.nnodes)) {
      auto count = [](const NodeInfo& n) {
        std::string t = std::to_string(n.nnodes);
        if (n.max_nnodes != n.nnodes) t.append(1, ':').append(std::to_string(n.max_nnodes));
        return t;
      };
      return who(i) + " was started for " + count(i) + " nodes but " + who(me) + " for " + count(me) +
             " (check --nnodes / the cluster description on every node)";
    }
    if (i.nproc != me.nproc) {
      return who(i) + " has --nproc-per-node " + std::to_string(i.nproc) + " but " + who(me) + " has " +
             std::to_string(me.nproc) + "; every node must run the same number of workers";
    }
    if (i.max_restarts != me.max_restarts) {
      return who(i) + " has --max-restarts " + std::to_string(i.max_restarts) + " but " + who(me) + " has " +
             std::to_string(me.max_restarts) + "; every node must use the same value";
    }
  }
  return "";
}

bool LauncherRendezvous::join_static(int round, const NodeInfo& me, Clock::time_point deadline, Assignment* out) {
  shoal::TcpStore& s = *store_;
  const int nnodes = cluster_.nnodes;
  const std::string node_key = key(round, "node/" + std::to_string(me.node));
  if (s.add(key(round, "claim/" + std::to_string(me.node)), 1) > 1) {
    std::string other = "another launcher";
    if (s.check({node_key})) other = who(info_from(parse_or_empty(s.get_str(node_key))));
    const std::string msg = "node rank " + std::to_string(me.node) + " was given to two launchers: " + other +
                            " and host " + me.host + ", pid " + std::to_string(me.pid) +
                            " (check --node-rank on every node)";
    if (!s.check({key(round, "verdict")})) {
      s.set_str(key(round, "verdict"), json{{"ok", false}, {"code", 2}, {"message", msg}}.dump());
    }
    throw RendezvousError(2, msg);
  }
  s.set_str(node_key, info_json(me).dump());
  const int64_t slot = s.add(key(round, "njoined"), 1) - 1;
  s.set_str(key(round, "joined/" + std::to_string(slot)), std::to_string(me.node));
  vlog("joined the rendezvous at " + addr_ + " as node " + std::to_string(me.node) + " (round " +
       std::to_string(round) + ")");

  if (coordinator_) {
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
                     {"message", "rendezvous timed out after " + seconds_text(opts_.rdzv_timeout_s) + ": node" +
                                     (n_missing == 1 ? " " : "s ") + missing + " of " + std::to_string(nnodes) +
                                     " never arrived at " + addr_ + " (arrived: " + arrived + ")"}};
    } else {
      std::vector<NodeInfo> infos;
      std::map<int64_t, NodeInfo> by_slot;
      for (int64_t i = 0; i < count; ++i) {
        const int n = std::stoi(s.get_str(key(round, "joined/" + std::to_string(i))));
        infos.push_back(info_from(parse_or_empty(s.get_str(key(round, "node/" + std::to_string(n))))));
        by_slot[i] = infos.back();
      }
      std::string problem = agreement_problem(infos, me);
      json sealed = json::object();
      for (const auto& [i, info] : by_slot) {
        if (problem.empty()) seal_for(secret_, seal_context(round, i), i, info, &sealed, &problem);
      }
      if (!problem.empty()) {
        verdict = json{{"ok", false}, {"code", 2}, {"message", problem}};
      } else {
        std::vector<std::string> hosts(nnodes);
        for (const auto& i : infos) hosts[i.node] = i.host;
        verdict = json{{"ok", true},      {"nnodes", nnodes},
                       {"hosts", hosts},  {"secrets", sealed},
                       {"restarts_used", restarts_used_}};
      }
    }
    if (!verdict.is_null()) s.set_str(key(round, "verdict"), verdict.dump());
  }
  bool admitted = true;
  read_verdict(round, slot, me, deadline, out, &admitted);
  out->node_rank = me.node;
  out->master_addr = cluster_.master_addr;
  out->master_port = cluster_.master_port;
  return true;
}

int LauncherRendezvous::wait_for_open_round(int not_admitted_to, Clock::time_point deadline) {
  shoal::TcpStore& s = *store_;
  int waiting_on = -1;  // the running round whose coordinator knows this launcher waits
  bool said = false;
  // Counted while it waits, so that the coordinator's leave() lets it read the end.
  s.add(job_key("waiters"), 1);
  struct Uncount {
    shoal::TcpStore& s;
    std::string key;
    ~Uncount() {
      try {
        s.add(key, -1);
      } catch (const shoal::Error&) {
      }
    }
  } uncount{s, job_key("waiters")};
  while (true) {
    if (s.check({job_key("final")})) {
      const int code = std::stoi(s.get_str(job_key("final")));
      throw RendezvousError(code, std::string("the job ended (") + (code == 0 ? "successfully" : "exit code " +
                                  std::to_string(code)) + ") before this launcher was admitted to it");
    }
    if (s.check({job_key("round")})) {
      const int r = std::stoi(s.get_str(job_key("round")));
      const bool closed = s.check({key(r, "verdict")});
      if (r > not_admitted_to && !closed) return r;
      if (waiting_on != r) {
        // The job runs round r without this launcher: ask for a place.
        s.add(key(r, "waiting"), 1);
        waiting_on = r;
        if (!said) {
          log("the job is running without this node (round " + std::to_string(r) +
              " is closed); waiting to be admitted at its next restart");
          said = true;
        }
      }
    }
    if (Clock::now() >= deadline) {
      throw RendezvousError(1, "rendezvous timed out after " + seconds_text(opts_.rdzv_timeout_s) +
                                   ": the job at " + addr_ + " did not admit this launcher (it runs with as many "
                                   "nodes as --nnodes allows, or did not restart)");
    }
    std::this_thread::sleep_for(kJoinPoll);
  }
}

bool LauncherRendezvous::join_c10d(int round, const NodeInfo& me, Clock::time_point deadline, Assignment* out) {
  shoal::TcpStore& s = *store_;
  if (coordinator_) s.set_str(job_key("round"), std::to_string(round));
  const int64_t slot = s.add(key(round, "njoined"), 1) - 1;
  s.set_str(key(round, "joined/" + std::to_string(slot)), info_json(me).dump());
  vlog("joined the rendezvous at " + addr_ + " (round " + std::to_string(round) + ", slot " + std::to_string(slot) +
       ")");

  if (coordinator_) {
    const int min_nodes = min_nnodes_, max_nodes = cluster_.max_nnodes;
    auto joined = [&] { return s.add(key(round, "njoined"), 0); };
    while (joined() < min_nodes && Clock::now() < deadline) std::this_thread::sleep_for(kJoinPoll);
    json verdict;
    int64_t count = joined();
    if (count < min_nodes) {
      verdict = json{{"ok", false},
                     {"code", 1},
                     {"message", "rendezvous timed out after " + seconds_text(opts_.rdzv_timeout_s) + ": " +
                                     std::to_string(count) + " of at least " + std::to_string(min_nodes) +
                                     " nodes arrived at " + addr_}};
    } else {
      // The last call: more nodes may come, up to MAX.
      const auto last_call = Clock::now() + ms(opts_.rdzv_conf.last_call_timeout);
      if (count < max_nodes) {
        vlog(std::to_string(count) + (count == 1 ? " node is" : " nodes are") + " in; waiting up to " +
             seconds_text(opts_.rdzv_conf.last_call_timeout) + " for more (at most " + std::to_string(max_nodes) +
             ")");
      }
      while ((count = joined()) < max_nodes && Clock::now() < last_call) std::this_thread::sleep_for(kJoinPoll);
      // This launcher first, then the others in the order they came.
      std::vector<std::pair<int64_t, NodeInfo>> nodes = {{slot, me}};
      for (int64_t i = 0; i < count && static_cast<int>(nodes.size()) < max_nodes; ++i) {
        const std::string k = key(round, "joined/" + std::to_string(i));
        if (i == slot) continue;
        try {
          s.wait({k}, milliseconds(2000));
        } catch (const shoal::TimeoutError&) {
          continue;  // took a slot and vanished before describing itself
        }
        nodes.emplace_back(i, info_from(parse_or_empty(s.get_str(k))));
      }
      std::vector<NodeInfo> infos;
      for (const auto& [i, info] : nodes) infos.push_back(info);
      std::string problem = agreement_problem(infos, me);
      json ranks = json::object(), sealed = json::object();
      std::vector<std::string> hosts;
      for (size_t rank = 0; rank < nodes.size() && problem.empty(); ++rank) {
        const auto& [i, info] = nodes[rank];
        ranks[std::to_string(i)] = rank;
        hosts.push_back(info.host);
        seal_for(secret_, seal_context(round, i), i, info, &sealed, &problem);
      }
      if (!problem.empty()) {
        verdict = json{{"ok", false}, {"code", 2}, {"message", problem}};
      } else {
        verdict = json{{"ok", true},
                       {"nnodes", nodes.size()},
                       {"ranks", ranks},
                       {"hosts", hosts},
                       {"master_addr", cluster_.advertise},
                       {"master_port", master_port_},
                       {"restarts_used", restarts_used_},
                       {"secrets", sealed}};
      }
    }
    s.set_str(key(round, "verdict"), verdict.dump());
  }
  bool admitted = true;
  read_verdict(round, slot, me, deadline + ms(opts_.rdzv_conf.last_call_timeout), out, &admitted);
  return admitted;
}

void LauncherRendezvous::read_verdict(int round, int64_t slot, const NodeInfo& me, Clock::time_point deadline,
                                      Assignment* out, bool* admitted) {
  shoal::TcpStore& s = *store_;
  // Non-coordinators allow the coordinator a little longer, so that its
  // message (naming the missing nodes) wins.
  const auto my_deadline = coordinator_ ? deadline + seconds(1) : deadline + seconds(5);
  while (!s.check({key(round, "verdict")})) {
    if (Clock::now() >= my_deadline) {
      throw RendezvousError(1, "rendezvous timed out after " + seconds_text(opts_.rdzv_timeout_s) +
                                   " waiting for the launcher hosting " + addr_ + " to admit every node");
    }
    std::this_thread::sleep_for(kJoinPoll);
  }
  const json v = parse_or_empty(s.get_str(key(round, "verdict")));
  if (!coordinator_) {
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
  const std::string mine = std::to_string(slot);
  out->round = round;
  out->nnodes = v.value("nnodes", 0);
  out->hosts = v.value("hosts", std::vector<std::string>());
  out->restarts_used = v.value("restarts_used", 0);
  if (cluster_.c10d()) {
    const json ranks = v.value("ranks", json::object());
    if (!ranks.contains(mine)) {
      *admitted = false;
      vlog("not admitted to round " + std::to_string(round) + " (" + std::to_string(out->nnodes) +
           " nodes came first)");
      return;
    }
    out->node_rank = ranks[mine].get<int>();
    out->master_addr = v.value("master_addr", std::string());
    out->master_port = v.value("master_port", 0);
  } else if (out->nnodes != me.nnodes) {
    throw RendezvousError(2, who(me) + " was started for " + std::to_string(me.nnodes) + " nodes but node 0 for " +
                                 std::to_string(out->nnodes));
  }
  if (secret_.empty()) {
    const json sealed = v.value("secrets", json::object());
    if (!sealed.is_object() || !sealed.contains(mine) || !sealed[mine].is_string()) {
      throw RendezvousError(2, "node 0 did not hand this node the job's secret (does node 0 have a "
                               "--secret-file or SHOAL_SECRET that this node lacks?)");
    }
    try {
      secret_ = recipient_->open(sealed[mine].get<std::string>(), seal_context(round, slot));
    } catch (const shoal::Error& e) {
      throw RendezvousError(1, std::string("the job's secret from node 0 cannot be opened: ") + e.what());
    }
    recipient_.reset();
    vlog("received the job's secret from node 0 (sealed to this launcher's key)");
  }
}

}  // namespace shoalrun
