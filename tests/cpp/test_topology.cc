// test_topology.cc — which ranks share a host, and the algorithms built on it.
//
// Ranks here all run on one machine; SHOAL_HOST_ID (set per rank before the
// communicator is created) splits them into "hosts", so that ranks of one
// host talk through shared memory and ranks of different hosts over TCP,
// as on a cluster.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "collectives/patterns/hierarchy.h"
#include "harness.h"

namespace shoal {
namespace {

using coll::patterns::make_topology;
using coll::patterns::peers_across_hosts;
using test::run_ranks;

TEST(Hierarchy, HostsNumberedByLowestRank) {
  auto t = make_topology({"b", "a", "b", "c", "a", "c"});
  ASSERT_EQ(t.nhosts(), 3);
  EXPECT_EQ(t.hosts[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(t.hosts[1], (std::vector<int>{1, 4}));
  EXPECT_EQ(t.hosts[2], (std::vector<int>{3, 5}));
  EXPECT_EQ(t.host_of, (std::vector<int>{0, 1, 0, 2, 1, 2}));
  EXPECT_EQ(t.local_index, (std::vector<int>{0, 0, 1, 0, 1, 1}));
  EXPECT_TRUE(t.uniform());
  EXPECT_TRUE(t.hierarchical());
  EXPECT_EQ(peers_across_hosts(t, 1), (std::vector<int>{2, 4, 5}));
}

TEST(Hierarchy, FlatCases) {
  auto one = make_topology({"x", "x", "x"});
  EXPECT_EQ(one.nhosts(), 1);
  EXPECT_FALSE(one.hierarchical());
  auto spread = make_topology({"a", "b", "c"});
  EXPECT_EQ(spread.nhosts(), 3);
  EXPECT_FALSE(spread.hierarchical());  // one rank per host: nothing to share
  auto uneven = make_topology({"a", "a", "a", "b"});
  EXPECT_FALSE(uneven.uniform());
  EXPECT_TRUE(uneven.hierarchical());
  EXPECT_EQ(make_topology({}).nhosts(), 0);
}

// `hosts` fake hosts: rank r is on host host_of(r). Every rank checks an
// allreduce of known values with the given algorithm ("" = the table's choice).
void check_allreduce(int n, std::vector<int> host_of, const std::string& algo) {
  test::JobOptions jo;
  jo.create_comm = false;
  auto res = run_ranks(n, [&](std::shared_ptr<Communicator>&, int me, int, const std::shared_ptr<Store>& store) {
    setenv("SHOAL_HOST_ID", ("fake-host-" + std::to_string(host_of[static_cast<size_t>(me)])).c_str(), 1);
    Options o;
    o.name = "topo";
    o.algorithms = algo.empty() ? "" : "allreduce=" + algo;
    auto c = Communicator::create(store, me, n, o);
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{65537}, (size_t{1} << 20) + 3}) {
      for (bool in_place : {false, true}) {
        std::vector<int32_t> in(count), out(count, -7);
        for (size_t i = 0; i < count; ++i) in[i] = static_cast<int32_t>((i * 13 + static_cast<size_t>(me) * 5) % 1000);
        int32_t* dst = in_place ? in.data() : out.data();
        c->allreduce(in.data(), dst, count, DataType::kInt32, ReduceOp::kSum)->wait();
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < count; ++i) {
          int64_t want = 0;
          for (int r = 0; r < n; ++r) want += static_cast<int64_t>((i * 13 + static_cast<size_t>(r) * 5) % 1000);
          if (dst[i] != want && bad++ == 0) first = i;
        }
        SHOAL_CHECK_MSG(bad == 0, "sum count " << count << " in_place " << in_place << ": " << bad
                                               << " wrong, first at " << first << " = " << dst[first]);
      }
      // A float max as well (a different kernel path).
      std::vector<float> f(count);
      for (size_t i = 0; i < count; ++i) f[i] = static_cast<float>((i + static_cast<size_t>(me) * 3) % 17);
      c->allreduce(f.data(), f.data(), count, DataType::kFloat32, ReduceOp::kMax)->wait();
      size_t bad = 0;
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int r = 0; r < n; ++r) want = std::max(want, static_cast<float>((i + static_cast<size_t>(r) * 3) % 17));
        bad += f[i] != want;
      }
      SHOAL_CHECK_MSG(bad == 0, "max count " << count << ": " << bad << " wrong");
    }
    c->barrier()->wait();
  }, jo);
  EXPECT_EQ(test::failures(res), "");
}

TEST(Topology, HierarchicalTwoHostsOfTwo) { check_allreduce(4, {0, 0, 1, 1}, "hierarchical"); }
TEST(Topology, HierarchicalInterleavedRanks) { check_allreduce(6, {0, 1, 2, 0, 1, 2}, "hierarchical"); }
TEST(Topology, HierarchicalTwoHostsOfThree) { check_allreduce(6, {0, 0, 0, 1, 1, 1}, "hierarchical"); }
// Two hosts of one rank: the pipelined exchange alone (nothing inside a host).
TEST(Topology, HierarchicalTwoHostsOfOne) { check_allreduce(2, {0, 1}, "hierarchical"); }
TEST(Topology, HierarchicalUnevenHostsFallsBack) { check_allreduce(5, {0, 0, 0, 1, 1}, "hierarchical"); }
TEST(Topology, TableChoiceAcrossHosts) { check_allreduce(4, {0, 0, 1, 1}, ""); }
TEST(Topology, RingAcrossHostsMixesTransports) { check_allreduce(4, {0, 1, 0, 1}, "ring"); }

}  // namespace
}  // namespace shoal
