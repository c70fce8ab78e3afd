// common/thread_annotations.h — which lock guards what, said so that the
// compiler checks it: clang's -Wthread-safety (on in every clang build)
// reports a guarded field touched without its lock, a lock not released,
// and a function called without the lock it requires. Other compilers see
// nothing.
//
// std::mutex carries no annotations in libstdc++, so the core locks a
// Mutex (a std::mutex that says what it does) through a MutexLock, which
// also waits on a std::condition_variable. Condition waits are written as
// loops over MutexLock::wait(): a predicate lambda is a function of its own
// to the analysis, which cannot see the lock its caller holds.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define SHOAL_TSA(x) __attribute__((x))
#else
#define SHOAL_TSA(x)
#endif

#define CAPABILITY(x) SHOAL_TSA(capability(x))
#define SCOPED_CAPABILITY SHOAL_TSA(scoped_lockable)
#define GUARDED_BY(x) SHOAL_TSA(guarded_by(x))
#define PT_GUARDED_BY(x) SHOAL_TSA(pt_guarded_by(x))
#define REQUIRES(...) SHOAL_TSA(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) SHOAL_TSA(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) SHOAL_TSA(acquire_capability(__VA_ARGS__))
#define RELEASE(...) SHOAL_TSA(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) SHOAL_TSA(try_acquire_capability(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) SHOAL_TSA(assert_capability(x))
#define RETURN_CAPABILITY(x) SHOAL_TSA(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS SHOAL_TSA(no_thread_safety_analysis)

namespace shoal {

class CAPABILITY("mutex") Mutex {
 public:
  void lock() ACQUIRE() { m_.lock(); }
  void unlock() RELEASE() { m_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return m_.try_lock(); }
  std::mutex& native() { return m_; }

 private:
  std::mutex m_;
};

// Holds a Mutex for its scope (or until unlock()).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& m) ACQUIRE(m) : lock_(m.native()) {}
  ~MutexLock() RELEASE() {}
  void unlock() RELEASE() { lock_.unlock(); }
  void lock() ACQUIRE() { lock_.lock(); }
  // Releases the lock while asleep on `cv` and holds it again on return
  // (which may be spurious: callers loop on their condition).
  void wait(std::condition_variable& cv) { cv.wait(lock_); }
  // As wait(), returning false at `until`.
  bool wait_until(std::condition_variable& cv, std::chrono::steady_clock::time_point until) {
    return cv.wait_until(lock_, until) == std::cv_status::no_timeout;
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace shoal
