// shoal-perf: the per-collective setup, run and check (perf_ops.cc).
#pragma once

#include <string>
#include <vector>

#include "shoal/communicator.h"

namespace shoal::perf {

struct Config {
  std::string op = "allreduce";
  size_t min_bytes = 8, max_bytes = 256u << 20;
  int factor = 2;
  DataType dtype = DataType::kFloat32;
  ReduceOp redop = ReduceOp::kSum;
  int root = 0;
  int iters = 20, warmup = 5;
  bool check = false, inplace = false, json = false;
  bool queued = false;  // hand every operation to the executor (no blocking fast path)
  bool barrier = false;  // an untimed barrier before each timed iteration (the peers' rule)
  bool touch = false;    // untimed, before each timed iteration: rewrite the input, read the output
  std::string algo;
};

std::vector<std::string> op_names();
// Runs the sweep on this rank; rank 0 prints. Returns the process exit code.
int run(Communicator& comm, const Config& cfg);

}  // namespace shoal::perf
