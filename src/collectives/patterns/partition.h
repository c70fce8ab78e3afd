// collectives/patterns/partition.h — splitting `count` elements into parts.
// Pure functions; unit-tested in tests/cpp/test_patterns.cc.
#pragma once

#include <cstddef>

namespace shoal::coll::patterns {

struct Range {
  size_t off = 0;  // first element
  size_t len = 0;  // elements
};

// Part i of `count` split into `parts` nearly equal contiguous parts: the
// first count % parts parts hold one element more.
inline Range block(size_t count, int parts, int i) {
  const size_t p = static_cast<size_t>(parts), k = static_cast<size_t>(i);
  const size_t base = count / p, extra = count % p;
  return Range{k * base + (k < extra ? k : extra), base + (k < extra ? 1 : 0)};
}

// Number of segments of at most `seg_elems` elements needed for `len`
// elements (at least 1).
inline size_t num_segments(size_t len, size_t seg_elems) {
  if (seg_elems == 0) return 1;
  size_t n = (len + seg_elems - 1) / seg_elems;
  return n == 0 ? 1 : n;
}

}  // namespace shoal::coll::patterns
