// shoalrun/command.cc — see command.h.
#include "command.h"

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "common/env.h"
#include "shoal/error.h"

extern char** environ;

namespace shoalrun {
namespace {

std::string dir_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string find_python(const char* argv0) {
  if (const auto p = shoal::env::get("SHOAL_PYTHON")) {
    const std::string found = find_executable(*p);
    if (found.empty()) throw UsageError("SHOAL_PYTHON: '" + *p + "' is not an executable");
    return found;
  }
  // The shoalrun that was invoked, before resolving symlinks: a venv's
  // bin/shoalrun links to the build, and its python3 is right beside it.
  std::string invoked = argv0 != nullptr ? argv0 : "";
  if (!invoked.empty() && invoked.find('/') == std::string::npos) invoked = find_executable(invoked);
  if (!invoked.empty()) {
    const std::string beside = dir_of(invoked) + "/python3";
    if (::access(beside.c_str(), X_OK) == 0) return beside;
  }
  const std::string found = find_executable("python3");
  if (found.empty()) throw UsageError("no python3 on PATH (set SHOAL_PYTHON, or use --no-python)");
  return found;
}

std::string find_bootstrap() {
  const std::string exe = self_exe();
  const std::string boot = dir_of(dir_of(exe)) + "/share/shoalrun/shoalrun_boot.py";
  if (!is_file(boot)) throw UsageError("the Python bootstrap " + boot + " is missing (a broken install?)");
  return boot;
}

}  // namespace

WorkerCommand build_command(const Options& o, const char* argv0) {
  WorkerCommand w;
  const std::string& first = o.command.at(0);
  if (o.no_python) {
    w.path = find_executable(first);
    if (w.path.empty()) throw UsageError("command '" + first + "' not found (or not executable)");
    w.argv = o.command;
  } else {
    if (!o.module) {
      struct stat st;
      if (::stat(first.c_str(), &st) != 0) throw UsageError("script '" + first + "' not found");
      if (S_ISDIR(st.st_mode) && !is_file(first + "/__main__.py")) {
        throw UsageError("'" + first + "' is a directory without __main__.py");
      }
    }
    w.path = find_python(argv0);
    w.argv = {w.path, find_bootstrap()};
    if (o.module) w.argv.push_back("-m");
    w.argv.insert(w.argv.end(), o.command.begin(), o.command.end());
  }
  for (const auto& a : w.argv) w.describe += (w.describe.empty() ? "" : " ") + a;
  return w;
}

shoal::auth::Secret given_secret(const Options& o) {
  try {
    if (!o.secret_file.empty()) {
      std::ifstream f(o.secret_file);
      std::stringstream text;
      text << f.rdbuf();
      if (!f) throw UsageError("--secret-file " + o.secret_file + ": cannot read it");
      return shoal::auth::Secret::from_hex(text.str(), "--secret-file " + o.secret_file);
    }
    return shoal::auth::Secret::from_env();
  } catch (const shoal::InvalidArgument& e) {
    throw UsageError(e.what());
  }
}

std::string default_omp_threads(const Cluster& c) {
  if (const char* v = std::getenv("OMP_NUM_THREADS"); v != nullptr && *v) return "";
  const int n = cpu_count() / c.nproc_per_node;
  return std::to_string(n < 1 ? 1 : n);
}

std::string virtual_device(int local_rank) {
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  if (cvd == nullptr) return std::to_string(local_rank);
  std::vector<std::string> ids;
  std::stringstream in(cvd);
  for (std::string id; std::getline(in, id, ',');) ids.push_back(id);
  if (local_rank >= static_cast<int>(ids.size())) {
    throw UsageError("--virtual-local-rank: local rank " + std::to_string(local_rank) +
                     " has no device in CUDA_VISIBLE_DEVICES=" + cvd);
  }
  return ids[local_rank];
}

std::vector<std::string> worker_env(const Cluster& c, const Options& o, const WorkerPlace& w,
                                    const std::string& omp_threads, const std::string& secret_hex) {
  const std::string world = std::to_string(c.world_size());
  std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(w.rank)},
      {"LOCAL_RANK", o.virtual_local_rank ? "0" : std::to_string(w.local_rank)},
      {"WORLD_SIZE", world},
      {"LOCAL_WORLD_SIZE", std::to_string(c.nproc_per_node)},
      {"GROUP_RANK", std::to_string(c.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(c.nnodes)},
      {"ROLE_NAME", o.role},
      {"ROLE_RANK", std::to_string(w.rank)},
      {"ROLE_WORLD_SIZE", world},
      {"MASTER_ADDR", c.master_addr},
      {"MASTER_PORT", std::to_string(c.master_port)},
      {"SHOAL_RESTART_COUNT", std::to_string(w.restart_count)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(w.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"TORCHELASTIC_RUN_ID", o.rdzv_id},
      {"TORCHELASTIC_USE_AGENT_STORE", o.launcher_store() ? "True" : "False"},
      {"SHOAL_ERROR_FILE", w.error_file},
      {"TORCHELASTIC_ERROR_FILE", w.error_file},
      {"SHOAL_SECRET", secret_hex},
  };
  if (!omp_threads.empty()) ours.emplace_back("OMP_NUM_THREADS", omp_threads);
  if (o.virtual_local_rank) ours.emplace_back("CUDA_VISIBLE_DEVICES", virtual_device(w.local_rank));
  if (!o.local_addr.empty() && !shoal::env::is_set("SHOAL_ADVERTISE_ADDR")) {
    ours.emplace_back("SHOAL_ADVERTISE_ADDR", o.local_addr);
  }
  if (o.fault_tolerance != "none") ours.emplace_back("SHOAL_FAULT_TOLERANCE", o.fault_tolerance);
  std::set<std::string> names;
  for (const auto& [k, v] : ours) names.insert(k);
  // Set for replacements only (group.cc), never inherited; the mode only by the flag.
  names.insert("SHOAL_REPLACEMENT");
  names.insert("SHOAL_FAULT_TOLERANCE");
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq == nullptr) continue;
    if (names.count(std::string(*e, static_cast<size_t>(eq - *e)))) continue;
    env.emplace_back(*e);
  }
  for (const auto& [k, v] : ours) env.push_back(k + "=" + v);
  return env;
}

}  // namespace shoalrun
