// collectives/shared_rounds.cc — see shared_rounds.h.
#include "collectives/shared_rounds.h"
#include "common/copy.h"

#include <cstring>
#include <string>
#include <vector>

#include "common/copy.h"
#include "kernels/reduce.h"
#include "shoal/error.h"

namespace shoal::coll {

transport::shm::HostArena& arena_of(Ctx& c, Coll coll) {
  if (auto* a = c.arena()) return *a;
  throw InvalidArgument(std::string(coll_name(coll)) +
                        ": algorithm 'shared' needs every rank of the communicator on one host with shared "
                        "memory on (SHOAL_SHM not 0, SHOAL_SHM_ARENA_BYTES not 0)");
}

void reduce_all(const Args& a, char* dst, const char* const* srcs, int n, size_t len) {
  if (n == 1) {
    if (dst != srcs[0]) copy(dst, srcs[0], len * a.elem());
    return;
  }
  kernels::reduce(a.dt, a.op, dst, srcs[0], srcs[1], len);
  for (int q = 2; q < n; ++q) kernels::reduce_inplace(a.dt, a.op, dst, srcs[q], len);
}

patterns::Range reduce_own_slice(Ctx& c, const Args& a, size_t len) {
  auto& arena = *c.arena();
  const int n = c.size(), me = c.rank();
  const size_t es = a.elem();
  const patterns::Range mine = patterns::block(len, n, me);
  std::vector<const char*> slice(static_cast<size_t>(n));
  char* own = arena.slot(me) + mine.off * es;
  slice[0] = own;
  for (int q = 0, k = 1; q < n; ++q) {
    if (q != me) slice[static_cast<size_t>(k++)] = arena.slot(q) + mine.off * es;
  }
  reduce_all(a, own, slice.data(), n, mine.len);
  return mine;
}

void copy_reduced_slices(Ctx& c, const Args& a, size_t len, char* dst) {
  auto& arena = *c.arena();
  const size_t es = a.elem();
  for (int q = 0; q < c.size(); ++q) {
    const patterns::Range b = patterns::block(len, c.size(), q);
    copy(dst + b.off * es, arena.slot(q) + b.off * es, b.len * es);
  }
}

size_t slot_elems(const transport::shm::HostArena& arena, size_t es, size_t parts) {
  const size_t n = arena.slot_bytes() / (es * parts);
  return n ? n : 1;
}

}  // namespace shoal::coll
