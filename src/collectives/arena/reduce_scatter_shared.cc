// reduce_scatter_shared.cc — reduce_scatter for ranks that share a host,
// directly on the communicator's shared segment (shared_rounds.h): per
// round every rank copies a piece of every other rank's block into its
// slot and announces it; each rank then reduces its own block's piece from
// all slots (its own data straight from its input), in rank order. The
// pieces are written through the cache or streamed as the arena's
// SlotStores choose (slot_stores.h), like allgather's.
//
// Cost (p ranks, N input bytes per rank, c = copy per byte): 1 arrival per
// round + (p-1)/p N c + (p-1)/p N gamma.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/arena/shared_rounds.h"
#include "common/copy.h"

namespace shoal::coll {

void reduce_scatter_shared(Ctx& c, const Args& a) {
  const int n = c.size(), me = c.rank();
  const size_t es = a.elem();
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  if (n == 1) {
    copy(out, in, a.count * es);
    return;
  }
  auto& arena = arena_of(c, Coll::kReduceScatter);
  auto& stores = arena.stores();
  const size_t per_round = slot_elems(arena, es, static_cast<size_t>(n));
  RankPtrs srcs(n);
  for (size_t off = 0; off < a.count; off += per_round) {
    const size_t len = std::min(per_round, a.count - off);
    c.begin_round();
    // Piece q of the slot holds this rank's contribution to rank q's block.
    const size_t round_bytes = static_cast<size_t>(n) * len * es;
    char* slot = arena.slot(me, round_bytes);
    const bool stream = stores.begin(static_cast<size_t>(n - 1) * len * es);
    for (int q = 0; q < n; ++q) {
      if (q == me) continue;
      copy_out(slot + static_cast<size_t>(q) * len * es, in + (a.count * static_cast<size_t>(q) + off) * es,
               len * es, stream);
    }
    arena.arrive(1);
    arena.wait_all(1, c.lazy_deadline());
    for (int q = 0; q < n; ++q) {
      srcs[q] = q == me ? in + (a.count * static_cast<size_t>(me) + off) * es
                                             : arena.slot(q, round_bytes) + static_cast<size_t>(me) * len * es;
    }
    reduce_all(a, out + off * es, srcs.data(), n, len);
    stores.end();
  }
}

}  // namespace shoal::coll
