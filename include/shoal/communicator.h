// shoal/communicator.h — a group of ranks and the collectives among them.
//
// Ordering: every operation (collectives and send/recv) is queued in the
// order it was issued and started in that order on a single executor thread
// owned by the communicator, like a CUDA stream; collectives therefore
// complete in issue order on every rank. Sends and receives are started in
// order but complete when their peer is ready, so send/recv pairs issued in
// any order on two ranks cannot deadlock each other.
//
// Buffers: every pointer passed to an operation must stay valid and must not
// be written by the caller until that operation's Work completes. Counts are
// in elements. `send == recv` means in place.
//
// Thread-safety: all methods may be called from any thread; operations issued
// concurrently from several threads are ordered by the order the calls took
// the queue's lock, which must be the same on every rank (as with MPI).
//
// Errors (docs/errors.md): bad arguments throw InvalidArgument from the call
// itself, naming the argument and the rank, before anything is sent. Failures
// while running are reported by Work::wait(): PeerLost naming the lost rank,
// TimeoutError, Mismatch. The first failure breaks the communicator: every
// pending and later operation fails fast with the same cause.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "shoal/error.h"
#include "shoal/store.h"
#include "shoal/types.h"

namespace shoal {

inline constexpr int kAnySource = -1;

struct Options {
  // Default timeout of every operation (measured from when it starts).
  // SHOAL_TIMEOUT_S overrides the default.
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  // Algorithm overrides, "allreduce=ring,broadcast=chain" (SHOAL_ALGO adds to
  // these; the options win on conflict).
  std::string algorithms;
  // Address to listen on and to publish to peers. Empty: the address this host
  // uses to reach the store (or 127.0.0.1 on a single host).
  std::string advertise_host;
  // Busy-poll this long before sleeping in a wait; -1 = automatic (on when
  // this host runs no more ranks than it has cores). SHOAL_SPIN_US.
  int spin_us = -1;
  // Pipelining segment of large transfers. SHOAL_SEGMENT_BYTES.
  size_t segment_bytes = 0;  // 0: SHOAL_SEGMENT_BYTES (docs/knobs.md)
  // Store keys of this communicator live under "shoal/<name>/". Empty: a
  // per-process counter, so communicators created in the same order on every
  // rank pair up.
  std::string name;
  // The rank hosting the store, if it is a rank of this communicator (-1: not
  // known). Used to name the culprit when the store itself disappears.
  int store_host_rank = -1;
  // create_or_split: make the group afresh, with connections (and shared
  // memory) of its own, rather than split it from a communicator that
  // holds its ranks; as SHOAL_GROUP_CONNECTIONS=own does for every group.
  // Such a group costs a listening socket and connections (or shared-memory
  // rings) of its own, but it fails only with its own members: a lost rank
  // breaks the groups that contain it and no other.
  // The group's rank 0 decides for the group. Ignored by create and split.
  bool own_connections = false;
};

// Per-operation options.
struct OpOptions {
  // How long the operation may take before it fails with TimeoutError
  // (naming the ranks it waits for). Unset: the communicator's timeout.
  // Zero is a zero timeout: the operation fails at once unless it completes
  // without waiting for a peer. Negative is an argument error.
  std::optional<std::chrono::milliseconds> timeout;
  std::string algorithm;                  // force an algorithm by name
  double scale = 1.0;                     // the factor of ReduceOp::kPremulSum
  // The call returns only once the operation has completed (its Work is done;
  // wait() on it returns at once or rethrows the error). A collective with
  // nothing queued ahead of it then runs in the calling thread, with no
  // hand-off to the executor thread: the fast path for small synchronous
  // collectives. Ignored by send and receive, which may have to wait for a
  // later call of the caller's.
  bool blocking = false;
  // No thread will wait for the operation soon after issuing it (a thread
  // that issues for others, such as the torch backend's device path, whose
  // callers wait on their own events). The executor starts it at once
  // instead of leaving a waiting caller the chance to run it (by default it
  // gives a non-blocking operation up to 200 us for that).
  bool detached = false;
};

// The handle of one queued operation.
class Work {
 public:
  // Blocks until the operation completes; rethrows its error.
  void wait();
  // Waits at most `timeout`; returns false if still running (no error is
  // raised and the operation goes on). Rethrows the operation's error.
  bool wait_for(std::chrono::milliseconds timeout);
  // True once the operation has completed, successfully or not.
  bool test() const;
  // The error the operation failed with, or null.
  std::exception_ptr error() const;
  // The sequence number of a collective (0 for send/recv).
  uint64_t seq() const { return seq_; }
  // For a receive: the rank the message came from (meaningful after completion).
  int source() const;
  // Runs `fn` once the operation completes (at once if it already has), on
  // the thread that completes it. `fn` must not block.
  void on_complete(std::function<void()> fn);

  // Internal: used by the communicator. `help` lets a waiting thread run
  // queued operations itself when the executor is idle (returns true if it
  // made progress), which saves two thread hand-offs per synchronous call.
  explicit Work(uint64_t seq) : seq_(seq) {}
  void finish(std::exception_ptr err, int source = -1);
  void set_helper(std::function<bool(const Work&)> help) { help_ = std::move(help); }
  // finish() for a Work no other thread can reach yet (one that runs before
  // its call returns): no lock, nobody to wake.
  void finish_unshared(std::exception_ptr err) {
    done_ = true;
    error_ = std::move(err);
    finished_.store(true, std::memory_order_release);
  }
  // Makes a finished Work that nobody else holds new again, for `seq` (no
  // lock: no other thread can reach it).
  void reset(uint64_t seq) {
    seq_ = seq;
    done_ = false;
    finished_.store(false, std::memory_order_relaxed);
    error_ = nullptr;
    source_ = -1;
  }

 private:
  uint64_t seq_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;                          // under mu_
  // done_, readable without the lock: once true, error_ and source_ no
  // longer change (set after them, with release order).
  std::atomic<bool> finished_{false};
  std::exception_ptr error_;                   // under mu_
  int source_ = -1;                            // under mu_
  std::vector<std::function<void()>> hooks_;   // under mu_
  std::function<bool(const Work&)> help_;      // set before the Work is shared
};

using WorkPtr = std::shared_ptr<Work>;

// The outcome of Communicator::agree(): the same on every rank that returns it.
struct Membership {
  uint64_t epoch = 0;        // the agreement's epoch that decided it (>= 1)
  std::vector<int> members;  // the communicator's ranks that go on, ascending
};

struct AgreeOptions {
  // How long the agreement waits for a rank that is neither known lost nor
  // checked in (a survivor that has not noticed the fault yet), and for the
  // decision of a leader that stopped answering before it moves to the next
  // epoch. Lost ranks found by the error's suspects or by their process
  // having exited on this host are not waited for.
  std::chrono::milliseconds window{std::chrono::seconds(10)};
  // Ranks this rank believes lost, besides those the communicator's error
  // names (Error::suspects()).
  std::vector<int> suspects;
  // The agreement gives up (TimeoutError) after this long in all.
  std::chrono::milliseconds timeout{std::chrono::minutes(2)};
};

// Communicator::grow() and Communicator::join(): newcomers joining a
// communicator's ranks (replacements of lost ones, or more).
struct GrowOptions {
  // How many newcomers grow() admits: -1, those waiting in the lobby when its
  // leader looks (none: grow() returns null and changes nothing); n > 0,
  // exactly n, waiting for them up to `timeout`.
  int joiners = -1;
  // grow() and join() give up (TimeoutError) after this long.
  std::chrono::milliseconds timeout{std::chrono::minutes(2)};
};

class CommunicatorImpl;

class Communicator : public std::enable_shared_from_this<Communicator> {
 public:
  // Joins the communicator of `size` ranks rendezvousing through `store`.
  // Collective over all ranks only in that every rank must create it; it does
  // not block on the others (connections are made when first needed).
  static std::shared_ptr<Communicator> create(std::shared_ptr<Store> store, int rank, int size,
                                              Options opts = {});
  // From RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: rank 0 hosts a TcpStore
  // at MASTER_ADDR:MASTER_PORT, the others connect to it; with
  // TORCHELASTIC_USE_AGENT_STORE=True (shoalrun's default) the launcher hosts
  // it and every rank connects.
  static std::shared_ptr<Communicator> from_env(Options opts = {});

  // A communicator of this one's ranks `ranks` (rank i of the new one is
  // ranks[i]), called by those ranks only, with the same list. It reuses
  // this communicator's connections (and shared memory) instead of making
  // its own: no new sockets, no new rendezvous of addresses. `store` is the
  // group's own (e.g. a PrefixStore unique to it; or give each group sharing
  // a store its own Options::name): it holds the group's few keys (its
  // context id and member list; the stall inspector's records).
  // Blocks until the group's rank 0 has split (it draws the group's id).
  //
  // The price of sharing: the operations of a communicator and of the
  // groups split from it run one at a time, in the order each rank issued
  // them, so collectives on them must be issued in the same relative order
  // on every rank that takes part in both (as NCCL asks of communicators
  // that share resources). A rank that sees another order fails with a
  // Mismatch naming both collectives rather than hanging. Failures are
  // shared too: a lost peer or a timeout breaks the parent and every group
  // split from it; abort() on a group breaks only the group unless one of
  // its operations is in the transport at the time. Error messages name
  // ranks as the root communicator numbers them. The group keeps its
  // parent alive.
  std::shared_ptr<Communicator> split(const std::vector<int>& ranks, std::shared_ptr<Store> store,
                                      Options opts = {});

  // The communicator of a group of the job's processes, as frameworks make
  // one per process group: `job_ranks` are the group's members as the job
  // numbers them (this process is job_ranks[rank]; empty: 0..size-1), and
  // `store` is the group's own. The group is split (above) from the first
  // live communicator this process made here that holds all its members, so
  // that it shares that one's connections; else it is created afresh and
  // later groups may be split from it. The group's rank 0 decides, and tells
  // the others through `store`: it makes a fresh one when the candidate is
  // broken, when its `opts.own_connections` is set, or under
  // SHOAL_GROUP_CONNECTIONS=own. Every process must make its groups in the
  // same order (as torch.distributed.new_group requires). A group made
  // afresh names its ranks in messages as the job numbers them
  // ("rank 3 (group rank 1)"), as a split group names its parent's.
  static std::shared_ptr<Communicator> create_or_split(std::shared_ptr<Store> store, int rank, int size,
                                                       std::vector<int64_t> job_ranks, Options opts = {});

  // Stops the executor. Operations still queued or running fail with Aborted.
  // Does not wait for peers.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;

  WorkPtr allreduce(const void* send, void* recv, size_t count, DataType dt, ReduceOp op,
                    const OpOptions& o = {});
  WorkPtr broadcast(void* buf, size_t count, DataType dt, int root, const OpOptions& o = {});
  // `recv` is used on the root only (may be null elsewhere).
  WorkPtr reduce(const void* send, void* recv, size_t count, DataType dt, ReduceOp op, int root,
                 const OpOptions& o = {});
  // recv holds size*count; rank i's block at i*count.
  WorkPtr allgather(const void* send, void* recv, size_t count, DataType dt,
                    const OpOptions& o = {});
  // Rank i contributes recv_counts[i] elements, placed at recv + displs[i]
  // (displs empty: packed in rank order). send holds recv_counts[rank].
  WorkPtr allgatherv(const void* send, void* recv, std::vector<size_t> recv_counts,
                     std::vector<size_t> displs, DataType dt, const OpOptions& o = {});
  // send holds size*count; rank i receives block i, reduced, in recv.
  WorkPtr reduce_scatter(const void* send, void* recv, size_t count, DataType dt, ReduceOp op,
                         const OpOptions& o = {});
  // Rank i receives recv_counts[i] elements; send holds them packed in rank order.
  WorkPtr reduce_scatterv(const void* send, void* recv, std::vector<size_t> recv_counts,
                          DataType dt, ReduceOp op, const OpOptions& o = {});
  // `count` elements to and from every rank.
  WorkPtr alltoall(const void* send, void* recv, size_t count, DataType dt,
                   const OpOptions& o = {});
  // Split sizes in elements; displacements empty: packed.
  WorkPtr alltoallv(const void* send, std::vector<size_t> send_counts,
                    std::vector<size_t> send_displs, void* recv, std::vector<size_t> recv_counts,
                    std::vector<size_t> recv_displs, DataType dt, const OpOptions& o = {});
  // recv (root only) holds size*count.
  WorkPtr gather(const void* send, void* recv, size_t count, DataType dt, int root,
                 const OpOptions& o = {});
  // send (root only) holds size*count.
  WorkPtr scatter(const void* send, void* recv, size_t count, DataType dt, int root,
                  const OpOptions& o = {});
  WorkPtr barrier(const OpOptions& o = {});
  // Tagged point-to-point; tag >= 0. recv from kAnySource reports the sender
  // in Work::source().
  WorkPtr send(const void* buf, size_t count, DataType dt, int peer, int64_t tag = 0,
               const OpOptions& o = {});
  WorkPtr recv(void* buf, size_t count, DataType dt, int peer, int64_t tag = 0,
               const OpOptions& o = {});

  // ---- Surviving a lost rank (docs/errors.md, "Recovery").
  //
  // agree(): the ranks of this communicator that are still running agree,
  // through the store, on who goes on. Every rank that calls it returns the
  // same Membership or throws: Aborted when the decision left it out (it
  // was late, stopped or cut off), TimeoutError past `o.timeout`. It does
  // not use the transport, so it works on a broken communicator. Epoch by
  // epoch, under keys of this communicator that no other one uses: each
  // rank checks in with whom it suspects; the leader (the lowest rank not
  // known lost) waits until every rank not known lost has checked in (or
  // `o.window`), and proposes the checked-in ranks; the store's
  // compare-and-set makes the first proposal the decision, once and for
  // all. A leader that dies is seen on its host and replaced in the same
  // epoch; one that answers no more within `o.window` is voted out (the
  // epoch is closed by the same compare-and-set) and the next epoch starts
  // without it. Never two memberships.
  Membership agree(const AgreeOptions& o = {});
  // A fresh communicator over `m.members` (this rank must be one; rank i of
  // the new one is m.members[i]), called by every member with the same `m`:
  // aborts this one locally first (never waiting for a peer), then wires a
  // new root communicator with its own connections under store keys no
  // communicator used before, a new id and a new secret, so that nothing of
  // this one (a half-written frame, a stale or resumed rank's hello) reaches
  // it. Options: this communicator's.
  std::shared_ptr<Communicator> shrink(const Membership& m);
  // agree() then shrink(): what a survivor calls after an operation failed.
  // A member that dies before it joins the new communicator (every member
  // then fails to make it alike) is agreed away in the next epoch, and so on.
  std::shared_ptr<Communicator> recover(const AgreeOptions& o = {});

  // Newcomers join (docs/errors.md, "Growing back"). Every rank of this
  // communicator calls grow() with the same `lobby` (a store the newcomers
  // reach too, e.g. a PrefixStore of the job's store) and options, at the
  // same point of its work (a step boundary); each newcomer calls join() with
  // that lobby. This communicator's rank 0 (the leader) admits newcomers in
  // the order they arrived and tells the others; then every rank aborts this
  // communicator locally (as shrink() does) and all, old and new, wire a
  // fresh communicator under keys no communicator used before, with a new
  // id and secret: the old ranks keep their numbers, newcomers follow them
  // (size(), size()+1, ...). Returns it, or null when nobody was admitted
  // (joiners = -1 and the lobby was empty: this communicator goes on). A
  // leader that fails before it decides makes the others fail with a
  // TimeoutError naming it; they can still agree() and shrink().
  std::shared_ptr<Communicator> grow(std::shared_ptr<Store> lobby, const GrowOptions& o = {});
  // A newcomer's side of grow(): waits in `lobby` (up to o.timeout) until a
  // communicator's grow() admits it, and returns its rank of the grown
  // communicator (options as create()'s; the name is the grown one's).
  static std::shared_ptr<Communicator> join(std::shared_ptr<Store> lobby, Options opts = {},
                                            const GrowOptions& o = {});

  // This communicator's id: the same on every rank, different for every
  // communicator the job makes (drawn by its rank 0).
  uint64_t id() const;

  // Breaks the communicator: pending and later operations fail with Aborted.
  void abort(const std::string& reason);
  // The first cause of a break, or null.
  std::exception_ptr error() const;

 private:
  explicit Communicator(std::unique_ptr<CommunicatorImpl> impl);
  // agree() from epoch `first` on (recover(): an epoch whose members could
  // not make their communicator is passed over by all of them alike).
  Membership agree_from(const AgreeOptions& o, uint64_t first);
  // create(), naming rank i as the job's rank job_ranks[i] in messages
  // (empty: i), for create_or_split.
  static std::shared_ptr<Communicator> create_named(std::shared_ptr<Store> store, int rank, int size, Options opts,
                                                    std::vector<int64_t> job_ranks);
  std::unique_ptr<CommunicatorImpl> impl_;
};

}  // namespace shoal
