// allgather_shared.cc — allgather for ranks that share a host, directly on
// the communicator's shared segment (shared_rounds.h): per round every rank
// copies a piece of its block into its slot, announces it, and copies every
// peer's piece out of their slots into place.
//
// Cost (p ranks, N output bytes, c = copy per byte): 1 arrival per round +
// N/p c in + (p-1)/p N c out.
#include <algorithm>
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/arena/shared_rounds.h"
#include "common/copy.h"

namespace shoal::coll {

void allgather_shared(Ctx& c, const Args& a) {
  const int n = c.size(), me = c.rank();
  const size_t es = a.elem();
  char* out = static_cast<char*>(a.recv);
  const char* mine = a.allgather_input(me);
  char* own_block = a.own_block(me);
  if (n == 1) {
    if (mine != own_block) copy(own_block, mine, a.count * es);
    return;
  }
  auto& arena = arena_of(c, Coll::kAllgather);
  auto& stores = arena.stores();
  const size_t per_round = slot_elems(arena, es);
  const bool stream = streams(a.count * es * static_cast<size_t>(n), n);
  for (size_t off = 0; off < a.count; off += per_round) {
    const size_t len = std::min(per_round, a.count - off);
    c.begin_round();
    copy_out(arena.slot(me, len * es), mine + off * es, len * es, stores.begin(len * es));
    arena.arrive(1);
    if (mine != own_block) copy_out(own_block + off * es, mine + off * es, len * es, stream);
    arena.wait_all(1, c.lazy_deadline());
    for (int q = 0; q < n; ++q) {
      if (q == me) continue;
      copy_out(out + (a.count * static_cast<size_t>(q) + off) * es, arena.slot(q, len * es), len * es, stream);
    }
    stores.end();
  }
}

}  // namespace shoal::coll
