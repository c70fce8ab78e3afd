// collectives/shared_rounds.h — what the *_shared algorithms have in common.
//
// These algorithms work directly on the communicator's shared segment
// (transport/shm/host_arena.h) when every rank is on one host: each rank
// copies its input into its own slot, announces it, and then reads the
// others' slots in place, with no message in between. Large operations run
// as several rounds of at most one slot per rank. Cost per round: one or
// two arrivals (a cache line each way) instead of messages, so they win on
// latency; the data is copied in and out of shared memory, where the
// message-based algorithms copy once out of the sender's buffer
// (docs/algorithms.md gives the costs and where each is chosen).
#pragma once

#include <cstddef>

#include "collectives/coll.h"
#include "collectives/patterns/partition.h"

namespace shoal::coll {

// Allreduce and reduce: a piece whose p copies fit here is reduced whole by
// every rank (one arrival) rather than slice by slice (two).
inline constexpr size_t kSharedOnePhaseBytes = 32 << 10;

// The arena, or InvalidArgument naming the collective when there is none
// (a forced *_shared algorithm where the ranks span hosts or shared memory
// is off; every rank sees the same answer, so every rank fails alike).
transport::shm::HostArena& arena_of(Ctx& c, Coll coll);

// dst = srcs[0] (op) srcs[1] (op) ... (op) srcs[n-1], left to right, `len`
// elements; dst may alias srcs[0] exactly. n >= 1.
void reduce_all(const Args& a, char* dst, const char* const* srcs, int n, size_t len);

// Two-phase rounds of allreduce and reduce (`len` elements in every slot):
// reduces this rank's slice, patterns::block(len, p, rank), in place in its
// own slot, its own data first, then the others' in rank order.
patterns::Range reduce_own_slice(Ctx& c, const Args& a, size_t len);
// ... and, after phase 2, copies every rank's reduced slice to `dst`.
void copy_reduced_slices(Ctx& c, const Args& a, size_t len, char* dst);

// Elements of `es` bytes that fit one slot `parts` times (at least 1).
size_t slot_elems(const transport::shm::HostArena& arena, size_t es, size_t parts = 1);

}  // namespace shoal::coll
