// broadcast_shared_cma.cc — broadcast for ranks that share a host, with one
// copy: the root publishes the address of its buffer in the arena
// (HostArena::publish), every other rank copies it straight out of the
// root's memory (process_vm_readv, HostArena::read), and the root returns
// once all of them have. Needs the arena's single-copy reads
// (Ctx::arena()->reads()).
//
// Cost (p ranks, n bytes, c = copy per byte, s = a system call): 2 arrivals
// + s + n c, the copies in parallel; against broadcast_shared's 1 arrival +
// 2 n c (docs/algorithms.md gives the range where it is ahead).
#include "collectives/algorithms.h"
#include "collectives/arena/shared_rounds.h"

namespace shoal::coll {

void broadcast_shared_cma(Ctx& c, const Args& a) {
  const int n = c.size(), me = c.rank();
  if (n == 1) return;
  auto& arena = reading_arena_of(c, Coll::kBroadcast);
  c.begin_round();
  if (me == a.root) arena.publish(a.recv);
  arena.arrive(1);
  if (me == a.root) {
    arena.wait_all(2, c.lazy_deadline());
    return;
  }
  // Every peer's phase 1, not just the root's: a rank that has seen all of
  // them enter this round knows they left the previous one, whose line it
  // overwrites when it begins the next (host_arena.h, double buffering).
  arena.wait_all(1, c.lazy_deadline());
  arena.read(a.root, a.recv, a.count * a.elem());
  arena.arrive(2);
}

}  // namespace shoal::coll
