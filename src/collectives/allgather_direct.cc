// allgather_direct.cc — allgather for ranks that share a host: every rank
// sends its block to all peers at once, and each receiver places it straight
// into its output (on shared memory, one copy out of the sender's buffer).
//
// Cost (p ranks, N output bytes): alpha + (p-1)/p N beta, one step instead
// of the ring's p-1. Chosen when every rank is on one host and p > 2
// (select.cc).
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/direct_phases.h"

namespace shoal::coll {

void allgather_direct(Ctx& c, const Args& a) {
  const int n = c.size();
  const std::vector<int> ranks = all_ranks(n);
  const EqualBlocks b(n, a.count);
  RingGroup g{ranks.data(), n, c.rank()};
  char* out = static_cast<char*>(a.recv);
  direct_allgather(c, g, a, a.allgather_input(c.rank()), b.counts.data(), b.displs.data(), out, 0);
}

}  // namespace shoal::coll
