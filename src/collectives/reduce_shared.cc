// reduce_shared.cc — reduce for ranks that share a host, directly on the
// communicator's shared segment (shared_rounds.h). As allreduce_shared,
// except that only the root reads the result: a small piece is reduced by
// the root alone; a larger one slice by slice by every rank in parallel,
// and the root copies the reduced slices out.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/patterns/partition.h"
#include "collectives/shared_rounds.h"
#include "common/copy.h"

namespace shoal::coll {

void reduce_shared(Ctx& c, const Args& a) {
  const int n = c.size(), me = c.rank();
  const size_t es = a.elem();
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  const bool root = me == a.root;
  if (n == 1) {
    if (!a.in_place()) copy(out, in, a.count * es);
    return;
  }
  auto& arena = arena_of(c, Coll::kReduce);
  const size_t per_round = slot_elems(arena, es);
  std::vector<const char*> srcs(static_cast<size_t>(n));
  for (size_t off = 0; off < a.count; off += per_round) {
    const size_t len = std::min(per_round, a.count - off);
    c.begin_round();
    for (int q = 0; q < n; ++q) srcs[static_cast<size_t>(q)] = arena.slot(q);
    copy(arena.slot(me), in + off * es, len * es);
    arena.arrive(1);
    arena.wait_all(1, c.deadline());
    if (len * es * static_cast<size_t>(n) <= kSharedOnePhaseBytes) {
      if (root) reduce_all(a, out + off * es, srcs.data(), n, len);
      continue;
    }
    reduce_own_slice(c, a, len);
    arena.arrive(2);
    if (!root) continue;
    arena.wait_all(2, c.deadline());
    copy_reduced_slices(c, a, len, out + off * es);
  }
}

}  // namespace shoal::coll
