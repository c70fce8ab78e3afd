// allreduce_rabenseifner.cc — Rabenseifner's allreduce: reduce-scatter by
// recursive halving, then allgather by recursive doubling; any world size.
//
// Ranks first fold onto p2 = the largest power of two <= p, as in
// recursive doubling (patterns/recursive.h): the odd rank of each of the
// first p - p2 pairs sends its vector to the even one and sits out. The
// vector is cut into p2 blocks. In the reduce-scatter, at step k each rank
// swaps half of its current window of blocks with the rank at distance
// p2 / 2^(k+1) and reduces the half it keeps, so the data exchanged halves at
// every step and new rank v ends with block v fully reduced. The allgather
// retraces the steps in reverse, doubling the data each time, and receives
// straight into recv. Last, the even ranks of the pairs send the result to
// their odd partners.
//
// Every block is reduced by exactly one rank, so all ranks end with bitwise
// the same result.
//
// Cost (p ranks, n bytes, L = floor(log2 p)):
//   power of two:  2 L alpha + 2 (p-1)/p n beta + (p-1)/p n gamma
//   otherwise:     add 2 alpha + 2 n beta + n gamma for the fold and unfold.
// Latency of recursive doubling's order with ring's bandwidth: chosen for
// medium messages (see select.cc). Not segmented: each step's message is a
// single transfer and the next step needs all of it.
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/patterns/partition.h"
#include "collectives/patterns/recursive.h"
#include "kernels/reduce.h"

namespace shoal::coll {

using patterns::BlockSpan;
using patterns::Range;

void allreduce_rabenseifner(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t es = a.elem();
  const size_t bytes = a.count * es;
  char* out = static_cast<char*>(a.recv);
  const char* in = static_cast<const char*>(a.send);
  if (n == 1) {
    if (!a.in_place()) std::memcpy(out, in, bytes);
    return;
  }
  const patterns::Fold f = patterns::make_fold(n);
  const int p2 = f.p2;
  const int steps = patterns::log2_floor(p2);
  // Step numbers: 0 fold, 1..steps reduce-scatter, steps+1..2*steps
  // allgather, 2*steps + 1 unfold.
  const uint32_t kFold = 0, kUnfold = 2 * static_cast<uint32_t>(steps) + 1;

  if (patterns::fold_sits_out(r, f)) {
    const int partner = patterns::fold_partner(r, f);
    c.send(partner, kFold, in, bytes);
    c.recv(partner, kUnfold, out, bytes);
    return;
  }

  char* tmp = static_cast<char*>(c.scratch(bytes, 0));
  const char* cur = in;  // where this rank's partial result lives so far
  const int partner = patterns::fold_partner(r, f);
  if (partner >= 0) {
    c.recv(partner, kFold, tmp, bytes);
    kernels::reduce(a.dt, a.op, out, in, tmp, a.count);
    cur = out;
  }

  const int nr = patterns::fold_new_rank(r, f);
  auto elems = [&](BlockSpan s) { return patterns::span_elems(a.count, p2, s); };

  // ---- reduce-scatter by recursive halving ----
  // Only the kept half is written to `out`; later steps read only inside
  // it, so a rank that started from `send` needs no copy.
  for (int k = 0; k < steps; ++k) {
    const int peer = patterns::fold_old_rank(patterns::halving_partner(nr, p2, k), f);
    const Range keep = elems(patterns::halving_keep(nr, p2, k));
    const Range give = elems(patterns::halving_send(nr, p2, k));
    c.sendrecv(peer, cur + give.off * es, give.len * es, peer, tmp, keep.len * es,
               static_cast<uint32_t>(k) + 1);
    char* dst = out + keep.off * es;
    const char* mine = cur + keep.off * es;
    if (r < peer) {
      kernels::reduce(a.dt, a.op, dst, mine, tmp, keep.len);
    } else {
      kernels::reduce(a.dt, a.op, dst, tmp, mine, keep.len);
    }
    cur = out;
  }

  // ---- allgather by recursive doubling, straight into out ----
  for (int j = 0; j < steps; ++j) {
    const int peer = patterns::fold_old_rank(patterns::doubling_partner(nr, j), f);
    const Range have = elems(patterns::doubling_have(nr, j));
    const Range get = elems(patterns::doubling_get(nr, j));
    c.sendrecv(peer, out + have.off * es, have.len * es, peer, out + get.off * es, get.len * es,
               static_cast<uint32_t>(steps + j) + 1);
  }

  if (partner >= 0) c.send(partner, kUnfold, out, bytes);
}

}  // namespace shoal::coll
