// reduce_scatterv_ring.cc — ring reduce-scatter with a block per rank of any
// size, segmented and pipelined. Also the engine of reduce_scatter_ring
// (equal blocks) and of reduce_scatter_gather's first phase.
//
// send holds one block per rank, block i being counts[i] elements at
// displs[i] (packed in rank order when displs is null); rank i ends with
// block i reduced over all ranks in recv. In size-1 steps each rank sends a
// block to its successor and reduces the block arriving from its
// predecessor with its own copy, so that after the last step it holds its
// own block fully reduced. As in allreduce_ring, blocks are cut into
// segments of Tuning::segment_bytes (every block into the same number of
// segments, sized by the largest block) and a segment moves on as soon as
// it is reduced, so all steps of the ring are in flight at once. Partial
// sums travel in three rotating scratch buffers of one block each; only the
// last step writes recv.
//
// Cost (p ranks, N = the total bytes of send, B = the largest block):
//   (p-1) alpha + (p-1) B beta + (p-1) B gamma; with equal blocks
//   (p-1) alpha + (p-1)/p N beta + (p-1)/p N gamma. Bandwidth-optimal.
// The only reduce_scatterv algorithm (see select.cc).
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/patterns/partition.h"
#include "collectives/patterns/ring.h"
#include "kernels/reduce.h"

namespace shoal::coll {

using patterns::block;
using patterns::Range;

void reduce_scatterv_ring(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t es = a.elem();
  const size_t* counts = a.counts;
  std::vector<size_t> packed;
  const size_t* displs = a.displs;
  if (!displs) {
    packed.resize(static_cast<size_t>(n));
    size_t off = 0;
    for (int i = 0; i < n; ++i) {
      packed[i] = off;
      off += counts[i];
    }
    displs = packed.data();
  }
  char* out = static_cast<char*>(a.recv);
  const char* in = static_cast<const char*>(a.send);
  if (n == 1) {
    const char* src = in + displs[0] * es;
    if (src != out) std::memmove(out, src, counts[0] * es);
    return;
  }

  const int next = patterns::ring_next(r, n), prev = patterns::ring_prev(r, n);
  // Step s in [0, n-1): send block send_block(s), receive and reduce
  // recv_block(s) = send_block(s + 1); the last one received is block r.
  auto send_block = [&](int s) { return patterns::mod(r - 1 - s, n); };
  auto recv_block = [&](int s) { return patterns::mod(r - 2 - s, n); };
  const size_t max_block = *std::max_element(counts, counts + n);
  const size_t seg_elems = std::max<size_t>(1, c.tuning().segment_bytes / es);
  const int nseg = static_cast<int>(patterns::num_segments(max_block, seg_elems));
  auto seg = [&](int b, int k) { return block(counts[b], nseg, k); };  // offset within block b
  auto tag = [&](int s, int k) { return static_cast<uint32_t>(s * nseg + k); };

  const int steps = n - 1;
  const size_t buf_bytes = max_block * es;
  // Step s receives into, reduces in, and (at step s + 1) sends from tmp[s % 3].
  char* tmp[3] = {static_cast<char*>(c.scratch(buf_bytes, 0)),
                  static_cast<char*>(c.scratch(buf_bytes, 1)),
                  static_cast<char*>(c.scratch(buf_bytes, 2))};
  std::unique_ptr<Request[]> rrecv(new Request[2 * static_cast<size_t>(nseg)]);
  std::unique_ptr<Request[]> rsend(new Request[static_cast<size_t>(steps) * nseg]);
  auto send_req = [&](int s, int k) -> Request& {
    return rsend[static_cast<size_t>(s) * nseg + k];
  };
  auto wait_sends = [&](int s) {
    for (int k = 0; k < nseg; ++k) c.wait(send_req(s, k));
  };
  auto post_recvs = [&](int s) {
    // tmp[s % 3] last held step s-3's block, sent at step s-2.
    if (s >= 3) wait_sends(s - 2);
    const int b = recv_block(s);
    for (int k = 0; k < nseg; ++k) {
      const Range g = seg(b, k);
      c.irecv(rrecv[static_cast<size_t>(s % 2) * nseg + k], prev, tag(s, k),
              tmp[s % 3] + g.off * es, g.len * es);
    }
  };

  post_recvs(0);
  {
    const int b = send_block(0);
    const char* src = in + displs[b] * es;
    for (int k = 0; k < nseg; ++k) {
      const Range g = seg(b, k);
      c.isend(send_req(0, k), next, tag(0, k), src + g.off * es, g.len * es);
    }
  }
  for (int s = 0; s < steps; ++s) {
    if (s + 1 < steps) post_recvs(s + 1);
    const int b = recv_block(s);
    const char* mine = in + displs[b] * es;
    const bool last = s + 1 == steps;
    char* dst = last ? out : tmp[s % 3];
    for (int k = 0; k < nseg; ++k) {
      const Range g = seg(b, k);
      c.wait(rrecv[static_cast<size_t>(s % 2) * nseg + k]);
      kernels::reduce(a.dt, a.op, dst + g.off * es, mine + g.off * es, tmp[s % 3] + g.off * es,
                      g.len);
      if (!last) c.isend(send_req(s + 1, k), next, tag(s + 1, k), dst + g.off * es, g.len * es);
    }
  }
  std::unique_ptr<Request*[]> all(new Request*[static_cast<size_t>(steps) * nseg]);
  for (size_t i = 0; i < static_cast<size_t>(steps) * nseg; ++i) all[i] = &rsend[i];
  c.wait_all(all.get(), static_cast<size_t>(steps) * nseg);
}

}  // namespace shoal::coll
