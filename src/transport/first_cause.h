// transport/first_cause.h — the broken state of a transport: the first cause
// wins, later ones are dropped; any thread may set it, the driving thread
// tests it cheaply on every call.
#pragma once

#include <atomic>
#include <exception>
#include <mutex>

#include "common/thread_annotations.h"

namespace shoal::transport {

class FirstCause {
 public:
  // Records `cause` unless one is recorded already; returns the first.
  std::exception_ptr keep(std::exception_ptr cause) {
    std::exception_ptr first;
    {
      MutexLock g(mu_);
      if (!cause_) cause_ = cause;
      first = cause_;
    }
    set_.store(true, std::memory_order_release);
    return first;
  }
  std::exception_ptr get() const {
    MutexLock g(mu_);
    return cause_;
  }
  // Lock-free: true once a cause is recorded.
  bool set() const { return set_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> set_{false};
  mutable Mutex mu_;
  std::exception_ptr cause_ GUARDED_BY(mu_);
};

}  // namespace shoal::transport
