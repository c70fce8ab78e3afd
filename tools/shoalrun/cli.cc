// shoalrun/cli.cc — see cli.h. CLI11 reads the command line into text; the
// PET_* variables fill what it did not give; then every value is converted
// here, naming the flag or variable it came from when it is bad.
#include "cli.h"

#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

#include "cluster.h"

namespace shoalrun {
namespace {

constexpr const char* kVersion = "shoalrun 0.1.0";

constexpr const char* kFooter = R"(Every option of torchrun (torch.distributed.run) is accepted, with dashes or
underscores, and read from PET_<NAME> (PET_NNODES, PET_NODE_RANK, ...) when it
is not on the command line. The cluster description comes from, first match
wins: the flags above (--nnodes, --node-rank, --standalone or their PET_*),
SageMaker (SM_HOSTS, SM_CURRENT_HOST, SM_NUM_GPUS or resourceconfig.json),
Slurm (SLURM_NODEID, SLURM_NNODES, SLURM_JOB_NODELIST), Open MPI
(OMPI_COMM_WORLD_RANK/SIZE, one shoalrun per node), else one node. --verbose
says which. See docs/launcher.md.)";

// One option: its name (torchrun's argparse dest), its flags, its PET_*
// variable (nullptr: torchrun reads none), and whether it takes no value.
struct Spec {
  const char* name;
  const char* flags;  // dashed long names (an underscore twin is added) and short ones
  const char* env;
  bool is_flag;
  const char* help;
};

const Spec kSpecs[] = {
    // Where this node sits in the job.
    {"nnodes", "--nnodes", "PET_NNODES", false,
     "Number of nodes: N, or MIN:MAX for an elastic job (needs --rdzv-backend c10d)"},
    {"nproc_per_node", "--nproc-per-node", "PET_NPROC_PER_NODE", false,
     "Workers on this node: N, gpu (GPUs), cpu (cores), auto (GPUs, else cores); default: GPUs, else 1"},
    {"node_rank", "--node-rank", "PET_NODE_RANK", false,
     "This node's rank, 0 .. nnodes-1 (static rendezvous; c10d assigns ranks itself)"},
    {"master_addr", "--master-addr", "PET_MASTER_ADDR", false,
     "Address of node 0 (static rendezvous; default 127.0.0.1, one node only)"},
    {"master_port", "--master-port", "PET_MASTER_PORT", false,
     "Port of the workers' store on node 0 (default 29500; one node, or c10d: a free port)"},
    {"standalone", "--standalone", "PET_STANDALONE", true, "One node, on a free local port"},
    // Rendezvous.
    {"rdzv_backend", "--rdzv-backend", "PET_RDZV_BACKEND", false,
     "static (node ranks given; default) or c10d (nodes meet at --rdzv-endpoint; ranks assigned there)"},
    {"rdzv_endpoint", "--rdzv-endpoint", "PET_RDZV_ENDPOINT", false,
     "HOST[:PORT] of the launchers' rendezvous store (c10d: default port 29400; hosted by the launcher on HOST)"},
    {"rdzv_id", "--rdzv-id", "PET_RDZV_ID", false,
     "The job's id: launchers started with another id never join this job (default: none)"},
    {"rdzv_conf", "--rdzv-conf", "PET_RDZV_CONF", false,
     "key=value,...: join_timeout, last_call_timeout, close_timeout, heartbeat_timeout, keep_alive_interval, "
     "keep_alive_max_attempt, read_timeout, timeout, is_host, store_type=tcp"},
    {"local_addr", "--local-addr", "PET_LOCAL_ADDR", false,
     "This node's address as the others reach it (its workers advertise it too)"},
    {"rdzv_port", "--rdzv-port", nullptr, false,
     "Static: port of the launchers' rendezvous store on node 0 (default master port + 1)"},
    {"rdzv_timeout", "--rdzv-timeout", nullptr, false,
     "Seconds to wait for every node's launcher (= --rdzv-conf join_timeout; default 600)"},
    {"same_host_nodes", "--same-host-nodes", nullptr, true,
     "Every node of this multi-node job runs on this machine (tests): a loopback master address or "
     "endpoint is then expected, not an error"},
    // Process management.
    {"max_restarts", "--max-restarts", "PET_MAX_RESTARTS", false,
     "Restart the worker group (on every node) up to this many times after a failure"},
    {"monitor_interval", "--monitor-interval", "PET_MONITOR_INTERVAL", false,
     "Seconds between looks at the other nodes (local workers are watched at once; default 0.25)"},
    {"start_method", "--start-method", "PET_START_METHOD", false,
     "spawn, fork or forkserver: accepted; every worker is a fresh process (fork and exec), as "
     "torchrun starts a script"},
    {"shutdown_timeout", "--shutdown-timeout", "PET_SHUTDOWN_TIMEOUT", false,
     "Seconds between SIGTERM and SIGKILL when stopping workers (default: TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30)"},
    {"term_timeout", "--term-timeout", nullptr, false, "The same as --shutdown-timeout"},
    {"signals_to_handle", "--signals-to-handle", "PET_SIGNALS_TO_HANDLE", false,
     "Signals forwarded to the workers (of SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2; default all)"},
    {"role", "--role", "PET_ROLE", false, "The workers' role (ROLE_NAME; default: default)"},
    {"virtual_local_rank", "--virtual-local-rank", "PET_VIRTUAL_LOCAL_RANK", true,
     "LOCAL_RANK=0 in every worker, CUDA_VISIBLE_DEVICES narrowed to the worker's own GPU"},
    {"secret_file", "--secret-file", nullptr, false,
     "The job's secret, in hex (openssl rand -hex 32), the same on every node; default: SHOAL_SECRET, "
     "else one made for this job (see docs/security.md)"},
    {"fault_tolerance", "--fault-tolerance", nullptr, false,
     "none (default: one failed worker stops the job), shrink (the others go on, down to --min-ranks) or replace "
     "(a replacement is started for a failed worker, SHOAL_REPLACEMENT set)"},
    {"min_ranks", "--min-ranks", nullptr, false,
     "With --fault-tolerance: the job fails when fewer ranks than this are left (default 1)"},
    {"max_replacements", "--max-replacements", nullptr, false,
     "With --fault-tolerance replace: replacements this node starts, at most (default 3); then as shrink"},
    {"workers_store", "--workers-store", nullptr, false,
     "Who hosts the workers' store on the master port: launcher (the default: node 0's launcher, "
     "TORCHELASTIC_USE_AGENT_STORE=True, so that losing any worker never loses it) or rank0 (rank 0 hosts it)"},
    {"event_log_handler", "--event-log-handler", "PET_EVENT_LOG_HANDLER", false,
     "null (default) or console (the launcher's events on stderr, as --verbose)"},
    {"logs_specs", "--logs-specs", nullptr, false, "Refused: shoalrun has no logs-specs plug-ins"},
    {"numa_binding", "--numa-binding", nullptr, false, "Refused: shoalrun does not bind workers to NUMA nodes"},
    // Output.
    {"log_dir", "--log-dir", "PET_LOG_DIR", false,
     "Directory of redirected output (DIR/rank_<rank>.log) and of the workers' error files"},
    {"redirects", "-r,--redirects", "PET_REDIRECTS", false,
     "Streams sent to the log files only: 0 none, 1 stdout, 2 stderr, 3 both; or per local rank: 0:3,1:2"},
    {"tee", "-t,--tee", "PET_TEE", false, "Streams sent to the log files and the console (as --redirects)"},
    {"local_ranks_filter", "--local-ranks-filter", "PET_LOCAL_RANKS_FILTER", false,
     "Only these local ranks' output reaches the console (e.g. 0,1); the log files get all of it"},
    {"duplicate_stdout_filters", "--duplicate-stdout-filters", "PET_DUPLICATE_STDOUT_FILTERS", false,
     "Copy the workers' stdout lines containing any of these words to <log dir>/filtered_stdout.log (,, = a comma)"},
    {"duplicate_stderr_filters", "--duplicate-stderr-filters", "PET_DUPLICATE_STDERR_FILTERS", false,
     "The same for stderr (<log dir>/filtered_stderr.log)"},
    // The worker command.
    {"module", "-m,--module", "PET_MODULE", true, "The command is a Python module (like python -m)"},
    {"no_python", "--no-python", "PET_NO_PYTHON", true, "Run the command as is, not through Python"},
    {"run_path", "--run-path", "PET_RUN_PATH", true,
     "Run the script with Python's runpy.run_path (how shoalrun runs scripts anyway; wins over --no-python)"},
    {"verbose", "-v,--verbose", nullptr, true, "Say where the cluster description came from, and more"},
    {"dry_run", "--dry-run", nullptr, true, "Print the resolved cluster description and exit"},
};

// "--nproc-per-node" -> "--nproc-per-node,--nproc_per_node".
std::string cli_names(const std::string& flags) {
  std::string out;
  size_t pos = 0;
  while (pos <= flags.size()) {
    const size_t comma = flags.find(',', pos);
    const std::string f = flags.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    out += (out.empty() ? "" : ",") + f;
    if (f.rfind("--", 0) == 0 && f.find('-', 2) != std::string::npos) {
      std::string u = f;
      for (size_t i = 2; i < u.size(); ++i) {
        if (u[i] == '-') u[i] = '_';
      }
      out += "," + u;
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

std::string long_name(const std::string& flags) {
  const size_t at = flags.find("--");
  const size_t comma = flags.find(',', at);
  return flags.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
}

int as_int(const std::string& text, const std::string& what, int min) {
  const int v = parse_int(text, what);
  if (v < min) throw UsageError(what + ": must be >= " + std::to_string(min) + ", got " + text);
  return v;
}

}  // namespace

std::string Options::named(const std::string& name) const {
  auto it = origin.find(name);
  if (it != origin.end()) return it->second;
  for (const auto& s : kSpecs) {
    if (name == s.name) return long_name(s.flags);
  }
  return name;
}

ParsedCommandLine parse_command_line(int argc, char** argv) {
  ParsedCommandLine out;
  Options& o = out.options;
  CLI::App app{
      "shoalrun: start one worker per device on this node, meeting the other nodes' launchers.\n"
      "  shoalrun [options] train.py [script args]\n"
      "  shoalrun [options] -m module [args]\n"
      "  shoalrun [options] --no-python command [args]\n",
      "shoalrun"};
  app.footer(kFooter);
  // Everything from the first positional on is the worker command.
  app.prefix_command();
  app.set_version_flag("--version", kVersion);

  std::map<std::string, std::string> text;
  std::map<std::string, bool> flag;
  std::map<std::string, CLI::Option*> cli;
  for (const auto& s : kSpecs) {
    const std::string names = cli_names(s.flags);
    cli[s.name] = s.is_flag ? app.add_flag(names, flag[s.name], s.help) : app.add_option(names, text[s.name], s.help);
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    out.exit_now = 0;
    return out;
  } catch (const CLI::CallForVersion&) {
    std::printf("%s\n", kVersion);
    out.exit_now = 0;
    return out;
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }

  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest[0] == "--") rest.erase(rest.begin());
  if (!rest.empty() && rest[0].size() > 1 && rest[0][0] == '-') {
    throw UsageError("unknown option " + rest[0] + " (options go before the script; see --help)");
  }

  // What was given, on the command line or (as torchrun reads them) in PET_*.
  std::map<std::string, std::string> value;
  for (const auto& s : kSpecs) {
    if (cli[s.name]->count() > 0) {
      o.origin[s.name] = long_name(s.flags);
      value[s.name] = s.is_flag ? "1" : text[s.name];
    } else if (s.env != nullptr) {
      if (const auto v = env_str(s.env)) {
        o.origin[s.name] = s.env;
        value[s.name] = *v;
      }
    }
  }
  if (!o.given("shutdown_timeout") && !o.given("term_timeout")) {
    if (const auto v = env_str("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")) {
      o.origin["shutdown_timeout"] = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT";
      value["shutdown_timeout"] = *v;
    }
  }
  auto has = [&](const char* name) { return value.count(name) > 0; };
  auto get = [&](const char* name) { return value.at(name); };
  auto what = [&](const char* name) { return o.named(name); };
  auto boolean = [&](const char* name) {
    if (!has(name)) return false;
    return o.origin[name].rfind("PET_", 0) == 0 ? parse_env_flag(get(name), what(name)) : true;
  };

  // Refused: options torchrun has that shoalrun cannot honour.
  if (has("logs_specs")) {
    throw UsageError("--logs-specs " + get("logs_specs") +
                     ": shoalrun has no logs-specs plug-ins (torchrun's entry points); its output is set with "
                     "--log-dir, --redirects, --tee and --local-ranks-filter");
  }
  if (has("numa_binding")) {
    throw UsageError("--numa-binding " + get("numa_binding") +
                     ": shoalrun does not bind workers to NUMA nodes; bind them yourself (e.g. --no-python numactl "
                     "... python train.py)");
  }
  if (has("event_log_handler")) {
    const std::string h = get("event_log_handler");
    if (h == "console") {
      o.verbose = true;
    } else if (h != "null") {
      throw UsageError(what("event_log_handler") + " " + h +
                       ": shoalrun has no such event handler (it knows null, and console: the launcher's events "
                       "on stderr, as --verbose)");
    }
  }

  o.standalone = boolean("standalone");
  o.same_host_nodes = boolean("same_host_nodes");
  o.module = boolean("module");
  o.no_python = boolean("no_python");
  o.run_path = boolean("run_path");
  o.virtual_local_rank = boolean("virtual_local_rank");
  o.verbose = o.verbose || boolean("verbose");
  o.dry_run = boolean("dry_run");

  if (has("nproc_per_node")) o.nproc_per_node = get("nproc_per_node");
  if (has("nnodes")) {
    int lo = 0, hi = 0;
    parse_node_range(get("nnodes"), what("nnodes"), &lo, &hi);
    o.nnodes = lo;
    o.max_nnodes = hi;
  }
  if (has("node_rank")) o.node_rank = parse_int(get("node_rank"), what("node_rank"));
  if (has("master_addr")) o.master_addr = get("master_addr");
  if (has("master_port")) o.master_port = parse_int(get("master_port"), what("master_port"));
  if (has("rdzv_port")) o.rdzv_port = parse_int(get("rdzv_port"), what("rdzv_port"));

  if (has("rdzv_backend")) {
    const std::string b = get("rdzv_backend");
    if (b == "etcd" || b == "etcd-v2") {
      throw UsageError(what("rdzv_backend") + " " + b +
                       ": shoalrun has no etcd rendezvous; use c10d (its own store, hosted by a launcher) or static");
    }
    if (b != "static" && b != "c10d") throw UsageError(what("rdzv_backend") + " " + b + ": use c10d or static");
    o.rdzv_backend = b;
  }
  if (has("rdzv_endpoint")) o.rdzv_endpoint = get("rdzv_endpoint");
  if (has("rdzv_id")) {
    o.rdzv_id = get("rdzv_id");
    if (o.rdzv_id.empty() || o.rdzv_id.size() > 256 || o.rdzv_id.find('/') != std::string::npos) {
      throw UsageError(what("rdzv_id") + " '" + o.rdzv_id + "': 1 to 256 characters, no '/'");
    }
  }
  if (has("rdzv_conf")) o.rdzv_conf = parse_rdzv_conf(get("rdzv_conf"), what("rdzv_conf"));
  if (has("rdzv_timeout")) o.rdzv_timeout_s = parse_seconds(get("rdzv_timeout"), what("rdzv_timeout"), true);
  if (o.rdzv_conf.join_timeout) {
    if (has("rdzv_timeout") && *o.rdzv_conf.join_timeout != o.rdzv_timeout_s) {
      throw UsageError("--rdzv-timeout and --rdzv-conf join_timeout disagree; give one");
    }
    o.rdzv_timeout_s = *o.rdzv_conf.join_timeout;
  }
  if (has("local_addr")) {
    o.local_addr = get("local_addr");
    if (o.local_addr.empty()) throw UsageError(what("local_addr") + " is empty");
  }

  if (has("max_restarts")) o.max_restarts = as_int(get("max_restarts"), what("max_restarts"), 0);
  if (has("monitor_interval")) {
    o.monitor_interval_s = parse_seconds(get("monitor_interval"), what("monitor_interval"), true);
  }
  if (has("start_method")) {
    o.start_method = get("start_method");
    if (o.start_method != "spawn" && o.start_method != "fork" && o.start_method != "forkserver") {
      throw UsageError(what("start_method") + " " + o.start_method + ": must be spawn, fork or forkserver");
    }
  }
  if (has("shutdown_timeout") && has("term_timeout")) {
    throw UsageError(what("shutdown_timeout") + " and --term-timeout are the same setting; give one");
  }
  for (const char* name : {"shutdown_timeout", "term_timeout"}) {
    if (has(name)) o.term_timeout_s = parse_seconds(get(name), what(name), false);
  }
  o.signals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
  if (has("signals_to_handle")) o.signals = parse_signal_list(get("signals_to_handle"), what("signals_to_handle"));
  if (has("role")) {
    o.role = get("role");
    if (o.role.empty()) throw UsageError(what("role") + " is empty");
  }
  if (has("secret_file")) o.secret_file = get("secret_file");
  if (has("fault_tolerance")) {
    o.fault_tolerance = get("fault_tolerance");
    if (o.fault_tolerance != "none" && o.fault_tolerance != "shrink" && o.fault_tolerance != "replace") {
      throw UsageError(what("fault_tolerance") + " " + o.fault_tolerance + ": must be none, shrink or replace");
    }
  }
  if (has("min_ranks")) o.min_ranks = as_int(get("min_ranks"), what("min_ranks"), 1);
  if (has("max_replacements")) o.max_replacements = as_int(get("max_replacements"), what("max_replacements"), 0);
  const bool tolerant = o.fault_tolerance != "none";
  if (has("workers_store")) {
    o.workers_store = get("workers_store");
    if (o.workers_store != "launcher" && o.workers_store != "rank0") {
      throw UsageError(what("workers_store") + " " + o.workers_store + ": must be launcher or rank0");
    }
    if (tolerant && o.workers_store == "rank0") {
      throw UsageError(what("workers_store") + " rank0: --fault-tolerance " + o.fault_tolerance +
                       " needs the store outside the ranks (--workers-store launcher)");
    }
  } else {
    o.workers_store = "launcher";
  }

  if (has("log_dir")) {
    o.log_dir = get("log_dir");
    if (o.log_dir.empty()) throw UsageError(what("log_dir") + " is empty");
  }
  if (has("redirects")) o.redirects = parse_stream_spec(get("redirects"), what("redirects"));
  if (has("tee")) o.tee = parse_stream_spec(get("tee"), what("tee"));
  if (has("local_ranks_filter") && !get("local_ranks_filter").empty()) {
    o.local_ranks_filter = parse_rank_list(get("local_ranks_filter"), what("local_ranks_filter"));
  }
  if (has("duplicate_stdout_filters")) o.duplicate_stdout_filters = parse_filter_list(get("duplicate_stdout_filters"));
  if (has("duplicate_stderr_filters")) o.duplicate_stderr_filters = parse_filter_list(get("duplicate_stderr_filters"));

  if (rest.empty()) {
    throw UsageError(std::string("no ") + (o.module ? "module" : o.no_python ? "command" : "training script") +
                     " given (usage: shoalrun [options] train.py [script args])");
  }
  o.command = rest;
  // As torchrun: --run-path runs a Python script whatever --no-python says.
  if (o.run_path) {
    if (o.module) throw UsageError(what("run_path") + " runs a script path; it cannot be combined with -m");
    o.no_python = false;
  }
  if (o.module && o.no_python) throw UsageError("-m and --no-python cannot be combined");
  return out;
}

}  // namespace shoalrun
