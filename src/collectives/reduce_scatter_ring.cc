// reduce_scatter_ring.cc — ring reduce-scatter, segmented and pipelined.
//
// send holds size * count elements; rank i ends with block i (elements
// [i*count, (i+1)*count)) reduced over all ranks, in recv. This is
// allreduce_ring's first phase with the blocks shifted so that each rank
// keeps its own: in size-1 steps each rank passes a partial sum to its
// successor and reduces the one arriving from its predecessor, segment by
// segment (Tuning::segment_bytes) so that all steps are in flight at once.
// The ring itself is reduce_scatterv_ring's, run with equal blocks.
//
// Cost (p ranks, n = count bytes per block, N = p n):
//   (p-1) alpha + (p-1)/p N beta + (p-1)/p N gamma. Bandwidth-optimal.
// Chosen across hosts for 2 ranks, above 512 KiB, or for a world size that
// is not a power of two (see select.cc).
#include <vector>

#include "collectives/algorithms.h"

namespace shoal::coll {

void reduce_scatter_ring(Ctx& c, const Args& a) {
  const int n = c.size();
  std::vector<size_t> counts(static_cast<size_t>(n), a.count), displs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) displs[i] = static_cast<size_t>(i) * a.count;
  Args v = a;
  v.counts = counts.data();
  v.displs = displs.data();
  reduce_scatterv_ring(c, v);
}

}  // namespace shoal::coll
