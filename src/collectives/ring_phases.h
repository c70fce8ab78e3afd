// collectives/ring_phases.h — the two halves of a ring allreduce, over any
// group of ranks and any range of the buffer, for algorithms built from them
// (allreduce_ring, allreduce_hierarchical).
//
// A group is a list of ranks in ring order; this rank is group[me]. The range
// of `count` elements is cut into g = group size blocks (patterns::block).
// Each block is cut into segments of Tuning::segment_bytes: a segment is
// forwarded as soon as it is reduced (or received), so reduction and
// transfer overlap and every step of the ring is in flight at once.
// Steps [step0, step0 + ring_steps(...)) are used; messages to one peer keep
// strictly increasing steps as long as callers give later phases larger
// step0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/coll.h"

namespace shoal::coll {

struct RingGroup {
  const int* ranks = nullptr;  // ring order
  int size = 1;
  int me = 0;                  // index of this rank in `ranks`
};

// 0, 1, ..., n-1: the whole communicator as a group.
std::vector<int> all_ranks(int n);

// Steps one phase over `count` elements uses.
uint32_t ring_steps(Ctx& c, const RingGroup& g, size_t count, size_t elem);

// Reduce-scatter: afterwards block patterns::rs_owned_block(me, size) of
// `out` holds the reduction of that block over the group. `in` may equal
// `out`; blocks not owned hold partial sums.
void ring_reduce_scatter(Ctx& c, const RingGroup& g, const Args& a, char* out, const char* in,
                         size_t count, uint32_t step0);

// Allgather of the blocks owned after ring_reduce_scatter: afterwards every
// block of `out` holds its owner's data.
void ring_allgather(Ctx& c, const RingGroup& g, const Args& a, char* out, size_t count,
                    uint32_t step0);

// Allreduce: ring_reduce_scatter then ring_allgather, fused: a segment of
// the owned block leaves for the next rank as soon as it is reduced, while it
// is still in this core's cache, instead of after the whole reduce-scatter.
// Uses steps [step0, step0 + 2 * ring_steps(...)); returns that count.
uint32_t ring_allreduce(Ctx& c, const RingGroup& g, const Args& a, char* out, const char* in,
                        size_t count, uint32_t step0);

}  // namespace shoal::coll
