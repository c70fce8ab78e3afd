// shoalrun/source_sagemaker.cc — the cluster description of a SageMaker
// training job: SM_HOSTS (a JSON list), SM_CURRENT_HOST and SM_NUM_GPUS (or
// SM_NUM_CPUS without GPUs); without those variables, the platform's file
// /opt/ml/input/config/resourceconfig.json ("current_host", "hosts").
// SHOAL_SM_RESOURCE_CONFIG names another file (tests, unusual images).
// The master is the first host; the node rank is the current host's index.
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cluster.h"
#include "common/env.h"

namespace shoalrun {
namespace {

std::vector<std::string> host_list(const nlohmann::json& j, const std::string& what) {
  if (!j.is_array()) throw UsageError(what + " must be a JSON list of host names, e.g. [\"algo-1\",\"algo-2\"]");
  if (j.empty()) throw UsageError(what + " is an empty list");
  std::vector<std::string> hosts;
  std::set<std::string> seen;
  for (const auto& h : j) {
    if (!h.is_string() || h.get<std::string>().empty()) {
      throw UsageError(what + " must be a JSON list of host names; found " + h.dump());
    }
    const std::string name = h.get<std::string>();
    if (!seen.insert(name).second) throw UsageError(what + " names host '" + name + "' twice");
    hosts.push_back(name);
  }
  return hosts;
}

SourceResult make_result(std::vector<std::string> hosts, const std::string& current, const std::string& detail,
                         const std::string& current_what) {
  SourceResult r;
  r.name = "sagemaker";
  r.detail = detail;
  int index = -1;
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (hosts[i] == current) index = static_cast<int>(i);
  }
  if (index < 0) {
    std::string list;
    for (const auto& h : hosts) list += (list.empty() ? "" : ", ") + h;
    throw UsageError(current_what + " '" + current + "' is not one of the hosts (" + list + ")");
  }
  r.nnodes = static_cast<int>(hosts.size());
  r.node_rank = index;
  r.master_addr = hosts[0];
  r.hosts = std::move(hosts);
  if (auto g = env_str("SM_NUM_GPUS"); g && parse_int(*g, "SM_NUM_GPUS") > 0) {
    r.nproc_per_node = parse_int(*g, "SM_NUM_GPUS");
    r.nproc_detail = "SM_NUM_GPUS";
  } else if (auto c = env_str("SM_NUM_CPUS"); c && parse_int(*c, "SM_NUM_CPUS") > 0) {
    r.nproc_per_node = parse_int(*c, "SM_NUM_CPUS");
    r.nproc_detail = "SM_NUM_CPUS (no GPU)";
  }
  return r;
}

}  // namespace

std::optional<SourceResult> source_from_sagemaker() {
  const auto hosts_env = env_str("SM_HOSTS");
  const auto current_env = env_str("SM_CURRENT_HOST");
  if (hosts_env || current_env) {
    if (!hosts_env) throw UsageError("SM_CURRENT_HOST is set but SM_HOSTS is not");
    if (!current_env) throw UsageError("SM_HOSTS is set but SM_CURRENT_HOST is not");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(*hosts_env);
    } catch (const nlohmann::json::exception&) {
      throw UsageError("SM_HOSTS is not valid JSON: '" + *hosts_env + "' (expected e.g. [\"algo-1\",\"algo-2\"])");
    }
    SourceResult r =
        make_result(host_list(j, "SM_HOSTS"), *current_env, "SM_HOSTS, SM_CURRENT_HOST", "SM_CURRENT_HOST");
    r.master_origin = "SM_HOSTS (its first host)";
    return r;
  }

  const bool override_path = shoal::env::is_set("SHOAL_SM_RESOURCE_CONFIG");
  const std::string path = shoal::env::get("SHOAL_SM_RESOURCE_CONFIG").value();
  std::ifstream in(path);
  if (!in) {
    if (override_path) throw UsageError("SHOAL_SM_RESOURCE_CONFIG: cannot read '" + path + "'");
    return std::nullopt;
  }
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception&) {
    throw UsageError(path + " is not valid JSON");
  }
  if (!j.is_object() || !j.contains("current_host") || !j["current_host"].is_string() || !j.contains("hosts")) {
    throw UsageError(path + " must hold \"current_host\" (a string) and \"hosts\" (a list)");
  }
  SourceResult r = make_result(host_list(j["hosts"], path + ": \"hosts\""), j["current_host"].get<std::string>(),
                               path, path + ": current_host");
  r.master_origin = path + " (the first of its \"hosts\")";
  return r;
}

}  // namespace shoalrun
