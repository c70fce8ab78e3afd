// reduce_scatter_direct.cc — reduce_scatter for ranks that share a host:
// rank i pulls block i from all peers at once and reduces it
// (direct_phases.h), in one step instead of the ring's p-1.
//
// Cost (p ranks, N = p * block bytes): alpha + (p-1)/p N beta + (p-1)/p N
// gamma. Chosen when every rank is on one host and p > 2 (select.cc).
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/direct_phases.h"

namespace shoal::coll {

void reduce_scatter_direct(Ctx& c, const Args& a) {
  const int n = c.size();
  const std::vector<int> ranks = all_ranks(n);
  const EqualBlocks b(n, a.count);
  RingGroup g{ranks.data(), n, c.rank()};
  direct_reduce_scatter(c, g, a, static_cast<const char*>(a.send), b.counts.data(), b.displs.data(),
                        static_cast<char*>(a.recv), 0);
}

}  // namespace shoal::coll
