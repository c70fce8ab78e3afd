// reduce_scatter_gather.cc — Rabenseifner's reduce: a reduce-scatter, then
// a gather of the reduced blocks to the root.
//
// The vector is cut into one nearly equal block per rank. A ring
// reduce-scatter (reduce_scatterv_ring: segmented and pipelined, any world
// size) leaves rank i with block i fully reduced, the root writing its block
// straight into recv; then every other rank sends its block to the root,
// which receives them all at once into their places in recv. Unlike the
// binomial tree, no rank reduces or forwards more than its share, so the
// root's link carries the vector about twice, not log2(p) times.
//
// Cost (p ranks, n bytes):
//   (p-1) alpha + (p-1)/p n beta + (p-1)/p n gamma   reduce-scatter
// + (p-1) alpha + (p-1)/p n beta                     gather (at the root)
// Chosen for large messages on more than 2 ranks (see select.cc).
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/patterns/partition.h"

namespace shoal::coll {

using patterns::block;
using patterns::Range;

namespace {
// Gather messages use steps from here on, above any the ring can use.
constexpr uint32_t kGatherStep = 1u << 31;
}  // namespace

void reduce_scatter_gather(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t es = a.elem();
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);  // root only
  if (n == 1) {
    if (!a.in_place()) std::memcpy(out, in, a.count * es);
    return;
  }
  const bool root = r == a.root;
  std::vector<size_t> counts(static_cast<size_t>(n)), displs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const Range b = block(a.count, n, i);
    counts[i] = b.len;
    displs[i] = b.off;
  }

  // ---- reduce-scatter: block r, reduced, into recv (root) or scratch ----
  // Scratch slot 3: reduce_scatterv_ring uses 0..2.
  char* mine = root ? out + displs[r] * es : static_cast<char*>(c.scratch(counts[r] * es, 3));
  Args rs = a;
  rs.recv = mine;
  rs.counts = counts.data();
  rs.displs = displs.data();
  reduce_scatterv_ring(c, rs);

  // ---- gather the blocks to the root (empty blocks are not sent) ----
  if (!root) {
    if (counts[r] > 0) c.send(a.root, kGatherStep, mine, counts[r] * es);
    return;
  }
  std::unique_ptr<Request[]> reqs(new Request[static_cast<size_t>(n)]);
  std::vector<Request*> pending;
  for (int i = 0; i < n; ++i) {
    if (i == r || counts[i] == 0) continue;
    c.irecv(reqs[i], i, kGatherStep, out + displs[i] * es, counts[i] * es);
    pending.push_back(&reqs[i]);
  }
  if (!pending.empty()) c.wait_all(pending.data(), pending.size());
}

}  // namespace shoal::coll
