// backend.h — shoal as a torch.distributed backend: a c10d::Backend over a
// shoal::Communicator, and the c10d::Work that wraps shoal's work handles.
//
// Ordering: every collective of one backend is queued on its communicator in
// the order the calls reach it, so they complete in issue order on every rank
// (the contract of shoal::Communicator and of c10d).
//
// Tensors: shoal works on raw pointers. A ShoalWork holds every tensor an
// operation touches (the user's and any staging copy) until it completes.
// Non-contiguous tensors are staged: inputs are copied into contiguous
// buffers before the call, outputs are received into contiguous buffers and
// copied back when the operation completes, before the work and its future
// are marked complete.
//
// Completion: shoal::Work::on_complete runs on the communicator's executor
// thread, which must never block. When nothing else has to happen (no copy
// back, no one holds the future) the work is marked complete right there.
// Otherwise it is handed to the backend's completion thread, which does the
// copy back and marks the c10::ivalue::Future completed; callbacks chained on
// the future (DDP communication hooks, Python ones taking the GIL) therefore
// run on that thread, never on shoal's executor.
//
// Errors: bad arguments raise (RuntimeError in Python) from the call itself,
// naming the rank, the collective and the argument, before anything is
// queued. Failures while running (a lost peer, a timeout, a mismatch) make the
// work fail with c10::DistBackendError carrying shoal's message.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shoal/communicator.h"

namespace shoal::torch_adapter {

class ShoalWork;

// The threads that finish works whose completion needs more than a flag:
// copies back into user tensors and future callbacks. Callbacks may block
// (PowerSGD's hook waits on a nested allreduce's future inside a callback),
// so a work is never left queued behind a busy thread: when no thread is
// idle, post() starts another (up to kMaxThreads). Works hold a shared
// reference to the queue, so the last reference may go on any thread.
class Completer {
 public:
  static constexpr int kMaxThreads = 64;

  struct Queue : std::enable_shared_from_this<Queue> {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<c10::intrusive_ptr<ShoalWork>> items;  // under mu
    std::vector<std::thread> threads;                 // under mu
    int idle = 0;                                     // under mu
    bool stop = false;                                // under mu
    void post(c10::intrusive_ptr<ShoalWork> w);
  };

  Completer();
  ~Completer();  // drains the queue, then joins
  Completer(const Completer&) = delete;
  Completer& operator=(const Completer&) = delete;

  const std::shared_ptr<Queue>& queue() const { return queue_; }

 private:
  static void run(std::shared_ptr<Queue> q);
  std::shared_ptr<Queue> queue_;
};

class ShoalWork : public c10d::Work {
 public:
  ShoalWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, uint64_t seq);
  ~ShoalWork() override;

  // Setup, before start(): tensors to keep alive, work to do at completion.
  void keep(at::Tensor t) { keep_.push_back(std::move(t)); }
  void on_success(std::function<void()> fn) { finishers_.push_back(std::move(fn)); }
  // Tracks the given shoal works; completes when all of them have.
  static void start(const c10::intrusive_ptr<ShoalWork>& self, std::vector<WorkPtr> works,
                    std::shared_ptr<Completer::Queue> completer);

  // c10d::Work. wait() first waits on shoal's handles, which lets the
  // calling thread run the queued operation itself when the executor is idle.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  uint64_t getSequencenumber() const override { return seq_; }

  // Run by the completion thread (or inline when nothing else is needed).
  void complete();

 private:
  void core_done(const c10::intrusive_ptr<ShoalWork>& self, std::exception_ptr err);

  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;
  std::vector<std::function<void()>> finishers_;
  std::vector<WorkPtr> works_;  // set by start(), then read-only
  std::shared_ptr<Completer::Queue> completer_;
  const uint64_t seq_;
  int source_ = -1;
  c10::intrusive_ptr<c10::ivalue::Future> future_;

  std::mutex state_mu_;
  int pending_ = 0;                  // under state_mu_
  std::exception_ptr first_error_;   // under state_mu_
  bool future_shared_ = false;       // under state_mu_: getFuture() was called
};

struct BackendConfig {
  std::string name = "shoal";             // the name PyTorch knows the backend by
  std::string group_name;                 // torch's group name (for messages)
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  std::string advertise_host;             // empty: shoal's default
  std::vector<int64_t> global_ranks;      // empty: the world
  int store_host_rank = -1;               // group rank hosting the store, if any
};

class ShoalBackend : public c10d::Backend {
 public:
  ShoalBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, BackendConfig cfg);
  ~ShoalBackend() override;

  const std::string getBackendName() const override { return cfg_.name; }
  void setTimeout(std::chrono::milliseconds timeout) override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;
  c10d::ErrorType getError() override;
  void abort() override;
  void shutdown() override;

  // For tests and diagnostics: the first error that broke the communicator.
  std::string comm_error() const;

 private:
  friend class Call;
  std::shared_ptr<Communicator> comm() const;
  OpOptions op_options(std::chrono::milliseconds timeout) const;
  // The timeout an operation runs under (see backend.cc); nullopt: the communicator's.
  std::optional<std::chrono::milliseconds> resolve_timeout(std::chrono::milliseconds timeout) const;

  BackendConfig cfg_;
  mutable std::mutex mu_;
  std::shared_ptr<Communicator> comm_;     // under mu_; null after shutdown()
  std::unique_ptr<Completer> completer_;
  std::atomic<int64_t> default_timeout_ms_;
  std::atomic<uint64_t> seq_{0};           // collectives issued (same on every rank)
  std::atomic<uint64_t> monitored_barrier_count_{0};
};

}  // namespace shoal::torch_adapter
