// allgather_ring.cc — ring allgather, segmented and pipelined.
//
// recv holds size*count elements, rank i's contribution at offset i*count.
// Each rank's block travels once around the ring: at step s a rank sends
// block rank-s to its successor and receives block rank-s-1 from its
// predecessor. Every receive lands in its final place, so all of them are
// posted up front; blocks are cut into segments of Tuning::segment_bytes and
// a segment is forwarded as soon as it has arrived, so all p-1 steps of the
// ring are in flight at once instead of advancing in lockstep.
//
// Cost (p ranks, n = p*count*elem bytes of output):
// (p-1) alpha + (p-1)/p n beta (plus S-1 segment times to fill the pipeline).
// Bandwidth-optimal; chosen for large messages and p <= 2 (see select.cc).
#include <algorithm>
#include <cstring>
#include <memory>

#include "collectives/algorithms.h"
#include "collectives/patterns/partition.h"
#include "collectives/patterns/ring.h"

namespace shoal::coll {

void allgather_ring(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t es = a.elem(), bb = a.count * es;  // block bytes
  char* out = static_cast<char*>(a.recv);
  // In place: send == recv (data already at its block) or send == its block.
  if (a.send != a.recv && a.send != out + r * bb) std::memcpy(out + r * bb, a.send, bb);
  if (n == 1) return;

  const int next = patterns::ring_next(r, n), prev = patterns::ring_prev(r, n);
  const size_t seg_elems = std::max<size_t>(1, c.tuning().segment_bytes / es);
  const int nseg = static_cast<int>(patterns::num_segments(a.count, seg_elems));
  const int steps = n - 1;
  const size_t nreq = static_cast<size_t>(steps) * nseg;
  auto seg = [&](int k) { return patterns::block(a.count, nseg, k); };
  auto tag = [&](int s, int k) { return static_cast<uint32_t>(s * nseg + k); };
  auto at = [&](int b, const patterns::Range& g) { return out + b * bb + g.off * es; };

  std::unique_ptr<Request[]> rrecv(new Request[nreq]);
  std::unique_ptr<Request[]> rsend(new Request[nreq]);
  for (int s = 0; s < steps; ++s) {
    const int b = patterns::mod(r - s - 1, n);
    for (int k = 0; k < nseg; ++k) {
      const patterns::Range g = seg(k);
      c.irecv(rrecv[static_cast<size_t>(s) * nseg + k], prev, tag(s, k), at(b, g), g.len * es);
    }
  }
  for (int k = 0; k < nseg; ++k) {
    const patterns::Range g = seg(k);
    c.isend(rsend[k], next, tag(0, k), at(r, g), g.len * es);
  }
  // The block received at step s is the one sent at step s+1.
  for (int s = 0; s < steps; ++s) {
    const int b = patterns::mod(r - s - 1, n);
    for (int k = 0; k < nseg; ++k) {
      c.wait(rrecv[static_cast<size_t>(s) * nseg + k]);
      if (s + 1 < steps) {
        const patterns::Range g = seg(k);
        c.isend(rsend[static_cast<size_t>(s + 1) * nseg + k], next, tag(s + 1, k), at(b, g),
                g.len * es);
      }
    }
  }
  std::unique_ptr<Request*[]> all(new Request*[nreq]);
  for (size_t i = 0; i < nreq; ++i) all[i] = &rsend[i];
  c.wait_all(all.get(), nreq);
}

}  // namespace shoal::coll
