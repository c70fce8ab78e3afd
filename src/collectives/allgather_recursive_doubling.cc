// allgather_recursive_doubling.cc — recursive doubling allgather for a
// power-of-two number of ranks.
//
// At step j (d = 2^j) a rank exchanges with rank ^ d: it sends the d blocks
// it holds, [rank & ~(d-1), +d), and receives the partner's d adjacent
// blocks, straight into their places in the output (no scratch, no final
// rotation). The partners are at distance 1, 2, 4, ...: when each host's
// ranks are numbered contiguously (a power of two per host), the first steps
// stay inside the host and only the last log2(H) cross the network, once
// each, where Bruck's allgather crosses it at every step (its step-1 partner
// rank + 1 is on the next host for the host's last rank).
//
// Cost (p = 2^L ranks, n = p*count*elem bytes of output):
// L alpha + (p-1)/p n beta. Not a power of two: Bruck's algorithm
// (allgather_bruck.cc), so that the algorithm can be forced at any size.
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/patterns/recursive.h"

namespace shoal::coll {

void allgather_recursive_doubling(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  if (!patterns::is_pow2(n)) {
    allgather_bruck(c, a);
    return;
  }
  const size_t bb = a.count * a.elem();  // block bytes
  char* out = static_cast<char*>(a.recv);
  char* own = a.own_block(r);
  const char* mine = a.allgather_input(r);
  if (mine != own) std::memcpy(own, mine, bb);
  uint32_t step = 0;
  for (int j = 0; (1 << j) < n; ++j, ++step) {
    const patterns::BlockSpan have = patterns::doubling_have(r, j);
    const patterns::BlockSpan get = patterns::doubling_get(r, j);
    const int partner = patterns::doubling_partner(r, j);
    c.sendrecv(partner, out + static_cast<size_t>(have.lo) * bb,
               static_cast<size_t>(have.len()) * bb, partner,
               out + static_cast<size_t>(get.lo) * bb, static_cast<size_t>(get.len()) * bb, step);
  }
}

}  // namespace shoal::coll
