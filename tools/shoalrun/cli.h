// shoalrun/cli.h — the command line: torchrun's (torch.distributed.run), and
// shoalrun's own few options.
//
//   shoalrun [options] train.py [script args]      (or -m module, or --no-python cmd)
//
// Every option of torchrun is accepted, in both spellings (--nproc-per-node,
// --nproc_per_node), and read from PET_<NAME> when it is not on the command
// line, as torchrun reads it (PET_NNODES, PET_NODE_RANK, PET_STANDALONE=1 ...);
// the command line wins. An option shoalrun cannot honour is refused with one
// line naming it. Everything from the first positional argument on is the
// worker command and passes through untouched. docs/launcher.md lists them all.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace shoalrun {

// Bad input: the launcher prints "shoalrun: error: <what>" and exits 2.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& what) : std::runtime_error(what) {}
};

// Which of a worker's streams go to a file: torchrun's -r/--redirects and
// -t/--tee values, "0".."3" for every local rank (1 stdout, 2 stderr, 3 both)
// or "0:3,1:1" per local rank (ranks not named: 0).
struct StreamSpec {
  static constexpr int kOut = 1;
  static constexpr int kErr = 2;
  int all = 0;
  std::map<int, int> per_rank;  // non-empty: the per-rank form
  int of(int local_rank) const;
  bool any() const;
};

// --rdzv-conf key=value,... (the keys torchrun documents; seconds may have
// decimals). Unset values keep shoalrun's defaults.
struct RendezvousConf {
  std::optional<double> join_timeout;   // every node must have arrived by then (also: timeout)
  double last_call_timeout = 30;        // elastic: wait this long for more nodes once MIN are in
  double close_timeout = 10;            // node 0 keeps the store up this long for the others to leave
  double heartbeat_timeout = 2;         // one heartbeat (store call) must complete within this
  double keep_alive_interval = 1;       // heartbeat period
  int keep_alive_max_attempt = 3;       // missed heartbeats before a node is declared lost
  double read_timeout = 10;             // one store operation of the rendezvous
  std::optional<bool> is_host;          // c10d: this launcher hosts the store (default: by address)
};

struct Options {
  // Cluster description (unset: taken from the environment, see cluster.h).
  std::optional<std::string> nproc_per_node;  // N, auto, gpu or cpu
  std::optional<int> nnodes;                  // MIN of --nnodes MIN:MAX (or N)
  std::optional<int> max_nnodes;              // MAX (= nnodes unless a range was given)
  std::optional<int> node_rank;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  std::optional<int> rdzv_port;
  bool standalone = false;
  bool same_host_nodes = false;  // every node of a multi-node job runs on this machine (tests)

  // Rendezvous.
  std::string rdzv_backend = "static";  // static or c10d
  std::string rdzv_endpoint;            // HOST[:PORT]
  std::string rdzv_id = "none";         // the job id: launchers of another id never meet this job's
  RendezvousConf rdzv_conf;
  double rdzv_timeout_s = 600;
  double monitor_interval_s = 0.25;  // how often the launchers look at the other nodes
  std::string local_addr;            // this node's address for the others (and its workers)

  // Process management.
  int max_restarts = 0;
  double term_timeout_s = 30;  // --term-timeout / --shutdown-timeout
  std::set<int> signals;       // handled and forwarded (--signals-to-handle)
  std::string secret_file;     // the job's secret, hex (docs/security.md); default SHOAL_SECRET, else made
  std::string role = "default";
  std::string start_method = "spawn";  // accepted; workers are always fresh processes
  bool virtual_local_rank = false;

  // Fault tolerance (docs/launcher.md, "Fault tolerance"; fault.h).
  std::string fault_tolerance = "none";  // none, shrink or replace
  int min_ranks = 1;                     // shrink/replace: fewer ranks left ends the job
  int max_replacements = 3;              // replace: per node
  // Who hosts the workers' store on MASTER_PORT: "launcher" (node 0's
  // launcher; TORCHELASTIC_USE_AGENT_STORE=True) or "rank0" (rank 0 itself).
  // Default: launcher with --fault-tolerance, else rank0.
  std::string workers_store;
  bool launcher_store() const { return workers_store == "launcher"; }

  // Output.
  std::string log_dir;  // where redirected/teed streams go (default: a new directory, as torchrun)
  StreamSpec redirects, tee;
  std::optional<std::set<int>> local_ranks_filter;  // console output only from these local ranks
  std::vector<std::string> duplicate_stdout_filters, duplicate_stderr_filters;

  // The worker command.
  bool module = false;     // -m: command[0] is a Python module
  bool no_python = false;  // command runs as is, not through Python
  bool run_path = false;   // the script runs with runpy.run_path (wins over --no-python)
  std::vector<std::string> command;

  bool verbose = false;
  bool dry_run = false;  // print the resolved cluster description and exit

  // Where each given value came from, by option name ("master_addr" ->
  // "--master-addr" or "PET_MASTER_ADDR"), for messages; absent: not given.
  std::map<std::string, std::string> origin;
  bool given(const std::string& name) const { return origin.count(name) > 0; }
  // "--master-addr" / "PET_MASTER_ADDR", or the option's flag when not given.
  std::string named(const std::string& name) const;
  bool elastic() const { return max_nnodes.value_or(1) != nnodes.value_or(1); }
};

// Parses argv (and the PET_* variables). Returns the options, or an exit
// code when the command line asked for --help or --version (already printed).
// Throws UsageError.
struct ParsedCommandLine {
  Options options;
  std::optional<int> exit_now;
};
ParsedCommandLine parse_command_line(int argc, char** argv);

// The conversions of option values, each naming `what` (the flag or variable)
// when it throws UsageError. cli_values.cc.
StreamSpec parse_stream_spec(const std::string& text, const std::string& what);
RendezvousConf parse_rdzv_conf(const std::string& text, const std::string& what);
std::set<int> parse_signal_list(const std::string& text, const std::string& what);
std::set<int> parse_rank_list(const std::string& text, const std::string& what);
std::vector<std::string> parse_filter_list(const std::string& text);
double parse_seconds(const std::string& text, const std::string& what, bool positive);
// "--nnodes 2" or "1:4" into MIN and MAX.
void parse_node_range(const std::string& text, const std::string& what, int* min, int* max);
bool parse_env_flag(const std::string& text, const std::string& what);  // PET_STANDALONE=1

}  // namespace shoalrun
