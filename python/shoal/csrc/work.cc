// work.cc — ShoalWork (a c10d::Work over shoal work handles) and the
// completion threads that finish works needing more than a flag.
#include <ATen/core/ivalue.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>

#include "backend.h"
#include "shoal/error.h"
#include "shoal/error_mapping.h"

namespace shoal::torch_adapter {
namespace {

// A failed work's error crosses into Python as torch.distributed.DistBackendError,
// whatever its category, with torch's phrase (torch_message).
std::exception_ptr as_dist_error(std::exception_ptr err) {
  try {
    std::rethrow_exception(err);
  } catch (const c10::Error&) {
    return err;
  } catch (const shoal::Error& e) {
    return std::make_exception_ptr(c10::DistBackendError(
        c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, torch_message(e)));
  } catch (const std::exception& e) {
    return std::make_exception_ptr(c10::DistBackendError(
        c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, e.what()));
  } catch (...) {
    return err;
  }
}

}  // namespace

std::string torch_message(const shoal::Error& e) { return shoal::error_message(e, "torch"); }

void raise_refusal(const shoal::Error& e, const std::string& prefix) {
  if (shoal::error_mapping(e.code()).category == ErrorCategory::kInvalidArgument) {
    TORCH_CHECK(false, prefix, e.what());
  }
  C10_THROW_ERROR(DistBackendError, prefix + torch_message(e));
}

// ---------------------------------------------------------------- Activity

namespace {
std::atomic<int64_t> g_activity{0};
std::mutex g_activity_mu;
std::condition_variable g_activity_cv;
}  // namespace

void Activity::begin() { g_activity.fetch_add(1, std::memory_order_relaxed); }

void Activity::end() {
  if (g_activity.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    std::lock_guard<std::mutex> g(g_activity_mu);  // pairs with wait_quiet's check
    g_activity_cv.notify_all();
  }
}

bool Activity::wait_quiet(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> g(g_activity_mu);
  return g_activity_cv.wait_for(g, timeout, [] { return g_activity.load(std::memory_order_acquire) == 0; });
}

// ---------------------------------------------------------------- Completer

void Completer::Queue::post(std::function<void()> task) {
  Activity::begin();  // ended once the task has run and is gone
  {
    std::lock_guard<std::mutex> g(mu);
    if (!stop || !threads.empty()) {
      items.push_back(std::move(task));
      if (idle == 0 && !stop && threads.size() < static_cast<size_t>(kMaxThreads)) {
        threads.emplace_back(&Completer::run, shared_from_this());
      }
      cv.notify_one();
      return;
    }
  }
  task();  // the backend is gone: finish here
  task = nullptr;
  Activity::end();
}

Completer::Completer() : queue_(std::make_shared<Queue>()) {}

Completer::~Completer() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> g(queue_->mu);
    queue_->stop = true;
    threads.swap(queue_->threads);
  }
  queue_->cv.notify_all();
  for (auto& t : threads) {
    if (t.get_id() == std::this_thread::get_id()) {
      t.detach();  // the thread owns a reference to the queue; it drains and exits
    } else {
      t.join();
    }
  }
}

void Completer::run(std::shared_ptr<Queue> q) {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> g(q->mu);
      ++q->idle;
      q->cv.wait(g, [&] { return q->stop || !q->items.empty(); });
      --q->idle;
      if (q->items.empty()) return;  // stopping and drained
      task = std::move(q->items.front());
      q->items.pop_front();
    }
    task();
    task = nullptr;  // what it held goes now, not at the next task
    Activity::end();
  }
}

// ---------------------------------------------------------------- ShoalWork

namespace {

c10::intrusive_ptr<c10::ivalue::Future> make_future(const std::shared_ptr<DeviceSide>& device) {
  auto type = c10::ListType::create(c10::TensorType::get());
  if (!device) return c10::make_intrusive<c10::ivalue::Future>(type);
  return c10::make_intrusive<c10::ivalue::Future>(type, std::vector<c10::Device>{device->device});
}

}  // namespace

ShoalWork::ShoalWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, uint64_t seq,
                     std::shared_ptr<DeviceSide> device, std::shared_ptr<c10::Event> ready, const char* title,
                     std::optional<std::vector<at::Tensor>> inputs)
    : c10d::Work(rank, type, title, inputs),
      outputs_(std::move(outputs)),
      seq_(seq),
      device_(std::move(device)),
      ready_(std::move(ready)),
      future_(make_future(device_)) {
  if (device_) done_ = std::make_unique<c10::Event>(device_->device.type());
}

ShoalWork::~ShoalWork() = default;

void ShoalWork::start(const c10::intrusive_ptr<ShoalWork>& self, std::shared_ptr<Completer::Queue> completer) {
  Activity::begin();  // ended when the work has finished (finish_up)
  self->completer_ = std::move(completer);
  std::lock_guard<std::mutex> g(self->state_mu_);
  self->pending_ = 1;  // the seal
}

void ShoalWork::add(const c10::intrusive_ptr<ShoalWork>& self, WorkPtr w, std::function<void()> after) {
  {
    std::lock_guard<std::mutex> g(self->state_mu_);
    ++self->pending_;
    self->works_.push_back(w);
  }
  shoal::Work* raw = w.get();
  if (!after) {
    // The hook holds the work (and its tensors) alive until it has run.
    raw->on_complete([self, raw] { self->part_done(self, raw->error()); });
    return;
  }
  // `after` (which may hold staging buffers) is moved out when the operation
  // ends, run or dropped then: never kept for the life of the shoal work.
  auto fn = std::make_shared<std::function<void()>>(std::move(after));
  // The hook holds the work (and its tensors) alive until it has run.
  raw->on_complete([self, raw, fn] {
    std::function<void()> then = std::move(*fn);
    *fn = nullptr;
    std::exception_ptr err = raw->error();
    if (err || !then) {
      then = nullptr;
      self->part_done(self, err);
      return;
    }
    self->completer_->post([self, then = std::move(then)]() mutable {
      std::exception_ptr e;
      try {
        at::NoGradGuard no_grad;
        std::optional<c10::StreamGuard> on_h2d;
        if (self->device_) {
          on_h2d.emplace(self->device_->h2d);
          self->ready_->block(self->device_->h2d);
        }
        then();
      } catch (...) {
        e = std::current_exception();
      }
      then = nullptr;
      self->part_done(self, e, Finish::kOnCompleter);
    });
  });
}

void ShoalWork::seal(const c10::intrusive_ptr<ShoalWork>& self, std::exception_ptr err, bool issuing_thread) {
  self->part_done(self, err, issuing_thread ? Finish::kOnIssuingThread : Finish::kPost);
}

bool ShoalWork::failed() {
  std::lock_guard<std::mutex> g(state_mu_);
  return first_error_ != nullptr;
}

void ShoalWork::part_done(const c10::intrusive_ptr<ShoalWork>& self, std::exception_ptr err, Finish where) {
  {
    std::lock_guard<std::mutex> g(state_mu_);
    if (err && !first_error_) first_error_ = err;
    if (--pending_ > 0) return;
    if (!future_shared_ && ((finishers_.empty() && !device_) || where == Finish::kOnIssuingThread)) {
      // No callbacks can be attached while we hold the lock (getFuture()
      // takes it), so none runs here: finish on this thread. Cheap when
      // there is nothing to copy (the core's executor may be this thread);
      // on the thread that issued the call, a device work's copies back
      // and its done event are queued here, which spares the caller a
      // second thread's wake-up before it sees the work done.
      complete();
      return;
    }
  }
  if (where == Finish::kOnCompleter) {
    complete();  // what the posted task would do, without the hop
    return;
  }
  completer_->post([self] { self->complete(); });
}

void ShoalWork::complete() {
  if (device_) {
    c10::StreamGuard on_h2d(device_->h2d);
    finish_up();
  } else {
    finish_up();
  }
}

void ShoalWork::finish_up() {
  std::exception_ptr err = first_error_;
  if (!err) {
    try {
      at::NoGradGuard no_grad;
      if (device_ && !finishers_.empty()) ready_->block(device_->h2d);
      for (auto& f : finishers_) f();
    } catch (...) {
      err = std::current_exception();
    }
  }
  finishers_.clear();
  if (device_) {
    done_->record(device_->h2d);
    std::lock_guard<std::mutex> g(sync_mu_);
    done_recorded_ = true;
    sync_cv_.notify_all();
  }
  if (err) err = as_dist_error(err);
  // works_ is final: every add() came before the seal, and we are past it.
  if (works_.size() == 1) source_ = works_[0]->source();
  keep_.clear();
  finish(err);
  if (err) {
    future_->setError(err);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  Activity::end();
}

bool ShoalWork::wait(std::chrono::milliseconds timeout) {
  std::vector<WorkPtr> works;
  {
    std::lock_guard<std::mutex> g(state_mu_);
    works = works_;
  }
  for (auto& w : works) {
    try {
      if (timeout == kNoTimeout) {
        w->wait();
      } else if (!w->wait_for(timeout)) {
        break;
      }
    } catch (...) {
      // Recorded by the completion hook; rethrown below as the work's error.
    }
  }
  return c10d::Work::wait(timeout);  // which calls synchronize()
}

// c10d::Work::wait() calls it once the work has completed, holding the
// work's mutex; Python's work.synchronize() may call it at any time.
void ShoalWork::synchronize() {
  if (!device_) return;
  {
    std::unique_lock<std::mutex> g(sync_mu_);
    sync_cv_.wait(g, [&] { return done_recorded_; });
  }
  done_->block(device_->current());
}

void ShoalWork::blockCurrentStream() { synchronize(); }

bool ShoalWork::isCompleted() {
  if (!c10d::Work::isCompleted()) return false;
  return !device_ || done_->query();
}

int ShoalWork::sourceRank() const {
  std::lock_guard<std::mutex> g(mutex_);
  TORCH_CHECK(completed_, "shoal: sourceRank() of a work that has not completed");
  return source_;
}

std::vector<at::Tensor> ShoalWork::result() { return outputs_; }

c10::intrusive_ptr<c10::ivalue::Future> ShoalWork::getFuture() {
  std::lock_guard<std::mutex> g(state_mu_);
  future_shared_ = true;
  return future_;
}

}  // namespace shoal::torch_adapter
