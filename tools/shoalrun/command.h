// shoalrun/command.h — what each worker runs, and with which environment.
//
// Python workers run through the bootstrap shoalrun_boot.py (installed in
// <prefix>/share/shoalrun next to <prefix>/bin/shoalrun), which runs the
// script with runpy (or the module for -m) and writes an uncaught exception
// to $SHOAL_ERROR_FILE. The interpreter is $SHOAL_PYTHON, else the python3
// beside the shoalrun that was invoked (a venv's bin/), else python3 on PATH.
// With --no-python the command runs as is.
#pragma once

#include <string>
#include <vector>

#include "cli.h"
#include "cluster.h"
#include "common/auth.h"
#include "process.h"

namespace shoalrun {

struct WorkerCommand {
  std::string path;               // executable
  std::vector<std::string> argv;  // full argv, argv[0] included
  std::string describe;           // for --verbose
};

// Throws UsageError for a missing script, command or interpreter.
WorkerCommand build_command(const Options& o, const char* argv0);

struct WorkerPlace {
  int rank = 0;
  int local_rank = 0;
  int restart_count = 0;
  std::string error_file;
};

// The launcher's environment plus RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
// SHOAL_RESTART_COUNT, SHOAL_ERROR_FILE, SHOAL_SECRET (the job's secret, hex),
// torchrun's GROUP_WORLD_SIZE, ROLE_NAME, ROLE_RANK, ROLE_WORLD_SIZE,
// TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID,
// TORCHELASTIC_USE_AGENT_STORE (False: the workers' store is their own) and
// TORCHELASTIC_ERROR_FILE (= SHOAL_ERROR_FILE), and (when set)
// OMP_NUM_THREADS. --local-addr becomes SHOAL_ADVERTISE_ADDR unless that is
// set; --virtual-local-rank sets LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES to the
// worker's own entry of the launcher's list (or its local rank).
std::vector<std::string> worker_env(const Cluster& c, const Options& o, const WorkerPlace& w,
                                    const std::string& omp_threads, const std::string& secret_hex);

// --virtual-local-rank: the CUDA_VISIBLE_DEVICES of local rank `l`. Throws
// UsageError when the launcher's list has no entry for it.
std::string virtual_device(int local_rank);

// The job's secret as the user gave it: --secret-file, else SHOAL_SECRET,
// else none (empty). Throws UsageError when it is unreadable or malformed.
shoal::auth::Secret given_secret(const Options& o);

// OMP_NUM_THREADS for the workers: "" when the user set it, else cores /
// local workers (at least 1); logged once by the caller.
std::string default_omp_threads(const Cluster& c);

}  // namespace shoalrun
