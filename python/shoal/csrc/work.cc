// work.cc — ShoalWork (a c10d::Work over shoal work handles) and the
// completion thread that finishes works needing more than a flag.
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include "backend.h"
#include "shoal/error.h"

namespace shoal::torch_adapter {
namespace {

// shoal's failures cross into Python as torch.distributed.DistBackendError.
std::exception_ptr as_dist_error(std::exception_ptr err) {
  try {
    std::rethrow_exception(err);
  } catch (const c10::Error&) {
    return err;
  } catch (const shoal::Error& e) {
    return std::make_exception_ptr(c10::DistBackendError(
        c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, e.what()));
  } catch (const std::exception& e) {
    return std::make_exception_ptr(c10::DistBackendError(
        c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, e.what()));
  } catch (...) {
    return err;
  }
}

}  // namespace

// ---------------------------------------------------------------- Completer

void Completer::Queue::post(c10::intrusive_ptr<ShoalWork> w) {
  {
    std::lock_guard<std::mutex> g(mu);
    if (!stop || !threads.empty()) {
      items.push_back(std::move(w));
      if (idle == 0 && !stop && threads.size() < static_cast<size_t>(kMaxThreads)) {
        threads.emplace_back(&Completer::run, shared_from_this());
      }
      cv.notify_one();
      return;
    }
  }
  w->complete();  // the backend is gone: finish here
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
    c10::intrusive_ptr<ShoalWork> w;
    {
      std::unique_lock<std::mutex> g(q->mu);
      ++q->idle;
      q->cv.wait(g, [&] { return q->stop || !q->items.empty(); });
      --q->idle;
      if (q->items.empty()) return;  // stopping and drained
      w = std::move(q->items.front());
      q->items.pop_front();
    }
    w->complete();
  }
}

// ---------------------------------------------------------------- ShoalWork

ShoalWork::ShoalWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, uint64_t seq)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      seq_(seq),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

ShoalWork::~ShoalWork() = default;

void ShoalWork::start(const c10::intrusive_ptr<ShoalWork>& self, std::vector<WorkPtr> works,
                      std::shared_ptr<Completer::Queue> completer) {
  self->completer_ = std::move(completer);
  self->works_ = works;
  {
    std::lock_guard<std::mutex> g(self->state_mu_);
    self->pending_ = static_cast<int>(works.size());
  }
  if (works.empty()) {
    self->complete();
    return;
  }
  for (auto& w : works) {
    shoal::Work* raw = w.get();
    // The hook holds the work (and its tensors) alive until it has run.
    w->on_complete([self, raw] { self->core_done(self, raw->error()); });
  }
}

void ShoalWork::core_done(const c10::intrusive_ptr<ShoalWork>& self, std::exception_ptr err) {
  {
    std::lock_guard<std::mutex> g(state_mu_);
    if (err && !first_error_) first_error_ = err;
    if (--pending_ > 0) return;
    if (finishers_.empty() && !future_shared_) {
      // Nothing to copy and no callbacks can be attached while we hold the
      // lock (getFuture() takes it): cheap, finish on the executor thread.
      complete();
      return;
    }
  }
  completer_->post(self);
}

void ShoalWork::complete() {
  std::exception_ptr err = first_error_;
  if (!err) {
    try {
      at::NoGradGuard no_grad;
      for (auto& f : finishers_) f();
    } catch (...) {
      err = std::current_exception();
    }
  }
  finishers_.clear();
  if (err) err = as_dist_error(err);
  if (works_.size() == 1) source_ = works_[0]->source();
  keep_.clear();
  finish(err);
  if (err) {
    future_->setError(err);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

bool ShoalWork::wait(std::chrono::milliseconds timeout) {
  for (auto& w : works_) {
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
  return c10d::Work::wait(timeout);
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
