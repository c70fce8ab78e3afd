// collectives/coll.h — what an algorithm sees: its arguments (type-erased)
// and Ctx, the handful of transport primitives it may use.
//
// Rules for algorithms (one per file, see docs/algorithms.md):
//  - use only Ctx's send/recv/wait, kernels::reduce*, Ctx::scratch(), and
//    (the *_shared algorithms) Ctx::arena();
//  - never assume a power-of-two world size; handle count 0 and size 1;
//  - messages to one peer use strictly increasing `step` numbers within the
//    collective (the transport relies on it to detect mismatched ranks);
//  - never modify `send`; `send == recv` means in place.
//  - reduce ops arrive already lowered: AVG as SUM (the core divides after),
//    PREMUL_SUM as SUM on pre-scaled input.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "collectives/patterns/hierarchy.h"
#include "shoal/types.h"
#include "collectives/arena/host_arena.h"
#include "transport/transport.h"
#include "transport/view.h"

namespace shoal::coll {

using transport::Clock;
using transport::Request;

enum class Coll : uint8_t {
  kAllreduce = 1,
  kBroadcast,
  kReduce,
  kAllgather,
  kAllgatherv,
  kReduceScatter,
  kReduceScatterv,
  kAlltoall,
  kAlltoallv,
  kGather,
  kScatter,
  kBarrier,
  kSend,
  kRecv,
};
inline constexpr int kNumColls = 15;  // index space incl. 0
std::string_view coll_name(Coll c);
// Whether `c` reduces (takes a ReduceOp): allreduce, reduce, reduce_scatter(v).
constexpr bool is_reducing(Coll c) {
  return c == Coll::kAllreduce || c == Coll::kReduce || c == Coll::kReduceScatter || c == Coll::kReduceScatterv;
}
// Whether `c` has a root: broadcast, reduce, gather, scatter.
constexpr bool is_rooted(Coll c) {
  return c == Coll::kBroadcast || c == Coll::kReduce || c == Coll::kGather || c == Coll::kScatter;
}
constexpr bool is_p2p(Coll c) { return c == Coll::kSend || c == Coll::kRecv; }
// Whether `count` (Args) is one block of several, one per rank, in the
// larger of `c`'s buffers: allgather, gather, scatter, reduce_scatter,
// alltoall.
constexpr bool blocks_per_rank(Coll c) {
  return c == Coll::kAllgather || c == Coll::kGather || c == Coll::kScatter || c == Coll::kReduceScatter ||
         c == Coll::kAlltoall;
}
bool parse_coll(std::string_view s, Coll* out);

// Arguments of one collective, in elements of `dt`.
//  allreduce, reduce, broadcast: `count` elements in total (broadcast uses recv).
//  allgather, gather: `count` elements contributed by each rank; recv holds size*count.
//  scatter: recv gets `count` elements; send (root) holds size*count.
//  reduce_scatter: recv gets `count`; send holds size*count.
//  alltoall: `count` elements to and from each rank.
//  allgatherv: rank i contributes counts[i] elements, placed at recv + displs[i].
//  reduce_scatterv: rank i gets counts[i] elements; send holds them at displs[i].
//  alltoallv: send_counts/send_displs and counts/displs (receive side).
struct Args {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DataType dt = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  const size_t* counts = nullptr;
  const size_t* displs = nullptr;
  const size_t* send_counts = nullptr;
  const size_t* send_displs = nullptr;

  size_t elem() const { return dtype_size(dt); }
  bool in_place() const { return send == recv; }
  // allgather: this rank's block of recv.
  char* own_block(int rank) const {
    return static_cast<char*>(recv) + static_cast<size_t>(rank) * count * elem();
  }
  // allgather: this rank's input; in place (send == recv) it is already its
  // own block of recv.
  const char* allgather_input(int rank) const {
    return in_place() ? own_block(rank) : static_cast<const char*>(send);
  }
};

// The bytes an operation is weighed by (select(), the arena's wait): the
// buffer per rank, or for the collectives of one block per rank
// (blocks_per_rank) all `size` of them.
inline size_t weighed_bytes(Coll c, const Args& a, int size) {
  return a.count * a.elem() * (blocks_per_rank(c) ? static_cast<size_t>(size) : 1);
}

struct Tuning {
  size_t segment_bytes = 512 << 10;  // pipelining unit of large transfers; the communicator sets it (SHOAL_SEGMENT_BYTES)
};

// Reusable scratch memory owned by the communicator (grows, never shrinks).
class Scratch {
 public:
  void* get(size_t bytes, int slot = 0);

 private:
  std::vector<uint8_t> slots_[4];
};

// One running collective. Created by the core, used on the executor thread.
class Ctx {
 public:
  // The collective `seq` of the communicator whose ranks and context on the
  // transport `t` are `view`.
  Ctx(transport::Transport& t, const transport::View& view, uint64_t seq, const transport::Fingerprint& fp,
      Clock::duration timeout, Scratch& scratch, const Tuning& tuning, const Topology& topo,
      coll::arena::HostArena* arena = nullptr)
      : t_(t), view_(view), rank_(view.rank()), size_(view.size()), seq_(seq), fp_(fp), deadline_(timeout),
        scratch_(scratch), tuning_(tuning), topo_(topo), arena_(arena) {}

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Tuning& tuning() const { return tuning_; }
  // Which ranks share a host (from the rendezvous).
  const Topology& topology() const { return topo_; }
  void* scratch(size_t bytes, int slot = 0) { return scratch_.get(bytes, slot); }
  // The shared segment of every rank of this communicator, when all of them
  // are on this host and it could be set up (collectives/arena/host_arena.h);
  // else null. Every rank sees the same answer.
  coll::arena::HostArena* arena() const { return arena_; }
  // Starts a round of this collective in the arena.
  void begin_round() {
    arena_->begin(seq_, fp_);
    if (!peer_bits_) return;
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) note_peer(q);
    }
  }
  // The operation's timeout runs from the first time it is asked for.
  Clock::time_point deadline() const { return deadline_.get(); }
  const transport::LazyDeadline& lazy_deadline() const { return deadline_; }
  // Notes every peer this collective sends to or receives from in `bits`
  // (one bit per rank; for the flight recorder). Null: nothing is noted.
  void note_peers(std::atomic<uint64_t>* bits) { peer_bits_ = bits; }

  // Non-blocking: `r` must outlive its completion.
  void isend(Request& r, int peer, uint32_t step, const void* buf, size_t bytes);
  void irecv(Request& r, int peer, uint32_t step, void* buf, size_t bytes);
  void wait(Request& r);
  void wait_all(Request* const* rs, size_t n);
  void wait(Request& a, Request& b) {
    Request* rs[2] = {&a, &b};
    wait_all(rs, 2);
  }

  // Blocking conveniences.
  void send(int peer, uint32_t step, const void* buf, size_t bytes);
  void recv(int peer, uint32_t step, void* buf, size_t bytes);
  // Posts the receive first, then the send, then waits for both.
  void sendrecv(int to, const void* sbuf, size_t sbytes, int from, void* rbuf, size_t rbytes,
                uint32_t step);

 private:
  transport::Transport& t_;
  const transport::View& view_;
  const int rank_, size_;  // the view's
  uint64_t seq_;
  transport::Fingerprint fp_;
  transport::LazyDeadline deadline_;
  Scratch& scratch_;
  const Tuning& tuning_;
  const Topology& topo_;
  coll::arena::HostArena* arena_;
  std::atomic<uint64_t>* peer_bits_ = nullptr;

  void note_peer(int peer) {
    if (!peer_bits_ || peer < 0) return;
    std::atomic<uint64_t>& w = peer_bits_[peer >> 6];
    const uint64_t bit = uint64_t{1} << (peer & 63);
    const uint64_t v = w.load(std::memory_order_relaxed);  // one writer: this thread
    if (!(v & bit)) w.store(v | bit, std::memory_order_relaxed);
  }
};

using AlgoFn = void (*)(Ctx&, const Args&);

}  // namespace shoal::coll
