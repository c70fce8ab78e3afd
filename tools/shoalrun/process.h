// shoalrun/process.h — the launcher's child processes.
//
// Workers are forked from the launcher's main thread (the parent-death signal
// follows the thread that forked) into their own process group, with
// PR_SET_PDEATHSIG = SIGKILL, so that `kill -9 shoalrun` takes them along.
// The launcher is a child subreaper: a worker's descendants that outlive it
// come back to the launcher, which kills them (sweep_stray_children).
// The guardian is a small process forked at start; it holds the read end of a
// pipe from the launcher and, when the launcher dies without cleaning up (EOF
// on that pipe), SIGKILLs every worker process group still registered and
// removes the launcher's scratch directory. Not thread-safe: main thread only.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace shoalrun {

struct ExecSpec {
  std::string path;               // resolved executable
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // "NAME=value"
};

struct SpawnedWorker {
  pid_t pid = -1;   // also its process group id
  int out_fd = -1;  // read ends of its stdout and stderr pipes (non-blocking, close-on-exec)
  int err_fd = -1;
};

// Forks and execs `spec` in a new process group with stdin on /dev/null.
// Throws std::runtime_error when pipes or fork fail. An exec failure shows as
// the child's own message on its stderr and exit code 127.
SpawnedWorker spawn_worker(const ExecSpec& spec);

// Sends `sig` to the worker's process group, or to the process alone if it
// moved itself to another group. No-op for pid <= 0.
void signal_worker(pid_t pid, int sig);

// SIGKILLs and reaps every child of this process except `keep` (the guardian)
// and except the pids in `workers`, repeating while new orphans arrive.
// Returns how many were killed.
int sweep_stray_children(pid_t keep, const std::vector<pid_t>& workers);

// Looks `name` up the way execvp would ("" when not found / not executable).
std::string find_executable(const std::string& name);

class Guardian {
 public:
  Guardian() = default;
  ~Guardian();
  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;

  // Forks the guardian; call before any thread starts. `scratch_dir` is
  // removed (its files, then itself) when the launcher goes away.
  void start(const std::string& scratch_dir);
  void track(pid_t pgid);
  void untrack(pid_t pgid);
  // Normal exit: closes the pipe and waits for the guardian.
  void stop();
  pid_t pid() const { return pid_; }

 private:
  void send(char op, pid_t pgid);
  pid_t pid_ = -1;
  int fd_ = -1;  // write end of the pipe
};

// The signals shoalrun forwards to every worker.
const std::vector<int>& forwarded_signals();
bool is_terminating_signal(int sig);  // INT, TERM, HUP, QUIT
// "SIGKILL" (or "signal 42").
std::string signal_name(int sig);

}  // namespace shoalrun
