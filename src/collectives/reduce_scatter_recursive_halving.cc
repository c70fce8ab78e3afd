// reduce_scatter_recursive_halving.cc — recursive halving reduce-scatter for
// a power-of-two number of ranks, nearest partners first.
//
// send holds p blocks of count elements; rank r ends with block r reduced
// over all ranks, in recv. At step k (d = 2^k) rank r holds partial sums of
// the blocks b with b = r (mod d), p/d of them, kept contiguous in the order
// of b ("compact" list: entry i is block (r mod d) + d i). It exchanges with
// rank r ^ d: it sends the entries whose block differs from r in bit k (the
// odd or even entries of the list, packed), receives the partner's sums of
// the other half and reduces them into its own, compacting as it goes. After
// log2 p steps the list is block r alone.
//
// Partners at distance 1, 2, 4, ... rather than the textbook p/2 first: when
// each host's ranks are numbered contiguously (a power of two per host), the
// first and biggest exchanges (half the vector) stay inside the host and the
// network carries only the last log2(H), each a fraction of the vector. The
// price is a packing copy of what is sent, which for the small vectors this
// is chosen for costs less than a step.
//
// Cost (p = 2^L ranks, N = p count elem bytes):
// L alpha + (p-1)/p N beta + (p-1)/p N gamma + (p-1)/p N of packing.
// Not a power of two: the ring (reduce_scatter_ring.cc).
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/patterns/recursive.h"
#include "kernels/reduce.h"

namespace shoal::coll {

void reduce_scatter_recursive_halving(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  if (!patterns::is_pow2(n)) {
    reduce_scatter_ring(c, a);
    return;
  }
  const size_t bb = a.count * a.elem();  // block bytes
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  if (n == 1) {
    if (out != in) std::memcpy(out, in, bb);
    return;
  }
  const size_t half = static_cast<size_t>(n / 2) * bb;
  char* acc = static_cast<char*>(c.scratch(half, 0));
  char* sbuf = static_cast<char*>(c.scratch(half, 1));
  char* rbuf = static_cast<char*>(c.scratch(half, 2));
  const char* cur = in;  // the compact list: the input itself before step 0
  uint32_t step = 0;
  for (int d = 1, m = n; d < n; d <<= 1, m >>= 1, ++step) {
    const int partner = r ^ d;
    const int keep = (r / d) & 1;  // entries 2j + keep stay, 2j + (1 - keep) go
    const int kept = m / 2;
    for (int j = 0; j < kept; ++j) {
      std::memcpy(sbuf + static_cast<size_t>(j) * bb,
                  cur + static_cast<size_t>(2 * j + 1 - keep) * bb, bb);
    }
    const size_t bytes = static_cast<size_t>(kept) * bb;
    c.sendrecv(partner, sbuf, bytes, partner, rbuf, bytes, step);
    // The last step writes block r to recv; the others compact into acc (in
    // place after step 0: entry j is written at or before entry 2j + keep
    // is read, and nothing later reads below it).
    char* dst = kept == 1 ? out : acc;
    for (int j = 0; j < kept; ++j) {
      char* o = dst + static_cast<size_t>(j) * bb;
      const char* mine = cur + static_cast<size_t>(2 * j + keep) * bb;
      const char* theirs = rbuf + static_cast<size_t>(j) * bb;
      // Lower rank's operand first, as every algorithm here does.
      if (r < partner) {
        kernels::reduce_unchecked(a.dt, a.op, o, mine, theirs, a.count);
      } else {
        kernels::reduce_unchecked(a.dt, a.op, o, theirs, mine, a.count);
      }
    }
    cur = acc;
  }
}

}  // namespace shoal::coll
