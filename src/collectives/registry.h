// collectives/registry.h — the table of algorithms and the selection rule.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "collectives/coll.h"

namespace shoal::coll {

struct Algorithm {
  Coll coll;
  std::string_view name;
  AlgoFn fn;
};

// All algorithms of `c`, in table order.
std::vector<const Algorithm*> algorithms(Coll c);
const Algorithm* find_algorithm(Coll c, std::string_view name);

// Per-collective overrides parsed from "allreduce=ring,broadcast=chain"
// (SHOAL_ALGO or the communicator's options). Throws InvalidArgument naming
// the unknown collective or algorithm.
struct Overrides {
  const Algorithm* by_coll[kNumColls] = {};
  static Overrides parse(const std::string& spec);
};

// The default choice for a collective of `bytes` (the per-rank payload as
// documented in docs/algorithms.md) on `size` ranks: the selection table.
// `arena`: every rank has the communicator's shared segment (Ctx::arena()).
const Algorithm& select(Coll c, const Args& a, int size, const Overrides& ov, const Topology& topo,
                        bool arena);

}  // namespace shoal::coll
