// core/family.h — what a communicator shares with the groups split from it
// (Communicator::split): the right to drive their one transport, and the
// order in which their operations run.
//
// Operations of the family run one at a time in the order they were issued
// across all its communicators, so that ranks which issue them in the same
// order also run them in the same order (a communicator's executor drains
// its own queue; without a family-wide order, one rank could run a parent's
// later operation before a group's earlier one and another rank not). Each
// operation draws a ticket when queued; a communicator runs its next
// operation only when no other member has one queued with a smaller ticket.
// A family of one (no groups) pays a few atomic operations per operation.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

#include "common/thread_annotations.h"
#include "core/drive_lock.h"

namespace shoal::core {

class Family {
 public:
  static constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();

  // A member's queue: the ticket at its front (kNone when empty). Written
  // under the member's own queue lock.
  struct Member {
    std::atomic<uint64_t> front{kNone};
    std::atomic<bool> stopping{false};  // wakes wait_turn()
    uint32_t ctx = 0;                   // the communicator's context id (0: the root)
    std::atomic<uint64_t> started{0};   // seq of its last collective that started running
  };

  // The collective running now (set by whoever drives): what a rank blocked
  // in it publishes, so that a peer can tell it waits in another member's
  // operation (CommunicatorImpl::order_check).
  // (Release stores: read only by this rank's own waits and its peers'
  // order checks, well after; a locked store here would cost every
  // collective.)
  void running(Member* m, uint64_t seq) {
    m->started.store(seq, std::memory_order_release);
    cur_ctx_.store(m->ctx, std::memory_order_release);
    cur_seq_.store(seq, std::memory_order_release);
  }
  uint32_t current_ctx() const { return cur_ctx_.load(); }
  uint64_t current_seq() const { return cur_seq_.load(); }
  // The member with context id `ctx`, if this rank has one: the seq of its
  // last started collective (else false).
  bool started_in(uint32_t ctx, uint64_t* seq) {
    MutexLock g(m_);
    for (const Member* o : members_) {
      if (o->ctx == ctx) {
        *seq = o->started.load();
        return true;
      }
    }
    return false;
  }
  int size() const { return count_.load(); }

  DriveLock drive;

  void join(Member* m) {
    MutexLock g(m_);
    members_.push_back(m);
    count_.store(static_cast<int>(members_.size()));
  }
  void leave(Member* m) {
    {
      MutexLock g(m_);
      members_.erase(std::remove(members_.begin(), members_.end(), m), members_.end());
      count_.store(static_cast<int>(members_.size()));
    }
    cv_.notify_all();
  }
  // A new operation at the back of m's queue: its ticket.
  uint64_t draw(Member* m, bool queue_was_empty) {
    const uint64_t t = next_.fetch_add(1);
    if (queue_was_empty) m->front.store(t);
    return t;
  }
  // m's queue front changed (popped, or emptied: kNone).
  void advance(Member* m, uint64_t new_front) {
    m->front.store(new_front);
    notify_waiters();
  }
  void stop(Member* m) {
    m->stopping.store(true);
    MutexLock g(m_);
    cv_.notify_all();
  }
  // Whether m's front operation may run now: no other member has an earlier one.
  bool my_turn(const Member* m) {
    if (count_.load() <= 1) return true;  // a member that joins later has only later tickets
    MutexLock g(m_);
    return turn_locked(m);
  }
  // Waits until m's front operation may run, or m stops.
  void wait_turn(const Member* m) {
    MutexLock g(m_);
    waiters_.fetch_add(1);  // before the test: advance() sees it, or we see its store
    while (!m->stopping.load() && !turn_locked(m)) g.wait(cv_);
    waiters_.fetch_sub(1);
  }

 private:
  bool turn_locked(const Member* m) const REQUIRES(m_) {
    const uint64_t mine = m->front.load();
    for (const Member* o : members_) {
      if (o != m && o->front.load() < mine) return false;
    }
    return true;
  }
  void notify_waiters() {
    if (waiters_.load() == 0) return;
    MutexLock g(m_);
    cv_.notify_all();
  }

  std::atomic<uint64_t> next_{0};
  std::atomic<uint32_t> cur_ctx_{0};
  std::atomic<uint64_t> cur_seq_{0};
  std::atomic<int> count_{0};
  std::atomic<int> waiters_{0};
  Mutex m_;
  std::condition_variable cv_;
  std::vector<Member*> members_ GUARDED_BY(m_);
};

}  // namespace shoal::core
