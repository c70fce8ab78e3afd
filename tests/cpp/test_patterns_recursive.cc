// Tests of collectives/patterns/recursive.h: powers of two, the
// non-power-of-two fold, and the block windows of recursive halving and
// doubling. Pure arithmetic, no transport.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "collectives/patterns/partition.h"
#include "collectives/patterns/recursive.h"
#include "collectives/patterns/ring.h"
#include "collectives/patterns/tree.h"

namespace {

namespace p = shoal::coll::patterns;

TEST(PatternsRecursive, Pow2FloorAndLog2) {
  const int want_p2[] = {0, 1, 2, 2, 4, 4, 4, 4, 8, 8, 8, 8, 8, 8, 8, 8, 16};
  for (int n = 1; n <= 16; ++n) {
    EXPECT_EQ(p::pow2_floor(n), want_p2[n]) << n;
    EXPECT_EQ(1 << p::log2_floor(n), want_p2[n]) << n;
  }
  EXPECT_EQ(p::pow2_floor(1000), 512);
  EXPECT_EQ(p::log2_floor(1024), 10);
  EXPECT_EQ(p::pow2_floor(1 << 30), 1 << 30);
}

TEST(PatternsRecursive, FoldOfSix) {
  const p::Fold f = p::make_fold(6);
  EXPECT_EQ(f.p2, 4);
  EXPECT_EQ(f.extra, 2);
  const int want_new[] = {0, -1, 1, -1, 2, 3};
  const int want_partner[] = {1, 0, 3, 2, -1, -1};
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(p::fold_new_rank(r, f), want_new[r]) << r;
    EXPECT_EQ(p::fold_partner(r, f), want_partner[r]) << r;
    EXPECT_EQ(p::fold_sits_out(r, f), want_new[r] < 0) << r;
  }
}

TEST(PatternsRecursive, FoldIsABijectionOntoP2) {
  for (int n = 1; n <= 70; ++n) {
    const p::Fold f = p::make_fold(n);
    ASSERT_EQ(f.p2 + f.extra, n);
    ASSERT_LT(f.extra, f.p2);
    std::set<int> seen;
    int out = 0;
    for (int r = 0; r < n; ++r) {
      const int nr = p::fold_new_rank(r, f);
      if (nr < 0) {
        ++out;
        ASSERT_TRUE(p::fold_sits_out(r, f));
        // The partner of a rank that sits out takes part, and vice versa.
        const int partner = p::fold_partner(r, f);
        ASSERT_GE(partner, 0);
        ASSERT_EQ(p::fold_partner(partner, f), r);
        ASSERT_FALSE(p::fold_sits_out(partner, f));
        continue;
      }
      ASSERT_LT(nr, f.p2) << "n " << n << " r " << r;
      ASSERT_EQ(p::fold_old_rank(nr, f), r) << "n " << n << " r " << r;
      seen.insert(nr);
    }
    EXPECT_EQ(out, f.extra) << n;
    EXPECT_EQ(static_cast<int>(seen.size()), f.p2) << n;
  }
}

TEST(PatternsRecursive, HalvingEndsWithOwnBlock) {
  for (int p2 = 1; p2 <= 64; p2 <<= 1) {
    const int steps = p::log2_floor(p2);
    for (int v = 0; v < p2; ++v) {
      p::BlockSpan win{0, p2};
      for (int k = 0; k < steps; ++k) {
        ASSERT_EQ(p::halving_window(v, p2, k), win);
        const int peer = p::halving_partner(v, p2, k);
        ASSERT_NE(peer, v);
        ASSERT_EQ(p::halving_partner(peer, p2, k), v);
        // Both partners hold the same window and split it between them.
        ASSERT_EQ(p::halving_window(peer, p2, k), win);
        const p::BlockSpan keep = p::halving_keep(v, p2, k), give = p::halving_send(v, p2, k);
        ASSERT_EQ(keep.len(), win.len() / 2);
        ASSERT_EQ(give, p::halving_keep(peer, p2, k));
        ASSERT_TRUE((keep.lo == win.lo && give.lo == keep.hi && give.hi == win.hi) ||
                    (give.lo == win.lo && keep.lo == give.hi && keep.hi == win.hi));
        ASSERT_TRUE(keep.lo <= v && v < keep.hi);
        win = keep;
      }
      EXPECT_EQ(win, (p::BlockSpan{v, v + 1})) << "p2 " << p2 << " v " << v;
    }
  }
}

TEST(PatternsRecursive, DoublingRetracesHalving) {
  for (int p2 = 2; p2 <= 64; p2 <<= 1) {
    const int steps = p::log2_floor(p2);
    for (int v = 0; v < p2; ++v) {
      p::BlockSpan have{v, v + 1};
      for (int j = 0; j < steps; ++j) {
        const int k = steps - 1 - j;
        ASSERT_EQ(p::doubling_partner(v, j), p::halving_partner(v, p2, k));
        ASSERT_EQ(p::doubling_have(v, j), have);
        ASSERT_EQ(p::doubling_have(v, j), p::halving_keep(v, p2, k));
        ASSERT_EQ(p::doubling_get(v, j), p::halving_send(v, p2, k));
        ASSERT_EQ(p::doubling_get(v, j), p::doubling_have(p::doubling_partner(v, j), j));
        const p::BlockSpan get = p::doubling_get(v, j);
        have = p::BlockSpan{std::min(have.lo, get.lo), std::max(have.hi, get.hi)};
        ASSERT_EQ(have.len(), 2 << j);
      }
      EXPECT_EQ(have, (p::BlockSpan{0, p2}));
    }
  }
}

TEST(PatternsRecursive, SpanElemsCoversBlocks) {
  for (size_t count : {0, 1, 2, 3, 7, 64, 1001}) {
    for (int parts : {1, 2, 4, 8, 16}) {
      for (int lo = 0; lo < parts; ++lo) {
        for (int hi = lo + 1; hi <= parts; ++hi) {
          const p::Range r = p::span_elems(count, parts, p::BlockSpan{lo, hi});
          size_t len = 0;
          for (int b = lo; b < hi; ++b) len += p::block(count, parts, b).len;
          ASSERT_EQ(r.off, p::block(count, parts, lo).off);
          ASSERT_EQ(r.len, len) << count << " " << parts << " [" << lo << "," << hi << ")";
          ASSERT_LE(r.off + r.len, count);
        }
      }
      EXPECT_EQ(p::span_elems(count, parts, p::BlockSpan{0, parts}).len, count);
      EXPECT_EQ(p::span_elems(count, parts, p::BlockSpan{1, 1}).len, 0u);
    }
  }
}

// The dissemination barrier's partners: rank + 2^k are distinct for every
// round, so steps to one peer never repeat.
TEST(PatternsRecursive, DisseminationPartnersAreDistinct) {
  for (int n = 2; n <= 33; ++n) {
    const int rounds = p::ceil_log2(n);
    EXPECT_GE(1 << rounds, n);
    for (int r = 0; r < n; ++r) {
      std::set<int> to;
      for (int k = 0; k < rounds; ++k) {
        const int peer = p::mod(r + (1 << k), n);
        ASSERT_NE(peer, r);
        to.insert(peer);
      }
      EXPECT_EQ(static_cast<int>(to.size()), rounds);
    }
  }
}

// What reduce_binomial relies on from tree.h: the children, sorted by
// relative rank, root subtrees that tile the parent's after itself.
TEST(PatternsRecursive, BinomialChildrenTileTheSubtree) {
  for (int n = 1; n <= 33; ++n) {
    for (int v = 0; v < n; ++v) {
      std::vector<int> kids = p::binomial_children(v, n);
      std::sort(kids.begin(), kids.end());
      int next = v + 1;
      for (auto it = kids.begin(); it != kids.end(); ++it) {
        ASSERT_EQ(*it, next) << "n " << n << " v " << v;
        ASSERT_EQ(p::binomial_parent(*it), v);
        next += p::binomial_subtree_size(*it, n);
      }
      EXPECT_EQ(next, v + p::binomial_subtree_size(v, n));
    }
  }
}

}  // namespace
