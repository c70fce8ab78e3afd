// collectives/patterns/tree.h — the binomial tree rooted at any rank.
// Pure functions; unit-tested in tests/cpp/test_patterns_tree.cc.
//
// Ranks are first made relative to the root (v = (rank - root) mod size), so
// the root is v = 0 and the tree is the same for every root. In relative
// terms the parent of v > 0 is v with its lowest set bit cleared, and the
// children of v are v + 2^k for every 2^k below v's lowest set bit (below
// size for the root) with v + 2^k < size. The subtree of v is the contiguous
// range of relative ranks [v, v + subtree_size(v)), which is what lets
// scatter and gather move one contiguous run of blocks per edge.
//
// Example, size 6: 0 -> {4, 2, 1}, 2 -> {3}, 4 -> {5}; depth ceil(log2 6) = 3.
// Size 5: 0 -> {2, 4, 1} (the subtree of 2 has two ranks, that of 4 one).
#pragma once

#include <algorithm>
#include <vector>

namespace shoal::coll::patterns {

inline int to_relative(int rank, int root, int size) {
  return ((rank - root) % size + size) % size;
}
inline int to_absolute(int rel, int root, int size) { return (rel + root) % size; }

// Smallest power of two >= size (1 for size 1).
inline int ceil_pow2(int size) {
  int p = 1;
  while (p < size) p <<= 1;
  return p;
}

// ceil(log2(size)): the number of rounds of a binomial tree.
inline int ceil_log2(int size) {
  int k = 0;
  while ((1 << k) < size) ++k;
  return k;
}

// The span below v: children are v + m for powers of two m < span(v).
// For the root that is every power of two below size.
inline int binomial_span(int rel, int size) { return rel == 0 ? ceil_pow2(size) : (rel & -rel); }

// Relative parent of relative rank `rel`; -1 for the root.
inline int binomial_parent(int rel) { return rel == 0 ? -1 : (rel & (rel - 1)); }

// Number of relative ranks in the subtree of `rel` (itself included).
inline int binomial_subtree_size(int rel, int size) {
  const int span = binomial_span(rel, size);
  return span < size - rel ? span : size - rel;
}

// Relative children of `rel` in send order: largest subtree first, i.e. the
// deepest first, so that the child with the most forwarding to do starts
// first (for a non-power-of-two size the farthest child may be a small,
// truncated subtree). Ties go to the farther child.
inline std::vector<int> binomial_children(int rel, int size) {
  std::vector<int> out;
  for (int m = binomial_span(rel, size) >> 1; m >= 1; m >>= 1) {
    if (rel + m < size) out.push_back(rel + m);
  }
  std::stable_sort(out.begin(), out.end(), [size](int x, int y) {
    return binomial_subtree_size(x, size) > binomial_subtree_size(y, size);
  });
  return out;
}

// Absolute-rank conveniences.
inline int tree_parent(int rank, int root, int size) {
  const int p = binomial_parent(to_relative(rank, root, size));
  return p < 0 ? -1 : to_absolute(p, root, size);
}

inline std::vector<int> tree_children(int rank, int root, int size) {
  std::vector<int> out = binomial_children(to_relative(rank, root, size), size);
  for (int& c : out) c = to_absolute(c, root, size);
  return out;
}

}  // namespace shoal::coll::patterns
