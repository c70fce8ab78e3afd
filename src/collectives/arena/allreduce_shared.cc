// allreduce_shared.cc — allreduce for ranks that share a host, directly on
// the communicator's shared segment (shared_rounds.h).
//
// Per round (a piece of at most one slot): every rank copies its piece into
// its slot and announces it (phase 1). A small piece is then reduced whole
// by every rank, reading all slots in rank order: one arrival per rank and
// bitwise identical results. A larger one is cut into p slices and each rank
// reduces its own slice in place in its slot, in parallel with the others,
// announces it (phase 2), and copies every reduced slice out.
//
// Cost (p ranks, n bytes, c = copy per byte): small: 1 arrival + n c +
// (p-1) n gamma; large: 2 arrivals + (2 - 1/p) n c + (p-1)/p n gamma.
#include "collectives/algorithms.h"
#include "collectives/arena/shared_rounds.h"

namespace shoal::coll {

void allreduce_shared(Ctx& c, const Args& a) { reduce_in_rounds(c, a, Coll::kAllreduce, -1); }

}  // namespace shoal::coll
