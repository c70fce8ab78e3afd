// allgather_shared_cma.cc — allgather for ranks that share a host, with one
// copy: every rank publishes the address of its input in the arena
// (HostArena::publish) and copies every peer's block straight out of the
// peer's memory into place (process_vm_readv, HostArena::read), its own
// block in the time it would wait, then waits until every peer has read
// before its input may change. Needs the arena's single-copy reads
// (Ctx::arena()->reads()).
//
// Cost (p ranks, N output bytes, c = copy per byte, s = a system call):
// 2 arrivals + (p-1) s + (p-1)/p N c; against allgather_shared's 1 arrival
// + N c: ahead where a block is large enough to pay for the call and the
// second arrival, and small enough that the slot copy has nothing in flight
// to overlap with (docs/algorithms.md gives the range).
#include <algorithm>

#include "collectives/algorithms.h"
#include "collectives/arena/shared_rounds.h"
#include "common/copy.h"

namespace shoal::coll {
namespace {

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
  arena.publish(mine);
  arena.arrive(1);
  // The rank's own block is copied while it would otherwise wait: in pieces
  // while the next peer has not arrived, the rest once it has read every
  // peer and announced so, while the slowest peer still reads (2 ranks,
  // 8 MiB on the 2-vCPU Xeon VM: 0.89x Open MPI's shared memory's speed
  // when the own block went first, 0.99x so; docs/algorithms.md, "Single
  // copy").
  size_t own_done = mine != own_block ? 0 : bytes;
  // Peers in rank order from the next one: not every rank reading the same
  // peer at once.
  for (int k = 1; k < n; ++k) {
    const int q = (me + k) % n;
    while (own_done < bytes && !arena.arrived(q, 1)) {
      const size_t piece = std::min(kOwnPiece, bytes - own_done);
      copy(own_block + own_done, mine + own_done, piece);
      own_done += piece;
    }
    arena.wait_one(q, 1, c.lazy_deadline());
    arena.read(q, out + bytes * static_cast<size_t>(q), bytes);
  }
  arena.arrive(2);
  if (own_done < bytes) copy(own_block + own_done, mine + own_done, bytes - own_done);
  arena.wait_all(2, c.lazy_deadline());
}

}  // namespace shoal::coll
