// gather_binomial.cc — binomial-tree gather to any root.
//
// In the binomial tree of patterns/tree.h the subtree of relative rank v is
// the contiguous range of relative ranks [v, v + size(v)). Each rank gathers
// its subtree's blocks in scratch, in relative-rank order (its own block
// first, then each child's run at offset child - v), and sends the whole run
// to its parent in one message; leaves send straight from `send`. At the
// root a child's run maps to consecutive blocks of recv unless it wraps past
// rank p-1; those are received straight into place, only the (at most one)
// wrapping run goes through scratch and is copied in two pieces.
//
// Cost (p ranks, n = p*count*elem bytes gathered):
// ceil(log2 p) alpha + (p-1)/p n beta.
// Latency-optimal; chosen for small messages on p > 2 (see select.cc).
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/patterns/tree.h"

namespace shoal::coll {

void gather_binomial(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank(), root = a.root;
  const size_t bb = a.count * a.elem();  // block bytes
  const int rel = patterns::to_relative(r, root, n);
  const std::vector<int> children = patterns::binomial_children(rel, n);
  std::unique_ptr<Request[]> rq(new Request[children.size()]);
  std::unique_ptr<Request*[]> all(new Request*[children.size() + 1]);

  if (rel != 0) {
    const int parent = patterns::tree_parent(r, root, n);
    if (children.empty()) {
      c.send(parent, 0, a.send, bb);
      return;
    }
    const size_t sub = static_cast<size_t>(patterns::binomial_subtree_size(rel, n));
    char* tmp = static_cast<char*>(c.scratch(sub * bb, 0));
    for (size_t j = 0; j < children.size(); ++j) {
      const int ch = children[j];
      const size_t len = static_cast<size_t>(patterns::binomial_subtree_size(ch, n)) * bb;
      c.irecv(rq[j], patterns::to_absolute(ch, root, n), 0, tmp + (ch - rel) * bb, len);
      all[j] = &rq[j];
    }
    std::memcpy(tmp, a.send, bb);
    c.wait_all(all.get(), children.size());
    c.send(parent, 0, tmp, sub * bb);
    return;
  }

  // ---- root ----
  char* out = static_cast<char*>(a.recv);
  char* own = out + r * bb;
  if (a.send != a.recv && a.send != own) std::memcpy(own, a.send, bb);
  int wrap_start = -1, wrap_blocks = 0;  // absolute start and size of the wrapping run
  char* wrap_tmp = nullptr;
  for (size_t j = 0; j < children.size(); ++j) {
    const int ch = children[j];
    const int sz = patterns::binomial_subtree_size(ch, n);
    const int start = patterns::to_absolute(ch, root, n);
    char* dst;
    if (start + sz <= n) {
      dst = out + start * bb;
    } else {
      wrap_start = start;
      wrap_blocks = sz;
      wrap_tmp = static_cast<char*>(c.scratch(static_cast<size_t>(sz) * bb, 0));
      dst = wrap_tmp;
    }
    c.irecv(rq[j], start, 0, dst, static_cast<size_t>(sz) * bb);
    all[j] = &rq[j];
  }
  if (!children.empty()) c.wait_all(all.get(), children.size());
  if (wrap_tmp) {
    const int head = n - wrap_start;  // blocks wrap_start .. n-1, then 0 ..
    std::memcpy(out + wrap_start * bb, wrap_tmp, head * bb);
    std::memcpy(out, wrap_tmp + head * bb, (wrap_blocks - head) * bb);
  }
}

}  // namespace shoal::coll
