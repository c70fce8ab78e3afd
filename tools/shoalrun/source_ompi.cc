// shoalrun/source_ompi.cc — the cluster description when mpirun starts one
// shoalrun per node (mpirun --map-by ppr:1:node shoalrun ...):
// OMPI_COMM_WORLD_RANK is the node rank, OMPI_COMM_WORLD_SIZE the node count.
// Open MPI does not say where rank 0 runs, so a multi-node job needs
// --master-addr (or MASTER_ADDR exported to every node with mpirun -x).
#include "cluster.h"

namespace shoalrun {

std::optional<SourceResult> source_from_ompi(const Options& o) {
  const auto rank = env_str("OMPI_COMM_WORLD_RANK");
  const auto size = env_str("OMPI_COMM_WORLD_SIZE");
  if (!rank || !size) return std::nullopt;
  SourceResult r;
  r.name = "openmpi";
  r.detail = "OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE";
  r.nnodes = parse_int(*size, "OMPI_COMM_WORLD_SIZE");
  r.node_rank = parse_int(*rank, "OMPI_COMM_WORLD_RANK");
  if (const auto local = env_str("OMPI_COMM_WORLD_LOCAL_SIZE")) {
    const int n = parse_int(*local, "OMPI_COMM_WORLD_LOCAL_SIZE");
    if (n > 1 && r.nnodes > 1) {
      throw UsageError("mpirun started " + *local +
                       " shoalruns on this node; start one per node (mpirun --map-by ppr:1:node)");
    }
  }
  if (r.nnodes > 1 && !o.master_addr) {
    if (const auto m = env_str("MASTER_ADDR")) {
      r.master_addr = *m;
      r.master_origin = "MASTER_ADDR";
      r.detail += ", MASTER_ADDR";
    } else {
      throw UsageError("Open MPI does not say where node 0 is: pass --master-addr (or mpirun -x MASTER_ADDR=...)");
    }
  }
  return r;
}

}  // namespace shoalrun
