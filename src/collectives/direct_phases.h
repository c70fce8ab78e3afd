// collectives/direct_phases.h — reduce-scatter and allgather in one step,
// every rank exchanging with every other rank of a group at once, for ranks
// that share a host (allreduce_direct, reduce_scatter_direct,
// allgather_direct).
//
// On shared memory a large message is read by its receiver straight from
// the sender's buffer, so each rank pulls its slice from all peers in
// parallel and reduces it (every rank reducing its own slice), instead of
// passing partial sums around a ring in size-1 dependent steps. The slice is
// cut into segments of Tuning::segment_bytes, a few in flight at once, so the
// reduction works on cache-resident data while the next segments arrive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/coll.h"
#include "collectives/ring_phases.h"

namespace shoal::coll {

// Equal blocks of `count` elements, block i at i * count (reduce_scatter
// and allgather layouts).
struct EqualBlocks {
  std::vector<size_t> counts, displs;
  EqualBlocks(int n, size_t count);
};

// Rank group[i] owns counts[i] elements at displs[i] of the buffers. Writes
// the reduction over the group of this rank's slice of `in` to `dst`
// (counts[me] elements; may alias this rank's slice of `in`).
// Uses steps [step0, step0 + direct_steps()).
void direct_reduce_scatter(Ctx& c, const RingGroup& g, const Args& a, const char* in,
                           const size_t* counts, const size_t* displs, char* dst, uint32_t step0);
uint32_t direct_steps(Ctx& c, const RingGroup& g, const Args& a, const size_t* counts);

// Sends `mine` (counts[me] elements) to every peer and receives peer i's
// slice at out + displs[i]. Uses step `step0`.
void direct_allgather(Ctx& c, const RingGroup& g, const Args& a, const char* mine,
                      const size_t* counts, const size_t* displs, char* out, uint32_t step0);

}  // namespace shoal::coll
