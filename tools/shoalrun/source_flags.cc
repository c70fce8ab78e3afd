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
    if (o.max_nnodes.value_or(1) != 1) {
      throw UsageError(o.named("standalone") + " runs one node; it cannot be combined with " + o.named("nnodes") + " " +
                       std::to_string(*o.max_nnodes));
    }
    if (o.node_rank && *o.node_rank != 0) {
      throw UsageError(o.named("standalone") + " runs one node; " + o.named("node_rank") + " must be 0");
    }
    r.detail = "--standalone";
    return r;
  }
  r.nnodes = o.nnodes.value_or(1);
  r.node_rank = o.node_rank.value_or(0);
  r.detail = o.named("nnodes") + " " + std::to_string(r.nnodes) + " " + o.named("node_rank") + " " +
             std::to_string(r.node_rank);
  if (o.rdzv_backend == "c10d") {  // node ranks are assigned at the rendezvous
    r.node_rank = 0;
    r.detail = o.named("nnodes") + " " + std::to_string(r.nnodes) +
               (o.elastic() ? ":" + std::to_string(*o.max_nnodes) : std::string());
    return r;
  }
  if (r.node_rank < 0 || r.node_rank >= r.nnodes) {
    throw UsageError(o.named("node_rank") + " " + std::to_string(r.node_rank) + " is out of range for " +
                     o.named("nnodes") + " " + std::to_string(r.nnodes) + " (0 .. " + std::to_string(r.nnodes - 1) +
                     ")");
  }
  return r;
}

}  // namespace shoalrun
