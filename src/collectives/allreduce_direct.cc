// allreduce_direct.cc — allreduce for ranks that share a host: every rank
// reduces its own slice, pulled from all peers at once, then every rank
// pulls every reduced slice (direct_phases.h).
//
// The buffer is cut into p slices. Step 1: rank i receives slice i from all
// p-1 peers in parallel (on shared memory, each a single copy out of the
// peer's buffer) and reduces it, segment by segment. Step 2: rank i sends its
// reduced slice to all peers, who place it straight into their output.
//
// Cost (p ranks, n bytes): 2 alpha + 2 (p-1)/p n beta + (p-1)/p n gamma, with
// 2 dependent steps instead of the ring's 2(p-1): the same bytes, p-1 times
// fewer hand-offs. On a network the p-1 concurrent flows per rank would
// contend for one link, so it is chosen only when every rank is on one host
// (select.cc); with 2 ranks it is the ring.
#include <cstring>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/direct_phases.h"
#include "collectives/patterns/partition.h"

namespace shoal::coll {

void allreduce_direct(Ctx& c, const Args& a) {
  const int n = c.size();
  char* out = static_cast<char*>(a.recv);
  const char* in = static_cast<const char*>(a.send);
  if (n == 1) {
    if (!a.in_place()) std::memcpy(out, in, a.count * a.elem());
    return;
  }
  const std::vector<int> ranks = all_ranks(n);
  std::vector<size_t> counts(static_cast<size_t>(n)), displs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    patterns::Range b = patterns::block(a.count, n, i);
    counts[static_cast<size_t>(i)] = b.len;
    displs[static_cast<size_t>(i)] = b.off;
  }
  const int me = c.rank();
  RingGroup g{ranks.data(), n, me};
  char* mine = out + displs[static_cast<size_t>(me)] * a.elem();
  direct_reduce_scatter(c, g, a, in, counts.data(), displs.data(), mine, 0);
  direct_allgather(c, g, a, mine, counts.data(), displs.data(), out,
                   direct_steps(c, g, a, counts.data()));
}

}  // namespace shoal::coll
