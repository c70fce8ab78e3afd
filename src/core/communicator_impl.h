// core/communicator_impl.h — the state behind a Communicator (internal).
//
// Threads: the caller threads validate and enqueue operations (under mu_);
// whoever holds the drive lock (the executor thread, or a caller waiting for its
// own operation while the executor is idle) runs them one at a time in queue
// order; only that thread touches the transport (except abort()/wake()).
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/coll.h"
#include "collectives/registry.h"
#include "core/family.h"
#include "core/observer.h"
#include "core/roll_call.h"
#include "shoal/communicator.h"
#include "transport/context_transport.h"
#include "transport/hybrid_transport.h"
#include "collectives/arena/host_arena.h"
#include "transport/tcp/tcp_transport.h"

namespace shoal {

// One queued operation. Owns copies of every vector argument.
struct Op {
  coll::Coll coll = coll::Coll::kAllreduce;
  coll::Args args;
  ReduceOp user_op = ReduceOp::kSum;  // before lowering
  std::vector<size_t> counts, displs, send_counts, send_displs;
  OpOptions opts;
  const coll::Algorithm* algo = nullptr;
  WorkPtr work;
  uint64_t seq = 0;
  uint64_t ticket = 0;  // its place in the family's order (core/family.h)
  // Point-to-point.
  int peer = 0;
  int64_t tag = 0;
  std::unique_ptr<transport::Request> req;
  transport::Clock::time_point deadline;  // point-to-point: when it times out
  core::OpTrace trace;                    // the observer's (flight recorder, timeline)
};

class CommunicatorImpl;

// The right to drive the transport. Held by the executor thread while it
// runs operations, or by a caller thread that runs queued operations itself
// from Work::wait(). Outlives the communicator (works keep it), so `impl` is
// cleared under the lock when the communicator goes away. Communicators
// that share a transport (a parent and the groups split from it) share the
// family, and with it the lock: their operations run one at a time, in the
// order they were issued.
struct Driver {
  std::shared_ptr<core::Family> family = std::make_shared<core::Family>();
  CommunicatorImpl* impl = nullptr;  // GUARDED_BY(family->drive)
  core::DriveLock& lock() { return family->drive; }
  // Called from Work::wait() for `waiting`: runs what is queued if nobody
  // drives now, and drives a send or receive in flight for a while.
  bool help(const Work& waiting);
};

class CommunicatorImpl {
 public:
  CommunicatorImpl(std::shared_ptr<Store> store, int rank, int size, Options opts);
  // A group of `parent`'s ranks `members` (parent numbering; this rank is
  // members[rank]) that shares the parent's transport (Communicator::split).
  // `keep` holds the parent alive as long as the group.
  CommunicatorImpl(std::shared_ptr<Communicator> keep, CommunicatorImpl& parent, std::shared_ptr<Store> store,
                   int rank, const std::vector<int>& members, Options opts);
  ~CommunicatorImpl();

  WorkPtr enqueue(Op&& op);
  void abort(const std::string& reason);
  std::exception_ptr error() const;

  // "shoal rank R: allreduce seq S: " ("shoal rank R (group G rank r): ..."
  // for a group split from a parent, R counting the root's ranks).
  std::string prefix(const Op& op) const;
  const std::string& label() const { return label_; }
  std::string describe(const transport::Fingerprint& fp) const;

  const int rank_;
  const int size_;
  const Options opts_;
  coll::Overrides overrides_;

 private:
  friend struct Driver;
  void init_common();
  void start();
  void run();
  // Runs every queued operation (caller holds the drive lock). Returns true if
  // it ran or completed anything. A caller that waits for `waiting` (a send
  // or receive in flight) drives the transport for up to spin_us_ before
  // handing the sends and receives in flight to the executor thread.
  bool drain(bool inline_caller, const Work* waiting = nullptr);
  // Runs `op`. `now`: from run_now(), which checked that the communicator
  // is not broken and has not handed `work` to anyone yet.
  void execute(Op& op, Work& work, bool now = false);
  const coll::Algorithm& chosen(coll::Coll c, const coll::Args& a, const coll::Topology& topo);
  void run_now(Op& op, Work& work);
  WorkPtr done_work(uint64_t seq);
  void run_collective(Op& op);
  void post_p2p(Op& op);
  void reap_p2p();
  bool spin_p2p(const Work& waiting);
  // Progresses sends and receives in flight until `until` (once if past) and
  // completes those done; a transport failure breaks the communicator.
  void progress_p2p(transport::Clock::time_point until);
  void mark_broken(std::exception_ptr e);
  // An operation of this communicator is in the transport: a collective
  // running, or sends and receives in flight (stopping it means breaking
  // the transport).
  bool in_transport() const { return busy_.load() || inflight_count_.load() > 0; }
  void fail_all(std::exception_ptr cause);
  void on_break(std::exception_ptr cause);
  std::exception_ptr on_lost(int peer, const std::string& detail);
  transport::tcp::PeerAddress lookup(int peer);
  std::exception_ptr peer_gone(int peer);
  std::exception_ptr timed_out(const std::string& waiting);
  std::exception_ptr abort_record();
  std::exception_ptr while_blocked(transport::Clock::time_point deadline);
  std::exception_ptr order_check(int peer);
  const coll::Topology& topology();
  // Sets up arena_ on the first collective when every rank is on this host
  // (core/arena_setup.cc); every rank reaches the same verdict.
  void setup_arena(transport::Clock::time_point deadline);
  void await_arena_key(const std::string& key, int who, transport::Clock::time_point deadline);
  std::string agree_on_reads(transport::Clock::time_point deadline);
  core::ObserverConfig observer_config(uint64_t id, const std::string& shm_mode);  // core/observer.cc

  // A group split from a parent keeps it alive (declared first: released last).
  std::shared_ptr<Communicator> parent_;
  CommunicatorImpl* root_ = this;  // the communicator that owns the transport
  std::string label_;              // "shoal rank R" (see prefix())
  uint64_t uid_ = 0;               // the communicator's id (flight recorder, connections)
  std::shared_ptr<Store> store_;  // prefixed with this communicator's name
  coll::Tuning tuning_;
  coll::Topology topo_;  // GUARDED_BY(driver_->lock()); empty until first needed
  coll::Scratch scratch_;                                   // GUARDED_BY(driver_->lock())
  struct Chosen {
    size_t count = 0;
    DataType dt = DataType::kFloat32;
    const coll::Algorithm* algo = nullptr;
  };
  Chosen chosen_[coll::kNumColls];                          // GUARDED_BY(driver_->lock()): see chosen()
  std::unique_ptr<coll::arena::HostArena> arena_;       // GUARDED_BY(driver_->lock()); set by setup_arena()
  size_t arena_bytes_ = 0;                                  // SHOAL_SHM_ARENA_BYTES (0: no arena)
  bool arena_reads_ = false;                                // SHOAL_SHM=1: single-copy reads in the arena if the kernel allows
  std::string shm_mode_ = "1";                              // SHOAL_SHM, checked once (init_common)
  bool arena_checked_ = false;                              // GUARDED_BY(driver_->lock())
  auth::Secret secret_;        // root: the job's secret (proofs of the arena's members)
  std::string published_pos_;  // root: the last "ctx seq" this rank published as blocked in
  std::shared_ptr<transport::HybridTransport> hybrid_;     // shm for this host, TCP beyond; shared with groups
  std::unique_ptr<transport::ContextTransport> transport_; // this communicator's view of hybrid_
  transport::tcp::TcpTransport* tcp_ = nullptr;            // owned by hybrid_ (root only)
  std::string host_id_;                                    // net::host_identity()
  transport::Clock::time_point next_liveness_probe_{};    // GUARDED_BY(driver_->lock())
  std::vector<std::string> processes_;  // peers' proc::self_token(), "-" if none (guarded by mu_)
  std::vector<std::unique_ptr<Op>> inflight_p2p_;          // GUARDED_BY(driver_->lock())
  std::shared_ptr<Driver> driver_ = std::make_shared<Driver>();
  core::Family::Member member_;  // this communicator's queue in the family
  bool turn_blocked_ = false;    // GUARDED_BY(driver_->lock()): drain() stopped for another member's turn
  std::atomic<bool> has_inflight_{false};
  std::atomic<size_t> inflight_count_{0};  // inflight_p2p_.size(), for threads without the drive lock

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Op>> queue_;  // GUARDED_BY(mu_)
  uint64_t next_seq_ = 1;                  // GUARDED_BY(mu_)
  bool stop_ = false;                      // GUARDED_BY(mu_)
  bool deferring_ = false;                 // GUARDED_BY(mu_): the executor waits for a caller to drive
  std::exception_ptr broken_;              // GUARDED_BY(mu_)
  std::atomic<bool> busy_{false};
  WorkPtr done_work_;                      // GUARDED_BY(mu_): run_now()'s last Work
  int spin_us_ = 0;  // busy-poll budget of a caller driving inline
  bool spin_yield_ = false;  // more ranks than cores here: spin by sched_yield
  bool spin_auto_ = false;  // spin_us_ was derived, not set: topology may revise it
  bool crowded_ = false;    // more ranks of this communicator on this machine than cores (topology())
  std::unique_ptr<core::Observer> observer_;  // set before the executor starts
  std::unique_ptr<core::RollCall> roll_call_;  // set before the executor starts
  std::thread executor_;
};

}  // namespace shoal
