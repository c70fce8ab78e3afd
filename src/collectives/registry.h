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
// A small number for each algorithm (1 and up; carried in the operation's
// Fingerprint, so that ranks running different algorithms for one
// operation meet as a mismatch), and back (null for an unknown id).
uint8_t algorithm_id(const Algorithm& a);
const Algorithm* algorithm_by_id(uint8_t id);

// Per-collective overrides parsed from "allreduce=ring,broadcast=chain"
// (SHOAL_ALGO or the communicator's options). Throws InvalidArgument naming
// the unknown collective or algorithm.
struct Overrides {
  const Algorithm* by_coll[kNumColls] = {};
  static Overrides parse(const std::string& spec);
};

// The default choice for a collective of `bytes` (the per-rank payload as
// documented in docs/algorithms.md) on `size` ranks: the selection table.
// What the communicator's shared segment offers (Ctx::arena()); every rank
// sees the same.
struct ArenaCaps {
  bool present = false;  // every rank has it
  bool reads = false;    // and single-copy reads (HostArena::reads)
  bool crowded = false;  // more ranks on this host than cores (they take turns)
};
const Algorithm& select(Coll c, const Args& a, int size, const Overrides& ov, const Topology& topo,
                        ArenaCaps arena);

}  // namespace shoal::coll
