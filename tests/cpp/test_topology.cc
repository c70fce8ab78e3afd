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
#include "core/host_table.h"
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

TEST(HostTable, RoundTrip) {
  const std::vector<std::string> ids = {"h1", "h0", "h1", "h2", "h0"};
  const std::string t = core::encode_host_table(ids);
  EXPECT_EQ(t, "h1 h0 h2\n0 1 0 2 1");
  EXPECT_EQ(core::decode_host_table(t, 5), ids);
  EXPECT_EQ(core::decode_host_table(core::encode_host_table({"x"}), 1), std::vector<std::string>{"x"});
  // Consecutive ranks of a host take one run.
  const std::vector<std::string> blocks = {"a", "a", "a", "b", "b", "a", "c", "c"};
  EXPECT_EQ(core::encode_host_table(blocks), "a b c\n0*3 1*2 0 2*2");
  EXPECT_EQ(core::decode_host_table("a b c\n0*3 1*2 0 2*2", 8), blocks);
}

TEST(HostTable, MalformedTablesAreRefused) {
  EXPECT_THROW(core::decode_host_table("h0 h1", 2), InternalError);        // no ranks line
  EXPECT_THROW(core::decode_host_table("h0 h1\n0 1", 3), InternalError);   // too few ranks
  EXPECT_THROW(core::decode_host_table("h0 h1\n0 2", 2), InternalError);   // no host 2
  EXPECT_THROW(core::decode_host_table("h0 h1\n0 x", 2), InternalError);   // not a number
  EXPECT_THROW(core::decode_host_table("h0\n0 -1", 2), InternalError);
  EXPECT_THROW(core::decode_host_table("h0\n0*3", 2), InternalError);    // too many ranks
  EXPECT_THROW(core::decode_host_table("h0\n0*0 0*2", 2), InternalError);  // an empty run
  EXPECT_THROW(core::decode_host_table("h0\n0*", 1), InternalError);
  EXPECT_THROW(core::decode_host_table("h0\n0x", 1), InternalError);
}

TEST(HostTable, TheLastRankToJoinPublishesIt) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.is_server = true;
  TcpStore store(o);
  auto addr = [](int r, const std::string& host) {
    return "127.0.0.1 " + std::to_string(1000 + r) + " node" + std::to_string(r) + " " + host + " pid:1";
  };
  const std::vector<std::string> hosts = {"hA", "hB", "hA"};
  for (int r : {2, 0, 1}) {  // (joining order is free)
    EXPECT_FALSE(store.check({"hosts"}));
    store.set_str("addr/" + std::to_string(10 + r), addr(r, hosts[static_cast<size_t>(r)]));
    core::join_host_table(store, 3, store, [](int i) { return 10 + i; });
  }
  EXPECT_EQ(core::read_host_table(store, 3), hosts);
  EXPECT_THROW(core::read_host_table(store, 4), InternalError);
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

// Rank `me`'s communicator with rank r on fake host host_of[r] and the given
// algorithm overrides.
std::shared_ptr<Communicator> on_fake_host(const std::shared_ptr<Store>& store, int me, int n,
                                           const std::vector<int>& host_of, const std::string& algorithms) {
  setenv("SHOAL_HOST_ID", ("fake-host-" + std::to_string(host_of[static_cast<size_t>(me)])).c_str(), 1);
  Options o;
  o.name = "topo";
  o.algorithms = algorithms;
  return Communicator::create(store, me, n, o);
}

// `hosts` fake hosts: rank r is on host host_of(r). Every rank checks an
// allreduce of known values with the given algorithm ("" = the table's choice).
void check_allreduce(int n, std::vector<int> host_of, const std::string& algo) {
  test::JobOptions jo;
  jo.create_comm = false;
  auto res = run_ranks(n, [&](std::shared_ptr<Communicator>&, int me, int, const std::shared_ptr<Store>& store) {
    auto c = on_fake_host(store, me, n, host_of, algo.empty() ? "" : "allreduce=" + algo);
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

// The same for allgather and reduce_scatter (int32 sum, and float32 max for
// reduce_scatter), out of place and, for allgather, in place, with the given
// algorithms ("" = the table's choice).
void check_gather_scatter(int n, std::vector<int> host_of, const std::string& ag, const std::string& rs) {
  test::JobOptions jo;
  jo.create_comm = false;
  auto res = run_ranks(n, [&](std::shared_ptr<Communicator>&, int me, int, const std::shared_ptr<Store>& store) {
    std::string algorithms;
    if (!ag.empty()) algorithms += "allgather=" + ag;
    if (!rs.empty()) algorithms += (algorithms.empty() ? "reduce_scatter=" : ",reduce_scatter=") + rs;
    auto c = on_fake_host(store, me, n, host_of, algorithms);
    const size_t p = static_cast<size_t>(n);
    auto val = [](size_t r, size_t i) { return static_cast<int32_t>((i * 7 + r * 11) % 1000); };
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{65537}, (size_t{1} << 18) + 3}) {
      for (bool in_place : {false, true}) {
        std::vector<int32_t> mine(count), all(count * p, -7);
        for (size_t i = 0; i < count; ++i) mine[i] = val(static_cast<size_t>(me), i);
        const int32_t* src = mine.data();
        if (in_place) {
          std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(count * static_cast<size_t>(me)));
          src = all.data() + count * static_cast<size_t>(me);
        }
        c->allgather(src, all.data(), count, DataType::kInt32)->wait();
        size_t bad = 0;
        for (size_t r = 0; r < p; ++r)
          for (size_t i = 0; i < count; ++i) bad += all[r * count + i] != val(r, i);
        SHOAL_CHECK_MSG(bad == 0, "allgather count " << count << " in_place " << in_place << ": " << bad << " wrong");
      }
      // reduce_scatter: element k of rank r's input is val(r, k); rank me gets block me.
      std::vector<int32_t> full(count * p), got(count, -7);
      for (size_t k = 0; k < full.size(); ++k) full[k] = val(static_cast<size_t>(me), k);
      c->reduce_scatter(full.data(), got.data(), count, DataType::kInt32, ReduceOp::kSum)->wait();
      size_t bad = 0;
      for (size_t i = 0; i < count; ++i) {
        int64_t want = 0;
        for (size_t r = 0; r < p; ++r) want += val(r, static_cast<size_t>(me) * count + i);
        bad += got[i] != want;
      }
      SHOAL_CHECK_MSG(bad == 0, "reduce_scatter sum count " << count << ": " << bad << " wrong");
      std::vector<float> ff(count * p), fg(count, -1.0f);
      for (size_t k = 0; k < ff.size(); ++k) ff[k] = static_cast<float>((k + static_cast<size_t>(me) * 3) % 17);
      c->reduce_scatter(ff.data(), fg.data(), count, DataType::kFloat32, ReduceOp::kMax)->wait();
      bad = 0;
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        const size_t k = static_cast<size_t>(me) * count + i;
        for (size_t r = 0; r < p; ++r) want = std::max(want, static_cast<float>((k + r * 3) % 17));
        bad += fg[i] != want;
      }
      SHOAL_CHECK_MSG(bad == 0, "reduce_scatter max count " << count << ": " << bad << " wrong");
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

TEST(Topology, GatherScatterHierarchicalTwoHostsOfTwo) {
  check_gather_scatter(4, {0, 0, 1, 1}, "hierarchical", "hierarchical");
}
TEST(Topology, GatherScatterHierarchicalInterleaved) {
  check_gather_scatter(6, {0, 1, 2, 0, 1, 2}, "hierarchical", "hierarchical");
}
TEST(Topology, GatherScatterHierarchicalTwoHostsOfThree) {
  check_gather_scatter(6, {0, 0, 0, 1, 1, 1}, "hierarchical", "hierarchical");
}
TEST(Topology, GatherScatterHierarchicalFallsBack) {
  check_gather_scatter(5, {0, 0, 0, 1, 1}, "hierarchical", "hierarchical");  // uneven hosts: the ring
  check_gather_scatter(2, {0, 1}, "hierarchical", "hierarchical");           // one rank per host: the ring
}
TEST(Topology, GatherScatterRecursiveAcrossHosts) {
  check_gather_scatter(4, {0, 0, 1, 1}, "recursive_doubling", "recursive_halving");
  check_gather_scatter(4, {0, 1, 0, 1}, "recursive_doubling", "recursive_halving");
}
TEST(Topology, GatherScatterTableChoiceAcrossHosts) { check_gather_scatter(4, {0, 0, 1, 1}, "", ""); }

}  // namespace
}  // namespace shoal
