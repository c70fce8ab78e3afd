// barrier_dissemination.cc — the dissemination barrier (Hensgen, Finkel and
// Manber), any world size.
//
// In round k = 0 .. ceil(log2 p) - 1 every rank sends an empty message to
// rank + 2^k and waits for one from rank - 2^k (mod p). After round k a
// rank has heard, directly or through others, from the 2^(k+1) - 1 ranks
// before it, so after the last round it knows that every rank has entered
// the barrier. Unlike a tree barrier there is no root and every rank is
// done after the same number of rounds.
//
// Cost (p ranks): ceil(log2 p) alpha. The barrier but where every rank
// shares the arena (barrier_shared.cc).
#include "collectives/algorithms.h"
#include "collectives/patterns/ring.h"
#include "collectives/patterns/tree.h"

namespace shoal::coll {

void barrier_dissemination(Ctx& c, const Args& /*a*/) {
  const int n = c.size(), r = c.rank();
  const int rounds = patterns::ceil_log2(n);
  for (int k = 0; k < rounds; ++k) {
    const int to = patterns::mod(r + (1 << k), n), from = patterns::mod(r - (1 << k), n);
    c.sendrecv(to, nullptr, 0, from, nullptr, 0, static_cast<uint32_t>(k));
  }
}

}  // namespace shoal::coll
