// allgather_shared_cma.cc — allgather for ranks that share a host, with one
// copy per destination: every rank publishes the address of its output in
// the arena (HostArena::publish), and writes its own block into place in
// its output and in every peer's (process_vm_writev, HostArena::write),
// piece by piece: each piece is read from memory once, written to the
// peers, and copied into the own output from the cache. A rank then waits
// until every peer has written its block (phase 2) before it returns. A
// rank that fails before then closes its output to writes and waits for
// those under way (HostArena::leave_writes) before the error reaches its
// caller. Needs the arena's single-copy reads (Ctx::arena()->reads()): the
// kernel allows the writes wherever it allows the reads.
//
// Why writes, not reads: a rank that read each peer's block out of the
// peer's memory would read every input p times on the host, once by its
// owner for its own copy and once by each peer; written on from the cache,
// each input is read once (2 ranks on the 2-vCPU Xeon VM, 1-16 MiB of
// output: 1.09-1.41x the speed of the reads; docs/algorithms.md, "Single
// copy").
//
// Cost (p ranks, N output bytes, c = copy per byte, s = a system call, P
// = kPushPiece): 2 arrivals + (p-1) N/(pP) s + (p-1)/p N c of writes +
// N/p c of the own copy, where the reads come to N/p per rank instead of N.
#include <algorithm>

#include "collectives/algorithms.h"
#include "collectives/arena/shared_rounds.h"
#include "common/copy.h"

namespace shoal::coll {
namespace {

// The pieces a rank copies and writes on: a few system calls per MiB, and
// a piece stays in a core's cache (the 2 MiB L2 of the Xeon VM, or its
// share of a larger one) between its copy and its writes.
constexpr size_t kPushPiece = 512 << 10;
// The piece of its own block a rank copies between looks at a peer that has
// not arrived (about 5-10 us of copying).
constexpr size_t kOwnPiece = 64 << 10;

}  // namespace

void allgather_shared_cma(Ctx& c, const Args& a) {
  const int n = c.size(), me = c.rank();
  const size_t bytes = a.count * a.elem();
  char* out = static_cast<char*>(a.recv);
  const char* mine = a.allgather_input(me);
  char* own_block = a.own_block(me);
  if (n == 1) {
    if (mine != own_block) copy(own_block, mine, bytes);
    return;
  }
  auto& arena = reading_arena_of(c, Coll::kAllgather);
  c.begin_round();
  arena.publish(nullptr, out);
  arena.arrive(1);
  try {
    // Its own block is copied while a peer it must write to has not
    // arrived: in pieces, looking at the peer between them (peers in rank
    // order from the next one).
    size_t own_done = mine != own_block ? 0 : bytes;
    for (int k = 1; k < n; ++k) {
      const int q = (me + k) % n;
      while (own_done < bytes && !arena.arrived(q, 1)) {
        const size_t piece = std::min(kOwnPiece, bytes - own_done);
        copy(own_block + own_done, mine + own_done, piece);
        own_done += piece;
      }
      arena.wait_one(q, 1, c.lazy_deadline());
    }
    // Then piece by piece: the writes (a peer that has left, failing, never
    // arrives at phase 2: the wait below names it), then the own copy of
    // the piece, out of the cache; the last piece's after phase 2, while
    // the peers still write.
    const size_t at = bytes * static_cast<size_t>(me);
    for (size_t off = 0;; off += kPushPiece) {
      const size_t len = std::min(kPushPiece, bytes - off);
      for (int k = 1; k < n; ++k) arena.write((me + k) % n, at + off, mine + off, len);
      const bool last = off + len == bytes;
      if (last) arena.arrive(2);
      if (own_done < off + len) {
        copy(own_block + own_done, mine + own_done, off + len - own_done);
        own_done = off + len;
      }
      if (last) break;
    }
    arena.wait_all(2, c.lazy_deadline());
  } catch (...) {
    // Peers may be writing into `out`: none may once the caller has the error.
    arena.leave_writes(kLeaveWritesBound);
    throw;
  }
}

}  // namespace shoal::coll
