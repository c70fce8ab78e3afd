// core/scheduler.cc — Scheduler (scheduler.h): the queue, the family's
// order, the drive lock, the run-now path and the executor thread.
#include "core/scheduler.h"

#include <sched.h>

#include "common/yield_gauge.h"
#include "core/errors.h"
#include "shoal/error.h"

namespace shoal::core {

using transport::Clock;

namespace {

// How long the executor thread leaves a queued operation to a caller that
// may be about to wait for it (and run it itself).
constexpr auto kDeferHandoff = std::chrono::microseconds(200);

}  // namespace

bool Driver::help(const Work& waiting) {
  if (!lock().try_lock()) return false;
  DriveGuard d(lock(), std::adopt_lock);
  if (!sched) return false;
  sched->assert_driving();  // the same lock, reached through sched
  return sched->drain(true, &waiting);
}

Scheduler::Scheduler(Runner& runner, std::shared_ptr<Family> family) : runner_(runner) {
  driver_->family = std::move(family);
}

Scheduler::~Scheduler() = default;

void Scheduler::start(Observer& observer, uint32_t ctx, int spin_us) {
  observer_ = &observer;
  member_.ctx = ctx;
  spin_us_ = spin_us;
  driver_->attach(this);
  driver_->family->join(&member_);
  executor_ = std::thread([this] { run(); });
}

bool Scheduler::mark_broken(std::exception_ptr cause) {
  MutexLock g(mu_);
  if (!broken_) broken_ = std::move(cause);
  return in_transport();
}

std::exception_ptr Scheduler::broken() const {
  MutexLock g(mu_);
  return broken_;
}

void Scheduler::notify() { cv_.notify_all(); }

bool Scheduler::stop(bool queued_counts) {
  bool pending;
  {
    MutexLock g(mu_);
    stop_ = true;
    pending = in_transport() || (queued_counts && !queue_.empty());
  }
  driver_->family->stop(&member_);
  cv_.notify_all();
  return pending;
}

void Scheduler::join() {
  if (executor_.joinable()) executor_.join();
  DriveGuard d(driver_->lock());  // waits for a caller still driving
  driver_->sched = nullptr;
  driver_->family->leave(&member_);
}

WorkPtr Scheduler::enqueue(Op&& op) {
  const bool p2p = op.is_p2p();
  const bool blocking = op.opts.blocking && !p2p;  // a blocking send could never meet its receive
  WorkPtr w;
  std::unique_lock<DriveLock> drive(driver_->lock(), std::defer_lock);
  bool now = false;
  {
    MutexLock g(mu_);
    if (stop_) throw Aborted(runner_.prefix(op) + "the communicator is being destroyed");
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
    now = drive.owns_lock() && driver_->family->size() <= 1 && inflight_.load() == 0 && !broken_;
    if (now) {
      busy_.store(true, std::memory_order_release);  // mu_ orders it for mark_broken()
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
    assert_driving();
    run_now(op, *w);
    return w;
  }
  if (drive.owns_lock()) {
    assert_driving();
    drain(true);  // runs the queue, which starts with this operation
    drive.unlock();
  } else {
    cv_.notify_one();
    runner_.wake();  // an executor idle in the transport takes it at once
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
WorkPtr Scheduler::done_work(uint64_t seq) {
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
void Scheduler::run_now(Op& op, Work& work) {
  runner_.prepare(true);
  observer_->started_now(op);
  runner_.execute(op, work, true);  // enqueue() found it unbroken; `work` is not shared yet
  busy_.store(false, std::memory_order_release);
}

bool Scheduler::drain(bool inline_caller, const Work* waiting) {
  bool progressed = false;
  const bool had_inflight = inflight() > 0;
  turn_blocked_ = false;
  runner_.prepare(inline_caller);
  for (;;) {
    std::unique_ptr<Op> op;
    bool wake_executor;
    {
      MutexLock g(mu_);
      if (stop_ || queue_.empty()) break;
      if (!driver_->family->my_turn(&member_)) {  // a group's earlier operation goes first
        turn_blocked_ = true;
        break;
      }
      op = std::move(queue_.front());
      queue_.pop_front();
      driver_->family->advance(&member_, queue_.empty() ? Family::kNone : queue_.front()->ticket);
      busy_.store(true);
      wake_executor = deferring_;
    }
    if (wake_executor) cv_.notify_all();  // it deferred to us: it may go back to sleep
    runner_.execute(*op, *op->work, false);
    progressed = true;
    busy_.store(false);
  }
  if (inflight() > 0) {
    const size_t before = inflight();
    runner_.progress(Clock::now());
    const bool more = waiting && spin_us_ > 0 && !waiting->test() && spin(*waiting);
    progressed = progressed || more || inflight() != before;
  }
  if (!had_inflight && inflight() > 0) {
    // Sends and receives went in flight: the executor thread progresses them
    // (it sleeps on cv_ until inflight_ says so; taking mu_ orders the
    // count's store before its look).
    { MutexLock g(mu_); }
    cv_.notify_one();
  }
  return progressed;
}

// The caller waits for a send or receive in flight: drive the transport here
// for up to spin_us_, as a collective's wait does, rather than sleep at once
// while the executor thread blocks in epoll (each of the two wake-ups that
// costs is tens of microseconds on a virtual machine). Stops early when new
// operations are queued (returns true then: drain() must be called again).
bool Scheduler::spin(const Work& waiting) {
  const auto until = Clock::now() + std::chrono::microseconds(spin_us_);
  const bool yield = runner_.spin_yield();
  YieldGauge& gauge = YieldGauge::here();  // as the transport's own waits do
  if (yield && !gauge.spin()) return false;
  for (unsigned i = 1; inflight() > 0 && !waiting.test(); ++i) {
    runner_.progress(Clock::now());
    if (i % 16 == 0) {
      if (Clock::now() >= until || driver_->lock().contended()) return false;
      MutexLock g(mu_);
      if (stop_) return false;
      if (!queue_.empty()) return true;
    }
    if (yield && !gauge.yield()) return false;
  }
  if (yield) gauge.quiet();
  return false;
}

void Scheduler::run() {
  for (;;) {
    {
      MutexLock g(mu_);
      // Sleep until there is work: queued operations, or sends and receives
      // in flight that need progress (unless the communicator is broken).
      while (!stop_ && queue_.empty() && (inflight() == 0 || broken_)) g.wait(cv_);
      if (stop_) break;  // whatever is queued fails below
      // A caller that waits for its operation right away runs it itself
      // (Work::wait), saving two thread hand-offs; give it the chance before
      // taking the operation. Operations nobody waits for start at most
      // kDeferHandoff later; detached ones (OpOptions) at once.
      if (!queue_.empty() && inflight() == 0 && !queue_.front()->opts.detached) {
        deferring_ = true;
        const auto until = Clock::now() + kDeferHandoff;
        while (!stop_ && !queue_.empty() && g.wait_until(cv_, until)) {
        }
        deferring_ = false;
        if (stop_) break;
        if (queue_.empty()) continue;
      }
    }
    DriveGuard d(driver_->lock());
    drain(false);
    if (turn_blocked_) {
      // Another communicator of the family has an earlier operation: let
      // its thread drive, and come back when this one's turn has come.
      d.unlock();
      driver_->family->wait_turn(&member_);
      continue;
    }
    if (inflight() == 0) continue;
    bool idle;
    {
      MutexLock g(mu_);
      idle = queue_.empty() && !stop_;
    }
    if (!idle) continue;
    // Idle with receives or sends in flight: progress them.
    runner_.progress(Clock::now() + std::chrono::milliseconds(200));
  }
  // Stopping: whatever is left fails.
  auto cause = std::make_exception_ptr(Aborted("communicator destroyed"));
  std::deque<std::unique_ptr<Op>> rest;
  {
    MutexLock g(mu_);
    rest.swap(queue_);
  }
  driver_->family->advance(&member_, Family::kNone);
  for (auto& op : rest) op->work->finish(with_context(cause, runner_.prefix(*op)));
  DriveGuard d(driver_->lock());
  runner_.fail_inflight(cause);
}

}  // namespace shoal::core
