// core/executor.cc — what a communicator does with an operation when its
// scheduler runs it (core::Runner): a collective lowered (lowering.h) and
// run by the algorithm chosen for it, in the arena or over the transport;
// a send or receive posted, then moved while in flight; a failure turned
// into the communicator-wide broken state. (Its making: wiring.cc; the
// order and the threads: scheduler.h; how failures are learnt and named:
// liveness.cc.)
#include <sstream>

#include "collectives/arena/arena_setup.h"
#include "core/communicator_impl.h"
#include "core/errors.h"
#include "core/host_table.h"
#include "core/lowering.h"
#include "core/wait_spins.h"

namespace shoal {

using coll::Coll;
using transport::Clock;

std::string CommunicatorImpl::prefix(const Op& op) const {
  std::ostringstream o;
  o << label_ << ": " << coll::coll_name(op.coll);
  if (op.seq) o << " seq " << op.seq;
  o << ": ";
  return o.str();
}

CommunicatorImpl::~CommunicatorImpl() {
  // A group shares its parent's transport: break it only to stop what runs.
  if (sched_.stop(root_ == this)) hybrid_->abort(std::make_exception_ptr(Aborted(label_ + ": communicator destroyed")));
  hybrid_->wake();
  sched_.join();
}

// Which ranks share a host, from the host table the last rank to join
// published (core/host_table.h; read once, on first use: every rank computes
// the same answer).
const coll::Topology& CommunicatorImpl::topology() {
  if (!topo_.host_of.empty()) return topo_;
  if (size_ > 1) live_->wait_all_published("hosts");
  std::vector<std::string> ids{host_.id};
  if (size_ > 1) {
    try {
      ids = core::read_host_table(*store_, size_);
    } catch (const TimeoutError& e) {
      // The table comes once every rank has published its address: name
      // those that have not (the ranks that never came).
      std::vector<int> missing;
      for (int r = 0; r < size_ && missing.size() < 16; ++r) {
        if (!store_->check({"addr/" + std::to_string(r)})) missing.push_back(r);
      }
      if (missing.empty()) throw;
      std::string who;
      for (int r : missing) who += (who.empty() ? "" : ", ") + rank_name(r) + " (addr/" + std::to_string(r) + ")";
      TimeoutError t("timed out waiting for " + who + " to publish an address: never came to this communicator (" +
                     e.what() + ")");
      t.set_suspects(missing);
      throw t;
    }
  }
  topo_ = coll::patterns::make_topology(ids);
  // Spinning pays only while every rank of this machine has a core.
  crowded_ = host_.crowded(host_.ranks_here(ids));
  return topo_;
}


std::exception_ptr CommunicatorImpl::error() const {
  if (auto e = sched_.broken()) return e;
  return hybrid_ ? hybrid_->broken() : nullptr;  // broken through a group that shares it
}

void CommunicatorImpl::abort(const std::string& reason) {
  auto cause = std::make_exception_ptr(Aborted(label_ + ": aborted: " + reason));
  const bool running = sched_.mark_broken(cause);
  // A group shares its parent's transport: while none of its operations is
  // in the transport, breaking the group alone is enough (what is queued
  // fails when its turn comes); one that is must be stopped, and with it
  // everything that shares the connections.
  if (root_ == this || running) hybrid_->abort(cause);
  sched_.notify();
}

void CommunicatorImpl::prepare(bool inline_caller) {
  inline_caller_ = inline_caller;
  hybrid_->set_spin(inline_caller ? spin_us_ : 0, spin_yield());
}

// How a collective of `bytes` (per rank, as select() weighs them) waits,
// for messages and in `arena` (core/wait_spins.h).
void CommunicatorImpl::set_spins(coll::arena::HostArena* arena, size_t bytes) {
  const core::WaitSpins w = core::wait_spins(inline_caller_, spin_yield(), spin_auto_, spin_us_, bytes);
  hybrid_->set_spin(w.message_us, spin_yield());
  if (arena) arena->set_spin(w.arena_us, w.arena);
}

void CommunicatorImpl::fail_inflight(std::exception_ptr cause) {
  observer_->broke(cause);  // dumps the flight recorder before anyone sees the error (not for aborts)
  for (auto& op : inflight_p2p_) {
    observer_->finished(*op, cause);
    op->work->finish(core::with_context(cause, prefix(*op)));
  }
  inflight_p2p_.clear();
  sched_.set_inflight(0);
}

void CommunicatorImpl::progress(Clock::time_point until) {
  try {
    if (until <= Clock::now()) {
      hybrid_->poll();
    } else {
      hybrid_->poll_wait(until);
    }
    reap_p2p();
  } catch (...) {
    auto e = std::current_exception();
    sched_.mark_broken(e);
    fail_inflight(e);
  }
}

void CommunicatorImpl::reap_p2p() {
  if (inflight_p2p_.empty()) return;
  const auto now = Clock::now();
  // Now and then, ask whether a peer that an unfinished send or receive waits
  // for has died without a word (collectives ask in the transport's wait).
  const bool probe = now >= next_liveness_probe_;
  if (probe) next_liveness_probe_ = now + std::chrono::milliseconds(250);
  for (auto it = inflight_p2p_.begin(); it != inflight_p2p_.end();) {
    Op& op = **it;
    if (op.req->complete) {
      observer_->finished(op, nullptr);
      op.work->finish(nullptr, view_.from_wire(op.req->source));
      it = inflight_p2p_.erase(it);
      sched_.set_inflight(inflight_p2p_.size());
      continue;
    }
    if (probe) live_->roll_call().poll(op.deadline);
    if (now >= op.deadline) {
      // Like a collective's timeout: the transport is broken (the message may
      // be half sent) and the cause is published for the other ranks.
      transport::Request* one[1] = {op.req.get()};
      hybrid_->abort(core::with_context(live_->timed_out(hybrid_->pending_summary(one, 1)),
                                           label_ + ": " + std::string(coll::coll_name(op.coll)) + " (tag " +
                                               std::to_string(op.tag) + "): "));
      hybrid_->poll();  // throws the cause, after publishing it
    }
    if (probe) {
      // Has another rank failed the job, or is the store gone? (Collectives
      // ask in the transport's wait.)
      if (auto cause = live_->abort_record()) {
        hybrid_->abort(core::with_context(cause, label_ + ": " + std::string(coll::coll_name(op.coll)) + ": "));
        hybrid_->poll();  // throws the cause
      }
    }
    if (probe && op.peer >= 0) {
      if (auto gone = hybrid_->gone_silently(view_.to_wire(op.peer))) {
        hybrid_->abort(gone);
        hybrid_->poll();  // throws the cause, after publishing it
      }
    }
    ++it;
  }
}

void CommunicatorImpl::execute(Op& op, Work& work, bool now) {
  auto finish = [&](std::exception_ptr e) {
    if (now) {
      work.finish_unshared(std::move(e));
    } else {
      work.finish(std::move(e));
    }
  };
  std::exception_ptr broken;
  if (!now) broken = sched_.broken();
  // A group split from a parent breaks with the connections they share (a
  // lost peer, a timeout, the parent's abort), also when its collective
  // would run in the shared arena without touching them.
  if (!broken && root_ != this && (broken = hybrid_->broken())) sched_.mark_broken(broken);
  if (broken) {
    observer_->finished(op, broken);
    finish(core::with_context(broken, prefix(op)));
    return;
  }
  if (!now) observer_->started(op);  // run_now() said so
  try {
    if (op.is_p2p()) {
      post_p2p(op);
    } else {
      sched_.running(op.seq);
      run_collective(op);
      observer_->finished(op, nullptr);
      finish(nullptr);
    }
    reap_p2p();
  } catch (...) {
    auto e = std::current_exception();
    sched_.mark_broken(e);
    // The transport is broken already for transport errors; anything else
    // thrown mid-collective leaves ranks out of step, so break it too.
    if (!hybrid_->broken()) {
      try {
        hybrid_->abort(e);
        hybrid_->poll();
      } catch (...) {
      }
    }
    observer_->finished(op, e);
    observer_->broke(e);
    finish(core::with_context(e, prefix(op)));
    fail_inflight(e);
  }
}

void CommunicatorImpl::post_p2p(Op& op) {
  auto r = std::make_unique<transport::Request>();
  r->kind = op.coll == Coll::kSend ? transport::Request::Kind::kSend : transport::Request::Kind::kRecv;
  r->peer = op.peer;
  r->tag = transport::Tag{transport::Space::kP2P, static_cast<uint64_t>(op.tag), 0};
  r->fp.coll = static_cast<uint8_t>(Coll::kSend);
  r->fp.dtype = static_cast<uint8_t>(op.args.dt);
  r->fp.count = op.args.count;
  r->buf = op.coll == Coll::kSend ? const_cast<void*>(op.args.send) : op.args.recv;
  r->len = op.args.count * op.args.elem();
  op.req = std::move(r);
  view_.stamp(*op.req);
  if (op.coll == Coll::kSend) {
    hybrid_->post_send(op.req.get());
  } else {
    hybrid_->post_recv(op.req.get());
  }
  // Posted: the operation moves to the in-flight list (what the caller of
  // execute() keeps is left empty, but for its Work, coll and seq).
  auto owned = std::make_unique<Op>(std::move(op));
  owned->deadline = Clock::now() + owned->opts.timeout.value_or(opts_.timeout);
  inflight_p2p_.push_back(std::move(owned));
  sched_.set_inflight(inflight_p2p_.size());
}

void CommunicatorImpl::run_collective(Op& op) {
  if (core::moves_nothing(op)) return;  // count 0 everywhere
  transport::Fingerprint fp;
  fp.coll = static_cast<uint8_t>(op.coll);
  fp.dtype = static_cast<uint8_t>(op.args.dt);
  fp.op = coll::is_reducing(op.coll) ? static_cast<uint8_t>(op.user_op) : 0;
  fp.root = static_cast<uint32_t>(op.args.root);
  fp.count = core::fingerprint_count(op);
  const core::Lowering lowered(op, size_);
  const coll::Args& a = lowered.args();

  const auto timeout = op.opts.timeout.value_or(opts_.timeout);
  const coll::Topology& topo = topology();
  coll::arena::HostArena* shared = arena(timeout);  // set up within this operation's time
  set_spins(shared, coll::weighed_bytes(op.coll, a, size_));
  if (!op.algo) op.algo = &chosen(op.coll, a, topo);
  fp.algo = coll::algorithm_id(*op.algo);
  coll::Ctx ctx(*hybrid_, view_, op.seq, fp, timeout, scratch_, tuning_, topo, shared);
  observer_->running(op, ctx);
  op.algo->fn(ctx, a);
  lowered.finish(op, rank_);
}

coll::arena::HostArena* CommunicatorImpl::arena(Clock::duration timeout) {
  if (arena_checked_) return arena_.get();  // (no clock read: a fair share of a small collective)
  arena_checked_ = true;
  if (size_ < 2 || arena_bytes_ == 0 || topo_.nhosts() != 1) return nullptr;
  coll::arena::SetupParams p{*store_, *live_, rank_, size_, uid_, root_->secret_, arena_bytes_, shm_mode_ == "1",
                             slot_stores_};
  std::string report;
  arena_ = coll::arena::set_up(p, Clock::now() + timeout, &report);
  observer_->info(label_ + ": " + report);
  return arena_.get();
}

// select(), remembered per collective for the last element count and type:
// the rest of what the choice depends on is fixed once the arena is settled.
const coll::Algorithm& CommunicatorImpl::chosen(Coll c, const coll::Args& a, const coll::Topology& topo) {
  Chosen& m = chosen_[static_cast<size_t>(c)];
  if (!m.algo || m.count != a.count || m.dt != a.dt) {
    const coll::ArenaCaps caps{arena_ != nullptr, arena_ && arena_->reads(), crowded_};
    m = {a.count, a.dt, &coll::select(c, a, size_, overrides_, topo, caps)};
  }
  return *m.algo;
}

}  // namespace shoal
