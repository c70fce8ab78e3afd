// shoalrun/summary.cc — see summary.h. The error file is what shoalrun_boot.py
// (or any worker) writes to $SHOAL_ERROR_FILE: a JSON object with "type",
// "message" and "traceback"; or what torch's @record decorator writes to
// $TORCHELASTIC_ERROR_FILE (the same file): {"message": {"message": ...,
// "extraInfo": {"py_callstack": ...}}}, read as message and traceback.
#include "summary.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "process.h"

namespace shoalrun {
namespace {

constexpr size_t kMaxTracebackLines = 40;

bool read_error_file(const std::string& path, nlohmann::json* out) {
  if (path.empty()) return false;
  std::ifstream in(path);
  if (!in) return false;
  std::stringstream text;
  text << in.rdbuf();
  try {
    *out = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception&) {
    return false;
  }
  if (!out->is_object()) return false;
  if (out->contains("message") && (*out)["message"].is_object()) {  // torch's form
    const nlohmann::json m = (*out)["message"];
    nlohmann::json flat = nlohmann::json::object();
    if (m.contains("message") && m["message"].is_string()) flat["message"] = m["message"];
    if (m.contains("extraInfo") && m["extraInfo"].is_object() && m["extraInfo"].contains("py_callstack") &&
        m["extraInfo"]["py_callstack"].is_string()) {
      flat["traceback"] = m["extraInfo"]["py_callstack"];
    }
    *out = flat;
  }
  return true;
}

std::string str_field(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_string()) return "";
  return j[key].get<std::string>();
}

}  // namespace

std::string describe_exit(const WorkerExit& e) {
  if (e.signal != 0) return "was killed by " + signal_name(e.signal) + " (signal " + std::to_string(e.signal) + ")";
  return "exited with code " + std::to_string(e.exit_code);
}

std::string describe_worker(const WorkerExit& e) {
  return "rank " + std::to_string(e.rank) + " (local rank " + std::to_string(e.local_rank) + ", pid " +
         std::to_string(e.pid) + ")";
}

std::string error_file_headline(const std::string& error_file) {
  nlohmann::json j;
  if (!read_error_file(error_file, &j)) return "";
  const std::string type = str_field(j, "type");
  const std::string msg = str_field(j, "message");
  if (type.empty() && msg.empty()) return "";
  return msg.empty() ? type : type.empty() ? msg : type + ": " + msg;
}

std::string failure_summary(const WorkerExit& e, int node_rank, const std::string& host,
                            const std::vector<std::string>& tail, const std::string& error_file,
                            const std::string& headline) {
  std::string s = headline + " on node " + std::to_string(node_rank) + " (host " + host +
                  "): rank " + std::to_string(e.rank) + " (local rank " + std::to_string(e.local_rank) + ", pid " +
                  std::to_string(e.pid) + ") " + describe_exit(e) + "\n";
  nlohmann::json j;
  if (read_error_file(error_file, &j)) {
    const std::string type = str_field(j, "type");
    const std::string msg = str_field(j, "message");
    s += "  uncaught exception in rank " + std::to_string(e.rank) + ": " +
         (msg.empty() ? type : type.empty() ? msg : type + ": " + msg) + "\n";
    std::istringstream tb(str_field(j, "traceback"));
    std::string line;
    size_t n = 0;
    while (std::getline(tb, line)) {
      if (++n > kMaxTracebackLines) {
        s += "    ...\n";
        break;
      }
      s += "    " + line + "\n";
    }
  }
  if (tail.empty()) {
    s += "  (rank " + std::to_string(e.rank) + " printed nothing)\n";
  } else {
    s += "  last " + std::to_string(tail.size()) + " lines of rank " + std::to_string(e.rank) + "'s output:\n";
    for (const auto& l : tail) s += "    [" + std::to_string(e.rank) + "]: " + l + "\n";
  }
  return s;
}

}  // namespace shoalrun
