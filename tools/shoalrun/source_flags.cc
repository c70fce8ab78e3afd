// shoalrun/source_flags.cc — the cluster description from torchrun-style flags.
// Flags are the source when --nnodes, --node-rank or --standalone is given;
// --master-addr, --master-port and --nproc-per-node alone only override single
// fields of whichever source matched (see resolve_cluster).
#include "cluster.h"

namespace shoalrun {

std::optional<SourceResult> source_from_flags(const Options& o) {
  if (!o.nnodes && !o.node_rank && !o.standalone) return std::nullopt;
  SourceResult r;
  r.name = "flags";
  if (o.standalone) {
    if (o.nnodes && *o.nnodes != 1) throw UsageError("--standalone runs one node; it cannot be combined with --nnodes " +
                                                    std::to_string(*o.nnodes));
    if (o.node_rank && *o.node_rank != 0) {
      throw UsageError("--standalone runs one node; --node-rank must be 0");
    }
    r.detail = "--standalone";
    return r;
  }
  r.nnodes = o.nnodes.value_or(1);
  r.node_rank = o.node_rank.value_or(0);
  r.detail = "--nnodes " + std::to_string(r.nnodes) + " --node-rank " + std::to_string(r.node_rank);
  if (o.nnodes && *o.nnodes < 1) throw UsageError("--nnodes must be at least 1 (got " + std::to_string(*o.nnodes) + ")");
  if (r.node_rank < 0 || r.node_rank >= r.nnodes) {
    throw UsageError("--node-rank " + std::to_string(r.node_rank) + " is out of range for --nnodes " +
                     std::to_string(r.nnodes) + " (0 .. " + std::to_string(r.nnodes - 1) + ")");
  }
  return r;
}

}  // namespace shoalrun
