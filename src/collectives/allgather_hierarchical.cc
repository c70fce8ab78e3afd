// allgather_hierarchical.cc — two-level allgather for several ranks per host
// (the structure of allreduce_hierarchical.cc, for an allgather).
//
//   1. Across hosts: the ranks with the same local index j (one per host)
//      exchange their blocks directly, each receiving the others' straight
//      into place. Every byte crosses the network once per receiving host,
//      spread evenly over the L ranks (and connections) of each host.
//   2. Inside each host: for every host h, the local ranks exchange the
//      blocks of h's ranks they now hold (local rank j holds block (h, j)),
//      over shared memory, one copy out of the holder's output. The host's
//      own row goes while step 1 is on the network, every other row as soon
//      as its block has landed.
//
// Cost (H hosts of L ranks, N bytes of output, blocks of N/(HL); a/b shared
// memory, A/B network):
//   A + (H-1)/(HL) N B                                   (step 1)
//   H a + (L-1)/L N b                                    (step 2)
// against the flat ring's (HL-1) A + (HL-1)/(HL) N B through its slowest
// link: a host takes in (H-1)/H N from the network instead of (HL-1)/(HL) N,
// on L connections instead of one.
// Chosen above 64 KiB of output when ranks span several hosts with the same
// number of ranks each, some host has more than one (select.cc); otherwise
// the flat ring.
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/patterns/hierarchy.h"

namespace shoal::coll {

void allgather_hierarchical(Ctx& c, const Args& a) {
  const Topology& t = c.topology();
  if (!patterns::two_level(t, c.size())) {
    allgather_ring(c, a);
    return;
  }
  const int me = c.rank();
  const size_t es = a.elem(), bb = a.count * es;
  char* out = static_cast<char*>(a.recv);
  char* own = a.own_block(me);
  const char* mine = a.allgather_input(me);
  const patterns::Place pl = patterns::place_of(t, me);
  const int host = pl.host, j = pl.index;
  const std::vector<int>&local = pl.local, &across = pl.across;
  const int H = t.nhosts(), L = static_cast<int>(local.size());

  auto block = [&](int rank) { return out + static_cast<size_t>(rank) * bb; };
  if (own != mine) std::memcpy(own, mine, bb);
  const size_t nreq = static_cast<size_t>(2 * (H - 1) + 2 * (L - 1) * H);
  std::unique_ptr<Request[]> rq(new Request[nreq]);
  size_t k = 0;
  std::vector<Request*> all;
  all.reserve(nreq);
  // 1. Across hosts (step 0): block (h, j) of every host h lands in place.
  std::vector<Request*> landed(static_cast<size_t>(H), nullptr);
  for (int d = 1; d < H; ++d) {
    const int from = (host - d + H) % H, to = (host + d) % H;
    Request& rr = rq[k++];
    c.irecv(rr, across[static_cast<size_t>(from)], 0, block(across[static_cast<size_t>(from)]), bb);
    landed[static_cast<size_t>(from)] = &rr;
    all.push_back(&rr);
    Request& sr = rq[k++];
    c.isend(sr, across[static_cast<size_t>(to)], 0, own, bb);
    all.push_back(&sr);
  }
  // 2. Inside the host, one exchange per host's row: this host's own row at
  // once (it needs nothing from the network), every other row as soon as
  // this rank's block of it has landed. Row d (this host's: d = 0) uses
  // step 1 + d; the host's ranks all count d from the same host.
  auto row = [&](int h, uint32_t step) {
    const std::vector<int>& ranks = t.hosts[static_cast<size_t>(h)];
    for (int e = 1; e < L; ++e) {
      const int from = (j - e + L) % L, to = (j + e) % L;
      Request& rr = rq[k++];
      c.irecv(rr, local[static_cast<size_t>(from)], step, block(ranks[static_cast<size_t>(from)]), bb);
      all.push_back(&rr);
      Request& sr = rq[k++];
      c.isend(sr, local[static_cast<size_t>(to)], step, block(ranks[static_cast<size_t>(j)]), bb);
      all.push_back(&sr);
    }
  };
  row(host, 1);
  for (int d = 1; d < H; ++d) {
    const int h = (host - d + H) % H;
    c.wait(*landed[static_cast<size_t>(h)]);
    row(h, 1 + static_cast<uint32_t>(d));
  }
  c.wait_all(all.data(), all.size());
}

}  // namespace shoal::coll
