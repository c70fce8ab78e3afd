// allreduce_shared_claim.cc — allreduce for ranks that share a host, with
// the work shared out as it goes rather than in fixed shares: every rank
// publishes the addresses of its input and its output (HostArena::publish);
// then, while pieces are left, a rank claims the next piece
// (HostArena::claim), reads that piece of every peer's input
// (process_vm_readv), reduces it in rank order into its own output, and
// writes the result into every peer's output (process_vm_writev). A rank
// that has no piece left waits for every peer's phase 2 ("my last piece is
// done"), after which no one reads or writes its buffers. A rank that fails
// before then closes its output to writes and waits for those under way
// (HostArena::leave_writes) before the error reaches its caller.
//
// Why: with fixed shares the slowest rank sets the pace of every round, and
// under load the slowest rank is the one whose core another process holds;
// here a rank that has its core does the pieces of one that has not, and
// the whole operation is one round, without a slot's size between rounds.
// Each byte is copied once in and once out instead of into a slot and back.
//
// Cost (p ranks, n bytes, s = a system call, c = copy per byte through the
// kernel): 2 arrivals + 2 (p-1) s per piece + (p-1)/p 2 n c + (p-1)/p n
// gamma per rank when the cores are shared evenly.
#include <algorithm>

#include "collectives/algorithms.h"
#include "collectives/arena/shared_rounds.h"
#include "common/copy.h"

namespace shoal::coll {

namespace {

// Elements a rank claims at a time: kClaimPieces pieces per rank, within
// kClaimPieceBytes.
size_t claim_piece(size_t count, size_t es, int n) {
  const size_t bytes = count * es / (kClaimPieces * static_cast<size_t>(n));
  const size_t clamped = std::clamp(bytes, kClaimPieceBytes.first, kClaimPieceBytes.second);
  return std::max<size_t>(clamped / es, 1);
}

}  // namespace

void allreduce_shared_claim(Ctx& c, const Args& a) {
  const int n = c.size(), me = c.rank();
  const size_t es = a.elem();
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  if (n == 1 || a.count == 0) {
    if (!a.in_place()) copy(out, in, a.count * es);
    return;
  }
  auto& arena = reading_arena_of(c, Coll::kAllreduce, "shared_claim");
  const size_t piece = claim_piece(a.count, es, n);
  const uint64_t pieces = (a.count + piece - 1) / piece;
  // A piece of every peer's input, and of this rank's own where the output
  // is the input and this rank's turn in the rank order comes after the
  // output is first written (me >= 2).
  char* tmp = static_cast<char*>(c.scratch(static_cast<size_t>(n) * piece * es));
  RankPtrs srcs(n);
  c.begin_round();
  arena.publish(in, out);
  arena.arrive(1);
  try {
    arena.wait_all(1, c.lazy_deadline());
    uint64_t k = 0;
    while (arena.claim(pieces, &k)) {
      const size_t off = static_cast<size_t>(k) * piece * es;
      const size_t len = std::min(piece, a.count - static_cast<size_t>(k) * piece);
      for (int q = 0; q < n; ++q) {
        char* t = tmp + static_cast<size_t>(q) * piece * es;
        if (q != me) {
          arena.read(q, t, len * es, off);
          srcs[q] = t;
        } else if (me >= 2 && a.in_place()) {
          copy(t, in + off, len * es);
          srcs[q] = t;
        } else {
          srcs[q] = in + off;
        }
      }
      reduce_all(a, out + off, srcs.data(), n, len);
      // A peer that has left (it failed) never arrives at phase 2: the wait
      // below names it.
      for (int j = 1; j < n; ++j) arena.write((me + j) % n, off, out + off, len * es);
    }
    arena.arrive(2);
    arena.wait_all(2, c.lazy_deadline());
  } catch (...) {
    // Peers may be writing into `out`: none may once the caller has the error.
    arena.leave_writes(kLeaveWritesBound);
    throw;
  }
}

}  // namespace shoal::coll
