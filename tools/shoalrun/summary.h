// shoalrun/summary.h — how the launcher describes worker exits and failures.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace shoalrun {

struct WorkerExit {
  int rank = -1;
  int local_rank = -1;
  pid_t pid = 0;
  int exit_code = 0;  // the code, or 128 + signal number
  int signal = 0;     // killed by this signal, else 0

  bool failed() const { return exit_code != 0; }
};

// "exited with code 3" / "was killed by SIGKILL (signal 9)".
std::string describe_exit(const WorkerExit& e);
// "rank 3 (local rank 1, pid 1234)".
std::string describe_worker(const WorkerExit& e);

// The failure summary printed when a local worker failed: who, how, the
// Python exception from its error file (if it wrote one) and the tail of its
// output. Multi-line; each line indented under the first. `headline` starts it
// ("job failed: first failure"; under --fault-tolerance the job goes on).
std::string failure_summary(const WorkerExit& e, int node_rank, const std::string& host,
                            const std::vector<std::string>& tail, const std::string& error_file,
                            const std::string& headline = "job failed: first failure");

// "Type: message" from an error file, or "" when there is none.
std::string error_file_headline(const std::string& error_file);

}  // namespace shoalrun
