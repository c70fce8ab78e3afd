// core/liveness.cc — the communicator's JobLiveness (liveness.h): peers'
// addresses and processes, a lost connection turned into the job-wide
// cause, the cause another rank published, the roll call at a timeout, and
// operations issued in different orders across a family.
#include "core/liveness.h"

#include <cstdio>
#include <sstream>
#include <thread>

#include "collectives/registry.h"
#include "common/process.h"
#include "core/communicator_impl.h"
#include "core/errors.h"

namespace shoal::core {

using transport::Clock;

std::string describe_fingerprint(const transport::Fingerprint& fp) {
  using coll::Coll;
  const Coll c = static_cast<Coll>(fp.coll);
  std::ostringstream o;
  o << coll::coll_name(c) << "(count=" << fp.count << ", " << dtype_name(static_cast<DataType>(fp.dtype));
  if (coll::is_reducing(c)) o << ", " << reduce_op_name(static_cast<ReduceOp>(fp.op));
  if (coll::is_rooted(c)) {
    o << ", root=" << fp.root;
  }
  if (const coll::Algorithm* algo = coll::algorithm_by_id(fp.algo)) o << ", algorithm " << algo->name;
  o << ")";
  return o.str();
}

JobLiveness::JobLiveness(CommunicatorImpl& c) : c_(c), roll_call_(c.store_, c.rank_, c.size_) {}

bool JobLiveness::is_root() const { return c_.root_ == &c_; }
JobLiveness& JobLiveness::root() const { return *c_.root_->live_; }
int JobLiveness::to_wire(int peer) const { return c_.view_.to_wire(peer); }

transport::PeerAddress JobLiveness::address(int peer) {
  if (!is_root()) return root().address(to_wire(peer));
  {
    MutexLock g(mu_);
    if (addresses_.empty()) addresses_.resize(static_cast<size_t>(c_.size_));
    if (!addresses_[static_cast<size_t>(peer)].host.empty()) return addresses_[static_cast<size_t>(peer)];
  }
  const std::string key = "addr/" + std::to_string(peer);
  wait_published(peer, key);
  std::istringstream in(c_.store_->get_str(key));
  transport::PeerAddress a;
  in >> a.host >> a.port >> a.hostname >> a.host_id >> a.process;
  MutexLock g(mu_);
  addresses_[static_cast<size_t>(peer)] = a;
  return a;
}

std::string JobLiveness::name(int peer) {
  if (!is_root()) return root().name(to_wire(peer));
  return c_.rank_name(peer);
}

bool JobLiveness::is_local(int peer) {
  if (!is_root()) return root().is_local(to_wire(peer));
  return (peer == c_.rank_ ? c_.host_.id : address(peer).host_id) == c_.host_.id;
}

// A peer whose process on this machine has exited, though no socket of ours
// to it said so (it died before connecting to this rank): lost.
std::string JobLiveness::process_token(int peer) {
  std::string token;
  {
    MutexLock g(mu_);
    if (processes_.empty()) processes_.resize(static_cast<size_t>(c_.size_));
    token = processes_[static_cast<size_t>(peer)];
  }
  if (token.empty()) {
    try {
      token = address(peer).process;
    } catch (const Error&) {
      return "-";  // the store is gone (check_abort's business): asked again next time
    }
    if (token.empty()) token.assign(1, '-');  // not probeable; do not ask again ("= "-"" draws GCC 12's -Wrestrict)
    MutexLock g(mu_);
    processes_[static_cast<size_t>(peer)] = token;
  }
  return token;
}

int64_t JobLiveness::local_pid(int peer) {
  if (!is_root()) return root().local_pid(to_wire(peer));
  const std::string token = process_token(peer);
  return token == "-" ? 0 : proc::local_pid(token);
}

// A peer publishes its address (and rank 0 the communicator's id and
// secret) when it makes the communicator. One that died first never will:
// when its process is known (seed_processes: the same processes as an
// earlier communicator), ask after it while waiting.
void JobLiveness::wait_published(int peer, const std::string& key) {
  std::string known;
  {
    MutexLock g(mu_);
    if (!processes_.empty()) known = processes_[static_cast<size_t>(peer)];
  }
  if (known.empty() || known == "-") return;  // the caller's get waits as the store does
  const auto until = Clock::now() + c_.store_->timeout();
  for (int poll = 0; !c_.store_->check({key}); ++poll) {
    if (proc::probe(known) == proc::Liveness::kGone) {
      std::rethrow_exception(lost_error("peer lost: " + c_.rank_name(peer) + ": its process (pid " +
                                            proc::pid_of(known) + " on this machine) has exited before it joined this "
                                            "communicator",
                                        peer));
    }
    if (Clock::now() > until) return;  // the caller's get says what the store says
    std::this_thread::sleep_for(std::chrono::milliseconds(poll < 50 ? 2 : 20));  // polling the store
  }
}

void JobLiveness::wait_all_published(const std::string& key) {
  if (!is_root()) return;  // (a group's ranks are seeded through the root only)
  std::vector<int> ranks;
  std::vector<std::string> known;
  {
    MutexLock g(mu_);
    for (size_t r = 0; r < processes_.size(); ++r) {
      if (processes_[r].empty() || processes_[r] == "-" || static_cast<int>(r) == c_.rank_) continue;
      ranks.push_back(static_cast<int>(r));
      known.push_back(processes_[r]);
    }
  }
  if (ranks.empty()) return;  // the caller's get waits as the store does
  const auto until = Clock::now() + c_.store_->timeout();
  for (int poll = 0; !c_.store_->check({key}); ++poll) {
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (proc::probe(known[i]) != proc::Liveness::kGone) continue;
      std::rethrow_exception(lost_error("peer lost: " + c_.rank_name(ranks[i]) + ": its process (pid " +
                                            proc::pid_of(known[i]) + " on this machine) has exited before every "
                                            "rank joined this communicator",
                                        ranks[i]));
    }
    if (Clock::now() > until) return;  // the caller's get says what the store says
    std::this_thread::sleep_for(std::chrono::milliseconds(poll < 50 ? 2 : 20));  // polling the store
  }
}

void JobLiveness::learned_process(int peer, const std::string& token) {
  if (!is_root()) return root().learned_process(to_wire(peer), token);
  if (token.empty() || peer < 0 || peer >= c_.size_) return;
  MutexLock g(mu_);
  if (processes_.empty()) processes_.resize(static_cast<size_t>(c_.size_));
  if (processes_[static_cast<size_t>(peer)].empty()) processes_[static_cast<size_t>(peer)] = token;
}

void JobLiveness::seed_processes(const std::vector<std::string>& tokens) {
  MutexLock g(mu_);
  if (processes_.empty()) processes_.resize(static_cast<size_t>(c_.size_));
  for (size_t i = 0; i < tokens.size() && i < processes_.size(); ++i) {
    if (!tokens[i].empty() && tokens[i] != "-") processes_[i] = tokens[i];
  }
}

std::string JobLiveness::process_of(int peer) { return process_token(peer); }

std::exception_ptr JobLiveness::peer_gone(int peer) {
  if (!is_root()) return root().peer_gone(to_wire(peer));
  const std::string token = process_token(peer);
  if (proc::probe(token == "-" ? "" : token) != proc::Liveness::kGone) return nullptr;
  return lost(peer, c_.hybrid_->describe_peer(peer),
              "its process (pid " + proc::pid_of(token) + " on this machine) has exited");
}

bool JobLiveness::process_gone(int peer) {
  if (!is_root()) return root().process_gone(to_wire(peer));
  const std::string token = process_token(peer);
  return token != "-" && proc::probe(token) == proc::Liveness::kGone;
}

// A wait reached its deadline: call the roll, so that the error names the
// ranks the job waits for (roll_call.h), not just the peer this rank waited
// for, which may itself be waiting for them.
std::exception_ptr JobLiveness::timed_out(const std::string& waiting) {
  // A group's waits are the shared transport's: the root's ranks answer its roll.
  if (!is_root()) return root().timed_out(waiting);
  // A rank that failed first has said why; ranks that left after it would
  // not answer the roll either.
  if (auto first = abort_record()) return first;
  auto silent = roll_call_.silent();
  std::string msg = "timed out waiting for " + waiting;  // also when no roll call was made
  std::vector<int> suspects;
  if (silent && !silent->empty()) {
    suspects = *silent;
    msg = "timed out: " + core::describe_silent(*silent, [this](int r) { return c_.rank_name(r); }) +
          " a roll call before the deadline (stopped, hung, or busy outside this communicator); rank " +
          std::to_string(c_.rank_) + " was waiting for " + waiting;
  } else if (silent) {
    msg += "; every rank answered a roll call, so all are alive and waiting in shoal (operations that "
           "do not match across ranks?)";
  }
  TimeoutError e(msg);
  e.set_suspects(std::move(suspects));
  return std::make_exception_ptr(e);
}

// Beside the stall inspector's report of who has joined (core/stall_inspector.h):
// what the wait holds open, with the connections' state, also when every
// rank has joined and the data does not come.
void JobLiveness::still_waiting(double waited_s, const std::string& waiting) {
  char waited[32];
  std::snprintf(waited, sizeof(waited), "%.1f", waited_s);
  const std::string line = c_.label_ + ": a wait in the transport has lasted " + waited + " s, for " + waiting + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

// Another rank's published cause (see broke()), or null.
std::exception_ptr JobLiveness::abort_record() {
  if (!is_root()) return root().abort_record();
  try {
    if (c_.store_->check({"abort"})) {
      auto rec = core::AbortRecord::decode(c_.store_->get_str("abort"));
      if (rec && rec->detector != c_.rank_) return rec->to_error(c_.rank_name(rec->detector));
    }
  } catch (const Error& e) {
    // A store whose connection is lost stays lost (TcpStore): its host is
    // gone, and with it the job's rendezvous, agreement and abort records.
    // (A client-side timeout is a TimeoutError: asked again next poll.)
    if (e.code() == ErrorCode::kStore) return store_lost(e.what());
  } catch (...) {
  }
  return nullptr;
}

std::string JobLiveness::store_unreachable(const std::string& cause) const {
  return "the job's rendezvous store (" + describe_store(*c_.store_) + ") is unreachable: " + cause;
}

std::exception_ptr JobLiveness::store_lost(const std::string& cause) {
  if (!is_root()) return root().store_lost(cause);
  const int host = c_.opts_.store_host_rank;
  const std::string msg = store_unreachable(cause);
  if (host >= 0 && host != c_.rank_) {
    return lost_error("peer lost: " + c_.rank_name(host) + ", which hosts " + msg, host);
  }
  if (host < 0) {
    // The store's host is not known (a store the caller made, as torchft's
    // quorum stores): a member whose process has exited is likely it, and
    // is lost either way, so the members gone are named first.
    if (auto e = exited_error(exited_members(), msg)) return e;
  }
  return std::make_exception_ptr(
      StoreError(msg + (host < 0 ? " (its host, e.g. the launcher of node 0, is gone)" : "")));
}

std::exception_ptr JobLiveness::exited_error(const std::vector<int>& gone, const std::string& store_msg) {
  if (gone.empty()) return nullptr;
  std::string who, pids;
  for (int r : gone) {
    who += (who.empty() ? "" : ", ") + c_.rank_name(r);
    pids += (pids.empty() ? "" : ", ") + proc::pid_of(known_process(r));
  }
  PeerLost e("peer lost: " + who + ": " + (gone.size() == 1 ? "its process (pid " : "their processes (pids ") + pids +
                 " on this machine) " + (gone.size() == 1 ? "has" : "have") + " exited; and " + store_msg,
             static_cast<int>(c_.job_rank(gone.front())));
  e.set_suspects(gone);
  return std::make_exception_ptr(e);
}

std::string JobLiveness::known_process(int peer) {
  MutexLock g(mu_);
  const auto i = static_cast<size_t>(peer);
  if (i < processes_.size() && !processes_[i].empty()) return processes_[i];
  if (i < addresses_.size() && !addresses_[i].host.empty()) return addresses_[i].process;
  return "";
}

std::vector<int> JobLiveness::exited_members() {
  std::vector<int> gone;
  for (int r = 0; r < c_.size_; ++r) {
    if (r == c_.rank_) continue;
    const std::string token = known_process(r);
    if (!token.empty() && token != "-" && proc::probe(token) == proc::Liveness::kGone) gone.push_back(r);
  }
  return gone;
}

// Called every abort poll while this rank is blocked in shoal: answers a
// roll call, publishes which operation of the family it is blocked in (for
// order_check on its peers), and returns another rank's published cause,
// if any.
std::exception_ptr JobLiveness::check_abort(Clock::time_point deadline) {
  if (!is_root()) return root().check_abort(deadline);
  roll_call_.poll(deadline);  // blocked in shoal: answer a roll call, or call one near the deadline
  auto& fam = c_.sched_.family();
  if (fam.size() > 1) {
    const std::string pos = std::to_string(fam.current_ctx()) + " " + std::to_string(fam.current_seq());
    if (pos != published_pos_) {
      try {
        c_.store_->set_str("pos/" + std::to_string(c_.rank_), pos);
        published_pos_ = pos;
      } catch (const Error&) {
      }
    }
  }
  return abort_record();
}

std::exception_ptr JobLiveness::broken() { return c_.hybrid_->broken(); }

namespace {
std::string position(uint64_t ctx, uint64_t seq) {
  return (ctx ? "group " + std::to_string(ctx) + " " : std::string()) + "seq " + std::to_string(seq);
}
}  // namespace

// This rank waits for `peer` to join an operation that `peer` has not
// started (an arrival in the shared arena). If `peer` is blocked in an
// operation of another communicator of the family that this rank has not
// started, the two ranks issued them in different orders: neither can go on.
std::exception_ptr JobLiveness::order_check(int peer) {
  auto& fam = c_.sched_.family();
  if (fam.size() <= 1) return nullptr;
  const int wire = to_wire(peer);
  Store& store = *c_.root_->store_;
  uint64_t ctx = 0, seq = 0, mine = 0;
  try {
    const std::string key = "pos/" + std::to_string(wire);
    if (!store.check({key})) return nullptr;
    std::istringstream in(store.get_str(key));
    if (!(in >> ctx >> seq)) return nullptr;
  } catch (const Error&) {
    return nullptr;
  }
  const uint32_t own = c_.view_.ctx();
  if (ctx == own || !fam.started_in(static_cast<uint32_t>(ctx), &mine) || mine >= seq) return nullptr;
  return std::make_exception_ptr(Mismatch(
      "collective order mismatch with rank " + std::to_string(wire) + ": this rank waits for it in " +
      position(own, fam.current_seq()) + ", rank " + std::to_string(wire) + " waits in " +
      position(ctx, seq) + ", which this rank has not started; communicators that share connections must issue "
      "their collectives in the same order on every rank (or give the group its own connections: "
      "SHOAL_GROUP_CONNECTIONS=own)"));
}

void JobLiveness::broke(std::exception_ptr cause) {
  if (!is_root()) return root().broke(cause);
  c_.sched_.mark_broken(cause);
  // Publish the first cause, so that ranks that only see this rank's sockets
  // close can name the real culprit.
  try {
    core::AbortRecord rec = core::AbortRecord::from(cause, c_.rank_);
    if (rec.code == ErrorCode::kAborted) return;  // a local decision, not a job fault
    if (!c_.store_->check({"abort"})) c_.store_->set_str("abort", rec.encode());
  } catch (...) {
  }
}

// PeerLost names the lost rank as the job numbers it (its torch phrase,
// error_mapping.h) and suspects it in this communicator's ranks (agree()).
std::exception_ptr JobLiveness::lost_error(const std::string& msg, int peer) const {
  PeerLost e(msg, static_cast<int>(c_.job_rank(peer)));
  e.set_suspects({peer});
  return std::make_exception_ptr(e);
}

std::exception_ptr JobLiveness::lost(int peer, const std::string& who, const std::string& detail) {
  if (!is_root()) return root().lost(to_wire(peer), who, detail);
  try {
    if (c_.store_->check({"abort"})) {
      auto rec = core::AbortRecord::decode(c_.store_->get_str("abort"));
      if (rec && rec->detector != c_.rank_) return rec->to_error(c_.rank_name(rec->detector));
    }
  } catch (const Error& e) {
    const int host = c_.opts_.store_host_rank;
    if (host >= 0 && host != c_.rank_ && host != peer) {
      return lost_error("peer lost: " + c_.rank_name(host) +
                            " (it hosts the rendezvous store, which is unreachable; the connection to " + who +
                            " closed too)",
                        host);
    }
    if (e.code() == ErrorCode::kStore && host < 0 && !process_gone(peer)) {
      // No cause can be published without the store: a peer whose process
      // lives closed the connection because it broke itself, likely on the
      // loss of a member whose process has exited (named, when there is one).
      if (auto gone = exited_error(exited_members(), store_unreachable(e.what()))) return gone;
    }
    if (e.code() == ErrorCode::kStore) {
      return lost_error("peer lost: " + who + ": " + detail + "; and " + store_unreachable(e.what()), peer);
    }
  }
  return lost_error("peer lost: " + who + ": " + detail, peer);
}

}  // namespace shoal::core
