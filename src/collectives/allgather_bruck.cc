// allgather_bruck.cc — Bruck's allgather: ceil(log2 p) steps for any p.
//
// Works in a buffer W of p blocks where W[j] holds the block of rank
// (rank + j) mod p; it starts with W[0] = own block. At step k, with
// d = 2^k, a rank sends W[0, m) to rank - d and receives W[d, d + m) from
// rank + d, where m = min(d, p - d): afterwards W[0, min(2d, p)) is filled.
// A final rotation moves W[j] to recv block (rank + j) mod p. Rank 0 needs no
// rotation and works in recv directly; the others use scratch.
//
// Cost (p ranks, n = p*count*elem bytes of output):
// ceil(log2 p) alpha + (p-1)/p n beta, plus a local copy of n bytes.
// Latency-optimal; chosen for small messages on p > 2 when p is not a power
// of two (recursive doubling otherwise; see select.cc).
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/patterns/ring.h"

namespace shoal::coll {

void allgather_bruck(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t es = a.elem(), bb = a.count * es;  // block bytes
  char* out = static_cast<char*>(a.recv);
  char* own = a.own_block(r);
  const char* mine = a.allgather_input(r);
  if (n == 1) {
    if (mine != own) std::memcpy(own, mine, bb);
    return;
  }

  const size_t total = static_cast<size_t>(n) * bb;
  char* w = r == 0 ? out : static_cast<char*>(c.scratch(total, 0));
  if (mine != w) std::memcpy(w, mine, bb);
  uint32_t step = 0;
  for (int d = 1; d < n; d <<= 1, ++step) {
    const int m = d < n - d ? d : n - d;
    const int to = patterns::mod(r - d, n), from = patterns::mod(r + d, n);
    c.sendrecv(to, w, m * bb, from, w + d * bb, m * bb, step);
  }
  if (w != out) {
    // W[j] -> recv block (r + j) mod n: W[0, n-r) to blocks [r, n), W[n-r, n) to [0, r).
    std::memcpy(out + r * bb, w, (n - r) * bb);
    std::memcpy(out, w + (n - r) * bb, r * bb);
  }
}

}  // namespace shoal::coll
