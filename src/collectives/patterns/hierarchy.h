// collectives/patterns/hierarchy.h — which ranks share a host: the topology
// topology-aware algorithms are built on. Pure functions; unit-tested in
// tests/cpp/test_patterns_hierarchy.cc.
#pragma once

#include <string>
#include <vector>

namespace shoal::coll {

struct Topology {
  std::vector<int> host_of;             // rank -> host index
  std::vector<std::vector<int>> hosts;  // host -> its ranks, ascending
  std::vector<int> local_index;         // rank -> position within its host

  int nhosts() const { return static_cast<int>(hosts.size()); }
  int local_size(int rank) const { return static_cast<int>(hosts[host_of[rank]].size()); }
  // Every host runs the same number of ranks.
  bool uniform() const {
    for (const auto& h : hosts) {
      if (h.size() != hosts[0].size()) return false;
    }
    return true;
  }
  // More than one host, and some host with more than one rank.
  bool hierarchical() const {
    return nhosts() > 1 && nhosts() < static_cast<int>(host_of.size());
  }
};

namespace patterns {

// Hosts are numbered in the order of their lowest rank, so every rank
// computes the same topology from the same list of host identities.
inline Topology make_topology(const std::vector<std::string>& host_ids) {
  Topology t;
  const int n = static_cast<int>(host_ids.size());
  t.host_of.assign(static_cast<size_t>(n), -1);
  t.local_index.assign(static_cast<size_t>(n), 0);
  for (int r = 0; r < n; ++r) {
    int h = -1;
    for (int k = 0; k < t.nhosts(); ++k) {
      if (host_ids[static_cast<size_t>(t.hosts[static_cast<size_t>(k)][0])] == host_ids[static_cast<size_t>(r)]) {
        h = k;
        break;
      }
    }
    if (h < 0) {
      h = t.nhosts();
      t.hosts.emplace_back();
    }
    t.host_of[static_cast<size_t>(r)] = h;
    t.local_index[static_cast<size_t>(r)] = static_cast<int>(t.hosts[static_cast<size_t>(h)].size());
    t.hosts[static_cast<size_t>(h)].push_back(r);
  }
  return t;
}

// The ranks with local index `j` on every host, in host order (defined when
// the topology is uniform).
inline std::vector<int> peers_across_hosts(const Topology& t, int j) {
  std::vector<int> out;
  for (const auto& h : t.hosts) out.push_back(h[static_cast<size_t>(j)]);
  return out;
}

// Where a rank sits: its host, its index there, its host's ranks, and the
// ranks with the same index on every host (peers_across_hosts).
struct Place {
  int host = 0;
  int index = 0;
  std::vector<int> local;
  std::vector<int> across;
};

inline Place place_of(const Topology& t, int rank) {
  Place p;
  p.host = t.host_of[static_cast<size_t>(rank)];
  p.index = t.local_index[static_cast<size_t>(rank)];
  p.local = t.hosts[static_cast<size_t>(p.host)];
  p.across = peers_across_hosts(t, p.index);
  return p;
}

// The two-level algorithms apply: `size` ranks on several hosts with the
// same number each, more than one per host.
inline bool two_level(const Topology& t, int size) {
  return t.host_of.size() == static_cast<size_t>(size) && t.uniform() && t.hierarchical();
}

}  // namespace patterns
}  // namespace shoal::coll
