// launch.cc — how a Call reaches the core: its work is made, device data is
// queued for the host, and the Issuer hands the shoal operations to the
// communicator in call order (device.h). The pipelined all_reduce of a large
// device tensor is in allreduce_pipelined.cc.
#include <ATen/record_function.h>
#include <c10/core/StreamGuard.h>

#include <optional>
#include <utility>
#include <vector>

#include "call.h"
#include "shoal/error.h"

namespace shoal::torch_adapter {
namespace {

// An issue the core refused, as the caller sees it when it ran inline.
[[noreturn]] void rethrow_refusal(std::exception_ptr err) {
  try {
    std::rethrow_exception(err);
  } catch (const shoal::Error& e) {
    raise_refusal(e);
  }
}

}  // namespace

c10::intrusive_ptr<ShoalWork> Call::make_work(std::vector<at::Tensor> outputs, std::shared_ptr<c10::Event> ready) {
  // A profiler event only when something records them (the check is cheap;
  // making the event is not).
  const bool profiled = at::hasCallbacks() && at::isRecordFunctionEnabled();
  std::optional<std::vector<at::Tensor>> inputs;
  if (profiled) inputs = profiled_ ? *profiled_ : outputs;
  auto work = c10::make_intrusive<ShoalWork>(rank(), type_, std::move(outputs), 0, device_, std::move(ready),
                                             profiled ? profiling_title(be_.getBackendName(), type_) : nullptr,
                                             std::move(inputs));
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

}  // namespace shoal::torch_adapter
