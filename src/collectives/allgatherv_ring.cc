// allgatherv_ring.cc — ring allgather of blocks of different sizes,
// segmented and pipelined.
//
// Rank i contributes counts[i] elements, placed at recv + displs[i] (in
// elements); send holds counts[rank] elements. As in allgather_ring, at step s
// a rank sends block rank-s to its successor and receives block rank-s-1
// from its predecessor, every receive is posted up front into its final
// place, and each segment (Tuning::segment_bytes) is forwarded as soon as it
// has arrived. Empty blocks are never sent: every rank knows every count.
//
// Cost (p ranks, n = sum of counts * elem bytes, largest block m bytes):
// (p-1) alpha + (p-1) m beta; (p-1)/p n beta when the blocks are equal.
// The only allgatherv algorithm (see select.cc).
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/patterns/partition.h"
#include "collectives/patterns/ring.h"

namespace shoal::coll {

void allgatherv_ring(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t es = a.elem();
  char* out = static_cast<char*>(a.recv);
  char* own = out + a.displs[r] * es;
  // In place: send == recv (data already at its block) or send == its block.
  if (a.send != a.recv && a.send != own && a.counts[r] > 0) {
    std::memcpy(own, a.send, a.counts[r] * es);
  }
  if (n == 1) return;

  const int next = patterns::ring_next(r, n), prev = patterns::ring_prev(r, n);
  const size_t seg_elems = std::max<size_t>(1, c.tuning().segment_bytes / es);
  size_t max_count = 0;
  for (int i = 0; i < n; ++i) max_count = std::max(max_count, a.counts[i]);
  if (max_count == 0) return;
  const int max_seg = static_cast<int>(patterns::num_segments(max_count, seg_elems));
  auto nseg = [&](int b) {
    return a.counts[b] == 0 ? 0 : static_cast<int>(patterns::num_segments(a.counts[b], seg_elems));
  };
  auto seg = [&](int b, int k) { return patterns::block(a.counts[b], nseg(b), k); };
  auto tag = [&](int s, int k) { return static_cast<uint32_t>(s * max_seg + k); };
  auto at = [&](int b, const patterns::Range& g) { return out + (a.displs[b] + g.off) * es; };

  const int steps = n - 1;
  const size_t nreq = static_cast<size_t>(steps) * max_seg;
  std::unique_ptr<Request[]> rrecv(new Request[nreq]);
  std::unique_ptr<Request[]> rsend(new Request[nreq]);
  std::vector<Request*> sends;
  sends.reserve(nreq);
  for (int s = 0; s < steps; ++s) {
    const int b = patterns::mod(r - s - 1, n);
    for (int k = 0; k < nseg(b); ++k) {
      const patterns::Range g = seg(b, k);
      c.irecv(rrecv[static_cast<size_t>(s) * max_seg + k], prev, tag(s, k), at(b, g), g.len * es);
    }
  }
  for (int k = 0; k < nseg(r); ++k) {
    const patterns::Range g = seg(r, k);
    c.isend(rsend[k], next, tag(0, k), at(r, g), g.len * es);
    sends.push_back(&rsend[k]);
  }
  // The block received at step s is the one sent at step s+1.
  for (int s = 0; s < steps; ++s) {
    const int b = patterns::mod(r - s - 1, n);
    for (int k = 0; k < nseg(b); ++k) {
      c.wait(rrecv[static_cast<size_t>(s) * max_seg + k]);
      if (s + 1 < steps) {
        const patterns::Range g = seg(b, k);
        Request& q = rsend[static_cast<size_t>(s + 1) * max_seg + k];
        c.isend(q, next, tag(s + 1, k), at(b, g), g.len * es);
        sends.push_back(&q);
      }
    }
  }
  if (!sends.empty()) c.wait_all(sends.data(), sends.size());
}

}  // namespace shoal::coll
