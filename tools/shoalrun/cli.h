// shoalrun/cli.h — the command line, parsed by CLI11.
//
//   shoalrun [options] train.py [script args]      (or -m module, or --no-python cmd)
//
// Option names are torchrun's; dashes and underscores are both accepted
// (--nproc-per-node, --nproc_per_node). Everything from the first positional
// argument on is the worker command and passes through untouched.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace shoalrun {

// Bad input: the launcher prints "shoalrun: error: <what>" and exits 2.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& what) : std::runtime_error(what) {}
};

struct Options {
  // Cluster description (unset: taken from the environment, see cluster.h).
  std::optional<std::string> nproc_per_node;  // N, auto, gpu or cpu
  std::optional<int> nnodes;
  std::optional<int> node_rank;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  std::optional<int> rdzv_port;
  bool standalone = false;

  // Process management.
  int max_restarts = 0;
  double term_timeout_s = 30;
  double rdzv_timeout_s = 600;
  std::string log_dir;
  bool tee = false;
  std::string secret_file;  // the job's secret, hex (docs/security.md); default SHOAL_SECRET, else made

  // The worker command.
  bool module = false;     // -m: command[0] is a Python module
  bool no_python = false;  // command runs as is, not through Python
  std::vector<std::string> command;

  bool verbose = false;
  bool dry_run = false;  // print the resolved cluster description and exit
};

// Parses argv. Returns the options, or an exit code when the command line
// asked for --help or --version (already printed). Throws UsageError.
struct ParsedCommandLine {
  Options options;
  std::optional<int> exit_now;
};
ParsedCommandLine parse_command_line(int argc, char** argv);

}  // namespace shoalrun
