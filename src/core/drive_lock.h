// core/drive_lock.h — the right to drive a transport, shared by the
// communicators that use it (a parent and the groups split from it).
//
// A FIFO (ticket) lock. The executor of a communicator that idles with sends
// and receives in flight takes and releases it in a loop; a plain mutex
// could hand it back to that thread every time and starve another
// communicator's thread waiting to run a collective. lock() first calls
// `wake` (the transport's wake()), so that a holder blocked in an idle wait
// for network events lets go at once. Uncontended, taking and releasing it
// is two atomic operations (it sits on the path of every small collective).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>

#include "common/thread_annotations.h"

namespace shoal::core {

class CAPABILITY("drive lock") DriveLock {
 public:
  DriveLock() = default;
  void set_wake(std::function<void()> wake) { wake_ = std::move(wake); }

  void lock() ACQUIRE() {
    const uint64_t ticket = next_.fetch_add(1);
    if (serving_.load() == ticket) return;
    if (wake_) wake_();
    std::unique_lock<std::mutex> g(m_);
    waiters_.fetch_add(1);  // before the test below: unlock() sees it, or we see its increment
    cv_.wait(g, [&] { return serving_.load() == ticket; });
    waiters_.fetch_sub(1);
  }
  // Succeeds only when nobody holds the lock or waits for it.
  bool try_lock() TRY_ACQUIRE(true) {
    uint64_t s = serving_.load();
    return next_.compare_exchange_strong(s, s + 1);
  }
  void unlock() RELEASE() {
    serving_.fetch_add(1);
    if (waiters_.load() > 0) {
      std::lock_guard<std::mutex> g(m_);  // a waiter is either before its test or asleep
      cv_.notify_all();
    }
  }
  // Another thread waits for the lock (the holder should let go soon).
  bool contended() const { return next_.load() - serving_.load() > 1; }

 private:
  std::atomic<uint64_t> next_{0};     // the next ticket
  std::atomic<uint64_t> serving_{0};  // the ticket that holds the lock
  std::atomic<int> waiters_{0};
  std::mutex m_;
  std::condition_variable cv_;
  std::function<void()> wake_;  // set before the lock is shared
};

// Holds a DriveLock for its scope (or until unlock()); adopts one already
// taken with try_lock().
class SCOPED_CAPABILITY DriveGuard {
 public:
  explicit DriveGuard(DriveLock& l) ACQUIRE(l) : l_(l) { l_.lock(); }
  DriveGuard(DriveLock& l, std::adopt_lock_t) REQUIRES(l) : l_(l) {}
  ~DriveGuard() RELEASE() {
    if (held_) l_.unlock();
  }
  void unlock() RELEASE() {
    l_.unlock();
    held_ = false;
  }
  DriveGuard(const DriveGuard&) = delete;
  DriveGuard& operator=(const DriveGuard&) = delete;

 private:
  DriveLock& l_;
  bool held_ = true;
};

}  // namespace shoal::core
