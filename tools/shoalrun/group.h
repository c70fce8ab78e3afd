// shoalrun/group.h — one run of this node's worker group: start every worker,
// multiplex their output, forward signals, and on the first failure stop the
// others (SIGTERM, the grace period, then SIGKILL).
//
// Events come from one poll() loop on the main thread: the launcher's
// signalfd (SIGCHLD and the forwarded signals), the workers' pipes, and an
// optional RemoteEvents source (other nodes' failures, from the rendezvous
// monitor). Nothing else touches the workers while run_group() runs.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fault.h"
#include "output.h"
#include "process.h"
#include "summary.h"

namespace shoalrun {

// A failure reported by another node (or the loss of a node or of the store).
struct RemoteEvent {
  // kAdmit: the coordinator restarts the job to admit launchers that wait.
  enum class Kind { kNodeFailed, kNodeLost, kMasterLost, kAdmit };
  Kind kind = Kind::kNodeFailed;
  int node = -1;
  std::string host;
  std::string message;  // "rank 3 (local rank 1, pid 12) exited with code 3"
  int exit_code = 1;    // what this launcher exits with because of it
  bool restartable = false;

  std::string describe() const;  // "node 1 (host h) failed: ..."
};

// Where remote events come from. fd() becomes readable when one is waiting.
class RemoteEvents {
 public:
  virtual ~RemoteEvents() = default;
  virtual int fd() const = 0;
  virtual std::optional<RemoteEvent> take() = 0;
};

struct WorkerSpec {
  int rank = -1;
  int local_rank = -1;
  ExecSpec exec;
  std::string error_file;
  OutputMux::Route route;  // where its stdout and stderr go
};

struct GroupConfig {
  std::vector<WorkerSpec> workers;
  double term_timeout_s = 30;
  double remote_term_timeout_s = 3;  // grace when another node failed
  OutputMux::Config output;
  int signal_fd = -1;
  Guardian* guardian = nullptr;
  RemoteEvents* remote = nullptr;  // multi-node only
  // Called at once on the first local failure / on a terminating signal, so
  // that other nodes hear of it while this node is still stopping.
  std::function<void(const WorkerExit&)> on_failure;
  std::function<void(int sig)> on_stop_signal;

  // The workers' store's records (fault.h); null when the launcher does not
  // host the store: nothing is recorded and nothing fenced. With it, every
  // failed worker's death is recorded at once (not those the launcher stops
  // itself), and a running worker whose rank the store says was excluded is
  // SIGKILLed (fenced), looked at every fence_interval_s.
  Ledger* ledger = nullptr;
  double fence_interval_s = 0.25;
  int node_rank = 0;
  std::string host;
  // kShrink: a failed worker does not stop the others while at least
  // min_ranks of world_size ranks are left, job-wide (from the store's
  // records); kReplace: first start a replacement for it, up to
  // max_replacements on this node (SHOAL_REPLACEMENT=<its incarnation>).
  FaultTolerance fault_tolerance = FaultTolerance::kNone;
  int min_ranks = 1;
  int max_replacements = 0;
  int world_size = 0;
};

struct GroupResult {
  std::optional<WorkerExit> first_failure;  // the first worker to fail here
  std::vector<std::string> failure_tail;    // its last output lines
  std::string failure_error_file;
  int stop_signal = 0;                      // a terminating signal shoalrun received
  std::optional<RemoteEvent> remote;        // stopped because of another node
  int tolerated = 0;                        // failed workers the job went on without
  int replaced = 0;                         // replacements started

  bool ok() const { return !first_failure && stop_signal == 0 && !remote; }
  // The exit code this outcome gives the launcher.
  int exit_code() const;
};

GroupResult run_group(const GroupConfig& cfg);

}  // namespace shoalrun
