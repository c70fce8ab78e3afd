// shoal-trace — reads the flight-recorder dumps of all ranks of a job and
// says which ranks did not join which collective.
//
//   shoal-trace [--all] [--comm ID] [PATH...]
//
// PATH: dump files, or directories holding shoal-trace-*.jsonl (default:
// $SHOAL_TRACE_DIR, else /tmp). Dumps are grouped by communicator id; each
// group is reported on its own. Exit status: 0 when every recorded
// collective completed on every rank, 1 when something did not (or ranks
// disagree about a collective), 2 on bad input. docs/observability.md.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "trace_analysis.h"

int main(int argc, char** argv) {
  CLI::App app{"shoal-trace: which ranks did not join which collective, from the flight-recorder dumps"};
  std::vector<std::string> paths;
  std::string comm;
  bool all = false;
  app.add_option("paths", paths, "dump files, or directories with shoal-trace-*.jsonl (default: $SHOAL_TRACE_DIR or /tmp)");
  app.add_option("--comm", comm, "only the communicator with this id (the hex number in the file names)");
  app.add_flag("--all", all, "list every recorded collective, not only those with a problem");
  CLI11_PARSE(app, argc, argv);
  if (paths.empty()) {
    const char* dir = std::getenv("SHOAL_TRACE_DIR");
    paths.push_back(dir && *dir ? dir : "/tmp");
  }
  std::map<std::string, std::vector<shoal::trace::Dump>> groups;
  try {
    groups = shoal::trace::read_dumps(paths);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shoal-trace: %s\n", e.what());
    return 2;
  }
  if (!comm.empty()) {
    for (auto it = groups.begin(); it != groups.end();) it = it->first == comm ? std::next(it) : groups.erase(it);
  }
  if (groups.empty()) {
    std::fprintf(stderr, "shoal-trace: no dumps found%s\n", comm.empty() ? "" : (" of communicator " + comm).c_str());
    return 2;
  }
  bool any = false;
  bool first = true;
  for (const auto& [id, dumps] : groups) {
    bool problems = false;
    std::string text = shoal::trace::render(shoal::trace::analyze(dumps), dumps, all, &problems);
    std::printf("%s%s", first ? "" : "\n", text.c_str());
    first = false;
    any = any || problems;
  }
  return any ? 1 : 0;
}
