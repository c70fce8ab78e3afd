// allreduce_pipelined.cc — all_reduce of one large device tensor, its bytes
// through host memory in pieces, the copies and the host reduction
// overlapped (the device path: device.h).
//
// The tensor is cut into P = ceil(n / c) pieces of c = SHOAL_DEVICE_CHUNK_BYTES,
// each in a staging buffer of its own, so that the copy down of piece k+1,
// the reduction of piece k across ranks and the copy back of piece k-1
// overlap. Cost: about (P + 2) * max(d2h(c), allreduce(c), h2d(c)) against
// d2h(n) + allreduce(n) + h2d(n) in one piece; each piece is a collective of
// its own, so the host all_reduce's latency terms (alpha) are paid P times.
// The pieces in flight fit in the staging pool's cap (SHOAL_DEVICE_STAGING_BYTES).
//
// Chosen by ShoalBackend::allreduce (backend_collectives.cc) for a
// contiguous device tensor of more than one piece; a smaller or
// non-contiguous one goes through Call::launch in one piece.
//
// Runs on the Issuer's thread: it waits for each piece to reach the host
// before handing it to the core, and for room in the pool before copying the
// next one down. The caller waits on events, never on this thread.
#include <c10/core/StreamGuard.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "call.h"

namespace shoal::torch_adapter {

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
