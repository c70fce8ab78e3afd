// scatter_binomial.cc — binomial-tree scatter from any root.
//
// The mirror of gather_binomial: in the binomial tree of patterns/tree.h the
// subtree of relative rank v is the contiguous range of relative ranks
// [v, v + size(v)), so every edge carries one contiguous run of blocks. A
// rank receives its subtree's run from its parent (into scratch, or straight
// into recv for a leaf), keeps the first block and sends each child its run,
// largest subtree first. The root sends straight from `send`, except for the
// (at most one) run that wraps past rank p-1, which it first assembles in
// scratch.
//
// Cost (p ranks, n = p*count*elem bytes scattered):
// ceil(log2 p) alpha + (p-1)/p n beta.
// Latency-optimal; chosen for small messages on p > 2 (see select.cc).
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/patterns/tree.h"

namespace shoal::coll {

void scatter_binomial(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank(), root = a.root;
  const size_t bb = a.count * a.elem();  // block bytes
  const int rel = patterns::to_relative(r, root, n);
  const std::vector<int> children = patterns::binomial_children(rel, n);
  std::unique_ptr<Request[]> rq(new Request[children.size()]);
  std::unique_ptr<Request*[]> all(new Request*[children.size() + 1]);
  auto run_bytes = [&](int ch) {
    return static_cast<size_t>(patterns::binomial_subtree_size(ch, n)) * bb;
  };

  if (rel != 0) {
    const int parent = patterns::tree_parent(r, root, n);
    if (children.empty()) {
      c.recv(parent, 0, a.recv, bb);
      return;
    }
    const size_t sub = static_cast<size_t>(patterns::binomial_subtree_size(rel, n));
    char* tmp = static_cast<char*>(c.scratch(sub * bb, 0));
    c.recv(parent, 0, tmp, sub * bb);
    for (size_t j = 0; j < children.size(); ++j) {
      const int ch = children[j];
      c.isend(rq[j], patterns::to_absolute(ch, root, n), 0, tmp + (ch - rel) * bb, run_bytes(ch));
      all[j] = &rq[j];
    }
    std::memcpy(a.recv, tmp, bb);
    c.wait_all(all.get(), children.size());
    return;
  }

  // ---- root ----
  const char* in = static_cast<const char*>(a.send);
  for (size_t j = 0; j < children.size(); ++j) {
    const int ch = children[j];
    const int sz = patterns::binomial_subtree_size(ch, n);
    const int start = patterns::to_absolute(ch, root, n);
    const char* src;
    if (start + sz <= n) {
      src = in + start * bb;
    } else {
      const int head = n - start;  // blocks start .. n-1, then 0 ..
      char* tmp = static_cast<char*>(c.scratch(static_cast<size_t>(sz) * bb, 0));
      std::memcpy(tmp, in + start * bb, head * bb);
      std::memcpy(tmp + head * bb, in, (sz - head) * bb);
      src = tmp;
    }
    c.isend(rq[j], start, 0, src, static_cast<size_t>(sz) * bb);
    all[j] = &rq[j];
  }
  const char* own = in + r * bb;
  if (a.recv != a.send && a.recv != own) std::memcpy(a.recv, own, bb);
  if (!children.empty()) c.wait_all(all.get(), children.size());
}

}  // namespace shoal::coll
