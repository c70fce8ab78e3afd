// shoalrun/cli.cc — see cli.h.
#include "cli.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

namespace shoalrun {
namespace {

constexpr const char* kVersion = "shoalrun 0.1.0";

constexpr const char* kFooter = R"(The cluster description comes from, first match wins: the flags above
(--nnodes, --node-rank or --standalone), SageMaker (SM_HOSTS, SM_CURRENT_HOST,
SM_NUM_GPUS or resourceconfig.json), Slurm (SLURM_NODEID, SLURM_NNODES,
SLURM_JOB_NODELIST), Open MPI (OMPI_COMM_WORLD_RANK/SIZE, one shoalrun per
node), else one node. --verbose says which. See docs/launcher.md.)";

// A number >= 0 (> 0 when `positive`), refused with a plain message (CLI11's
// own NonNegativeNumber prints its range as "0.000000 to 1797693...").
CLI::Validator number_at_least_zero(bool positive) {
  return CLI::Validator(
      [positive](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || end == s.c_str() || *end != '\0' || v != v) return "'" + s + "' is not a number";
        if (positive ? v > 0 : v >= 0) return "";
        return std::string("must be ") + (positive ? "> 0" : ">= 0") + ", got " + s;
      },
      positive ? "NUMBER > 0" : "NUMBER >= 0");
}

}  // namespace

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

  std::string nproc, nnodes;
  app.add_option("--nproc-per-node,--nproc_per_node", nproc,
                 "Workers on this node: N, auto (GPUs, else 1), gpu or cpu (cores)");
  app.add_option("--nnodes", nnodes, "Number of nodes (N, or N:N)");
  int node_rank_v = 0, master_port_v = 0, rdzv_port_v = 0;
  std::string master_addr_v;
  auto* node_rank = app.add_option("--node-rank,--node_rank", node_rank_v, "This node's rank, 0 .. nnodes-1");
  auto* master_addr =
      app.add_option("--master-addr,--master_addr", master_addr_v, "Address of node 0 (default 127.0.0.1)");
  auto* master_port =
      app.add_option("--master-port,--master_port", master_port_v,
                     "Port of the workers' store on node 0 (default 29500; one node: a free port)");
  auto* rdzv_port =
      app.add_option("--rdzv-port,--rdzv_port", rdzv_port_v,
                     "Port of the launchers' rendezvous store on node 0 (default master port + 1)");
  app.add_flag("--standalone", o.standalone, "One node, on a free local port");
  app.add_option("--max-restarts,--max_restarts", o.max_restarts,
                 "Restart the worker group up to this many times after a failure")
      ->check(number_at_least_zero(false));
  app.add_option("--term-timeout,--term_timeout", o.term_timeout_s,
                 "Seconds between SIGTERM and SIGKILL when stopping workers")
      ->check(number_at_least_zero(false));
  app.add_option("--rdzv-timeout,--rdzv_timeout", o.rdzv_timeout_s,
                 "Seconds to wait for every node's launcher")
      ->check(number_at_least_zero(true));
  app.add_option("--log-dir,--log_dir", o.log_dir, "Write each rank's output to DIR/rank_<rank>.log");
  app.add_flag("--tee", o.tee, "With --log-dir: also print the output to the console");
  app.add_option("--secret-file,--secret_file", o.secret_file,
                 "The job's secret, in hex (openssl rand -hex 32), the same on every node; default: "
                 "SHOAL_SECRET, else one made for this job (see docs/security.md)");
  app.add_flag("-m,--module", o.module, "The command is a Python module (like python -m)");
  app.add_flag("--no-python,--no_python", o.no_python, "Run the command as is, not through Python");
  app.add_flag("-v,--verbose", o.verbose, "Say where the cluster description came from, and more");
  app.add_flag("--dry-run,--dry_run", o.dry_run, "Print the resolved cluster description and exit");

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
  if (rest.empty()) {
    throw UsageError(std::string("no ") + (o.module ? "module" : o.no_python ? "command" : "training script") +
                     " given (usage: shoalrun [options] train.py [script args])");
  }
  o.command = rest;

  if (!nproc.empty()) o.nproc_per_node = nproc;
  if (!nnodes.empty()) {
    // torchrun accepts MIN:MAX for elastic jobs; shoalrun is not elastic.
    std::string n = nnodes;
    const auto colon = n.find(':');
    if (colon != std::string::npos) {
      if (n.substr(0, colon) != n.substr(colon + 1)) {
        throw UsageError("--nnodes " + nnodes + ": elastic ranges are not supported; give one number");
      }
      n = n.substr(0, colon);
    }
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(n, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != n.size()) throw UsageError("--nnodes " + nnodes + ": not a number");
    o.nnodes = v;
  }
  if (node_rank->count() > 0) o.node_rank = node_rank_v;
  if (master_addr->count() > 0) o.master_addr = master_addr_v;
  if (master_port->count() > 0) o.master_port = master_port_v;
  if (rdzv_port->count() > 0) o.rdzv_port = rdzv_port_v;
  if (o.module && o.no_python) throw UsageError("-m and --no-python cannot be combined");
  if (o.tee && o.log_dir.empty()) throw UsageError("--tee needs --log-dir");
  return out;
}

}  // namespace shoalrun
