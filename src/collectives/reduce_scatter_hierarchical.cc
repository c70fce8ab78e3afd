// reduce_scatter_hierarchical.cc — two-level reduce-scatter for several ranks
// per host (allgather_hierarchical.cc run backwards).
//
//   1. Inside each host: for every host h, the local ranks reduce-scatter
//      h's row of blocks over shared memory (direct_phases.h: each pulls its
//      block from all local peers and reduces it), so that local rank j
//      holds block (h, j) reduced over its host, for every h.
//   2. Across hosts: the ranks with the same local index j reduce-scatter
//      those H partial blocks directly: each receives its own block's
//      partial sums from the other hosts and reduces them into recv.
//      Each partial sum leaves as soon as it is reduced, and the host's own
//      row is reduced last, while they are on the network.
//
// Cost (H hosts of L ranks, N bytes of input, blocks of N/(HL)):
//   H a + (L-1)/L N (b + gamma)                          (step 1)
//   A + (H-1)/(HL) N (B + gamma)                         (step 2)
// against the flat ring's (HL-1) A + (HL-1)/(HL) N (B + gamma): a host puts
// (H-1)/H N on the network instead of (HL-1)/(HL) N, on L connections.
// Chosen above 512 KiB of input when ranks span several hosts with the same
// number of ranks each, some host has more than one (select.cc); otherwise
// the flat ring.
#include <memory>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/direct_phases.h"
#include "collectives/patterns/hierarchy.h"
#include "kernels/reduce.h"

namespace shoal::coll {

void reduce_scatter_hierarchical(Ctx& c, const Args& a) {
  const Topology& t = c.topology();
  if (!patterns::two_level(t, c.size())) {
    reduce_scatter_ring(c, a);
    return;
  }
  const int me = c.rank();
  const size_t es = a.elem(), bb = a.count * es;
  const char* in = static_cast<const char*>(a.send);
  const patterns::Place pl = patterns::place_of(t, me);
  const int host = pl.host, j = pl.index;
  const std::vector<int>&local = pl.local, &across = pl.across;
  const int H = t.nhosts(), L = static_cast<int>(local.size());
  std::vector<size_t> counts(static_cast<size_t>(H > L ? H : L), a.count);

  std::vector<size_t> row(static_cast<size_t>(L));
  auto set_row = [&](int h) {
    const std::vector<int>& ranks = t.hosts[static_cast<size_t>(h)];
    for (int q = 0; q < L; ++q) row[static_cast<size_t>(q)] = static_cast<size_t>(ranks[static_cast<size_t>(q)]) * a.count;
  };
  RingGroup lg{local.data(), L, j};
  const uint32_t per_row = direct_steps(c, lg, a, counts.data());
  const uint32_t across_step = static_cast<uint32_t>(H) * per_row;  // after every row's steps
  // Scratch slot 0 is direct_reduce_scatter's own: 1 holds what arrives
  // from the other hosts, 2 the partial sums sent to them.
  char* inbox = static_cast<char*>(c.scratch(static_cast<size_t>(H - 1) * bb, 1));
  char* partial = static_cast<char*>(c.scratch(static_cast<size_t>(H - 1) * bb, 2));
  std::unique_ptr<Request[]> got(new Request[static_cast<size_t>(H - 1)]);
  std::unique_ptr<Request[]> sent(new Request[static_cast<size_t>(H - 1)]);
  for (int d = 1; d < H; ++d) {
    const int from = (host + d) % H;
    c.irecv(got[static_cast<size_t>(d - 1)], across[static_cast<size_t>(from)], across_step,
            inbox + static_cast<size_t>(d - 1) * bb, bb);
  }
  // 1. Inside the host, the other hosts' rows first, each partial sum sent
  // across as soon as it is done; then this host's own row, straight into
  // recv, while those cross the network.
  uint32_t step = 0;
  for (int d = 1; d < H; ++d, step += per_row) {
    const int h = (host - d + H) % H;
    char* p = partial + static_cast<size_t>(d - 1) * bb;
    set_row(h);
    direct_reduce_scatter(c, lg, a, in, counts.data(), row.data(), p, step);
    c.isend(sent[static_cast<size_t>(d - 1)], across[static_cast<size_t>(h)], across_step, p, bb);
  }
  char* out = static_cast<char*>(a.recv);
  set_row(host);
  direct_reduce_scatter(c, lg, a, in, counts.data(), row.data(), out, step);
  // 2. This rank's block: the other hosts' partial sums, in a fixed order.
  for (int d = 1; d < H; ++d) {
    c.wait(got[static_cast<size_t>(d - 1)]);
    kernels::reduce_unchecked(a.dt, a.op, out, out, inbox + static_cast<size_t>(d - 1) * bb, a.count);
  }
  for (int d = 1; d < H; ++d) c.wait(sent[static_cast<size_t>(d - 1)]);
}

}  // namespace shoal::coll
