// collectives/patterns/recursive.h — rank arithmetic of recursive doubling
// and recursive halving, and the fold that runs them on any world size.
// Pure functions; unit-tested in tests/cpp/test_patterns_recursive.cc.
//
// Fold. Recursive algorithms need a power-of-two group. With `size` ranks and
// p2 the largest power of two <= size, the first 2 * (size - p2) ranks pair
// up (0,1), (2,3), ...: the odd rank of each pair is "extra" — it hands its
// data to its even partner and sits out until the result comes back. The
// remaining p2 ranks are renumbered 0..p2-1 ("new ranks"):
//
//   old rank r < 2*extra, r even  ->  new rank r / 2
//   old rank r < 2*extra, r odd   ->  sits out (partner r - 1)
//   old rank r >= 2*extra         ->  new rank r - extra
//
// Example, size 6 (p2 4, extra 2): old 0 1 2 3 4 5 -> new 0 - 1 - 2 3.
//
// Recursive halving (reduce-scatter over p2 ranks). The vector is cut into
// p2 blocks (patterns::block). Before step k (k = 0 .. log2(p2) - 1) a rank
// holds a window of p2 >> k blocks, aligned to its size; it exchanges with
// the new rank at distance p2 >> (k + 1), keeps the half of the window on
// its own side and sends the other half. After the last step new rank v
// holds exactly block v.
//
// Recursive doubling (allgather over p2 ranks): the same steps in reverse.
// At step j the partner is at distance 2^j; a rank sends the window of 2^j
// blocks it has and receives the partner's adjacent window.
#pragma once

#include <cstddef>

#include "collectives/patterns/partition.h"

namespace shoal::coll::patterns {

// Largest power of two <= n (n >= 1).
inline int pow2_floor(int n) {
  int p = 1;
  while (p <= n / 2) p <<= 1;
  return p;
}

inline bool is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

// floor(log2(n)) for n >= 1.
inline int log2_floor(int n) {
  int k = 0;
  while ((2 << k) <= n) ++k;
  return k;
}

struct Fold {
  int size = 1;   // ranks in the communicator
  int p2 = 1;     // largest power of two <= size
  int extra = 0;  // size - p2: number of ranks that sit out
};

inline Fold make_fold(int size) {
  Fold f;
  f.size = size;
  f.p2 = pow2_floor(size);
  f.extra = size - f.p2;
  return f;
}

// True if `rank` hands its data to rank - 1 and waits for the result.
inline bool fold_sits_out(int rank, const Fold& f) { return rank < 2 * f.extra && (rank & 1); }

// The rank this one exchanges with in the fold and unfold steps, or -1 if
// it is not part of a pair.
inline int fold_partner(int rank, const Fold& f) { return rank < 2 * f.extra ? (rank ^ 1) : -1; }

// New rank in [0, p2), or -1 for a rank that sits out.
inline int fold_new_rank(int rank, const Fold& f) {
  if (rank < 2 * f.extra) return (rank & 1) ? -1 : rank / 2;
  return rank - f.extra;
}

// Inverse of fold_new_rank.
inline int fold_old_rank(int new_rank, const Fold& f) {
  return new_rank < f.extra ? 2 * new_rank : new_rank + f.extra;
}

// Blocks [lo, hi) of a vector cut into p2 blocks.
struct BlockSpan {
  int lo = 0;
  int hi = 0;
  int len() const { return hi - lo; }
  bool operator==(const BlockSpan&) const = default;
};

// Recursive halving, step k in [0, log2(p2)): the partner's new rank.
inline int halving_partner(int new_rank, int p2, int k) { return new_rank ^ (p2 >> (k + 1)); }

// The window of blocks `new_rank` holds (partly reduced) before step k.
inline BlockSpan halving_window(int new_rank, int p2, int k) {
  const int w = p2 >> k;
  const int lo = new_rank & ~(w - 1);
  return BlockSpan{lo, lo + w};
}

// The half of the window kept (and reduced with the partner's copy) at step k.
inline BlockSpan halving_keep(int new_rank, int p2, int k) {
  const BlockSpan win = halving_window(new_rank, p2, k);
  const int half = win.len() / 2;
  return (new_rank & half) ? BlockSpan{win.lo + half, win.hi} : BlockSpan{win.lo, win.lo + half};
}

// The half sent to the partner at step k (the partner's keep half).
inline BlockSpan halving_send(int new_rank, int p2, int k) {
  return halving_keep(halving_partner(new_rank, p2, k), p2, k);
}

// Recursive doubling allgather, step j in [0, log2(p2)): the partner's new rank.
inline int doubling_partner(int new_rank, int j) { return new_rank ^ (1 << j); }

// The blocks `new_rank` holds before step j (and sends at step j).
inline BlockSpan doubling_have(int new_rank, int j) {
  const int w = 1 << j;
  const int lo = new_rank & ~(w - 1);
  return BlockSpan{lo, lo + w};
}

// The blocks received at step j: the partner's window.
inline BlockSpan doubling_get(int new_rank, int j) {
  return doubling_have(doubling_partner(new_rank, j), j);
}

// The elements of blocks [s.lo, s.hi) of `count` elements cut into `parts`
// blocks (patterns::block). An empty span gives an empty range.
inline Range span_elems(size_t count, int parts, BlockSpan s) {
  if (s.hi <= s.lo) return Range{block(count, parts, s.lo < parts ? s.lo : parts - 1).off, 0};
  const Range first = block(count, parts, s.lo);
  const Range last = block(count, parts, s.hi - 1);
  return Range{first.off, last.off + last.len - first.off};
}

}  // namespace shoal::coll::patterns
