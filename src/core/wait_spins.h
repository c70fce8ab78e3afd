// core/wait_spins.h — how the waits of one collective spin: for messages
// (HybridTransport::set_spin) and in the shared arena (HostArena::set_spin).
//
// A caller that runs a collective itself, on a host with a core per rank,
// holds its core for up to kHoldUs when the budget is derived
// (SHOAL_SPIN_US auto): a peer preempted by a bursty neighbour is back
// within a time slice or two, while a core given away, or left by a sleep,
// goes to that neighbour for a slice of its own (bench/results/arena-spin;
// for messages, bench/results/tcp-spin). The arena holds up to
// kHoldMaxBytes per rank, messages up to kMessageHoldMaxBytes: a wait
// through a longer transfer keeps a core from the sender's kernel copies.
// Larger collectives, the executor (which overlaps computation) and a
// crowded host spin for the budget, and in the arena give the core away.
#pragma once

#include <cstddef>

#include "collectives/arena/host_arena.h"

namespace shoal::core {

struct WaitSpins {
  int message_us;  // a message wait's spin (0: the executor never spins on messages)
  int arena_us;
  coll::arena::HostArena::Spin arena;
};

inline constexpr int kHoldUs = 5000;
inline constexpr size_t kHoldMaxBytes = size_t{8} << 20;
inline constexpr size_t kMessageHoldMaxBytes = size_t{4} << 20;

// `bytes`: per rank, as select() weighs them; `spin_us`: the budget
// (derived: `spin_auto`); `crowded`: more ranks here than cores, with the
// budget derived (every wait yields).
inline WaitSpins wait_spins(bool inline_caller, bool crowded, bool spin_auto, int spin_us, size_t bytes) {
  using Spin = coll::arena::HostArena::Spin;
  if (crowded) return {inline_caller ? spin_us : 0, spin_us, Spin::kYield};
  if (!inline_caller) return {0, spin_us, Spin::kShare};
  const bool hold = spin_auto;  // an explicit budget is every wait's spin
  const int message_us = hold && bytes <= kMessageHoldMaxBytes ? kHoldUs : spin_us;
  if (bytes > kHoldMaxBytes) return {message_us, spin_us, Spin::kShare};
  return {message_us, hold ? kHoldUs : spin_us, Spin::kHold};
}

}  // namespace shoal::core
