// collectives/shared_rounds.h — what the *_shared algorithms have in common.
//
// These algorithms work directly on the communicator's shared segment
// (collectives/arena/host_arena.h) when every rank is on one host: each rank
// copies its input into its own slot, announces it, and then reads the
// others' slots in place, with no message in between. Large operations run
// as several rounds of at most one slot per rank. Cost per round: one or
// two arrivals (a cache line each way) instead of messages, so they win on
// latency; the data is copied in and out of shared memory, where the
// message-based algorithms copy once out of the sender's buffer
// (docs/algorithms.md gives the costs and where each is chosen).
#pragma once

#include <chrono>
#include <cstddef>
#include <utility>
#include <vector>

#include "collectives/coll.h"

namespace shoal::coll {

// Allreduce and reduce: a piece whose p copies fit here is reduced whole by
// every rank (one arrival) rather than slice by slice (two).
inline constexpr size_t kSharedOnePhaseBytes = 32 << 10;

// allreduce_shared_claim: the pieces a rank claims at a time, kClaimPieces
// per rank in an operation, each within kClaimPieceBytes: large enough that
// the two system calls per peer are a small part of a piece, small enough
// that a rank whose core is taken holds back little work, and that a
// piece's reads stay in the cache for the reduction.
inline constexpr size_t kClaimPieces = 4;
inline constexpr std::pair<size_t, size_t> kClaimPieceBytes{64 << 10, 256 << 10};

// How long a rank that fails waits for the writes of its peers into its
// output that are under way (HostArena::leave_writes; a piece's write takes
// microseconds: this only bounds a writer stopped in the middle of one).
inline constexpr auto kLeaveWritesBound = std::chrono::seconds(1);

// Whether an operation writes its output with non-temporal stores
// (copy_stream in common/copy.h): when the outputs of the host's `ranks`
// ranks, `output_bytes` each, fill the last-level cache or more, they
// do not stay cached along with the inputs anyway, and a normal store would
// first read each line of the destination from memory (a third more
// traffic; bench/results/copy-alignment).
bool streams(size_t output_bytes, int ranks);
// copy() or copy_stream().
void copy_out(void* dst, const void* src, size_t n, bool stream);

// One pointer per rank, on the stack up to 16 ranks (no allocation on the
// path of a small collective).
class RankPtrs {
 public:
  explicit RankPtrs(int n) {
    if (n > kInline) heap_.resize(static_cast<size_t>(n));
    p_ = n > kInline ? heap_.data() : inline_;
  }
  const char*& operator[](int i) { return p_[i]; }
  const char* const* data() const { return p_; }

 private:
  static constexpr int kInline = 16;
  const char* inline_[kInline];
  std::vector<const char*> heap_;
  const char** p_;
};

// The arena, or InvalidArgument naming the collective when there is none
// (a forced *_shared algorithm where the ranks span hosts or shared memory
// is off; every rank sees the same answer, so every rank fails alike).
coll::arena::HostArena& arena_of(Ctx& c, Coll coll, const char* algo = "shared");
// The arena when it has single-copy reads (HostArena::reads), else
// InvalidArgument naming the collective, as arena_of (the *_shared_cma
// algorithms, and allgather's shared_timed).
coll::arena::HostArena& reading_arena_of(Ctx& c, Coll coll, const char* algo = "shared_cma");

// dst = srcs[0] (op) srcs[1] (op) ... (op) srcs[n-1], left to right, `len`
// elements; dst may alias srcs[0] exactly. n >= 1.
void reduce_all(const Args& a, char* dst, const char* const* srcs, int n, size_t len);

// Allreduce (root < 0) and reduce (the result at `root` only), in rounds:
// every rank copies its piece into its slot (phase 1); a small piece is then
// reduced whole, in rank order, by every rank that wants the result; a
// larger one slice by slice, each rank its own slice in place in its slot,
// own data first (phase 2), and the ranks that want the result copy every
// slice out.
void reduce_in_rounds(Ctx& c, const Args& a, Coll coll, int root);

// Elements of `es` bytes that fit one slot `parts` times (at least 1).
size_t slot_elems(const coll::arena::HostArena& arena, size_t es, size_t parts = 1);

}  // namespace shoal::coll
