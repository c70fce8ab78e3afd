// alltoallv_pairwise.cc — pairwise-exchange alltoall with per-peer sizes.
//
// Rank j gets send_counts[j] elements from send + send_displs[j], and this
// rank receives counts[j] elements from rank j into recv + displs[j] (all in
// elements). The own block is copied locally; then in p-1 steps a rank sends
// to rank+s and receives from rank-s (mod p) with one sendrecv each. Empty
// blocks are still exchanged (a header only): a count that disagrees with the
// peer's then fails at once as a size mismatch instead of hanging.
//
// In place (send == recv) the send side is first copied to scratch, since the
// blocks of the two sides need not line up.
//
// Cost (p ranks, largest block m bytes): (p-1) alpha + (p-1) m beta;
// (p-1)/p n beta for equal blocks, n bytes per rank.
// The only alltoallv algorithm (see select.cc).
#include <algorithm>
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/patterns/ring.h"

namespace shoal::coll {

void alltoallv_pairwise(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t es = a.elem();
  char* out = static_cast<char*>(a.recv);
  const char* in = static_cast<const char*>(a.send);
  if (a.in_place()) {
    size_t extent = 0;
    for (int j = 0; j < n; ++j) extent = std::max(extent, a.send_displs[j] + a.send_counts[j]);
    char* copy = static_cast<char*>(c.scratch(extent * es, 0));
    if (extent > 0) std::memcpy(copy, in, extent * es);
    in = copy;
  }
  const size_t own = std::min(a.send_counts[r], a.counts[r]);
  if (own > 0) std::memcpy(out + a.displs[r] * es, in + a.send_displs[r] * es, own * es);
  for (int s = 1; s < n; ++s) {
    const int to = patterns::mod(r + s, n), from = patterns::mod(r - s, n);
    c.sendrecv(to, in + a.send_displs[to] * es, a.send_counts[to] * es, from,
               out + a.displs[from] * es, a.counts[from] * es, static_cast<uint32_t>(s));
  }
}

}  // namespace shoal::coll
