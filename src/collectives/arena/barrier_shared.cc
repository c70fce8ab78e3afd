// barrier_shared.cc — the barrier of ranks that share a host, on the
// communicator's shared segment (shared_rounds.h): one round in which every
// rank announces phase 1 and waits for every peer's.
//
// Every rank leaves once the last one has arrived, within a cache line's
// transfer of it (a rank waiting on messages leaves when its last message
// is read, after a wake-up if it slept). Cost (p ranks): 1 arrival.
#include "collectives/algorithms.h"
#include "collectives/arena/shared_rounds.h"

namespace shoal::coll {

void barrier_shared(Ctx& c, const Args& /*a*/) {
  if (c.size() == 1) return;
  auto& arena = arena_of(c, Coll::kBarrier);
  c.begin_round();
  arena.arrive(1);
  arena.wait_all(1, c.lazy_deadline());
}

}  // namespace shoal::coll
