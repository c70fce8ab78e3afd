// core/work.cc — the completion handle of one operation.
#include "shoal/communicator.h"

namespace shoal {

void Work::wait() {
  if (finished_.load(std::memory_order_acquire)) {
    if (error_) std::rethrow_exception(error_);
    return;
  }
  std::unique_lock<std::mutex> g(mu_);
  while (!done_) {
    if (help_) {
      g.unlock();
      bool progressed = help_(*this);
      g.lock();
      if (progressed) continue;
    }
    cv_.wait(g, [&] { return done_; });
  }
  if (error_) std::rethrow_exception(error_);
}

bool Work::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> g(mu_);
  if (!cv_.wait_for(g, timeout, [&] { return done_; })) return false;
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Work::test() const { return finished_.load(std::memory_order_acquire); }

std::exception_ptr Work::error() const {
  std::lock_guard<std::mutex> g(mu_);
  return error_;
}

int Work::source() const {
  std::lock_guard<std::mutex> g(mu_);
  return source_;
}

void Work::on_complete(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!done_) {
      hooks_.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

void Work::finish(std::exception_ptr err, int source) {
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (done_) return;
    done_ = true;
    error_ = err;
    source_ = source;
    finished_.store(true, std::memory_order_release);
    hooks.swap(hooks_);
  }
  cv_.notify_all();
  for (auto& h : hooks) {
    try {
      h();
    } catch (...) {
    }
  }
}

}  // namespace shoal
