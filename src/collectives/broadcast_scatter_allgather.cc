// broadcast_scatter_allgather.cc — van de Geijn broadcast: binomial scatter
// of the buffer from the root, then a ring allgather.
//
// The buffer is cut into p nearly equal blocks, block j belonging to relative
// rank j (patterns/partition.h; with count < p some blocks are empty and are
// never sent). The root scatters the blocks down the binomial tree of
// patterns/tree.h: since a subtree is a contiguous range of relative ranks,
// every edge carries one contiguous run of blocks, received straight into
// its final place. Then the blocks travel once around the ring of relative
// ranks; all ring receives are posted up front and each block is forwarded
// as soon as it lands. The root already holds everything, so it receives
// nothing in the ring and its predecessor sends it nothing.
//
// Cost (p ranks, n bytes): scatter ceil(log2 p) alpha + (p-1)/p n beta, then
// allgather (p-1) alpha + (p-1)/p n beta: in all
// (ceil(log2 p) + p - 1) alpha + 2 (p-1)/p n beta.
// Chosen for medium to large messages on p > 2 (see select.cc); for very large
// ones the pipelined chain wins because it moves only n beta.
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/patterns/partition.h"
#include "collectives/patterns/ring.h"
#include "collectives/patterns/tree.h"

namespace shoal::coll {

void broadcast_scatter_allgather(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t es = a.elem();
  char* buf = static_cast<char*>(a.recv);
  if (r == a.root && a.send && a.send != a.recv) std::memcpy(buf, a.send, a.count * es);
  if (n == 1) return;

  const int root = a.root;
  const int rel = patterns::to_relative(r, root, n);
  auto blk = [&](int j) { return patterns::block(a.count, n, j); };
  // Elements [off, off+len) of the relative blocks [lo, lo + nblocks).
  auto run = [&](int lo, int nblocks) {
    const size_t off = blk(lo).off;
    const int hi = lo + nblocks;
    const size_t end = hi >= n ? a.count : blk(hi).off;
    return patterns::Range{off, end - off};
  };

  // ---- post every receive: the scatter run from the parent, the ring blocks ----
  Request scat_recv;
  const patterns::Range mine = run(rel, patterns::binomial_subtree_size(rel, n));
  const bool scat_in = rel != 0 && mine.len > 0;
  if (scat_in) {
    c.irecv(scat_recv, patterns::tree_parent(r, root, n), 0, buf + mine.off * es, mine.len * es);
  }
  const int steps = n - 1;
  const int next_rel = patterns::ring_next(rel, n), prev_rel = patterns::ring_prev(rel, n);
  const int next = patterns::to_absolute(next_rel, root, n);
  const int prev = patterns::to_absolute(prev_rel, root, n);
  // Step s: send relative block rel - s, receive relative block rel - s - 1.
  auto send_block = [&](int s) { return patterns::mod(rel - s, n); };
  auto recv_block = [&](int s) { return patterns::mod(rel - s - 1, n); };
  std::unique_ptr<Request[]> ring_recv(new Request[steps]);
  std::unique_ptr<Request[]> ring_send(new Request[steps]);
  std::vector<Request*> pending;
  pending.reserve(2 * static_cast<size_t>(steps) + 32);
  std::vector<bool> posted(static_cast<size_t>(steps), false);
  if (rel != 0) {
    for (int s = 0; s < steps; ++s) {
      const patterns::Range g = blk(recv_block(s));
      if (g.len == 0) continue;
      c.irecv(ring_recv[s], prev, static_cast<uint32_t>(1 + s), buf + g.off * es, g.len * es);
      posted[s] = true;
      pending.push_back(&ring_recv[s]);
    }
  }

  // ---- scatter: forward each child's run of blocks ----
  if (scat_in) c.wait(scat_recv);
  const std::vector<int> children = patterns::binomial_children(rel, n);
  std::unique_ptr<Request[]> scat_send(new Request[children.size()]);
  for (size_t j = 0; j < children.size(); ++j) {
    const int ch = children[j];
    const patterns::Range g = run(ch, patterns::binomial_subtree_size(ch, n));
    if (g.len == 0) continue;
    c.isend(scat_send[j], patterns::to_absolute(ch, root, n), 0, buf + g.off * es, g.len * es);
    pending.push_back(&scat_send[j]);
  }

  // ---- ring allgather: forward each block as soon as it is here ----
  for (int s = 0; s < steps; ++s) {
    if (s > 0 && posted[s - 1]) c.wait(ring_recv[s - 1]);
    if (next_rel == 0) continue;  // the root has every block already
    const patterns::Range g = blk(send_block(s));
    if (g.len == 0) continue;
    c.isend(ring_send[s], next, static_cast<uint32_t>(1 + s), buf + g.off * es, g.len * es);
    pending.push_back(&ring_send[s]);
  }
  if (!pending.empty()) c.wait_all(pending.data(), pending.size());
}

}  // namespace shoal::coll
