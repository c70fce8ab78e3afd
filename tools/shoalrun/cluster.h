// shoalrun/cluster.h — where this node sits in the job: the cluster description.
//
// Sources, first match wins (resolve_cluster):
//   1. flags      --nnodes / --node-rank / --standalone given
//   2. sagemaker  SM_HOSTS + SM_CURRENT_HOST, or resourceconfig.json
//   3. slurm      SLURM_NODEID + SLURM_NNODES + SLURM_JOB_NODELIST
//   4. openmpi    OMPI_COMM_WORLD_RANK + OMPI_COMM_WORLD_SIZE (one shoalrun per node)
//   5. local      one node
// --master-addr, --master-port and --nproc-per-node then override single fields
// of whichever source matched. Then the rendezvous of the launchers is
// planned (static: node 0 hosts it; c10d: the launcher on the endpoint's
// host, node ranks assigned there), and a multi-node job whose other
// launchers would look for this node's peers on loopback is refused.
// Every function throws UsageError on bad input.
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
  std::string master_origin;       // the variable it came from, for messages
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
  int nnodes = 1;      // c10d: MIN until the rendezvous says how many came
  int max_nnodes = 1;  // MAX of an elastic (c10d) job; else nnodes
  int node_rank = 0;   // c10d: -1 until the rendezvous assigns it
  int nproc_per_node = 1;
  std::string nproc_detail;
  std::string master_addr = "127.0.0.1";  // the workers' MASTER_ADDR (c10d: from the rendezvous)
  std::string master_origin;              // where it came from, for messages
  int master_port = 29500;
  std::string master_port_detail;
  bool master_port_given = false;
  std::vector<std::string> hosts;
  std::string node_name;  // this node's name in messages (its host)
  std::vector<std::string> notes;  // said once on stderr before the job starts

  // The launchers' rendezvous (multi-node only).
  std::string backend = "static";  // static or c10d
  std::string store_host;          // where the launchers' store is
  int rdzv_port = 0;               // its port
  std::string store_origin;        // the flag or variable that named it
  bool host_store = false;         // this launcher hosts it
  bool host_by_guess = false;      // c10d, by address: a client instead when the port is taken
  std::string advertise;           // c10d: the workers' MASTER_ADDR when this node hosts

  bool multi_node() const { return max_nnodes > 1; }
  bool c10d() const { return backend == "c10d"; }
  int world_size() const { return nnodes * nproc_per_node; }
};

Cluster resolve_cluster(const Options& o);
// The launchers' rendezvous of a multi-node job: where the store is, who hosts
// it, and the loopback check (rendezvous_plan.cc). Called by resolve_cluster.
void plan_rendezvous(const Options& o, Cluster* c);

// Helpers shared by the sources.
std::optional<std::string> env_str(const char* name);  // set and non-empty
int parse_int(const std::string& text, const std::string& what);  // throws UsageError
int gpu_count();  // CUDA_VISIBLE_DEVICES entries, else /dev/nvidiaN devices
int cpu_count();  // CPUs this process may run on

}  // namespace shoalrun
