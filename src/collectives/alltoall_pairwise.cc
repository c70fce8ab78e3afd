// alltoall_pairwise.cc — pairwise-exchange alltoall.
//
// send and recv hold p blocks of `count` elements; block j of send goes to
// rank j, block j of recv comes from rank j. The own block is copied locally;
// then in p-1 steps a rank sends to rank+s and receives from rank-s (mod p)
// with one sendrecv each, so every rank sends and receives exactly one block
// per step and no link carries two messages at once.
//
// In place (send == recv): the receive of step s overwrites block rank-s,
// which still has to go out at step p-s. Where that comes later (s <= p-s)
// the block is first saved to scratch and sent from there, so at most
// floor(p/2) blocks are copied.
//
// Cost (p ranks, n = p*count*elem bytes per rank): (p-1) alpha + (p-1)/p n beta.
// The only alltoall algorithm (see select.cc).
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/patterns/ring.h"

namespace shoal::coll {

void alltoall_pairwise(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t bb = a.count * a.elem();  // block bytes
  char* out = static_cast<char*>(a.recv);
  const bool in_place = a.in_place();
  const char* in = static_cast<const char*>(a.send);
  if (!in_place) std::memcpy(out + r * bb, in + r * bb, bb);
  if (n == 1) return;

  // In place: stash slot s-1 holds the original block rank-s, saved at step s.
  char* stash =
      in_place ? static_cast<char*>(c.scratch(static_cast<size_t>(n / 2) * bb, 0)) : nullptr;
  for (int s = 1; s < n; ++s) {
    const int to = patterns::mod(r + s, n), from = patterns::mod(r - s, n);
    const char* sbuf;
    if (in_place) {
      if (s <= n - s) std::memcpy(stash + (s - 1) * bb, out + from * bb, bb);
      // Block `to` is overwritten at step n-s; saved then if that came first.
      sbuf = n - s <= s ? stash + (n - s - 1) * bb : out + to * bb;
    } else {
      sbuf = in + to * bb;
    }
    c.sendrecv(to, sbuf, bb, from, out + from * bb, bb, static_cast<uint32_t>(s));
  }
}

}  // namespace shoal::coll
