// core/communicator_impl.h — the state behind a Communicator (internal),
// by responsibility: its making (wiring.cc: knobs, transports, a group's
// view of its parent's), its scheduler (scheduler.h: queue, order, who
// drives), how it learns of failures (liveness.h), and what it does with an
// operation when the scheduler runs it (executor.cc: lowering.h, the
// algorithm's choice, the arena, sends and receives in flight).
//
// Threads: caller threads validate and enqueue operations; whoever holds
// the drive lock (the executor thread, or a caller running its own
// operation) runs them one at a time; only that thread touches the
// transport (except abort() and wake(), from any thread).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "collectives/arena/host_arena.h"
#include "collectives/coll.h"
#include "collectives/registry.h"
#include "common/auth.h"
#include "common/thread_annotations.h"
#include "core/family.h"
#include "core/host_info.h"
#include "core/liveness.h"
#include "core/observer.h"
#include "core/op.h"
#include "core/scheduler.h"
#include "shoal/communicator.h"
#include "transport/hybrid_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/view.h"

namespace shoal {

class CommunicatorImpl;

namespace core {
// A root communicator's transports, wired (core/wiring.cc).
struct Wired {
  uint64_t job = 0;     // the communicator's unique id, drawn by rank 0
  auth::Secret secret;  // the job's secret, which every connection proves
  std::shared_ptr<transport::HybridTransport> hybrid;  // shared memory on this host, TCP beyond
  transport::tcp::TcpTransport* tcp = nullptr;          // owned by `hybrid`
};
// Agrees on the job's id and secret through `store`, makes the transports
// (TCP; shared memory for this host unless SHOAL_SHM=0; the hybrid over
// them), all handed `live`, publishes where this rank listens and joins
// the host table (host_table.h).
// `shm_mode` and `tcp_congestion` are SHOAL_SHM and SHOAL_TCP_CONGESTION, checked.
// `fresh_secret`: a communicator made by Communicator::shrink, whose secret
// must differ from the job's even when SHOAL_SECRET gives one (rank 0 draws
// a salt; the secret is HMAC(SHOAL_SECRET, salt)).
Wired wire(Store& store, int rank, int size, const Options& opts, const std::string& shm_mode,
           const std::string& tcp_congestion, const HostInfo& host, JobLiveness& live,
           bool fresh_secret = false);
// "at <host>:<port>" for a TcpStore (under any PrefixStores).
std::string describe_store(const Store& store);
// Fills in what `opts` leaves to shoal (SHOAL_TIMEOUT_S, a per-process name,
// the advertised address: the one this host reaches `store`'s host by);
// checks the timeout (`who` prefixes the error).
void resolve_options(Options& opts, const Store& store, const std::string& who);
// `store` under `prefix`, or under "<prefix>/<n>" for this rank's n-th
// communicator there (n > 1): a fresh scope each time (core/bootstrap.cc).
std::shared_ptr<Store> incarnation(const std::shared_ptr<Store>& store, const std::string& prefix, int rank);
}  // namespace core

class CommunicatorImpl final : public core::Runner {
 public:
  // `processes`: the ranks' process tokens, when they are known from another
  // communicator of the same processes (shrink, grow; JobLiveness::seed_processes).
  // `job_ranks`: rank i is the job's rank job_ranks[i] (create_or_split,
  // and what shrinks one), as messages name it; empty: rank i is i.
  CommunicatorImpl(std::shared_ptr<Store> store, int rank, int size, Options opts, bool fresh_secret = false,
                   const std::vector<std::string>* processes = nullptr, std::vector<int64_t> job_ranks = {});
  // A group of `parent`'s ranks `members` (parent numbering; this rank is
  // members[rank]) that shares the parent's transport (Communicator::split).
  // `keep` holds the parent alive as long as the group.
  CommunicatorImpl(std::shared_ptr<Communicator> keep, CommunicatorImpl& parent, std::shared_ptr<Store> store,
                   int rank, const std::vector<int>& members, Options opts);
  ~CommunicatorImpl();

  WorkPtr enqueue(Op&& op) { return sched_.enqueue(std::move(op)); }
  void abort(const std::string& reason);
  std::exception_ptr error() const;

  // "shoal rank R: allreduce seq S: " ("shoal rank R (group G rank r): ..."
  // for a group split from a parent, R counting the root's ranks).
  std::string prefix(const Op& op) const override;
  const std::string& label() const { return label_; }
  uint64_t uid() const { return uid_; }
  int root_rank() const { return root_->rank_; }  // this process's rank in the root communicator
  // A root's rank `r` as the job numbers it, and as messages name it: "rank
  // 3", or "rank 3 (group rank 1)" when the two numberings differ.
  int64_t job_rank(int r) const { return job_ranks_.empty() ? r : job_ranks_[static_cast<size_t>(r)]; }
  std::string rank_name(int r) const;
  const std::vector<int64_t>& job_ranks() const { return job_ranks_; }
  // For recovery (core/recovery.cc): the communicator's prefixed store, its
  // liveness, and the advertised address of the transport it runs on.
  const std::shared_ptr<Store>& store() const { return store_; }
  core::JobLiveness& liveness() { return *live_; }
  const std::string& advertise_host() const { return root_->opts_.advertise_host; }

  const int rank_;
  const int size_;
  const Options opts_;
  coll::Overrides overrides_;
  // How many times grow() was called on this communicator (core/growth.cc).
  std::atomic<uint64_t> grow_calls_{0};

 private:
  friend class core::JobLiveness;
  void init_common();
  void start();

  // ---- core::Runner (executor.cc): called by the thread that drives.
  void prepare(bool inline_caller) override REQUIRES(sched_.drive());
  // Runs `op`. `now`: the run-now path, which checked that the communicator
  // is not broken and has not handed `work` to anyone yet.
  void execute(Op& op, Work& work, bool now) override REQUIRES(sched_.drive());
  // Progresses sends and receives in flight until `until` (once if past) and
  // completes those done; a transport failure breaks the communicator.
  void progress(transport::Clock::time_point until) override REQUIRES(sched_.drive());
  void fail_inflight(std::exception_ptr cause) override REQUIRES(sched_.drive());
  // Spin by yielding the core: the spin budget was derived, not set, and
  // this machine has more of the communicator's ranks than cores.
  bool spin_yield() const override REQUIRES(sched_.drive()) { return spin_auto_ && crowded_; }
  // How the collective of `bytes` per rank that prepare()'s caller runs
  // waits: for messages, and in `arena` when it has one.
  void set_spins(coll::arena::HostArena* arena, size_t bytes) REQUIRES(sched_.drive());
  void wake() override { hybrid_->wake(); }

  void run_collective(Op& op) REQUIRES(sched_.drive());
  const coll::Algorithm& chosen(coll::Coll c, const coll::Args& a, const coll::Topology& topo)
      REQUIRES(sched_.drive());
  void post_p2p(Op& op) REQUIRES(sched_.drive());  // moves `op` into the in-flight list once posted
  void reap_p2p() REQUIRES(sched_.drive());
  const coll::Topology& topology() REQUIRES(sched_.drive());
  // The arena, set up (within `timeout`) on the first collective when every
  // rank is on this host (collectives/arena/arena_setup.h); every rank
  // reaches the same verdict.
  coll::arena::HostArena* arena(transport::Clock::duration timeout) REQUIRES(sched_.drive());
  core::ObserverConfig observer_config(uint64_t id, const std::string& shm_mode);  // core/observer.cc

  // A group split from a parent keeps it alive (declared first: released last).
  std::shared_ptr<Communicator> parent_;
  CommunicatorImpl* root_ = this;  // the communicator that owns the transport
  std::vector<int64_t> job_ranks_;  // a root's: see job_rank() (set before anything reads it)
  std::string label_;              // "shoal rank R" (see prefix())
  uint64_t uid_ = 0;               // the communicator's id (flight recorder, connections)
  std::shared_ptr<Store> store_;   // prefixed with this communicator's name
  core::HostInfo host_;            // the root's, read once
  // Outlives the transports, which it is handed to (declared before them).
  std::unique_ptr<core::JobLiveness> live_;
  coll::Tuning tuning_;
  size_t arena_bytes_ = 0;       // SHOAL_SHM_ARENA_BYTES (0: no arena)
  std::string shm_mode_ = "1";   // SHOAL_SHM, checked once (init_common)
  std::string tcp_congestion_ = "auto";  // SHOAL_TCP_CONGESTION, checked once (init_common)
  coll::arena::SlotStores::Mode slot_stores_ = coll::arena::SlotStores::Mode::kAuto;  // SHOAL_SHM_STREAM
  auth::Secret secret_;          // root: the job's secret (proofs of the arena's members)
  int spin_us_ = 0;              // busy-poll budget of a caller driving inline
  bool spin_auto_ = false;       // spin_us_ was derived, not set (spin_yield())
  std::shared_ptr<transport::HybridTransport> hybrid_;  // shm for this host, TCP beyond; shared with groups
  transport::View view_;                                // this communicator's ranks and context on hybrid_
  std::unique_ptr<core::Observer> observer_;            // set before the scheduler starts
  core::Scheduler sched_;

  // What the thread that drives keeps.
  coll::Topology topo_ GUARDED_BY(sched_.drive());  // empty until first needed
  // More of this communicator's ranks on this machine than cores: a guess
  // from LOCAL_WORLD_SIZE until topology() counts them.
  bool crowded_ GUARDED_BY(sched_.drive()) = false;
  bool inline_caller_ GUARDED_BY(sched_.drive()) = false;  // of the operation being prepared
  coll::Scratch scratch_ GUARDED_BY(sched_.drive());
  struct Chosen {
    size_t count = 0;
    DataType dt = DataType::kFloat32;
    const coll::Algorithm* algo = nullptr;
  };
  Chosen chosen_[coll::kNumColls] GUARDED_BY(sched_.drive());  // see chosen()
  std::unique_ptr<coll::arena::HostArena> arena_ GUARDED_BY(sched_.drive());  // see arena()
  bool arena_checked_ GUARDED_BY(sched_.drive()) = false;
  std::vector<std::unique_ptr<Op>> inflight_p2p_ GUARDED_BY(sched_.drive());
  transport::Clock::time_point next_liveness_probe_ GUARDED_BY(sched_.drive()){};
};

}  // namespace shoal
