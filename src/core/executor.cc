// core/executor.cc — the communicator's executor thread: runs queued
// operations in order, lowers reduce ops, and turns failures into the
// communicator-wide broken state. (Its making: wiring.cc; how failures are
// learnt and named: liveness.cc.)
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

#include "common/auth.h"
#include "common/env.h"
#include "common/process.h"
#include "core/communicator_impl.h"
#include "core/errors.h"
#include "kernels/reduce.h"
#include "transport/shm/shm_transport.h"

namespace shoal {

using coll::Coll;
using transport::Clock;

namespace {

constexpr auto kDeferHandoff = std::chrono::microseconds(200);

bool is_reducing(Coll c) {
  return c == Coll::kAllreduce || c == Coll::kReduce || c == Coll::kReduceScatter ||
         c == Coll::kReduceScatterv;
}

// Elements of the buffer a reducing collective's input spans.
size_t input_elems(const Op& op, int size) {
  switch (op.coll) {
    case Coll::kReduceScatter: return op.args.count * static_cast<size_t>(size);
    case Coll::kReduceScatterv: {
      size_t t = 0;
      for (size_t c : op.counts) t += c;
      return t;
    }
    default: return op.args.count;
  }
}

size_t output_elems(const Op& op, int rank) {
  switch (op.coll) {
    case Coll::kReduceScatterv: return op.counts[static_cast<size_t>(rank)];
    default: return op.args.count;
  }
}

// Total element count of the operation, the same on every rank.
uint64_t fingerprint_count(const Op& op) {
  switch (op.coll) {
    case Coll::kAllgatherv:
    case Coll::kReduceScatterv: {
      uint64_t t = 0;
      for (size_t c : op.counts) t += c;
      return t;
    }
    case Coll::kAlltoallv: return 0;  // per-pair sizes are checked per message
    default: return op.args.count;
  }
}

}  // namespace

std::string CommunicatorImpl::prefix(const Op& op) const {
  std::ostringstream o;
  o << label_ << ": " << coll::coll_name(op.coll);
  if (op.seq) o << " seq " << op.seq;
  o << ": ";
  return o.str();
}

std::string CommunicatorImpl::describe(const transport::Fingerprint& fp) const {
  std::ostringstream o;
  o << coll::coll_name(static_cast<Coll>(fp.coll)) << "(count=" << fp.count << ", "
    << dtype_name(static_cast<DataType>(fp.dtype));
  Coll c = static_cast<Coll>(fp.coll);
  if (is_reducing(c)) o << ", " << reduce_op_name(static_cast<ReduceOp>(fp.op));
  if (c == Coll::kBroadcast || c == Coll::kReduce || c == Coll::kGather || c == Coll::kScatter) {
    o << ", root=" << fp.root;
  }
  if (const coll::Algorithm* algo = coll::algorithm_by_id(fp.algo)) o << ", algorithm " << algo->name;
  o << ")";
  return o.str();
}


bool Driver::help(const Work& waiting) {
  std::unique_lock<core::DriveLock> d(lock(), std::try_to_lock);
  if (!d.owns_lock() || !impl) return false;
  return impl->drain(true, &waiting);
}

CommunicatorImpl::~CommunicatorImpl() {
  bool pending;
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
    // A group shares its parent's transport: break it only to stop what runs.
    pending = in_transport() || (root_ == this && !queue_.empty());
  }
  driver_->family->stop(&member_);
  if (pending) {
    transport_->abort(std::make_exception_ptr(
        Aborted(label_ + ": communicator destroyed")));
  }
  cv_.notify_all();
  transport_->wake();
  if (executor_.joinable()) executor_.join();
  std::lock_guard<core::DriveLock> d(driver_->lock());  // waits for a caller still driving
  driver_->impl = nullptr;
  driver_->family->leave(&member_);
}

// Which ranks share a host, from the addresses every rank published (read
// once, on first use: every rank computes the same answer).
const coll::Topology& CommunicatorImpl::topology() {
  if (!topo_.host_of.empty()) return topo_;
  std::vector<std::string> ids(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) ids[static_cast<size_t>(r)] = r == rank_ ? host_id_ : lookup(r).host_id;
  topo_ = coll::patterns::make_topology(ids);
  // Ranks in other network namespaces of the same kernel count too (same
  // boot id).
  const std::string boot = net::boot_id();
  int here = 0;
  for (const auto& id : ids) here += boot.empty() ? id == host_id_ : id.find(boot) != std::string::npos;
  crowded_ = here > sysconf(_SC_NPROCESSORS_ONLN);
  // Spinning pays only while every rank of this machine has a core.
  if (spin_auto_) spin_yield_ = crowded_;
  return topo_;
}


std::exception_ptr CommunicatorImpl::error() const {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (broken_) return broken_;
  }
  return hybrid_ ? hybrid_->broken() : nullptr;  // broken through a group that shares it
}

void CommunicatorImpl::abort(const std::string& reason) {
  auto cause = std::make_exception_ptr(Aborted(label_ + ": aborted: " + reason));
  bool running;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!broken_) broken_ = cause;
    running = in_transport();
  }
  // A group shares its parent's transport: while none of its operations is
  // in the transport, breaking the group alone is enough (what is queued
  // fails when its turn comes); one that is must be stopped, and with it
  // everything that shares the connections.
  if (root_ == this || running) transport_->abort(cause);
  cv_.notify_all();
}

WorkPtr CommunicatorImpl::enqueue(Op&& op) {
  const bool p2p = op.coll == Coll::kSend || op.coll == Coll::kRecv;
  const bool blocking = op.opts.blocking && !p2p;  // a blocking send could never meet its receive
  WorkPtr w;
  std::unique_lock<core::DriveLock> drive(driver_->lock(), std::defer_lock);
  bool now = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_) throw Aborted(prefix(op) + "the communicator is being destroyed");
    // A blocking collective with nothing queued ahead of it runs right here,
    // in the calling thread: no hand-off to the executor and back (two futex
    // wake-ups and an eventfd write, more than a small collective costs on a
    // busy host). try_lock only: elsewhere the drive lock is taken before mu_.
    if (!p2p) op.seq = next_seq_++;
    const bool was_empty = queue_.empty();
    // (Not before an earlier operation of a group sharing the transport.)
    if (blocking && was_empty && !busy_.load() && driver_->family->my_turn(&member_)) (void)drive.try_lock();
    // Alone in its family with nothing in flight, it need not pass through
    // the queue at all (run_now), nor leave the caller's stack.
    now = drive.owns_lock() && driver_->family->size() <= 1 && inflight_count_.load() == 0 && !broken_;
    if (now) {
      busy_.store(true, std::memory_order_release);  // mu_ orders it for abort()
      w = done_work(op.seq);
    } else {
      auto queued = std::make_unique<Op>(std::move(op));
      queued->ticket = driver_->family->draw(&member_, was_empty);
      queued->work = std::make_shared<Work>(queued->seq);
      if (!drive.owns_lock()) queued->work->set_helper([d = driver_](const Work& w) { return d->help(w); });
      observer_->enqueued(*queued);
      w = queued->work;
      queue_.push_back(std::move(queued));
    }
  }
  if (now) {
    run_now(op, *w);
    return w;
  }
  if (drive.owns_lock()) {
    drain(true);  // runs the queue, which starts with this operation
    drive.unlock();
  } else {
    cv_.notify_one();
    transport_->wake();
  }
  if (blocking) {  // done already when it ran here (unless the communicator is stopping)
    try {
      w->wait();
    } catch (...) {  // the Work keeps the error for the caller's wait()
    }
  }
  return w;
}

// The Work for an operation that run_now() completes before returning: the
// last one again when its caller has let go of it (a small collective's
// allocation, mutex and condition variable are a fair share of its cost).
WorkPtr CommunicatorImpl::done_work(uint64_t seq) {
  if (done_work_ && done_work_.use_count() == 1) {
    done_work_->reset(seq);
  } else {
    done_work_ = std::make_shared<Work>(seq);
  }
  return done_work_;
}

// A blocking collective of an idle communicator, alone in its family (see
// enqueue): it runs here, under the drive lock the caller holds, as the
// queue would run it, minus the queue.
void CommunicatorImpl::run_now(Op& op, Work& work) {
  transport_->set_spin_us(spin_us_);
  transport_->set_spin_yield(spin_yield_);
  observer_->started_now(op);
  execute(op, work, true);  // enqueue() found it unbroken; `work` is not shared yet
  busy_.store(false, std::memory_order_release);
}

void CommunicatorImpl::fail_all(std::exception_ptr cause) {
  observer_->broke(cause);  // dumps the flight recorder before anyone sees the error (not for aborts)
  for (auto& op : inflight_p2p_) {
    observer_->finished(*op, cause);
    op->work->finish(core::with_context(cause, prefix(*op)));
  }
  inflight_p2p_.clear();
  inflight_count_.store(0);
}

bool CommunicatorImpl::drain(bool inline_caller, const Work* waiting) {
  bool progressed = false;
  turn_blocked_ = false;
  transport_->set_spin_us(inline_caller ? spin_us_ : 0);
  transport_->set_spin_yield(spin_yield_);
  for (;;) {
    std::unique_ptr<Op> op;
    bool wake_executor;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (stop_ || queue_.empty()) break;
      if (!driver_->family->my_turn(&member_)) {  // a group's earlier operation goes first
        turn_blocked_ = true;
        break;
      }
      op = std::move(queue_.front());
      queue_.pop_front();
      driver_->family->advance(&member_, queue_.empty() ? core::Family::kNone : queue_.front()->ticket);
      busy_.store(true);
      wake_executor = deferring_;
    }
    if (wake_executor) cv_.notify_all();  // it deferred to us: it may go back to sleep
    execute(*op, *op->work);
    progressed = true;
    busy_.store(false);
  }
  if (!inflight_p2p_.empty()) {
    size_t before = inflight_p2p_.size();
    progress_p2p(Clock::now());
    const bool more = waiting && spin_us_ > 0 && !waiting->test() && spin_p2p(*waiting);
    progressed = progressed || more || inflight_p2p_.size() != before;
  }
  if (!inflight_p2p_.empty() && !has_inflight_.load()) {
    // Hand the in-flight sends and receives to the executor thread.
    {
      std::lock_guard<std::mutex> g(mu_);
      has_inflight_.store(true);
    }
    cv_.notify_one();
  } else if (inflight_p2p_.empty()) {
    has_inflight_.store(false);
  }
  return progressed;
}

// The caller waits for a send or receive in flight: drive the transport here
// for up to spin_us_, as a collective's wait does, rather than sleep at once
// while the executor thread blocks in epoll (each of the two wake-ups that
// costs is tens of microseconds on a virtual machine). Stops early when new
// operations are queued (returns true then: drain() must be called again).
bool CommunicatorImpl::spin_p2p(const Work& waiting) {
  const auto until = Clock::now() + std::chrono::microseconds(spin_us_);
  for (unsigned i = 1; !inflight_p2p_.empty() && !waiting.test(); ++i) {
    progress_p2p(Clock::now());
    if (i % 16 == 0) {
      if (Clock::now() >= until || driver_->lock().contended()) return false;
      std::lock_guard<std::mutex> g(mu_);
      if (stop_) return false;
      if (!queue_.empty()) return true;
    }
    if (spin_yield_) sched_yield();
  }
  return false;
}

void CommunicatorImpl::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> g(mu_);
      // Sleep until there is work: queued operations, or sends and receives
      // in flight that need progress (unless the communicator is broken).
      cv_.wait(g, [&] { return stop_ || !queue_.empty() || (has_inflight_.load() && !broken_); });
      if (stop_) break;  // whatever is queued fails below
      // A caller that waits for its operation right away runs it itself
      // (Work::wait), saving two thread hand-offs; give it the chance before
      // taking the operation. Operations nobody waits for start at most
      // kDeferHandoff later.
      if (!queue_.empty() && !has_inflight_.load()) {
        deferring_ = true;
        cv_.wait_for(g, kDeferHandoff, [&] { return stop_ || queue_.empty(); });
        deferring_ = false;
        if (stop_) break;
        if (queue_.empty()) continue;
      }
    }
    std::unique_lock<core::DriveLock> d(driver_->lock());
    drain(false);
    if (turn_blocked_) {
      // Another communicator of the family has an earlier operation: let
      // its thread drive, and come back when this one's turn has come.
      d.unlock();
      driver_->family->wait_turn(&member_);
      continue;
    }
    if (inflight_p2p_.empty()) continue;
    bool idle;
    {
      std::lock_guard<std::mutex> g(mu_);
      idle = queue_.empty() && !stop_;
    }
    if (!idle) continue;
    // Idle with receives or sends in flight: progress them.
    progress_p2p(Clock::now() + std::chrono::milliseconds(200));
    has_inflight_.store(!inflight_p2p_.empty());
  }
  // Stopping: whatever is left fails.
  auto cause = std::make_exception_ptr(Aborted("communicator destroyed"));
  std::deque<std::unique_ptr<Op>> rest;
  {
    std::lock_guard<std::mutex> g(mu_);
    rest.swap(queue_);
  }
  driver_->family->advance(&member_, core::Family::kNone);
  for (auto& op : rest) op->work->finish(core::with_context(cause, prefix(*op)));
  std::lock_guard<core::DriveLock> d(driver_->lock());
  fail_all(cause);
  has_inflight_.store(false);
}

void CommunicatorImpl::mark_broken(std::exception_ptr e) {
  std::lock_guard<std::mutex> g(mu_);
  if (!broken_) broken_ = e;
}

void CommunicatorImpl::progress_p2p(Clock::time_point until) {
  try {
    if (until <= Clock::now()) {
      transport_->poll();
    } else {
      transport_->poll_wait(until);
    }
    reap_p2p();
  } catch (...) {
    auto e = std::current_exception();
    mark_broken(e);
    fail_all(e);
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
      op.work->finish(nullptr, transport_->from_wire(op.req->source));
      it = inflight_p2p_.erase(it);
      inflight_count_.store(inflight_p2p_.size());
      continue;
    }
    if (probe) roll_call_->poll(op.deadline);
    if (now >= op.deadline) {
      // Like a collective's timeout: the transport is broken (the message may
      // be half sent) and the cause is published for the other ranks.
      transport::Request* one[1] = {op.req.get()};
      transport_->abort(core::with_context(timed_out(transport_->pending_summary(one, 1)),
                                           label_ + ": " + std::string(coll::coll_name(op.coll)) + " (tag " +
                                               std::to_string(op.tag) + "): "));
      transport_->poll();  // throws the cause, after publishing it
    }
    if (probe && op.peer >= 0) {
      if (auto gone = transport_->gone_silently(op.peer)) {
        transport_->abort(gone);
        transport_->poll();  // throws the cause, after publishing it
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
  if (!now) {
    std::lock_guard<std::mutex> g(mu_);
    broken = broken_;
  }
  if (broken) {
    observer_->finished(op, broken);
    finish(core::with_context(broken, prefix(op)));
    return;
  }
  if (!now) observer_->started(op);  // run_now() said so
  try {
    if (op.coll == Coll::kSend || op.coll == Coll::kRecv) {
      post_p2p(op);
    } else {
      driver_->family->running(&member_, op.seq);
      run_collective(op);
      observer_->finished(op, nullptr);
      finish(nullptr);
    }
    reap_p2p();
  } catch (...) {
    auto e = std::current_exception();
    mark_broken(e);
    // The transport is broken already for transport errors; anything else
    // thrown mid-collective leaves ranks out of step, so break it too.
    if (!transport_->broken()) {
      try {
        transport_->abort(e);
        transport_->poll();
      } catch (...) {
      }
    }
    observer_->finished(op, e);
    observer_->broke(e);
    finish(core::with_context(e, prefix(op)));
    fail_all(e);
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
  if (op.coll == Coll::kSend) {
    transport_->post_send(op.req.get());
  } else {
    transport_->post_recv(op.req.get());
  }
  // Ownership moves to the in-flight list; the queue's unique_ptr is released
  // by the caller of execute() going out of scope, so take a fresh one.
  auto owned = std::make_unique<Op>();
  owned->coll = op.coll;
  owned->seq = op.seq;
  owned->work = op.work;
  owned->req = std::move(op.req);
  owned->peer = op.peer;
  owned->tag = op.tag;
  owned->args = op.args;
  owned->trace = op.trace;
  owned->deadline = Clock::now() + op.opts.timeout.value_or(opts_.timeout);
  inflight_p2p_.push_back(std::move(owned));
  inflight_count_.store(inflight_p2p_.size());
}

void CommunicatorImpl::run_collective(Op& op) {
  coll::Args a = op.args;
  const size_t es = a.elem();
  transport::Fingerprint fp;
  fp.coll = static_cast<uint8_t>(op.coll);
  fp.dtype = static_cast<uint8_t>(a.dt);
  fp.op = is_reducing(op.coll) ? static_cast<uint8_t>(op.user_op) : 0;
  fp.root = static_cast<uint32_t>(a.root);
  fp.count = fingerprint_count(op);

  // Count 0 everywhere: nothing to move (the barrier always runs).
  bool empty = fp.count == 0 && op.coll != Coll::kBarrier && op.coll != Coll::kAlltoallv;
  if (op.coll == Coll::kAlltoallv) {
    empty = true;
    for (size_t i = 0; i < op.counts.size(); ++i) {
      if (op.counts[i] || op.send_counts[i]) empty = false;
    }
    // Ranks may disagree on emptiness only when their peers send them
    // nothing as well; running the exchange anyway keeps everyone in step.
    empty = false;
  }
  if (empty) return;

  // Lower AVG and PREMUL_SUM to SUM.
  std::vector<uint8_t> premul;
  if (is_reducing(op.coll)) {
    a.op = (op.user_op == ReduceOp::kAvg || op.user_op == ReduceOp::kPremulSum) ? ReduceOp::kSum
                                                                                 : op.user_op;
    if (op.user_op == ReduceOp::kPremulSum) {
      size_t n = input_elems(op, size_);
      if (op.coll == Coll::kAllreduce) {
        kernels::scale(a.dt, a.recv, a.send, op.opts.scale, n);
        a.send = a.recv;
      } else {
        premul.resize(n * es);
        kernels::scale(a.dt, premul.data(), a.send, op.opts.scale, n);
        a.send = premul.data();
      }
    }
  }
  if (op.coll == Coll::kAllgatherv || op.coll == Coll::kReduceScatterv || op.coll == Coll::kAlltoallv) {
    a.counts = op.counts.data();
    a.displs = op.displs.data();
    a.send_counts = op.send_counts.empty() ? nullptr : op.send_counts.data();
    a.send_displs = op.send_displs.empty() ? nullptr : op.send_displs.data();
  }

  const auto timeout = op.opts.timeout.value_or(opts_.timeout);
  const coll::Topology& topo = topology();
  if (!arena_checked_) setup_arena(Clock::now() + timeout);  // within this operation's time
  if (!op.algo) op.algo = &chosen(op.coll, a, topo);
  fp.algo = coll::algorithm_id(*op.algo);
  coll::Ctx ctx(*transport_, op.seq, fp, timeout, scratch_, tuning_, topo, arena_.get());
  observer_->running(op, ctx);
  op.algo->fn(ctx, a);

  if (is_reducing(op.coll) && op.user_op == ReduceOp::kAvg) {
    bool has_output = op.coll != Coll::kReduce || rank_ == a.root;
    if (has_output) kernels::divide(a.dt, a.recv, a.recv, size_, output_elems(op, rank_));
  }
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
