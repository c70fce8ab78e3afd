// broadcast_binomial.cc — binomial-tree broadcast from any root, segmented
// and pipelined.
//
// The root sends the buffer to its children in the binomial tree of
// patterns/tree.h (largest subtree first); every other rank receives it from
// its parent and forwards it to its own children. The buffer is cut into
// segments of Tuning::segment_bytes: all receives from the parent are posted
// at once, and a rank forwards segment k as soon as it has arrived, while
// segment k+1 is still coming in, so the levels of the tree overlap.
//
// Cost (p ranks, n bytes, S segments): unsegmented ceil(log2 p)(alpha + n beta);
// segmented about (S + ceil(log2 p) - 1)(alpha + n/S beta) per link, but the
// root pushes the whole buffer once to each of its ceil(log2 p) children, so
// the bandwidth term stays ~ceil(log2 p) n beta at the root.
// Latency-optimal; chosen for small messages and for p <= 2 (see select.cc).
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/patterns/partition.h"
#include "collectives/patterns/tree.h"

namespace shoal::coll {

void broadcast_binomial(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t es = a.elem();
  char* buf = static_cast<char*>(a.recv);
  if (r == a.root && a.send && a.send != a.recv) std::memcpy(buf, a.send, a.count * es);
  if (n == 1) return;

  const int rel = patterns::to_relative(r, a.root, n);
  const int parent = patterns::tree_parent(r, a.root, n);
  const std::vector<int> children = patterns::tree_children(r, a.root, n);
  const size_t seg_elems = std::max<size_t>(1, c.tuning().segment_bytes / es);
  const int nseg = static_cast<int>(patterns::num_segments(a.count, seg_elems));
  auto seg = [&](int k) { return patterns::block(a.count, nseg, k); };

  const size_t nchild = children.size();
  std::unique_ptr<Request[]> rrecv(new Request[rel == 0 ? 0 : nseg]);
  std::unique_ptr<Request[]> rsend(new Request[nchild * nseg]);
  if (rel != 0) {
    for (int k = 0; k < nseg; ++k) {
      const patterns::Range g = seg(k);
      c.irecv(rrecv[k], parent, static_cast<uint32_t>(k), buf + g.off * es, g.len * es);
    }
  }
  for (int k = 0; k < nseg; ++k) {
    const patterns::Range g = seg(k);
    if (rel != 0) c.wait(rrecv[k]);
    for (size_t j = 0; j < nchild; ++j) {
      c.isend(rsend[static_cast<size_t>(k) * nchild + j], children[j], static_cast<uint32_t>(k),
              buf + g.off * es, g.len * es);
    }
  }
  const size_t nsend = nchild * static_cast<size_t>(nseg);
  if (nsend > 0) {
    std::unique_ptr<Request*[]> all(new Request*[nsend]);
    for (size_t i = 0; i < nsend; ++i) all[i] = &rsend[i];
    c.wait_all(all.get(), nsend);
  }
}

}  // namespace shoal::coll
