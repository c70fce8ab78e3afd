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
#include <algorithm>
#include <cstring>
#include <memory>

#include "collectives/algorithms.h"
#include "collectives/patterns/partition.h"
#include "collectives/patterns/ring.h"
#include "kernels/reduce.h"

namespace shoal::coll {

using patterns::block;
using patterns::Range;

void allreduce_ring(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t es = a.elem();
  char* out = static_cast<char*>(a.recv);
  const char* in = static_cast<const char*>(a.send);
  if (n == 1) {
    if (!a.in_place()) std::memcpy(out, in, a.count * es);
    return;
  }
  const int next = patterns::ring_next(r, n), prev = patterns::ring_prev(r, n);
  const size_t max_block = block(a.count, n, 0).len;
  const size_t seg_elems = std::max<size_t>(1, c.tuning().segment_bytes / es);
  const int nseg = static_cast<int>(patterns::num_segments(max_block, seg_elems));
  // Segment k of block b.
  auto seg = [&](int b, int k) {
    Range blk = block(a.count, n, b);
    Range s = block(blk.len, nseg, k);
    s.off += blk.off;
    return s;
  };
  const size_t step_bytes = max_block * es;
  char* tmp[2] = {static_cast<char*>(c.scratch(step_bytes, 0)),
                  static_cast<char*>(c.scratch(step_bytes, 1))};
  auto tag = [&](int phase_step, int k) { return static_cast<uint32_t>(phase_step * nseg + k); };

  // ---- reduce-scatter ----
  const int steps = n - 1;
  std::unique_ptr<Request[]> rrecv(new Request[2 * nseg]);  // double-buffered by step parity
  std::unique_ptr<Request[]> rsend(new Request[static_cast<size_t>(steps) * nseg]);
  auto post_recvs = [&](int s) {
    const int b = patterns::rs_recv_block(r, n, s);
    const size_t base = block(a.count, n, b).off;
    for (int k = 0; k < nseg; ++k) {
      Range g = seg(b, k);
      c.irecv(rrecv[(s % 2) * nseg + k], prev, tag(s, k), tmp[s % 2] + (g.off - base) * es,
              g.len * es);
    }
  };
  post_recvs(0);
  {
    const int b = patterns::rs_send_block(r, n, 0);
    for (int k = 0; k < nseg; ++k) {
      Range g = seg(b, k);
      c.isend(rsend[k], next, tag(0, k), in + g.off * es, g.len * es);
    }
  }
  for (int s = 0; s < steps; ++s) {
    if (s + 1 < steps) post_recvs(s + 1);
    const int b = patterns::rs_recv_block(r, n, s);
    const size_t base = block(a.count, n, b).off;
    for (int k = 0; k < nseg; ++k) {
      Range g = seg(b, k);
      c.wait(rrecv[(s % 2) * nseg + k]);
      kernels::reduce(a.dt, a.op, out + g.off * es, in + g.off * es,
                      tmp[s % 2] + (g.off - base) * es, g.len);
      if (s + 1 < steps) {
        c.isend(rsend[static_cast<size_t>(s + 1) * nseg + k], next, tag(s + 1, k), out + g.off * es,
                g.len * es);
      }
    }
  }
  {
    std::unique_ptr<Request*[]> all(new Request*[static_cast<size_t>(steps) * nseg]);
    for (size_t i = 0; i < static_cast<size_t>(steps) * nseg; ++i) all[i] = &rsend[i];
    c.wait_all(all.get(), static_cast<size_t>(steps) * nseg);
  }

  // ---- allgather: every receive lands in its final place ----
  const int ag0 = steps;  // tag base, after the reduce-scatter's
  std::unique_ptr<Request[]> arecv(new Request[static_cast<size_t>(steps) * nseg]);
  std::unique_ptr<Request[]> asend(new Request[static_cast<size_t>(steps) * nseg]);
  for (int s = 0; s < steps; ++s) {
    const int b = patterns::ag_recv_block(r, n, s);
    for (int k = 0; k < nseg; ++k) {
      Range g = seg(b, k);
      c.irecv(arecv[static_cast<size_t>(s) * nseg + k], prev, tag(ag0 + s, k), out + g.off * es,
              g.len * es);
    }
  }
  {
    const int b = patterns::ag_send_block(r, n, 0);
    for (int k = 0; k < nseg; ++k) {
      Range g = seg(b, k);
      c.isend(asend[k], next, tag(ag0, k), out + g.off * es, g.len * es);
    }
  }
  for (int s = 0; s < steps; ++s) {
    const int b = patterns::ag_recv_block(r, n, s);
    for (int k = 0; k < nseg; ++k) {
      c.wait(arecv[static_cast<size_t>(s) * nseg + k]);
      if (s + 1 < steps) {
        Range g = seg(b, k);
        c.isend(asend[static_cast<size_t>(s + 1) * nseg + k], next, tag(ag0 + s + 1, k),
                out + g.off * es, g.len * es);
      }
    }
  }
  std::unique_ptr<Request*[]> all(new Request*[static_cast<size_t>(steps) * nseg]);
  for (size_t i = 0; i < static_cast<size_t>(steps) * nseg; ++i) all[i] = &asend[i];
  c.wait_all(all.get(), static_cast<size_t>(steps) * nseg);
}

}  // namespace shoal::coll
