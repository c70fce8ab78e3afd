// allreduce_hierarchical.cc — two-level allreduce for several ranks per host
// (the structure of SageMaker's data-parallel library: every host's ranks
// serve an equal shard, and each byte crosses the network twice).
//
//   1. Inside each host (shared memory): ring reduce-scatter over the L local
//      ranks; local rank j then holds shard j, reduced over its host.
//   2. Across hosts: the ranks with the same local index j (one per host)
//      allreduce shard j among themselves (ring reduce-scatter + allgather).
//      Every host sends and receives the same number of bytes, and all L
//      shards cross the network at once, on L connections per host.
//   3. Inside each host: ring allgather of the shards.
//
// Cost (H hosts of L ranks, n bytes; a/b for shared memory, A/B network):
//   2(L-1) a + 2 (L-1)/L n b                          (steps 1 and 3)
//   2(H-1) A + 2 (H-1)/H (n/L) B + reduction          (step 2)
// against the flat ring's 2(HL-1) A + 2 (HL-1)/(HL) n B when the ring's
// hops between hosts set its pace: the network carries n/L per rank instead
// of n, and takes 2(H-1) latencies instead of 2(HL-1).
// Chosen for messages above 256 KiB when ranks span several hosts with the
// same number of ranks each (select.cc); with one host, or one rank per host,
// it is the flat ring.
#include <cstring>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/patterns/partition.h"
#include "collectives/patterns/ring.h"
#include "collectives/ring_phases.h"

namespace shoal::coll {

void allreduce_hierarchical(Ctx& c, const Args& a) {
  const Topology& t = c.topology();
  char* out = static_cast<char*>(a.recv);
  const char* in = static_cast<const char*>(a.send);
  if (!t.uniform() || t.host_of.size() != static_cast<size_t>(c.size())) {
    allreduce_ring(c, a);  // uneven hosts: the flat ring
    return;
  }
  if (c.size() == 1) {
    if (!a.in_place()) std::memcpy(out, in, a.count * a.elem());
    return;
  }
  const int me = c.rank();
  const int host = t.host_of[static_cast<size_t>(me)];
  const int j = t.local_index[static_cast<size_t>(me)];
  const std::vector<int>& local = t.hosts[static_cast<size_t>(host)];
  const int L = static_cast<int>(local.size());
  const std::vector<int> across = patterns::peers_across_hosts(t, j);
  const int H = static_cast<int>(across.size());

  RingGroup lg{local.data(), L, j};
  RingGroup xg{across.data(), H, host};
  // 1. Reduce-scatter inside the host: this rank owns shard `mine`.
  uint32_t step = 0;
  if (L > 1) {
    ring_reduce_scatter(c, lg, a, out, in, a.count, step);
    step += ring_steps(c, lg, a.count, a.elem());
  } else if (!a.in_place()) {
    std::memcpy(out, in, a.count * a.elem());
  }
  const patterns::Range shard = patterns::block(a.count, L, patterns::rs_owned_block(j, L));
  char* sp = out + shard.off * a.elem();
  // 2. Allreduce of the shard across hosts (in place in `out`).
  step += ring_allreduce(c, xg, a, sp, sp, shard.len, step);
  // 3. Allgather inside the host.
  ring_allgather(c, lg, a, out, a.count, step);
}

}  // namespace shoal::coll
