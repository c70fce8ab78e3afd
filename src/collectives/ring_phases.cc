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

// Segments of a reduce-scatter in flight at once (see reduce_scatter_phase).
constexpr int kWindow = 4;

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

// Reduce-scatter; with `forward`, each segment of the owned block is sent on
// to the next rank as soon as it is reduced (the allgather's first step, at
// steps forward_step0 + k), while it is still in this core's cache.
void reduce_scatter_phase(Ctx& c, const RingGroup& g, const Args& a, char* out, const char* in,
                          size_t count, uint32_t step0, Request* forward, uint32_t forward_step0) {
  const int n = g.size, r = g.me;
  if (n == 1) return;
  const size_t es = a.elem();
  const Layout L = layout(c, n, count, es);
  const int nseg = L.nseg;
  const int next = g.ranks[patterns::ring_next(r, n)], prev = g.ranks[patterns::ring_prev(r, n)];
  auto tag = [&](int s, int k) { return step0 + static_cast<uint32_t>(s * nseg + k); };
  const int steps = n - 1;
  // Incoming segments land in a window of kWindow slots of one segment each,
  // reused round-robin: the window stays in cache while it is reduced, and
  // kWindow receives are always posted, so transfer and reduction overlap.
  const int total = steps * nseg;
  const int window = std::min(total, kWindow);
  size_t seg_bytes = 0;
  for (int k = 0; k < nseg; ++k) seg_bytes = std::max(seg_bytes, L.seg(0, k).len * es);
  char* tmp = static_cast<char*>(c.scratch(seg_bytes * static_cast<size_t>(window), 0));
  std::unique_ptr<Request[]> rrecv(new Request[static_cast<size_t>(window)]);
  std::unique_ptr<Request[]> rsend(new Request[static_cast<size_t>(total)]);
  auto post_recv = [&](int i) {  // i-th incoming segment: step i / nseg, segment i % nseg
    const int s = i / nseg, k = i % nseg;
    Range s_ = L.seg(patterns::rs_recv_block(r, n, s), k);
    c.irecv(rrecv[i % window], prev, tag(s, k), tmp + static_cast<size_t>(i % window) * seg_bytes,
            s_.len * es);
  };
  for (int i = 0; i < window; ++i) post_recv(i);
  {
    const int b = patterns::rs_send_block(r, n, 0);
    for (int k = 0; k < nseg; ++k) {
      Range s_ = L.seg(b, k);
      c.isend(rsend[k], next, tag(0, k), in + s_.off * es, s_.len * es);
    }
  }
  for (int i = 0; i < total; ++i) {
    const int s = i / nseg, k = i % nseg;
    Range s_ = L.seg(patterns::rs_recv_block(r, n, s), k);
    c.wait(rrecv[i % window]);
    kernels::reduce(a.dt, a.op, out + s_.off * es, in + s_.off * es,
                    tmp + static_cast<size_t>(i % window) * seg_bytes, s_.len);
    if (i + window < total) post_recv(i + window);
    if (s + 1 < steps) {
      c.isend(rsend[static_cast<size_t>(s + 1) * nseg + k], next, tag(s + 1, k), out + s_.off * es,
              s_.len * es);
    } else if (forward) {
      c.isend(forward[k], next, forward_step0 + static_cast<uint32_t>(k), out + s_.off * es,
              s_.len * es);
    }
  }
  wait_all(c, rsend.get(), static_cast<size_t>(total));
}

// Allgather; with `sent`, the first step's sends were posted by
// reduce_scatter_phase (one request per segment) and are waited for here.
void allgather_phase(Ctx& c, const RingGroup& g, const Args& a, char* out, size_t count,
                     uint32_t step0, Request* sent) {
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
  // The first step's sends: posted here, or already by the reduce-scatter.
  Request* first = sent ? sent : asend.get();
  if (!sent) {
    const int b = patterns::ag_send_block(r, n, 0);
    for (int k = 0; k < nseg; ++k) {
      Range s_ = L.seg(b, k);
      c.isend(first[k], next, tag(0, k), out + s_.off * es, s_.len * es);
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
  wait_all(c, first, static_cast<size_t>(nseg));
  wait_all(c, asend.get() + nseg, total - static_cast<size_t>(nseg));
}

}  // namespace

std::vector<int> all_ranks(int n) {
  std::vector<int> r(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) r[static_cast<size_t>(i)] = i;
  return r;
}

uint32_t ring_steps(Ctx& c, const RingGroup& g, size_t count, size_t elem) {
  Layout L = layout(c, g.size, count, elem);
  return static_cast<uint32_t>((g.size - 1) * L.nseg);
}

void ring_reduce_scatter(Ctx& c, const RingGroup& g, const Args& a, char* out, const char* in,
                         size_t count, uint32_t step0) {
  reduce_scatter_phase(c, g, a, out, in, count, step0, nullptr, 0);
}

void ring_allgather(Ctx& c, const RingGroup& g, const Args& a, char* out, size_t count,
                    uint32_t step0) {
  allgather_phase(c, g, a, out, count, step0, nullptr);
}

uint32_t ring_allreduce(Ctx& c, const RingGroup& g, const Args& a, char* out, const char* in,
                        size_t count, uint32_t step0) {
  const uint32_t steps = ring_steps(c, g, count, a.elem());
  if (g.size == 1) return 0;
  // One request per segment of a block: the allgather's first step.
  std::unique_ptr<Request[]> first(new Request[steps / static_cast<uint32_t>(g.size - 1)]);
  reduce_scatter_phase(c, g, a, out, in, count, step0, first.get(), step0 + steps);
  allgather_phase(c, g, a, out, count, step0 + steps, first.get());
  return 2 * steps;
}

}  // namespace shoal::coll
