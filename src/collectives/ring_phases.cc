// collectives/ring_phases.cc — see ring_phases.h.
#include "collectives/ring_phases.h"

#include <algorithm>
#include <memory>

#include "collectives/patterns/partition.h"
#include "collectives/patterns/ring.h"
#include "kernels/reduce.h"

namespace shoal::coll {

using patterns::block;
using patterns::Range;

namespace {

struct Layout {
  size_t count, es;
  int n, nseg;
  // Segment k of block b, in elements from the start of the range.
  Range seg(int b, int k) const {
    Range blk = block(count, n, b);
    Range s = block(blk.len, nseg, k);
    s.off += blk.off;
    return s;
  }
};

Layout layout(Ctx& c, int n, size_t count, size_t es) {
  const size_t max_block = block(count, n, 0).len;
  const size_t seg_elems = std::max<size_t>(1, c.tuning().segment_bytes / es);
  return Layout{count, es, n, static_cast<int>(patterns::num_segments(max_block, seg_elems))};
}

void wait_all(Ctx& c, Request* rs, size_t n) {
  std::unique_ptr<Request*[]> all(new Request*[n]);
  for (size_t i = 0; i < n; ++i) all[i] = &rs[i];
  c.wait_all(all.get(), n);
}

}  // namespace

uint32_t ring_steps(Ctx& c, const RingGroup& g, size_t count, size_t elem) {
  Layout L = layout(c, g.size, count, elem);
  return static_cast<uint32_t>((g.size - 1) * L.nseg);
}

void ring_reduce_scatter(Ctx& c, const RingGroup& g, const Args& a, char* out, const char* in,
                         size_t count, uint32_t step0) {
  const int n = g.size, r = g.me;
  if (n == 1) return;
  const size_t es = a.elem();
  const Layout L = layout(c, n, count, es);
  const int nseg = L.nseg;
  const int next = g.ranks[patterns::ring_next(r, n)], prev = g.ranks[patterns::ring_prev(r, n)];
  const size_t step_bytes = block(count, n, 0).len * es;
  char* tmp[2] = {static_cast<char*>(c.scratch(step_bytes, 0)),
                  static_cast<char*>(c.scratch(step_bytes, 1))};
  auto tag = [&](int s, int k) { return step0 + static_cast<uint32_t>(s * nseg + k); };
  const int steps = n - 1;
  std::unique_ptr<Request[]> rrecv(new Request[2 * nseg]);  // double-buffered by step parity
  std::unique_ptr<Request[]> rsend(new Request[static_cast<size_t>(steps) * nseg]);
  auto post_recvs = [&](int s) {
    const int b = patterns::rs_recv_block(r, n, s);
    const size_t base = block(count, n, b).off;
    for (int k = 0; k < nseg; ++k) {
      Range s_ = L.seg(b, k);
      c.irecv(rrecv[(s % 2) * nseg + k], prev, tag(s, k), tmp[s % 2] + (s_.off - base) * es,
              s_.len * es);
    }
  };
  post_recvs(0);
  {
    const int b = patterns::rs_send_block(r, n, 0);
    for (int k = 0; k < nseg; ++k) {
      Range s_ = L.seg(b, k);
      c.isend(rsend[k], next, tag(0, k), in + s_.off * es, s_.len * es);
    }
  }
  for (int s = 0; s < steps; ++s) {
    if (s + 1 < steps) post_recvs(s + 1);
    const int b = patterns::rs_recv_block(r, n, s);
    const size_t base = block(count, n, b).off;
    for (int k = 0; k < nseg; ++k) {
      Range s_ = L.seg(b, k);
      c.wait(rrecv[(s % 2) * nseg + k]);
      kernels::reduce(a.dt, a.op, out + s_.off * es, in + s_.off * es,
                      tmp[s % 2] + (s_.off - base) * es, s_.len);
      if (s + 1 < steps) {
        c.isend(rsend[static_cast<size_t>(s + 1) * nseg + k], next, tag(s + 1, k),
                out + s_.off * es, s_.len * es);
      }
    }
  }
  wait_all(c, rsend.get(), static_cast<size_t>(steps) * nseg);
}

void ring_allgather(Ctx& c, const RingGroup& g, const Args& a, char* out, size_t count,
                    uint32_t step0) {
  const int n = g.size, r = g.me;
  if (n == 1) return;
  const size_t es = a.elem();
  const Layout L = layout(c, n, count, es);
  const int nseg = L.nseg;
  const int next = g.ranks[patterns::ring_next(r, n)], prev = g.ranks[patterns::ring_prev(r, n)];
  auto tag = [&](int s, int k) { return step0 + static_cast<uint32_t>(s * nseg + k); };
  const int steps = n - 1;
  const size_t total = static_cast<size_t>(steps) * nseg;
  std::unique_ptr<Request[]> arecv(new Request[total]);
  std::unique_ptr<Request[]> asend(new Request[total]);
  // Every receive lands in its final place.
  for (int s = 0; s < steps; ++s) {
    const int b = patterns::ag_recv_block(r, n, s);
    for (int k = 0; k < nseg; ++k) {
      Range s_ = L.seg(b, k);
      c.irecv(arecv[static_cast<size_t>(s) * nseg + k], prev, tag(s, k), out + s_.off * es,
              s_.len * es);
    }
  }
  {
    const int b = patterns::ag_send_block(r, n, 0);
    for (int k = 0; k < nseg; ++k) {
      Range s_ = L.seg(b, k);
      c.isend(asend[k], next, tag(0, k), out + s_.off * es, s_.len * es);
    }
  }
  for (int s = 0; s < steps; ++s) {
    const int b = patterns::ag_recv_block(r, n, s);
    for (int k = 0; k < nseg; ++k) {
      c.wait(arecv[static_cast<size_t>(s) * nseg + k]);
      if (s + 1 < steps) {
        Range s_ = L.seg(b, k);
        c.isend(asend[static_cast<size_t>(s + 1) * nseg + k], next, tag(s + 1, k),
                out + s_.off * es, s_.len * es);
      }
    }
  }
  wait_all(c, asend.get(), total);
}

}  // namespace shoal::coll
