// broadcast_shared.cc — broadcast for ranks that share a host, directly on
// the communicator's shared segment (shared_rounds.h): per round the root
// copies a piece into its slot and every rank copies it out once the root
// (and, for the double buffering, every rank) has arrived.
//
// Cost (p ranks, n bytes, c = copy per byte): 1 arrival per round + n c at
// the root and n c at every other rank, in parallel.
#include <algorithm>
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/arena/shared_rounds.h"
#include "common/copy.h"

namespace shoal::coll {

void broadcast_shared(Ctx& c, const Args& a) {
  const int n = c.size(), me = c.rank();
  const size_t es = a.elem();
  char* buf = static_cast<char*>(a.recv);
  if (n == 1) return;
  auto& arena = arena_of(c, Coll::kBroadcast);
  auto& stores = arena.stores();
  const size_t per_round = slot_elems(arena, es);
  for (size_t off = 0; off < a.count; off += per_round) {
    const size_t len = std::min(per_round, a.count - off);
    c.begin_round();
    // Through the cache or streamed (slot_stores.h): every rank counts the
    // round, the root writes and times it (to its next arrival, which waits
    // for every reader of the round before).
    const bool stream = stores.begin(len * es);
    if (me == a.root) copy_out(arena.slot(me, len * es), buf + off * es, len * es, stream);
    arena.arrive(1);
    arena.wait_all(1, c.lazy_deadline());
    if (me == a.root) {
      stores.end();
    } else {
      stores.abandon();
    }
    // Normal stores: measured, non-temporal ones made an 8 MiB broadcast
    // twice as slow here (the one buffer per rank stays in the cache).
    if (me != a.root) copy(buf + off * es, arena.slot(a.root, len * es), len * es);
  }
}

}  // namespace shoal::coll
