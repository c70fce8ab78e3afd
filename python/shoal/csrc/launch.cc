// launch.cc — how a Call reaches the core: its work is made, device data is
// queued for the host, and the Issuer hands the shoal operations to the
// communicator in call order (device.h); plus the pipelined all_reduce of a
// large device tensor.
#include <ATen/record_function.h>
#include <c10/core/StreamGuard.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "call.h"
#include "shoal/error.h"

namespace shoal::torch_adapter {
namespace {

// An issue the core refused, as the caller sees it when it ran inline.
[[noreturn]] void rethrow_refusal(std::exception_ptr err) {
  try {
    std::rethrow_exception(err);
  } catch (const shoal::InvalidArgument& e) {
    TORCH_CHECK(false, e.what());
  } catch (const shoal::Error& e) {
    C10_THROW_ERROR(DistBackendError, torch_message(e));
  }
}

}  // namespace

// "shoal:all_reduce", as the built-in backends name their profiler events
// ("gloo:all_reduce"): torch's suite and trace tools look for these. The
// strings live as long as the process (the profiler keeps the pointer); the
// backend asks once per type (ShoalBackend::profiling_title).
const char* profiling_title(const std::string& backend, c10d::OpType type) {
  const char* op = "unknown";
  switch (type) {
    case c10d::OpType::BROADCAST: op = "broadcast"; break;
    case c10d::OpType::ALLREDUCE: op = "all_reduce"; break;
    case c10d::OpType::ALLREDUCE_COALESCED: op = "all_reduce_coalesced"; break;
    case c10d::OpType::REDUCE: op = "reduce"; break;
    case c10d::OpType::ALLGATHER: op = "all_gather"; break;
    case c10d::OpType::_ALLGATHER_BASE: op = "all_gather_into_tensor"; break;
    case c10d::OpType::ALLGATHER_COALESCED: op = "all_gather_coalesced"; break;
    case c10d::OpType::COALESCED: op = "all_gather_into_tensor_coalesced"; break;
    case c10d::OpType::GATHER: op = "gather"; break;
    case c10d::OpType::SCATTER: op = "scatter"; break;
    case c10d::OpType::REDUCE_SCATTER: op = "reduce_scatter"; break;
    case c10d::OpType::_REDUCE_SCATTER_BASE: op = "reduce_scatter_tensor"; break;
#if SHOAL_TORCH_AT_LEAST(12)
    case c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED: op = "reduce_scatter_tensor_coalesced"; break;
#endif
    case c10d::OpType::ALLTOALL_BASE:
    case c10d::OpType::ALLTOALL: op = "all_to_all"; break;
    case c10d::OpType::SEND: op = "send"; break;
    case c10d::OpType::RECV: op = "recv"; break;
    case c10d::OpType::RECVANYSOURCE: op = "recvAnySource"; break;
    case c10d::OpType::BARRIER: op = "barrier"; break;
    default: break;
  }
  static std::mutex mu;
  static auto* titles = new std::set<std::string>();  // never freed: see above
  std::lock_guard<std::mutex> g(mu);
  return titles->insert(backend + ":" + op).first->c_str();
}

c10::intrusive_ptr<ShoalWork> Call::make_work(std::vector<at::Tensor> outputs, std::shared_ptr<c10::Event> ready) {
  // A profiler event only when something records them (the check is cheap;
  // making the event is not).
  const bool profiled = at::hasCallbacks() && at::isRecordFunctionEnabled();
  std::optional<std::vector<at::Tensor>> inputs;
  if (profiled) inputs = profiled_ ? *profiled_ : outputs;
  auto work = c10::make_intrusive<ShoalWork>(rank(), type_, std::move(outputs), 0, device_, std::move(ready),
                                             profiled ? be_.profiling_title(type_) : nullptr, std::move(inputs));
  for (auto& t : keep_) work->keep(std::move(t));
  for (auto& f : finishers_) work->on_success(std::move(f));
  for (auto& [user, staged] : copy_back_) {
    work->on_success([user = user, staged = staged]() mutable { user.copy_(staged, /*non_blocking=*/true); });
  }
  ShoalWork::start(work, be_.completer_->queue());
  return work;
}

c10::intrusive_ptr<c10d::Work> Call::launch(std::vector<at::Tensor> outputs, Issue issue) {
  std::shared_ptr<c10::Event> ready, copied;
  if (device_) {
    DeviceSide& ds = *device_;
    ready = std::make_shared<c10::Event>(ds.device.type());
    ready->record(ds.current());
    if (!downs_.empty()) {
      ready->block(ds.d2h);
      c10::StreamGuard on_d2h(ds.d2h);
      for (auto& [host, src] : downs_) {
        DeviceSide::record_on(src, ds.d2h);
        host.copy_(src, /*non_blocking=*/true);
      }
      copied = std::make_shared<c10::Event>(ds.device.type());
      copied->record(ds.d2h);
    }
    for (auto& [user, staged] : copy_back_) DeviceSide::record_on(user, ds.h2d);
    for (auto& t : written_) DeviceSide::record_on(t, ds.h2d);
    // The Issuer runs it after the copies, on its own thread (the caller
    // waits on the work's events): no hand-off to the core's executor.
    oo_.blocking = true;
  }
  auto work = make_work(std::move(outputs), ready);
  // Hands the operations to the core; the error (the work failed with it) if it refused them.
  auto run = [work, comm = comm_, oo = oo_, issue = std::move(issue), copied, be = &be_,
              counted = collective_]() -> std::exception_ptr {
    try {
      if (copied) copied->synchronize();
      std::vector<WorkPtr> works = issue(*comm, oo);
      // Counted once the core took it (a refused call counts nothing), in
      // issue order, so that ranks agree.
      if (counted) work->set_seq(++be->seq_);
      for (auto& w : works) ShoalWork::add(work, std::move(w));
      ShoalWork::seal(work, nullptr, /*issuing_thread=*/true);
      return nullptr;
    } catch (...) {
      ShoalWork::seal(work, std::current_exception(), /*issuing_thread=*/true);
      return std::current_exception();
    }
  };
  if (!be_.uses_device_.load(std::memory_order_acquire)) {
    // A group that never had a device operation has nothing queued to keep
    // order with: straight to the core, on this thread.
    if (auto err = run()) rethrow_refusal(err);
    return work;
  }
  std::exception_ptr refused;  // set only by an inline run, read below
  be_.issuer_->submit(
      [run = std::move(run), refused_at = &refused](bool now) {
        std::exception_ptr err = run();
        if (now) *refused_at = err;
      },
      /*may_run_inline=*/!device_);
  if (refused) rethrow_refusal(refused);
  return work;
}

// The shortest path for a small tensor is one piece: one copy down, one
// all_reduce, one copy back. A larger one goes in pieces of chunk_bytes,
// each in a staging buffer of its own, so that the copy down of piece k+1,
// the reduction of piece k across ranks and the copy back of piece k-1
// overlap; the pieces in flight fit in the pool's cap. Runs on the Issuer's
// thread: it waits for each piece to reach the host before handing it to the
// core, and for room in the pool before copying the next one down.
c10::intrusive_ptr<c10d::Work> Call::launch_pipelined_allreduce(const at::Tensor& t, const Elem& e, ReduceOp op) {
  std::shared_ptr<DeviceSide> ds = device_;
  auto ready = std::make_shared<c10::Event>(ds->device.type());
  ready->record(ds->current());
  DeviceSide::record_on(t, ds->d2h);
  DeviceSide::record_on(t, ds->h2d);
  keep_.push_back(t);
  auto work = make_work({t}, ready);
  oo_.detached = true;  // the pieces are issued here, on the Issuer's thread; the caller waits on events
  auto job = [work, ds, ready, comm = comm_, oo = oo_, t, e, op, be = &be_](bool) {
    try {
      const at::Tensor flat = t.view({-1});
      const int64_t n = flat.numel();
      const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(ds->chunk_bytes) / t.element_size());
      const int64_t pieces = std::max<int64_t>(1, (n + per - 1) / per);
      auto piece = [&](int64_t k) { return flat.narrow(0, k * per, std::min(per, n - k * per)); };
      ready->block(ds->d2h);
      std::vector<at::Tensor> host(pieces);
      std::vector<std::unique_ptr<c10::Event>> down(pieces);
      int64_t next = 0;  // the next piece to copy down
      work->set_seq(++be->seq_);
      for (int64_t k = 0; k < pieces; ++k) {
        while (next < pieces) {
          const at::Tensor src = piece(next);
          const size_t bytes = static_cast<size_t>(src.numel()) * t.element_size();
          at::Tensor h = next == k ? ds->pool.acquire(bytes, t.scalar_type(), /*wait=*/true)
                                   : ds->pool.try_acquire(bytes, t.scalar_type());
          if (!h.defined()) break;
          {
            c10::StreamGuard on_d2h(ds->d2h);
            h.copy_(src, /*non_blocking=*/true);
          }
          down[next] = std::make_unique<c10::Event>(ds->device.type());
          down[next]->record(ds->d2h);
          host[next++] = std::move(h);
        }
        down[k]->synchronize();
        down[k].reset();
        if (work->failed()) break;
        at::Tensor h = std::move(host[k]);
        WorkPtr w = comm->allreduce(h.data_ptr(), h.data_ptr(), e.count(h), e.dt, op, oo);
        ShoalWork::add(work, std::move(w), [h, dst = piece(k)]() mutable { dst.copy_(h, /*non_blocking=*/true); });
      }
      ShoalWork::seal(work, nullptr, /*issuing_thread=*/true);
    } catch (...) {
      ShoalWork::seal(work, std::current_exception(), /*issuing_thread=*/true);
    }
  };
  be_.issuer_->submit(std::move(job), /*may_run_inline=*/false);
  return work;
}

}  // namespace shoal::torch_adapter
