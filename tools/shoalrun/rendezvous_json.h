// shoalrun/rendezvous_json.h — what the launchers write into their store
// (NodeInfo as JSON) and small helpers shared by rendezvous_join.cc and
// rendezvous_watch.cc. Internal to the rendezvous.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "rendezvous.h"

namespace shoalrun::rdzv {

using json = nlohmann::json;

inline std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", s);
  return buf;
}

inline json info_json(const NodeInfo& i) {
  return json{{"node", i.node},   {"host", i.host}, {"nnodes", i.nnodes},   {"max_nnodes", i.max_nnodes},
              {"nproc", i.nproc}, {"pid", i.pid},   {"key", i.key}, {"max_restarts", i.max_restarts}};
}

inline NodeInfo info_from(const json& j) {
  NodeInfo i;
  i.node = j.value("node", -1);
  i.host = j.value("host", std::string());
  i.nnodes = j.value("nnodes", 0);
  i.max_nnodes = j.value("max_nnodes", 0);
  i.nproc = j.value("nproc", 0);
  i.max_restarts = j.value("max_restarts", 0);
  i.pid = j.value("pid", 0);
  i.key = j.value("key", std::string());
  return i;
}

// "node 1 (host h, pid 12)", or for a c10d launcher without a rank yet "the
// launcher on host h (pid 12)".
inline std::string who(const NodeInfo& i) {
  if (i.node < 0) return "the launcher on host " + i.host + " (pid " + std::to_string(i.pid) + ")";
  return "node " + std::to_string(i.node) + " (host " + i.host + ", pid " + std::to_string(i.pid) + ")";
}

inline json parse_or_empty(const std::string& text) {
  try {
    return json::parse(text);
  } catch (const json::exception&) {
    return json::object();
  }
}

}  // namespace shoalrun::rdzv
