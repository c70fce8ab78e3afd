// transport/first_cause.h — the broken state of a channel: the first cause
// wins, later ones are dropped; any thread may set it, the driving thread
// tests it cheaply on every call, and fails with it once (fail()).
#pragma once

#include <atomic>
#include <exception>
#include <mutex>

#include "common/thread_annotations.h"
#include "transport/liveness.h"

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

  // The channel fails with `cause` (or the first one recorded), on the
  // driving thread. The first time, it tells the job (Liveness::broke,
  // which publishes the cause for the other ranks; best effort) and then
  // runs `close`, which shuts the channel's connections so that peers
  // blocked on this rank fail too.
  template <class Close>
  [[noreturn]] void fail(std::exception_ptr cause, Liveness& live, Close&& close) {
    std::exception_ptr first = keep(std::move(cause));
    if (!closed_) {
      closed_ = true;
      try {
        live.broke(first);
      } catch (...) {
        // Publishing the cause is best effort; the local error stands.
      }
      close();
    }
    std::rethrow_exception(first);
  }

 private:
  bool closed_ = false;  // driving thread only
  std::atomic<bool> set_{false};
  mutable Mutex mu_;
  std::exception_ptr cause_ GUARDED_BY(mu_);
};

}  // namespace shoal::transport
