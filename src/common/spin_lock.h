// common/spin_lock.h — a lock for sections of a few stores that are almost
// never contended (the flight recorder's ring, written on every operation).
//
// Uncontended, lock and unlock are one atomic exchange and one store, where
// a std::mutex costs two calls and two locked instructions: on the path of
// every small collective, that difference is measurable. A waiter spins
// briefly, then yields its core; so it must never be held across I/O or a
// long copy made by a thread that may be descheduled for long.
#pragma once

#include <sched.h>

#include <atomic>

#include "common/thread_annotations.h"

namespace shoal {

// The pause between two polls of a busy wait: lets the core's other
// hardware thread run and spares the memory system, without giving the
// core to the scheduler.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class CAPABILITY("spin lock") SpinLock {
 public:
  void lock() ACQUIRE() {
    for (unsigned i = 0; held_.exchange(true, std::memory_order_acquire); ++i) {
      while (held_.load(std::memory_order_relaxed)) {
        if (i < 64) {
          cpu_relax();
        } else {
          sched_yield();
        }
        ++i;
      }
    }
  }
  void unlock() RELEASE() { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};

// Holds a SpinLock for its scope.
class SCOPED_CAPABILITY SpinLockGuard {
 public:
  explicit SpinLockGuard(SpinLock& l) ACQUIRE(l) : l_(l) { l_.lock(); }
  ~SpinLockGuard() RELEASE() { l_.unlock(); }
  SpinLockGuard(const SpinLockGuard&) = delete;
  SpinLockGuard& operator=(const SpinLockGuard&) = delete;

 private:
  SpinLock& l_;
};

}  // namespace shoal
