// reduce_binomial.cc — reduce to any root up a binomial tree, segmented and
// pipelined.
//
// The tree is patterns/tree.h's binomial tree relative to the root. Every
// rank reduces its own vector with those of its children's subtrees, in
// increasing relative rank, and sends the result to its parent; the root
// reduces into recv. The vector is cut into segments of
// Tuning::segment_bytes: a rank forwards segment s as soon as it has reduced
// it, while its children are already sending segment s + 1 (two receive
// buffers per child), so the tree's levels work at the same time.
//
// recv is written on the root only; elsewhere a partial result lives in
// scratch (recv may be null there).
//
// Cost (p ranks, n bytes, L = ceil(log2 p), S segments):
//   unsegmented: L alpha + L n beta + L n gamma
//   pipelined:   about (L + S - 1) (alpha + n/S beta) + L n gamma (the root
//                reduces every segment of each of its L children).
// Chosen for small and medium messages and for 2 ranks (see select.cc).
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/patterns/partition.h"
#include "collectives/patterns/tree.h"
#include "kernels/reduce.h"

namespace shoal::coll {

using patterns::block;
using patterns::Range;

void reduce_binomial(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t es = a.elem();
  const char* in = static_cast<const char*>(a.send);
  if (n == 1) {
    if (!a.in_place()) std::memcpy(a.recv, in, a.count * es);
    return;
  }
  const int parent = patterns::tree_parent(r, a.root, n);
  // Reduce the children in increasing relative rank, so that the operands
  // combine in rank order (the subtrees are consecutive runs of ranks); the
  // nearest child, a leaf, is also the first to arrive.
  std::vector<int> children =
      patterns::binomial_children(patterns::to_relative(r, a.root, n), n);
  std::sort(children.begin(), children.end());
  for (int& ch : children) ch = patterns::to_absolute(ch, a.root, n);
  const int nc = static_cast<int>(children.size());

  const size_t seg_elems = std::max<size_t>(1, c.tuning().segment_bytes / es);
  const int nseg = static_cast<int>(patterns::num_segments(a.count, seg_elems));
  auto seg = [&](int k) { return block(a.count, nseg, k); };
  // Every message on a tree edge carries its segment number as the step.
  auto tag = [](int k) { return static_cast<uint32_t>(k); };

  std::unique_ptr<Request[]> sends(new Request[static_cast<size_t>(nseg)]);
  auto wait_sends = [&] {
    std::unique_ptr<Request*[]> all(new Request*[static_cast<size_t>(nseg)]);
    for (int k = 0; k < nseg; ++k) all[k] = &sends[k];
    c.wait_all(all.get(), static_cast<size_t>(nseg));
  };

  if (nc == 0) {  // a leaf: forward the input as it is
    for (int k = 0; k < nseg; ++k) {
      const Range g = seg(k);
      c.isend(sends[k], parent, tag(k), in + g.off * es, g.len * es);
    }
    wait_sends();
    return;
  }

  // Where the partial result accumulates: recv on the root, scratch elsewhere.
  char* acc = parent < 0 ? static_cast<char*>(a.recv)
                         : static_cast<char*>(c.scratch(a.count * es, 1));
  const size_t seg_bytes = seg(0).len * es;
  // Receive buffer of child j for segment k: (k % 2) * nc + j.
  char* bufs = static_cast<char*>(c.scratch(2 * static_cast<size_t>(nc) * seg_bytes, 0));
  auto buf = [&](int k, int j) { return bufs + (static_cast<size_t>(k % 2) * nc + j) * seg_bytes; };
  std::unique_ptr<Request[]> recvs(new Request[2 * static_cast<size_t>(nc)]);
  auto post_recvs = [&](int k) {
    const Range g = seg(k);
    for (int j = 0; j < nc; ++j) {
      c.irecv(recvs[(k % 2) * nc + j], children[j], tag(k), buf(k, j), g.len * es);
    }
  };

  post_recvs(0);
  if (nseg > 1) post_recvs(1);
  for (int k = 0; k < nseg; ++k) {
    const Range g = seg(k);
    char* dst = acc + g.off * es;
    for (int j = 0; j < nc; ++j) {
      c.wait(recvs[(k % 2) * nc + j]);
      kernels::reduce(a.dt, a.op, dst, j == 0 ? in + g.off * es : dst, buf(k, j), g.len);
    }
    if (k + 2 < nseg) post_recvs(k + 2);  // this segment's buffers are free again
    if (parent >= 0) c.isend(sends[k], parent, tag(k), dst, g.len * es);
  }
  if (parent >= 0) wait_sends();
}

}  // namespace shoal::coll
