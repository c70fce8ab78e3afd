// tests/cpp/arena_util.h — one shared arena mapped by every rank of a
// communicator, all in this process (the ranks on threads, or none at all):
// for tests of HostArena itself, without a communicator around it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/arena/host_arena.h"

namespace shoal::test {

// Rank 0 makes the arena of job `job` for `n` ranks (slots of `slot_bytes`),
// ranks 1..n-1 attach to it. Empty, with `why`, when either fails.
inline std::vector<std::unique_ptr<coll::arena::HostArena>> arenas(int n, uint64_t job, std::string* why,
                                                                    size_t slot_bytes = 4096) {
  using coll::arena::HostArena;
  std::vector<std::unique_ptr<HostArena>> out;
  out.push_back(HostArena::create(0, n, job, slot_bytes, why));
  if (!out[0]) return {};
  for (int r = 1; r < n; ++r) {
    out.push_back(HostArena::attach(r, n, job, out[0]->where(), why));
    if (!out.back()) return {};
  }
  return out;
}

}  // namespace shoal::test
