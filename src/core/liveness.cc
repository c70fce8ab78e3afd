// core/liveness.cc — how a communicator learns that the job has failed
// and names why: peers' addresses and processes (lookup, peer_gone), a lost
// connection turned into the job-wide cause (on_lost, on_break), the cause
// another rank published (abort_record), the roll call at a timeout
// (timed_out, while_blocked; roll_call.h), and operations issued in
// different orders across a family (order_check).
#include <sstream>

#include "common/process.h"
#include "core/communicator_impl.h"
#include "core/errors.h"

namespace shoal {

transport::tcp::PeerAddress CommunicatorImpl::lookup(int peer) {
  if (root_ != this) return root_->lookup(transport_->to_wire(peer));
  std::string v = store_->get_str("addr/" + std::to_string(peer));
  std::istringstream in(v);
  transport::tcp::PeerAddress a;
  in >> a.host >> a.port >> a.hostname >> a.host_id >> a.process;
  return a;
}

// A peer whose process on this machine has exited, though no socket of ours
// to it said so (it died before connecting to this rank): lost.
std::exception_ptr CommunicatorImpl::peer_gone(int peer) {
  std::string token;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (processes_.empty()) processes_.resize(static_cast<size_t>(size_));
    token = processes_[static_cast<size_t>(peer)];
  }
  if (token.empty()) {
    try {
      token = lookup(peer).process;
    } catch (const Error&) {
      return nullptr;  // the store is gone: check_abort's business
    }
    if (token.empty()) token.assign(1, '-');  // not probeable; do not ask again ("= "-"" draws GCC 12's -Wrestrict)
    std::lock_guard<std::mutex> g(mu_);
    processes_[static_cast<size_t>(peer)] = token;
  }
  if (proc::probe(token == "-" ? "" : token) != proc::Liveness::kGone) return nullptr;
  return on_lost(peer, "its process (pid " + proc::pid_of(token) + " on this machine) has exited");
}

// A wait reached its deadline: call the roll, so that the error names the
// ranks the job waits for (roll_call.h), not just the peer this rank waited
// for, which may itself be waiting for them.
std::exception_ptr CommunicatorImpl::timed_out(const std::string& waiting) {
  // A group's waits are the shared transport's: the root's ranks answer its roll.
  if (root_ != this) return root_->timed_out(waiting);
  // A rank that failed first has said why; ranks that left after it would
  // not answer the roll either.
  if (auto first = abort_record()) return first;
  auto silent = roll_call_->silent();
  std::string msg = "timed out waiting for " + waiting;  // also when no roll call was made
  if (silent && !silent->empty()) {
    msg = "timed out: " + core::describe_silent(*silent) +
          " a roll call before the deadline (stopped, hung, or busy outside this communicator); rank " +
          std::to_string(rank_) + " was waiting for " + waiting;
  } else if (silent) {
    msg += "; every rank answered a roll call, so all are alive and waiting in shoal (operations that "
           "do not match across ranks?)";
  }
  return std::make_exception_ptr(TimeoutError(msg));
}

// Another rank's published cause (see on_break), or null.
std::exception_ptr CommunicatorImpl::abort_record() {
  if (root_ != this) return root_->abort_record();
  try {
    if (store_->check({"abort"})) {
      auto rec = core::AbortRecord::decode(store_->get_str("abort"));
      if (rec && rec->detector != rank_) return rec->to_error();
    }
  } catch (...) {
  }
  return nullptr;
}

// Called every abort poll while this rank is blocked in shoal (the root's
// communicator): answers a roll call, publishes which operation of the
// family it is blocked in (for order_check on its peers), and returns
// another rank's published cause, if any.
std::exception_ptr CommunicatorImpl::while_blocked(transport::Clock::time_point deadline) {
  if (root_ != this) return root_->while_blocked(deadline);
  roll_call_->poll(deadline);  // blocked in shoal: answer a roll call, or call one near the deadline
  auto& fam = *driver_->family;
  if (fam.size() > 1) {
    const std::string pos = std::to_string(fam.current_ctx()) + " " + std::to_string(fam.current_seq());
    if (pos != published_pos_) {
      try {
        store_->set_str("pos/" + std::to_string(rank_), pos);
        published_pos_ = pos;
      } catch (const Error&) {
      }
    }
  }
  return abort_record();
}

namespace {
std::string position(uint64_t ctx, uint64_t seq) {
  return (ctx ? "group " + std::to_string(ctx) + " " : std::string()) + "seq " + std::to_string(seq);
}
}  // namespace

// This rank waits for `peer` to join an operation that `peer` has not
// started (an arrival in the shared arena). If `peer` is blocked in an
// operation of another communicator of the family that this rank has not
// started, the two ranks issued them in different orders: neither can go on.
std::exception_ptr CommunicatorImpl::order_check(int peer) {
  auto& fam = *driver_->family;
  if (fam.size() <= 1) return nullptr;
  const int wire = transport_->to_wire(peer);
  uint64_t ctx = 0, seq = 0, mine = 0;
  try {
    const std::string key = "pos/" + std::to_string(wire);
    if (!root_->store_->check({key})) return nullptr;
    std::istringstream in(root_->store_->get_str(key));
    if (!(in >> ctx >> seq)) return nullptr;
  } catch (const Error&) {
    return nullptr;
  }
  if (ctx == member_.ctx || !fam.started_in(static_cast<uint32_t>(ctx), &mine) || mine >= seq) return nullptr;
  return std::make_exception_ptr(Mismatch(
      "collective order mismatch with rank " + std::to_string(wire) + ": this rank waits for it in " +
      position(member_.ctx, fam.current_seq()) + ", rank " + std::to_string(wire) + " waits in " +
      position(ctx, seq) + ", which this rank has not started; communicators that share connections must issue "
      "their collectives in the same order on every rank (or give the group its own connections: "
      "SHOAL_GROUP_CONNECTIONS=own)"));
}

void CommunicatorImpl::on_break(std::exception_ptr cause) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!broken_) broken_ = cause;
  }
  // Publish the first cause, so that ranks that only see this rank's sockets
  // close can name the real culprit.
  try {
    core::AbortRecord rec = core::AbortRecord::from(cause, rank_);
    if (rec.code == ErrorCode::kAborted) return;  // a local decision, not a job fault
    if (!store_->check({"abort"})) store_->set_str("abort", rec.encode());
  } catch (...) {
  }
}

std::exception_ptr CommunicatorImpl::on_lost(int peer, const std::string& detail) {
  std::string who = hybrid_ ? hybrid_->describe_peer(peer) : "rank " + std::to_string(peer);
  try {
    if (store_->check({"abort"})) {
      auto rec = core::AbortRecord::decode(store_->get_str("abort"));
      if (rec && rec->detector != rank_) return rec->to_error();
    }
  } catch (const Error&) {
    int host = opts_.store_host_rank;
    if (host >= 0 && host != rank_ && host != peer) {
      return std::make_exception_ptr(
          PeerLost("peer lost: rank " + std::to_string(host) +
                       " (it hosts the rendezvous store, which is unreachable; the connection to " +
                       who + " closed too)",
                   host));
    }
  }
  return std::make_exception_ptr(PeerLost("peer lost: " + who + ": " + detail, peer));
}

}  // namespace shoal
