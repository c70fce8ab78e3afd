// allreduce_ring.cc — ring allreduce: reduce-scatter then allgather around a
// ring, segmented and pipelined.
//
// The buffer is cut into `size` blocks. In size-1 reduce-scatter steps each
// rank sends one block to its successor and reduces the block arriving from
// its predecessor; then in size-1 allgather steps the reduced blocks travel
// once around the ring. Each block is further cut into segments of
// Tuning::segment_bytes: a segment is forwarded as soon as it is reduced
// (or received, in the allgather), so the reduction of one segment overlaps
// the transfer of the next and all steps of the ring are in flight at once.
//
// Cost (p ranks, n bytes): 2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma.
// Bandwidth-optimal; chosen for large messages (see select.cc).
#include <cstring>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/ring_phases.h"

namespace shoal::coll {

void allreduce_ring(Ctx& c, const Args& a) {
  const int n = c.size();
  char* out = static_cast<char*>(a.recv);
  const char* in = static_cast<const char*>(a.send);
  if (n == 1) {
    if (!a.in_place()) std::memcpy(out, in, a.count * a.elem());
    return;
  }
  const std::vector<int> ranks = all_ranks(n);
  RingGroup g{ranks.data(), n, c.rank()};
  ring_allreduce(c, g, a, out, in, a.count, 0);
}

}  // namespace shoal::coll
