// allreduce_recursive_doubling.cc — recursive-doubling allreduce, any world
// size.
//
// With p2 the largest power of two <= p, the ranks first fold onto p2 ranks
// (patterns/recursive.h): in each of the first p - p2 pairs (0,1), (2,3), ...
// the odd rank sends its whole vector to the even one, which reduces it and
// takes part for both. Then, in log2(p2) steps, every remaining rank swaps
// its whole partial result with the rank at distance 1, 2, 4, ... and both
// reduce the two vectors, so after the last step all of them hold the full
// result. Finally each even rank of a pair sends the result to its odd
// partner.
//
// Both partners of a step reduce the same two vectors in the same order
// (the lower rank's as the left operand), so every rank ends with bitwise
// the same result, floats included.
//
// Cost (p ranks, n bytes, L = floor(log2 p)):
//   power of two:  L alpha + L n beta + L n gamma
//   otherwise:     (L + 2) alpha + (L + 2) n beta + (L + 1) n gamma
// Latency-optimal but moves the whole vector at every step: chosen for small
// messages (see select.cc). Not segmented: in that regime one message per
// step is cheapest.
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/patterns/recursive.h"
#include "kernels/reduce.h"

namespace shoal::coll {

void allreduce_recursive_doubling(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t bytes = a.count * a.elem();
  char* out = static_cast<char*>(a.recv);
  const char* in = static_cast<const char*>(a.send);
  if (n == 1) {
    if (!a.in_place()) std::memcpy(out, in, bytes);
    return;
  }
  const patterns::Fold f = patterns::make_fold(n);
  const int steps = patterns::log2_floor(f.p2);
  // Step numbers: 0 fold, 1..steps exchanges, steps + 1 unfold.
  const uint32_t kFold = 0, kUnfold = static_cast<uint32_t>(steps) + 1;

  if (patterns::fold_sits_out(r, f)) {
    const int partner = patterns::fold_partner(r, f);
    c.send(partner, kFold, in, bytes);  // the partner's receive is posted first thing
    c.recv(partner, kUnfold, out, bytes);
    return;
  }

  char* tmp = static_cast<char*>(c.scratch(bytes, 0));
  const char* cur = in;  // this rank's partial result so far
  const int partner = patterns::fold_partner(r, f);
  if (partner >= 0) {  // even rank of a pair: take in the odd rank's vector
    c.recv(partner, kFold, tmp, bytes);
    kernels::reduce(a.dt, a.op, out, in, tmp, a.count);
    cur = out;
  }

  const int nr = patterns::fold_new_rank(r, f);
  for (int k = 0; k < steps; ++k) {
    const int peer = patterns::fold_old_rank(patterns::doubling_partner(nr, k), f);
    c.sendrecv(peer, cur, bytes, peer, tmp, bytes, static_cast<uint32_t>(k) + 1);
    if (r < peer) {
      kernels::reduce(a.dt, a.op, out, cur, tmp, a.count);
    } else {
      kernels::reduce(a.dt, a.op, out, tmp, cur, a.count);
    }
    cur = out;
  }

  if (partner >= 0) c.send(partner, kUnfold, out, bytes);
}

}  // namespace shoal::coll
