// collectives/select.cc — the selection table (documented, with the
// measurements behind each threshold, in docs/algorithms.md).
//
// `bytes` below is the payload per rank: count * element size for
// allreduce/broadcast/reduce, size * count * element size (the whole output)
// for allgather/gather/scatter, and the whole input (the same) for
// reduce_scatter.
#include "collectives/patterns/recursive.h"
#include "collectives/registry.h"
#include "shoal/error.h"

namespace shoal::coll {
namespace {

constexpr size_t KiB = 1024;

const Algorithm& must(Coll c, std::string_view name) {
  const Algorithm* a = find_algorithm(c, name);
  if (!a) throw InternalError("selection table names a missing algorithm");
  return *a;
}

}  // namespace

const Algorithm& select(Coll c, const Args& a, int size, const Overrides& ov, const Topology& topo,
                        ArenaCaps arena) {
  if (const Algorithm* forced = ov.by_coll[static_cast<int>(c)]) return *forced;
  const size_t elem = a.elem();
  // Every rank on this host: shared memory, where pulling from all peers at
  // once beats passing around a ring.
  const bool one_host = topo.nhosts() == 1;
  // Several hosts with the same number of ranks each, more than one per host.
  const bool two_level = patterns::two_level(topo, size);
  // One copy instead of two, for a second arrival and a system call per
  // peer; ranks that take turns on the cores pay for the arrival in context
  // switches (bench/results/shared-cma).
  const bool single_copy = arena.reads && !arena.crowded;
  switch (c) {
    case Coll::kAllreduce: {
      const size_t bytes = weighed_bytes(c, a, size);
      if (single_copy && bytes >= 128 * KiB) return must(c, "shared_claim");
      // Ranks that take turns on the cores: a slot round waits for its
      // share from whichever rank is not running, while claimed pieces go
      // to the ranks that are. 4 ranks on 2 cores beside a core of bursty
      // load: 0.65-0.85x the slots' time from 4 MiB; quiet, 0.88-1.09x;
      // below 2 MiB slower either way (bench/results/shared-claim).
      if (arena.reads && arena.crowded && bytes >= 4096 * KiB) return must(c, "shared_claim");
      if (arena.present) return must(c, "shared");
      if (bytes <= 16 * KiB) return must(c, "recursive_doubling");
      if (two_level && bytes > 256 * KiB) return must(c, "hierarchical");
      if (one_host && size > 2 && bytes > 256 * KiB) return must(c, "direct");
      if (bytes <= 256 * KiB && size > 2) return must(c, "rabenseifner");
      return must(c, "ring");
    }
    case Coll::kBroadcast: {
      const size_t bytes = weighed_bytes(c, a, size);
      if (single_copy && bytes >= 64 * KiB && bytes <= 256 * KiB) return must(c, "shared_cma");
      if (arena.present) return must(c, "shared");
      if (size <= 2 || bytes <= 256 * KiB) return must(c, "binomial");
      if (bytes <= 8192 * KiB) return must(c, "scatter_allgather");
      return must(c, "chain");
    }
    case Coll::kReduce: {
      const size_t bytes = weighed_bytes(c, a, size);
      if (arena.present) return must(c, "shared");
      if (size <= 2 || bytes <= 256 * KiB) return must(c, "binomial");
      return must(c, "scatter_gather");
    }
    case Coll::kAllgather: {
      const size_t bytes = weighed_bytes(c, a, size);
      // A block that pays for a system call: one copy or two, whichever
      // rank 0 measures faster (arena/copy_choice.h).
      if (single_copy && a.count * elem >= 32 * KiB) return must(c, "shared_timed");
      if (arena.present) return must(c, "shared");
      if (bytes <= 64 * KiB && size > 2) {
        // Same steps and bytes; recursive doubling needs no scratch or final
        // rotation, and its first steps stay inside a host.
        return must(c, patterns::is_pow2(size) ? "recursive_doubling" : "bruck");
      }
      if (two_level) return must(c, "hierarchical");
      if (one_host && size > 2) return must(c, "direct");
      return must(c, "ring");
    }
    case Coll::kGather:
    case Coll::kScatter: {
      const size_t bytes = weighed_bytes(c, a, size);
      if (bytes <= 64 * KiB && size > 2) return must(c, "binomial");
      return must(c, "linear");
    }
    case Coll::kAllgatherv: return must(c, "ring");
    case Coll::kReduceScatter: {
      const size_t bytes = weighed_bytes(c, a, size);  // the whole input
      if (arena.present) return must(c, "shared");
      if (one_host && size > 2) return must(c, "direct");
      if (size > 2 && patterns::is_pow2(size) && bytes <= 512 * KiB) {
        return must(c, "recursive_halving");
      }
      if (two_level) return must(c, "hierarchical");
      return must(c, "ring");
    }
    case Coll::kReduceScatterv: return must(c, "ring");
    case Coll::kAlltoall: return must(c, "pairwise");
    case Coll::kAlltoallv: return must(c, "pairwise");
    case Coll::kBarrier: return must(c, arena.present ? "shared" : "dissemination");
    default: break;
  }
  throw InternalError("no algorithm for collective " + std::string(coll_name(c)));
}

}  // namespace shoal::coll
