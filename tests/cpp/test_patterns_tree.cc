// test_patterns_tree.cc — the pure rank arithmetic of collectives/patterns:
// binomial trees (tree.h), ring neighbours and blocks (ring.h), partitions
// (partition.h). No transport.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "collectives/patterns/partition.h"
#include "collectives/patterns/ring.h"
#include "collectives/patterns/tree.h"

namespace shoal::coll::patterns {
namespace {

constexpr int kMaxSize = 33;

TEST(Tree, RelativeAbsoluteRoundTrip) {
  for (int n = 1; n <= kMaxSize; ++n) {
    for (int root = 0; root < n; ++root) {
      EXPECT_EQ(to_relative(root, root, n), 0);
      for (int r = 0; r < n; ++r) {
        const int v = to_relative(r, root, n);
        ASSERT_GE(v, 0);
        ASSERT_LT(v, n);
        EXPECT_EQ(to_absolute(v, root, n), r);
      }
    }
  }
}

TEST(Tree, Log2Helpers) {
  EXPECT_EQ(ceil_log2(1), 0);
  EXPECT_EQ(ceil_log2(2), 1);
  EXPECT_EQ(ceil_log2(3), 2);
  EXPECT_EQ(ceil_log2(8), 3);
  EXPECT_EQ(ceil_log2(9), 4);
  EXPECT_EQ(ceil_pow2(1), 1);
  EXPECT_EQ(ceil_pow2(5), 8);
  EXPECT_EQ(ceil_pow2(16), 16);
}

TEST(Tree, SmallExample) {
  // size 6: 0 -> {4, 2, 1}, 2 -> {3}, 4 -> {5}.
  EXPECT_EQ(binomial_children(0, 6), (std::vector<int>{4, 2, 1}));
  EXPECT_EQ(binomial_children(2, 6), (std::vector<int>{3}));
  EXPECT_EQ(binomial_children(4, 6), (std::vector<int>{5}));
  EXPECT_TRUE(binomial_children(1, 6).empty());
  EXPECT_TRUE(binomial_children(5, 6).empty());
  EXPECT_EQ(binomial_subtree_size(0, 6), 6);
  EXPECT_EQ(binomial_subtree_size(4, 6), 2);
  EXPECT_EQ(binomial_subtree_size(2, 6), 2);
  EXPECT_EQ(binomial_parent(5), 4);
  EXPECT_EQ(binomial_parent(0), -1);
  // Root 2 in absolute ranks: relative 4 is rank 0.
  EXPECT_EQ(tree_children(2, 2, 6), (std::vector<int>{0, 4, 3}));
  EXPECT_EQ(tree_parent(1, 2, 6), 0);
  EXPECT_EQ(tree_parent(2, 2, 6), -1);
  // size 5: the truncated far subtree {4} goes after {2, 3}.
  EXPECT_EQ(binomial_children(0, 5), (std::vector<int>{2, 4, 1}));
}

TEST(Tree, EveryNonRootHasOneParentAndTreeIsConnected) {
  for (int n = 1; n <= kMaxSize; ++n) {
    for (int root = 0; root < n; ++root) {
      std::vector<int> parent_count(n, 0);
      for (int r = 0; r < n; ++r) {
        for (int ch : tree_children(r, root, n)) {
          ASSERT_GE(ch, 0);
          ASSERT_LT(ch, n);
          ASSERT_NE(ch, root) << "n=" << n << " root=" << root;
          EXPECT_EQ(tree_parent(ch, root, n), r) << "n=" << n << " root=" << root;
          ++parent_count[ch];
        }
        const int p = tree_parent(r, root, n);
        if (r == root) {
          EXPECT_EQ(p, -1);
        } else {
          ASSERT_GE(p, 0);
          ASSERT_LT(p, n);
          // The child appears in its parent's list.
          auto kids = tree_children(p, root, n);
          EXPECT_NE(std::find(kids.begin(), kids.end(), r), kids.end());
        }
      }
      for (int r = 0; r < n; ++r) EXPECT_EQ(parent_count[r], r == root ? 0 : 1);
      // Reachability from the root, and depth <= ceil(log2 n).
      std::vector<int> depth(n, -1), frontier{root};
      depth[root] = 0;
      while (!frontier.empty()) {
        std::vector<int> next;
        for (int u : frontier) {
          for (int ch : tree_children(u, root, n)) {
            ASSERT_EQ(depth[ch], -1) << "visited twice";
            depth[ch] = depth[u] + 1;
            next.push_back(ch);
          }
        }
        frontier.swap(next);
      }
      for (int r = 0; r < n; ++r) {
        ASSERT_GE(depth[r], 0) << "n=" << n << " root=" << root << " rank " << r << " unreached";
        EXPECT_LE(depth[r], ceil_log2(n));
      }
    }
  }
}

TEST(Tree, SubtreesAreContiguousAndSizesAddUp) {
  for (int n = 1; n <= kMaxSize; ++n) {
    EXPECT_EQ(binomial_subtree_size(0, n), n);
    for (int v = 0; v < n; ++v) {
      const int sz = binomial_subtree_size(v, n);
      ASSERT_GE(sz, 1);
      ASSERT_LE(v + sz, n);
      // In rank order, the children's subtrees tile [v+1, v+sz).
      const std::vector<int> kids = binomial_children(v, n);
      std::vector<int> sorted = kids;
      std::sort(sorted.begin(), sorted.end());
      int sum = 1, expect = v + 1;
      for (int ch : sorted) {
        EXPECT_EQ(ch, expect) << "n=" << n << " v=" << v;
        expect += binomial_subtree_size(ch, n);
        sum += binomial_subtree_size(ch, n);
      }
      EXPECT_EQ(sum, sz) << "n=" << n << " v=" << v;
      EXPECT_EQ(expect, v + sz);
      // Send order: largest subtree first.
      for (size_t j = 1; j < kids.size(); ++j) {
        EXPECT_GE(binomial_subtree_size(kids[j - 1], n), binomial_subtree_size(kids[j], n));
      }
    }
  }
}

TEST(Ring, Neighbours) {
  for (int n = 1; n <= kMaxSize; ++n) {
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(ring_prev(ring_next(r, n), n), r);
      EXPECT_EQ(ring_next(r, n), (r + 1) % n);
    }
  }
  EXPECT_EQ(mod(-1, 5), 4);
  EXPECT_EQ(mod(-11, 5), 4);
  EXPECT_EQ(mod(7, 5), 2);
}

TEST(Ring, ReduceScatterThenAllgatherBlocks) {
  for (int n = 1; n <= kMaxSize; ++n) {
    for (int r = 0; r < n; ++r) {
      for (int s = 0; s + 1 < n; ++s) {
        // What r sends at step s is what its successor receives.
        EXPECT_EQ(rs_send_block(r, n, s), rs_recv_block(ring_next(r, n), n, s));
        EXPECT_EQ(ag_send_block(r, n, s), ag_recv_block(ring_next(r, n), n, s));
        // The block received at step s is sent at step s+1.
        if (s + 2 < n) {
          EXPECT_EQ(rs_recv_block(r, n, s), rs_send_block(r, n, s + 1));
          EXPECT_EQ(ag_recv_block(r, n, s), ag_send_block(r, n, s + 1));
        }
      }
      if (n > 1) {
        // The last reduce-scatter receive completes the owned block, which
        // starts the allgather.
        EXPECT_EQ(rs_recv_block(r, n, n - 2), rs_owned_block(r, n));
        EXPECT_EQ(ag_send_block(r, n, 0), rs_owned_block(r, n));
        // The allgather delivers every block but the owned one exactly once.
        std::vector<int> seen(n, 0);
        for (int s = 0; s + 1 < n; ++s) ++seen[ag_recv_block(r, n, s)];
        for (int b = 0; b < n; ++b) EXPECT_EQ(seen[b], b == rs_owned_block(r, n) ? 0 : 1);
      }
    }
  }
}

TEST(Partition, BlocksTileTheRange) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{64}, size_t{1000003}}) {
    for (int parts = 1; parts <= kMaxSize; ++parts) {
      size_t next = 0, lo = count, hi = 0;
      for (int i = 0; i < parts; ++i) {
        Range b = block(count, parts, i);
        EXPECT_EQ(b.off, next);
        next += b.len;
        lo = std::min(lo, b.len);
        hi = std::max(hi, b.len);
      }
      EXPECT_EQ(next, count);
      EXPECT_LE(hi - std::min(lo, hi), 1u);
      // The larger parts come first.
      EXPECT_EQ(block(count, parts, 0).len, (count + parts - 1) / parts);
    }
  }
}

TEST(Partition, NumSegments) {
  EXPECT_EQ(num_segments(0, 4), 1u);
  EXPECT_EQ(num_segments(1, 4), 1u);
  EXPECT_EQ(num_segments(4, 4), 1u);
  EXPECT_EQ(num_segments(5, 4), 2u);
  EXPECT_EQ(num_segments(9, 0), 1u);
}

}  // namespace
}  // namespace shoal::coll::patterns
