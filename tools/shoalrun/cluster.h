// shoalrun/cluster.h — where this node sits in the job: the cluster description.
//
// Sources, first match wins (resolve_cluster):
//   1. flags      --nnodes / --node-rank / --standalone given
//   2. sagemaker  SM_HOSTS + SM_CURRENT_HOST, or resourceconfig.json
//   3. slurm      SLURM_NODEID + SLURM_NNODES + SLURM_JOB_NODELIST
//   4. openmpi    OMPI_COMM_WORLD_RANK + OMPI_COMM_WORLD_SIZE (one shoalrun per node)
//   5. local      one node
// --master-addr, --master-port and --nproc-per-node then override single fields
// of whichever source matched. Every function throws UsageError on bad input.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cli.h"

namespace shoalrun {

// What one source says. Unset fields fall back to the defaults.
struct SourceResult {
  std::string name;    // "flags", "sagemaker", "slurm", "openmpi", "local"
  std::string detail;  // the variables or file it came from, for --verbose
  int nnodes = 1;
  int node_rank = 0;
  std::optional<std::string> master_addr;
  std::vector<std::string> hosts;  // host of each node rank, when the source lists them
  std::optional<int> nproc_per_node;
  std::string nproc_detail;
};

std::optional<SourceResult> source_from_flags(const Options& o);
std::optional<SourceResult> source_from_sagemaker();
std::optional<SourceResult> source_from_slurm();
std::optional<SourceResult> source_from_ompi(const Options& o);

// Expands Slurm's compressed host list ("node[01-04,07],gpu-a[1-2]-ib") in
// order, keeping zero padding; never calls scontrol.
std::vector<std::string> expand_slurm_nodelist(const std::string& list);

struct Cluster {
  std::string source;
  std::string source_detail;
  int nnodes = 1;
  int node_rank = 0;
  int nproc_per_node = 1;
  std::string nproc_detail;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string master_port_detail;
  int rdzv_port = 0;  // the launchers' store on node 0 (multi-node only)
  std::vector<std::string> hosts;
  std::string node_name;  // this node's name in messages (its host)

  int world_size() const { return nnodes * nproc_per_node; }
};

Cluster resolve_cluster(const Options& o);

// Helpers shared by the sources.
std::optional<std::string> env_str(const char* name);  // set and non-empty
int parse_int(const std::string& text, const std::string& what);  // throws UsageError
int gpu_count();  // CUDA_VISIBLE_DEVICES entries, else /dev/nvidiaN devices
int cpu_count();  // CPUs this process may run on

}  // namespace shoalrun
