// collectives/direct_phases.cc — see direct_phases.h.
#include "collectives/direct_phases.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/patterns/partition.h"
#include "kernels/reduce.h"

namespace shoal::coll {
namespace {

constexpr int kWindow = 2;  // segments in flight per peer

int segments(Ctx& c, size_t count, size_t es) {
  const size_t seg_elems = std::max<size_t>(1, c.tuning().segment_bytes / es);
  return static_cast<int>(patterns::num_segments(count, seg_elems));
}

}  // namespace

EqualBlocks::EqualBlocks(int n, size_t count)
    : counts(static_cast<size_t>(n), count), displs(static_cast<size_t>(n)) {
  for (int i = 0; i < n; ++i) displs[static_cast<size_t>(i)] = static_cast<size_t>(i) * count;
}

uint32_t direct_steps(Ctx& c, const RingGroup& g, const Args& a, const size_t* counts) {
  size_t most = 0;
  for (int i = 0; i < g.size; ++i) most = std::max(most, counts[i]);
  return static_cast<uint32_t>(segments(c, most, a.elem()));
}

void direct_reduce_scatter(Ctx& c, const RingGroup& g, const Args& a, const char* in,
                           const size_t* counts, const size_t* displs, char* dst, uint32_t step0) {
  const int n = g.size, me = g.me;
  const size_t es = a.elem();
  const char* mine = in + displs[me] * es;
  if (n == 1) {
    if (dst != mine) std::memcpy(dst, mine, counts[me] * es);
    return;
  }
  // Every peer's slice, cut into segments: the k-th segment of a slice uses
  // step step0 + k, whoever sends it (each pair sees increasing steps).
  auto seg_of = [&](int owner, int k) {
    const size_t cnt = counts[owner];
    patterns::Range r = patterns::block(cnt, segments(c, cnt, es), k);
    r.off += displs[owner];
    return r;
  };
  size_t nsend = 0;
  for (int q = 0; q < n; ++q) nsend += q == me ? 0 : static_cast<size_t>(segments(c, counts[q], es));
  std::unique_ptr<Request[]> sends(new Request[nsend]);
  size_t si = 0;
  for (int d = 1; d < n; ++d) {  // staggered so that peers do not all start on rank 0
    const int q = (me + d) % n;
    const int ks = segments(c, counts[q], es);
    for (int k = 0; k < ks; ++k) {
      patterns::Range r = seg_of(q, k);
      c.isend(sends[si++], g.ranks[q], step0 + static_cast<uint32_t>(k), in + r.off * es, r.len * es);
    }
  }
  // Receive this rank's slice from every peer, kWindow segments ahead.
  const int ks = segments(c, counts[me], es);
  const size_t seg_bytes = patterns::block(counts[me], ks, 0).len * es;
  const int peers = n - 1;
  char* tmp = static_cast<char*>(c.scratch(seg_bytes * static_cast<size_t>(peers * kWindow), 0));
  std::unique_ptr<Request[]> recvs(new Request[static_cast<size_t>(peers * kWindow)]);
  auto slot = [&](int k, int p) { return static_cast<size_t>((k % kWindow) * peers + p); };
  auto post = [&](int k) {
    patterns::Range r = seg_of(me, k);
    for (int p = 0; p < peers; ++p) {
      const int q = (me + 1 + p) % n;
      c.irecv(recvs[slot(k, p)], g.ranks[q], step0 + static_cast<uint32_t>(k), tmp + slot(k, p) * seg_bytes,
              r.len * es);
    }
  };
  for (int k = 0; k < std::min(ks, kWindow); ++k) post(k);
  for (int k = 0; k < ks; ++k) {
    patterns::Range r = seg_of(me, k);
    char* o = dst + (r.off - displs[me]) * es;
    const char* src = in + r.off * es;
    for (int p = 0; p < peers; ++p) {
      c.wait(recvs[slot(k, p)]);
      kernels::reduce(a.dt, a.op, o, src, tmp + slot(k, p) * seg_bytes, r.len);
      src = o;
    }
    if (k + kWindow < ks) post(k + kWindow);
  }
  std::vector<Request*> all(nsend);
  for (size_t i = 0; i < nsend; ++i) all[i] = &sends[i];
  c.wait_all(all.data(), all.size());
}

void direct_allgather(Ctx& c, const RingGroup& g, const Args& a, const char* mine,
                      const size_t* counts, const size_t* displs, char* out, uint32_t step0) {
  const int n = g.size, me = g.me;
  const size_t es = a.elem();
  char* own = out + displs[me] * es;
  if (own != mine) std::memcpy(own, mine, counts[me] * es);
  if (n == 1) return;
  std::unique_ptr<Request[]> rs(new Request[static_cast<size_t>(2 * (n - 1))]);
  std::vector<Request*> all;
  for (int d = 1; d < n; ++d) {
    const int from = (me - d + n) % n, to = (me + d) % n;
    Request& rr = rs[static_cast<size_t>(2 * (d - 1))];
    Request& sr = rs[static_cast<size_t>(2 * (d - 1) + 1)];
    c.irecv(rr, g.ranks[from], step0, out + displs[from] * es, counts[from] * es);
    c.isend(sr, g.ranks[to], step0, own, counts[me] * es);
    all.push_back(&rr);
    all.push_back(&sr);
  }
  c.wait_all(all.data(), all.size());
}

}  // namespace shoal::coll
