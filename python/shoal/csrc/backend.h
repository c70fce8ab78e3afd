// backend.h — shoal as a torch.distributed backend: a c10d::Backend over a
// shoal::Communicator, and the c10d::Work that wraps shoal's work handles.
//
// Ordering: every collective of one backend is queued on its communicator in
// the order the calls reach it, so they complete in issue order on every rank
// (the contract of shoal::Communicator and of c10d).
//
// Tensors: shoal works on raw pointers to host memory. A ShoalWork holds
// every tensor an operation touches (the user's and any staging copy) until
// it completes. Non-contiguous tensors are staged: inputs are copied into
// contiguous buffers before the call, outputs are received into contiguous
// buffers and copied back when the operation completes, before the work and
// its future are marked complete. Tensors on a device (CUDA, or any device
// torch drives through c10's streams and events) are staged through pinned
// host buffers on side streams, with NCCL's stream semantics (device.h).
//
// Order: once a group has had a device operation, the Issuer hands every
// operation to the core in call order; one whose device data is still on
// its way down waits there, and so do the CPU operations behind it (one
// process group serves both devices). A group that never had one issues on
// the calling thread, as before (no queue, no cost).
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
#include <torch/headeronly/version.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "device.h"
#include "shoal/communicator.h"
#include "shoal/error.h"

namespace shoal::torch_adapter {

// The c10d names that differ between the torch releases shoal builds against
// (2.11 and later: GPU machines often carry an older torch than the CPU one).
#define SHOAL_TORCH_AT_LEAST(minor) (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= (minor)))
// PREMUL_SUM's factor: 2.13 renamed NCCLPreMulSumSupplement (keeping the old
// name as an alias).
#if SHOAL_TORCH_AT_LEAST(13)
using PreMulSumFactor = c10d::PreMulSumSupplement;
#else
using PreMulSumFactor = c10d::NCCLPreMulSumSupplement;
#endif
// reduce_scatter_tensor_coalesced has an OpType of its own from 2.12; before,
// torch's own backends report it as COALESCED.
#if SHOAL_TORCH_AT_LEAST(12)
inline constexpr c10d::OpType kReduceScatterCoalescedOp = c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED;
#else
inline constexpr c10d::OpType kReduceScatterCoalescedOp = c10d::OpType::COALESCED;
#endif

class ShoalWork;

// What shoal's own threads still have to do for torch: works not finished,
// completion tasks and Issuer jobs not done (with what they hold released).
// At interpreter exit shoal.torch waits (bounded) until there is none, so
// that no thread of ours runs a Python callback or drops the last reference
// to a Python-owned tensor while the interpreter goes away.
struct Activity {
  static void begin();
  static void end();
  static bool wait_quiet(std::chrono::milliseconds timeout);
};

// The threads that finish works whose completion needs more than a flag:
// copies back into user tensors and future callbacks. Callbacks may block
// (PowerSGD's hook waits on a nested allreduce's future inside a callback),
// so a task is never left queued behind a busy thread: when no thread is
// idle, post() starts another (up to kMaxThreads). Tasks hold a shared
// reference to the queue, so the last reference may go on any thread.
class Completer {
 public:
  static constexpr int kMaxThreads = 64;

  struct Queue : std::enable_shared_from_this<Queue> {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> items;  // under mu
    std::vector<std::thread> threads;         // under mu
    int idle = 0;                             // under mu
    bool stop = false;                        // under mu
    void post(std::function<void()> task);
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

// A c10d::Work over the shoal operations of one c10d call. Issued in three
// steps, on whichever thread hands the call to the core: start(), add() for
// each shoal operation (with work to do on the completion thread when it
// has succeeded, e.g. copying one piece back to the device), seal().
//
// On a device (`device` set), completion runs with the device's h2d stream
// current: copies back are queued there after the call's `ready` event,
// then the work's done event is recorded; wait() and synchronize() make the
// caller's current stream wait for it, and the future's events are recorded
// on that stream (its callbacks run on streams that waited for them).
class ShoalWork : public c10d::Work {
 public:
  // `title` and `inputs`: the torch profiler event the work records from
  // construction (on the issuing thread) to completion, as torch's own
  // backends do (see profiling_title in profiler_titles.cc).
  ShoalWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, uint64_t seq,
            std::shared_ptr<DeviceSide> device = nullptr, std::shared_ptr<c10::Event> ready = nullptr,
            const char* title = nullptr, std::optional<std::vector<at::Tensor>> inputs = std::nullopt);
  ~ShoalWork() override;

  // Setup, before start(): tensors to keep alive, work to do at completion.
  void keep(at::Tensor t) { keep_.push_back(std::move(t)); }
  void on_success(std::function<void()> fn) { finishers_.push_back(std::move(fn)); }
  void set_seq(uint64_t seq) { seq_ = seq; }

  static void start(const c10::intrusive_ptr<ShoalWork>& self, std::shared_ptr<Completer::Queue> completer);
  static void add(const c10::intrusive_ptr<ShoalWork>& self, WorkPtr w, std::function<void()> after = {});
  // No more add()s; `err`: the issue itself failed (the work fails with it).
  // `issuing_thread`: called on the thread that issued the call (the
  // caller's or the Issuer's, never the core's executor), which may then
  // finish the work itself when nothing is attached to its future.
  static void seal(const c10::intrusive_ptr<ShoalWork>& self, std::exception_ptr err = nullptr,
                   bool issuing_thread = false);
  bool failed();

  // c10d::Work. wait() first waits on shoal's handles, which lets the
  // calling thread run the queued operation itself when the executor is idle.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  void blockCurrentStream() override;
  bool isCompleted() override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  uint64_t getSequencenumber() const override { return seq_; }

 private:
  // Where the last part may finish the work: posted to the completion
  // thread, or on this thread (see seal(); kOnCompleter: this is it).
  enum class Finish { kPost, kOnIssuingThread, kOnCompleter };
  void part_done(const c10::intrusive_ptr<ShoalWork>& self, std::exception_ptr err, Finish where = Finish::kPost);
  void complete();  // on the completion thread (or inline when nothing else is needed)
  void finish_up();

  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;
  std::vector<std::function<void()>> finishers_;
  std::shared_ptr<Completer::Queue> completer_;
  uint64_t seq_;
  int source_ = -1;
  const std::shared_ptr<DeviceSide> device_;
  const std::shared_ptr<c10::Event> ready_;
  std::unique_ptr<c10::Event> done_;  // device only: recorded on h2d at completion
  std::mutex sync_mu_;
  std::condition_variable sync_cv_;
  bool done_recorded_ = false;        // under sync_mu_
  c10::intrusive_ptr<c10::ivalue::Future> future_;

  std::mutex state_mu_;
  std::vector<WorkPtr> works_;       // under state_mu_
  int pending_ = 0;                  // under state_mu_: added works not done, +1 until sealed
  std::exception_ptr first_error_;   // under state_mu_
  bool future_shared_ = false;       // under state_mu_: getFuture() was called
};

// "<backend>:<op>" ("shoal:all_reduce"), as torch's own backends name their
// profiler events; <op> from the one table in profiler_titles.cc ("unknown"
// for a type the backend never issues). The string lives as long as the
// process (the profiler keeps the pointer). Thread-safe.
const char* profiling_title(const std::string& backend, c10d::OpType type);

// shoal's message followed by the phrase torch's tooling (its suite, log
// scrapers written for Gloo and NCCL) looks for in the same condition:
// "collective operation timeout" / "Timed out" for a timeout, "connection
// closed by peer" for a lost peer (shoal/error_mapping.h, docs/errors.md).
std::string torch_message(const shoal::Error& e);
// Raises what torch raises for `e` refused by a call itself (prefix, then
// the message), by the error's category: bad input is a RuntimeError
// (c10::Error, as TORCH_CHECK raises), anything else DistBackendError.
[[noreturn]] void raise_refusal(const shoal::Error& e, const std::string& prefix = "");

struct BackendConfig {
  std::string name = "shoal";             // the name PyTorch knows the backend by
  std::string group_name;                 // torch's group name (for messages)
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  std::string advertise_host;             // empty: shoal's default
  std::vector<int64_t> global_ranks;      // empty: the world
  int store_host_rank = -1;               // group rank hosting the store, if any
  bool own_connections = false;           // shoal::Options::own_connections (pg_options)
};

class ShoalBackend : public c10d::Backend {
 public:
  ShoalBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, BackendConfig cfg);
  // Over a communicator made already (shrink()).
  ShoalBackend(std::shared_ptr<Communicator> comm, BackendConfig cfg);
  ~ShoalBackend() override;

  const std::string getBackendName() const override { return cfg_.name; }
  void setTimeout(std::chrono::milliseconds timeout) override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  // Sparse COO tensors (backend_sparse.cc); allreduce() hands them here.
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
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
  // TIMEOUT for a deadline that passed, REMOTE_ERROR for a lost peer or
  // store (the error's category, shoal/error_mapping.h), COMM_ERROR for the
  // rest; SUCCESS while unbroken.
  c10d::ErrorType getError() override;
  // Breaks the communicator at once (Communicator::abort): never waits for
  // a peer or for what is queued.
  void abort() override;
  // abort() with the cause its operations fail with (a library above that
  // aborts a group for another rank's failure names that failure).
  void abort(const std::string& reason);
  void shutdown() override;

  // Surviving a lost rank (docs/torch.md, "Recovery"): agree() runs the
  // core's agreement and returns the group ranks that go on; shrink() (what
  // dist.shrink_group calls) agrees too (the decision, once made, is the
  // same for every later call), checks that it leaves out exactly
  // `ranks_to_exclude`, aborts this group's communicator locally and
  // returns a backend of the same name over a fresh one of the survivors.
  std::vector<int> agree(std::chrono::milliseconds window, std::vector<int> suspects);
#if SHOAL_TORCH_AT_LEAST(13)
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags = 0,
                                           const c10::intrusive_ptr<Options>& opts_override = nullptr) override;
#endif
  // The ranks the communicator's error blames (Error::suspects()).
  std::vector<int> suspects() const;
  // Newcomers join (Communicator::grow / join; docs/torch.md, "Growing
  // back"): grow() admits them through `lobby` and returns a backend of the
  // same name over the grown communicator, this group's ranks first, or null
  // when nobody was admitted (this backend goes on); join() is a newcomer's
  // side. The grown backend serves a world (no global ranks).
  c10::intrusive_ptr<ShoalBackend> grow(const c10::intrusive_ptr<c10d::Store>& lobby, int joiners,
                                        std::chrono::milliseconds timeout);
  uint64_t comm_id() const;
  static c10::intrusive_ptr<ShoalBackend> join_grown(const c10::intrusive_ptr<c10d::Store>& lobby, BackendConfig cfg,
                                                std::chrono::milliseconds timeout);

  // For tests and diagnostics: the first error that broke the communicator.
  std::string comm_error() const;
  // For tests and diagnostics: the device staging pool, once a device was used.
  struct StagingStats {
    std::string device;
    size_t cap, in_use, high_water;
  };
  std::optional<StagingStats> staging_stats();

 private:
  friend class Call;
  std::shared_ptr<Communicator> comm() const;
  // The device side of `d` for a call (binds the group's device on first use).
  std::shared_ptr<DeviceSide> device_side(const c10::Device& d, std::string* why);
  OpOptions op_options(std::chrono::milliseconds timeout) const;
  // The timeout an operation runs under (see backend.cc); nullopt: the communicator's.
  std::optional<std::chrono::milliseconds> resolve_timeout(std::chrono::milliseconds timeout) const;

  BackendConfig cfg_;
  mutable std::mutex mu_;
  std::shared_ptr<Communicator> comm_;     // under mu_; null after shutdown()
  std::unique_ptr<Completer> completer_;
  std::unique_ptr<Issuer> issuer_;
  std::mutex device_mu_;
  std::shared_ptr<DeviceSide> device_;     // under device_mu_: the group's device, once used
  std::atomic<bool> uses_device_{false};   // set once device_ is: calls go through issuer_ from then on
  std::atomic<int64_t> default_timeout_ms_;
  std::atomic<uint64_t> seq_{0};           // collectives issued (same on every rank)
  std::atomic<uint64_t> monitored_barrier_count_{0};
};

}  // namespace shoal::torch_adapter
