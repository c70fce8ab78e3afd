// collectives/registry.cc — the list of algorithms and SHOAL_ALGO parsing.
#include "collectives/registry.h"

#include <iterator>
#include <sstream>

#include "collectives/algorithms.h"
#include "shoal/error.h"

namespace shoal::coll {
namespace {

const Algorithm kTable[] = {
    {Coll::kAllreduce, "ring", allreduce_ring},
    {Coll::kAllreduce, "recursive_doubling", allreduce_recursive_doubling},
    {Coll::kAllreduce, "rabenseifner", allreduce_rabenseifner},
    {Coll::kAllreduce, "hierarchical", allreduce_hierarchical},
    {Coll::kAllreduce, "direct", allreduce_direct},
    {Coll::kAllreduce, "shared", allreduce_shared},
    {Coll::kAllreduce, "shared_claim", allreduce_shared_claim},
    {Coll::kBroadcast, "binomial", broadcast_binomial},
    {Coll::kBroadcast, "scatter_allgather", broadcast_scatter_allgather},
    {Coll::kBroadcast, "chain", broadcast_chain},
    {Coll::kBroadcast, "shared", broadcast_shared},
    {Coll::kBroadcast, "shared_cma", broadcast_shared_cma},
    {Coll::kReduce, "binomial", reduce_binomial},
    {Coll::kReduce, "scatter_gather", reduce_scatter_gather},
    {Coll::kReduce, "shared", reduce_shared},
    {Coll::kAllgather, "ring", allgather_ring},
    {Coll::kAllgather, "bruck", allgather_bruck},
    {Coll::kAllgather, "recursive_doubling", allgather_recursive_doubling},
    {Coll::kAllgather, "hierarchical", allgather_hierarchical},
    {Coll::kAllgather, "direct", allgather_direct},
    {Coll::kAllgather, "shared", allgather_shared},
    {Coll::kAllgather, "shared_cma", allgather_shared_cma},
    {Coll::kAllgather, "shared_timed", allgather_shared_timed},
    {Coll::kAllgatherv, "ring", allgatherv_ring},
    {Coll::kReduceScatter, "ring", reduce_scatter_ring},
    {Coll::kReduceScatter, "direct", reduce_scatter_direct},
    {Coll::kReduceScatter, "recursive_halving", reduce_scatter_recursive_halving},
    {Coll::kReduceScatter, "hierarchical", reduce_scatter_hierarchical},
    {Coll::kReduceScatter, "shared", reduce_scatter_shared},
    {Coll::kReduceScatterv, "ring", reduce_scatterv_ring},
    {Coll::kAlltoall, "pairwise", alltoall_pairwise},
    {Coll::kAlltoallv, "pairwise", alltoallv_pairwise},
    {Coll::kGather, "linear", gather_linear},
    {Coll::kGather, "binomial", gather_binomial},
    {Coll::kScatter, "linear", scatter_linear},
    {Coll::kScatter, "binomial", scatter_binomial},
    {Coll::kBarrier, "dissemination", barrier_dissemination},
    {Coll::kBarrier, "shared", barrier_shared},
};

static_assert(std::size(kTable) < 256, "algorithm ids are one byte (Fingerprint::algo)");

}  // namespace

std::vector<const Algorithm*> algorithms(Coll c) {
  std::vector<const Algorithm*> out;
  for (const auto& a : kTable) {
    if (a.coll == c) out.push_back(&a);
  }
  return out;
}

const Algorithm* find_algorithm(Coll c, std::string_view name) {
  for (const auto& a : kTable) {
    if (a.coll == c && a.name == name) return &a;
  }
  return nullptr;
}

uint8_t algorithm_id(const Algorithm& a) { return static_cast<uint8_t>(&a - kTable + 1); }

const Algorithm* algorithm_by_id(uint8_t id) {
  return id >= 1 && id <= std::size(kTable) ? &kTable[id - 1] : nullptr;
}

Overrides Overrides::parse(const std::string& spec) {
  Overrides ov;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos) {
      throw InvalidArgument("SHOAL_ALGO: '" + item + "' is not of the form collective=algorithm");
    }
    std::string cname = item.substr(0, eq), aname = item.substr(eq + 1);
    Coll c;
    if (!parse_coll(cname, &c)) throw InvalidArgument("SHOAL_ALGO: unknown collective '" + cname + "'");
    const Algorithm* a = find_algorithm(c, aname);
    if (!a) {
      std::string known;
      for (auto* k : algorithms(c)) known += (known.empty() ? "" : ", ") + std::string(k->name);
      throw InvalidArgument("SHOAL_ALGO: unknown algorithm '" + aname + "' for " + cname +
                            " (known: " + known + ")");
    }
    ov.by_coll[static_cast<int>(c)] = a;
  }
  return ov;
}

}  // namespace shoal::coll
