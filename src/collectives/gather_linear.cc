// gather_linear.cc — linear gather to any root.
//
// Every rank but the root sends its `count` elements straight to the root,
// which posts all p-1 receives at once, each into its final place
// (recv + i*count; recv is significant only at the root). The root's own
// block is copied locally unless it is already in place (send == recv, or
// send == its block of recv).
//
// Cost (p ranks, n = p*count*elem bytes gathered): (p-1) alpha + (p-1)/p n beta,
// all of it through the root's link; the alphas overlap in practice since
// every receive is in flight at once.
// Chosen for large messages and p <= 2 (see select.cc).
#include <cstring>
#include <memory>

#include "collectives/algorithms.h"

namespace shoal::coll {

void gather_linear(Ctx& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t bb = a.count * a.elem();  // block bytes
  if (r != a.root) {
    c.send(a.root, 0, a.send, bb);
    return;
  }
  char* out = static_cast<char*>(a.recv);
  char* own = out + r * bb;
  if (a.send != a.recv && a.send != own) std::memcpy(own, a.send, bb);
  if (n == 1) return;

  std::unique_ptr<Request[]> rq(new Request[n]);
  std::unique_ptr<Request*[]> all(new Request*[n - 1]);
  size_t k = 0;
  for (int i = 0; i < n; ++i) {
    if (i == r) continue;
    c.irecv(rq[i], i, 0, out + i * bb, bb);
    all[k++] = &rq[i];
  }
  c.wait_all(all.get(), k);
}

}  // namespace shoal::coll
