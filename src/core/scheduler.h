// core/scheduler.h — the order in which a communicator's operations run,
// and which thread runs them (internal).
//
// Callers enqueue; operations run one at a time in queue order and, across
// the communicators that share a transport (a family: family.h), in the
// order they were issued. Whoever holds the family's drive lock runs them:
// the scheduler's executor thread; a caller waiting for its operation
// (Work::wait, through Driver::help); or, for a blocking collective of an
// idle communicator alone in its family, the caller at once, without the
// queue (run-now). Sends and receives stay in flight after they are posted;
// a caller waiting for one drives them for a while, then hands them to the
// executor thread, which moves them whenever nothing else runs.
//
// What an operation does is the Runner's business (CommunicatorImpl); the
// scheduler never touches the transport.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <string>
#include <thread>

#include "common/thread_annotations.h"
#include "core/family.h"
#include "core/observer.h"
#include "core/op.h"
#include "transport/transport.h"

namespace shoal::core {

// What the scheduler asks of the communicator it schedules for. Called only
// by the thread that drives (it holds the family's drive lock).
class Runner {
 public:
  virtual ~Runner() = default;
  // Readies the transport for this thread: a caller driving inline spins
  // for the spin budget; the executor thread does not spin.
  virtual void prepare(bool inline_caller) = 0;
  // Runs `op`: a collective to its end, a send or receive posted (it is then
  // in flight). `now`: the run-now path, whose `work` nobody holds yet.
  virtual void execute(Op& op, Work& work, bool now) = 0;
  // Moves the sends and receives in flight until `until` (once if past),
  // completing those done; a transport failure fails them all.
  virtual void progress(transport::Clock::time_point until) = 0;
  // Fails every send and receive in flight with `cause`.
  virtual void fail_inflight(std::exception_ptr cause) = 0;
  // Whether a spinning wait should yield the core (more ranks than cores).
  virtual bool spin_yield() const = 0;
  // "shoal rank R: allreduce seq S: ", for the errors of `op`.
  virtual std::string prefix(const Op& op) const = 0;
  // Wakes the thread that drives, if it sleeps in the transport (any thread).
  virtual void wake() = 0;
};

class Scheduler;

// The right to drive the transport, held by whoever runs operations. Works
// keep it (their helper), so it outlives the scheduler: `sched` is cleared
// under the lock when the scheduler goes away. Communicators that share a
// transport share the family, and with it the lock.
struct Driver {
  std::shared_ptr<Family> family;
  Scheduler* sched GUARDED_BY(family->drive) = nullptr;
  DriveLock& lock() RETURN_CAPABILITY(family->drive) { return family->drive; }
  // Binds the Driver to `s` before anything is queued: no other thread can
  // reach this Driver yet (Works get it with their first operation), and
  // the family's lock may be held for long by a parent's collective.
  void attach(Scheduler* s) NO_THREAD_SAFETY_ANALYSIS { sched = s; }
  // Called from Work::wait() for `waiting`: runs what is queued if nobody
  // drives now, and drives a send or receive in flight for a while.
  bool help(const Work& waiting);
};

class Scheduler {
 public:
  // For `runner`, in `family` (a new one for a root communicator, the
  // parent's for a group).
  Scheduler(Runner& runner, std::shared_ptr<Family> family);
  ~Scheduler();  // after stop() and join()

  // Starts the executor thread: the scheduler of family member `ctx` (0 for
  // the root), whose operations `observer` follows; a caller that drives
  // inline spins for `spin_us`.
  void start(Observer& observer, uint32_t ctx, int spin_us);
  // Queues `op` (or runs it at once: run-now) and returns its Work; for a
  // blocking collective, returns once it is done.
  WorkPtr enqueue(Op&& op);

  // Marks the communicator broken (the first cause stays): what is queued
  // fails as its turn comes. Returns whether an operation of this
  // communicator is in the transport now (then the transport must be broken
  // to stop it).
  bool mark_broken(std::exception_ptr cause);
  std::exception_ptr broken() const;
  // Wakes the executor thread (after the communicator broke).
  void notify();
  // The first half of stopping: no operation is accepted any more. Returns
  // whether something is in the transport (or, with `queued_counts`, queued)
  // that the transport must be broken to stop.
  bool stop(bool queued_counts);
  // The second half, once the transport was broken and woken if need be:
  // joins the executor thread, whose last act fails what is left, and
  // waits for a caller still driving.
  void join();

  // The collective `seq` starts running now (Family::running).
  void running(uint64_t seq) { driver_->family->running(&member_, seq); }
  // Sends and receives in flight now (the runner says so when it changes).
  void set_inflight(size_t n) { inflight_.store(n); }
  size_t inflight() const { return inflight_.load(); }

  Family& family() { return *driver_->family; }
  const std::shared_ptr<Family>& family_ptr() const { return driver_->family; }
  // The family's drive lock (an expression the thread-safety analysis follows).
  DriveLock& drive() const RETURN_CAPABILITY(driver_->family->drive) { return driver_->family->drive; }
  // Says that this thread drives (the lock was taken through another path,
  // e.g. a std::unique_lock, that the analysis cannot see).
  void assert_driving() const ASSERT_CAPABILITY(driver_->family->drive) {}

 private:
  friend struct Driver;
  void run();
  // Runs every queued operation (the caller drives). Returns true if it
  // ran or completed anything. A caller that waits for `waiting` (a send or
  // receive in flight) drives the transport for up to spin_us_ before
  // handing the sends and receives in flight to the executor thread.
  bool drain(bool inline_caller, const Work* waiting = nullptr) REQUIRES(driver_->family->drive) EXCLUDES(mu_);
  bool spin(const Work& waiting) REQUIRES(driver_->family->drive) EXCLUDES(mu_);
  void run_now(Op& op, Work& work) REQUIRES(driver_->family->drive) EXCLUDES(mu_);
  WorkPtr done_work(uint64_t seq) REQUIRES(mu_);
  bool in_transport() const { return busy_.load() || inflight_.load() > 0; }

  Runner& runner_;
  Observer* observer_ = nullptr;  // set by start()
  int spin_us_ = 0;               // set by start()
  std::shared_ptr<Driver> driver_ = std::make_shared<Driver>();
  Family::Member member_;  // this communicator's queue in the family
  bool turn_blocked_ GUARDED_BY(driver_->family->drive) = false;  // drain() stopped for another member's turn
  std::atomic<size_t> inflight_{0};  // sends and receives in flight (set_inflight)
  std::atomic<bool> busy_{false};    // an operation runs now

  mutable Mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Op>> queue_ GUARDED_BY(mu_);
  uint64_t next_seq_ GUARDED_BY(mu_) = 1;
  bool stop_ GUARDED_BY(mu_) = false;
  bool deferring_ GUARDED_BY(mu_) = false;  // the executor waits for a caller to drive
  std::exception_ptr broken_ GUARDED_BY(mu_);
  WorkPtr done_work_ GUARDED_BY(mu_);  // run_now()'s last Work
  std::thread executor_;
};

}  // namespace shoal::core
