// broadcast_chain.cc — pipelined chain broadcast: root -> root+1 -> ... ->
// root-1, in segments of Tuning::segment_bytes.
//
// Every rank but the root posts the receives of all segments from its
// predecessor at once, and forwards segment k to its successor as soon as it
// has arrived, while segment k+1 is still coming in. Once the pipeline is
// full every link carries a different segment at the same time.
//
// Cost (p ranks, n bytes, S = ceil(n / segment_bytes) segments):
// (p + S - 2)(alpha + n/S beta), i.e. about n beta for S >> p.
// Bandwidth-optimal; chosen for very large messages (see select.cc), where the
// p-1 segment times of filling the pipeline are small against n beta.
#include <algorithm>
#include <cstring>
#include <memory>

#include "collectives/algorithms.h"
#include "collectives/patterns/partition.h"
#include "collectives/patterns/ring.h"
#include "collectives/patterns/tree.h"

namespace shoal::coll {

void broadcast_chain(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t es = a.elem();
  char* buf = static_cast<char*>(a.recv);
  if (r == a.root && a.send && a.send != a.recv) std::memcpy(buf, a.send, a.count * es);
  if (n == 1) return;

  const int rel = patterns::to_relative(r, a.root, n);
  const bool has_prev = rel != 0, has_next = rel != n - 1;
  const int prev = patterns::ring_prev(r, n), next = patterns::ring_next(r, n);
  const size_t seg_elems = std::max<size_t>(1, c.tuning().segment_bytes / es);
  const int nseg = static_cast<int>(patterns::num_segments(a.count, seg_elems));
  auto seg = [&](int k) { return patterns::block(a.count, nseg, k); };

  std::unique_ptr<Request[]> rrecv(new Request[has_prev ? nseg : 0]);
  std::unique_ptr<Request[]> rsend(new Request[has_next ? nseg : 0]);
  if (has_prev) {
    for (int k = 0; k < nseg; ++k) {
      const patterns::Range g = seg(k);
      c.irecv(rrecv[k], prev, static_cast<uint32_t>(k), buf + g.off * es, g.len * es);
    }
  }
  for (int k = 0; k < nseg; ++k) {
    if (has_prev) c.wait(rrecv[k]);
    if (has_next) {
      const patterns::Range g = seg(k);
      c.isend(rsend[k], next, static_cast<uint32_t>(k), buf + g.off * es, g.len * es);
    }
  }
  if (has_next) {
    std::unique_ptr<Request*[]> all(new Request*[nseg]);
    for (int k = 0; k < nseg; ++k) all[k] = &rsend[k];
    c.wait_all(all.get(), static_cast<size_t>(nseg));
  }
}

}  // namespace shoal::coll
