// collectives/algorithms.h — every algorithm, one function per file
// (<collective>_<algorithm>.cc). The registry (registry.cc) lists them and
// select.cc chooses among them.
#pragma once

#include "collectives/coll.h"

namespace shoal::coll {

void allreduce_ring(Ctx& c, const Args& a);
void allreduce_recursive_doubling(Ctx& c, const Args& a);
void allreduce_rabenseifner(Ctx& c, const Args& a);
void allreduce_hierarchical(Ctx& c, const Args& a);
void allreduce_direct(Ctx& c, const Args& a);
void allreduce_shared(Ctx& c, const Args& a);
void allreduce_shared_claim(Ctx& c, const Args& a);

void broadcast_binomial(Ctx& c, const Args& a);
void broadcast_scatter_allgather(Ctx& c, const Args& a);
void broadcast_chain(Ctx& c, const Args& a);
void broadcast_shared(Ctx& c, const Args& a);
void broadcast_shared_cma(Ctx& c, const Args& a);

void reduce_binomial(Ctx& c, const Args& a);
void reduce_scatter_gather(Ctx& c, const Args& a);
void reduce_shared(Ctx& c, const Args& a);

void allgather_ring(Ctx& c, const Args& a);
void allgather_bruck(Ctx& c, const Args& a);
void allgather_recursive_doubling(Ctx& c, const Args& a);
void allgather_hierarchical(Ctx& c, const Args& a);
void allgather_direct(Ctx& c, const Args& a);
void allgather_shared(Ctx& c, const Args& a);
void allgather_shared_cma(Ctx& c, const Args& a);
void allgather_shared_timed(Ctx& c, const Args& a);
void allgatherv_ring(Ctx& c, const Args& a);

void reduce_scatter_ring(Ctx& c, const Args& a);
void reduce_scatter_direct(Ctx& c, const Args& a);
void reduce_scatter_recursive_halving(Ctx& c, const Args& a);
void reduce_scatter_hierarchical(Ctx& c, const Args& a);
void reduce_scatter_shared(Ctx& c, const Args& a);
void reduce_scatterv_ring(Ctx& c, const Args& a);

void alltoall_pairwise(Ctx& c, const Args& a);
void alltoallv_pairwise(Ctx& c, const Args& a);

void gather_linear(Ctx& c, const Args& a);
void gather_binomial(Ctx& c, const Args& a);
void scatter_linear(Ctx& c, const Args& a);
void scatter_binomial(Ctx& c, const Args& a);

void barrier_dissemination(Ctx& c, const Args& a);
void barrier_shared(Ctx& c, const Args& a);

}  // namespace shoal::coll
