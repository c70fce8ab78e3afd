// scatter_linear.cc — linear scatter from any root.
//
// The root sends block i of send (send + i*count; send is significant only at
// the root) straight to rank i, all p-1 sends in flight at once; every other
// rank receives its `count` elements into recv. The root's own block is
// copied locally unless it is already in place (recv == send, or recv == its
// block of send).
//
// Cost (p ranks, n = p*count*elem bytes scattered): (p-1) alpha + (p-1)/p n beta,
// all of it through the root's link.
// Chosen for large messages and p <= 2 (see select.cc).
#include <cstring>
#include <memory>

#include "collectives/algorithms.h"

namespace shoal::coll {

void scatter_linear(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t bb = a.count * a.elem();  // block bytes
  if (r != a.root) {
    c.recv(a.root, 0, a.recv, bb);
    return;
  }
  const char* in = static_cast<const char*>(a.send);
  const char* own = in + r * bb;
  if (a.recv != a.send && a.recv != own) std::memcpy(a.recv, own, bb);
  if (n == 1) return;

  std::unique_ptr<Request[]> rq(new Request[n]);
  std::unique_ptr<Request*[]> all(new Request*[n - 1]);
  size_t k = 0;
  // Start with the root's successor so that the roots of successive scatters
  // do not all serve rank 0 first.
  for (int d = 1; d < n; ++d) {
    const int i = (r + d) % n;
    c.isend(rq[i], i, 0, in + i * bb, bb);
    all[k++] = &rq[i];
  }
  c.wait_all(all.get(), k);
}

}  // namespace shoal::coll
