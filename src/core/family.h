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
  };

  DriveLock drive;

  void join(Member* m) {
    std::lock_guard<std::mutex> g(m_);
    members_.push_back(m);
    count_.store(static_cast<int>(members_.size()));
  }
  void leave(Member* m) {
    {
      std::lock_guard<std::mutex> g(m_);
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
    std::lock_guard<std::mutex> g(m_);
    cv_.notify_all();
  }
  // Whether m's front operation may run now: no other member has an earlier one.
  bool my_turn(const Member* m) {
    if (count_.load() <= 1) return true;  // a member that joins later has only later tickets
    std::lock_guard<std::mutex> g(m_);
    return turn_locked(m);
  }
  // Waits until m's front operation may run, or m stops.
  void wait_turn(const Member* m) {
    std::unique_lock<std::mutex> g(m_);
    waiters_.fetch_add(1);  // before the test: advance() sees it, or we see its store
    cv_.wait(g, [&] { return m->stopping.load() || turn_locked(m); });
    waiters_.fetch_sub(1);
  }

 private:
  bool turn_locked(const Member* m) const {
    const uint64_t mine = m->front.load();
    for (const Member* o : members_) {
      if (o != m && o->front.load() < mine) return false;
    }
    return true;
  }
  void notify_waiters() {
    if (waiters_.load() == 0) return;
    std::lock_guard<std::mutex> g(m_);
    cv_.notify_all();
  }

  std::atomic<uint64_t> next_{0};
  std::atomic<int> count_{0};
  std::atomic<int> waiters_{0};
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<Member*> members_;  // GUARDED_BY(m_)
};

}  // namespace shoal::core
