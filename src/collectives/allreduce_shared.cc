// allreduce_shared.cc — allreduce for ranks that share a host, directly on
// the communicator's shared segment (shared_rounds.h).
//
// Per round (a piece of at most one slot): every rank copies its piece into
// its slot and announces it (phase 1). A small piece is then reduced whole
// by every rank, reading all slots in rank order: one arrival per rank and
// bitwise identical results. A larger one is cut into p slices and each rank
// reduces its own slice in place in its slot, in parallel with the others,
// announces it (phase 2), and copies every reduced slice out.
//
// Cost (p ranks, n bytes, c = copy per byte): small: 1 arrival + n c +
// (p-1) n gamma; large: 2 arrivals + (2 - 1/p) n c + (p-1)/p n gamma.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/patterns/partition.h"
#include "collectives/shared_rounds.h"
#include "common/copy.h"

namespace shoal::coll {

void allreduce_shared(Ctx& c, const Args& a) {
  const int n = c.size(), me = c.rank();
  const size_t es = a.elem();
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  if (n == 1) {
    if (!a.in_place()) copy(out, in, a.count * es);
    return;
  }
  auto& arena = arena_of(c, Coll::kAllreduce);
  const size_t per_round = slot_elems(arena, es);
  std::vector<const char*> srcs(static_cast<size_t>(n));
  for (size_t off = 0; off < a.count; off += per_round) {
    const size_t len = std::min(per_round, a.count - off);
    c.begin_round();
    for (int q = 0; q < n; ++q) srcs[static_cast<size_t>(q)] = arena.slot(q);
    copy(arena.slot(me), in + off * es, len * es);
    arena.arrive(1);
    arena.wait_all(1, c.deadline());
    char* dst = out + off * es;
    if (len * es * static_cast<size_t>(n) <= kSharedOnePhaseBytes) {
      reduce_all(a, dst, srcs.data(), n, len);
      continue;
    }
    reduce_own_slice(c, a, len);
    arena.arrive(2);
    arena.wait_all(2, c.deadline());
    copy_reduced_slices(c, a, len, dst);
  }
}

}  // namespace shoal::coll
