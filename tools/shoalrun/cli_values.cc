// shoalrun/cli_values.cc — the values of torchrun's options: stream specs,
// --rdzv-conf, signal and rank lists, node ranges. Each conversion names the
// flag or variable it read (`what`) when it refuses a value.
#include <signal.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "cli.h"
#include "cluster.h"

namespace shoalrun {
namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t at = text.find(sep, pos);
    out.push_back(text.substr(pos, at == std::string::npos ? std::string::npos : at - pos));
    if (at == std::string::npos) return out;
    pos = at + 1;
  }
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t") - a + 1);
}

int stream_mask(const std::string& v, const std::string& text, const std::string& what) {
  if (v.size() == 1 && v[0] >= '0' && v[0] <= '3') return v[0] - '0';
  throw UsageError(what + " '" + text + "': use 0 (none), 1 (stdout), 2 (stderr), 3 (both), or per local rank "
                   "as 0:3,1:2");
}

bool conf_bool(const std::string& v, const std::string& what) {
  if (v == "1" || v == "true" || v == "True" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "False" || v == "no" || v == "off") return false;
  throw UsageError(what + ": '" + v + "' is not a boolean (1/0, true/false)");
}

}  // namespace

int StreamSpec::of(int local_rank) const {
  if (per_rank.empty()) return all;
  auto it = per_rank.find(local_rank);
  return it == per_rank.end() ? 0 : it->second;
}

bool StreamSpec::any() const {
  if (all != 0) return true;
  for (const auto& [rank, mask] : per_rank) {
    if (mask != 0) return true;
  }
  return false;
}

StreamSpec parse_stream_spec(const std::string& text, const std::string& what) {
  StreamSpec s;
  const std::string t = trim(text);
  if (t.find(':') == std::string::npos) {
    s.all = stream_mask(t, text, what);
    return s;
  }
  for (const auto& item : split(t, ',')) {
    const auto kv = split(item, ':');
    if (kv.size() != 2) stream_mask("", text, what);
    const int rank = parse_int(kv[0], what + " '" + text + "': local rank");
    if (rank < 0) throw UsageError(what + " '" + text + "': local rank " + kv[0] + " is negative");
    if (!s.per_rank.emplace(rank, stream_mask(trim(kv[1]), text, what)).second) {
      throw UsageError(what + " '" + text + "' names local rank " + kv[0] + " twice");
    }
  }
  return s;
}

double parse_seconds(const std::string& text, const std::string& what, bool positive) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || *end != '\0' || std::isnan(v) || std::isinf(v) || errno == ERANGE) {
    throw UsageError(what + ": '" + text + "' is not a number");
  }
  if (positive ? v > 0 : v >= 0) return v;
  throw UsageError(what + ": must be " + (positive ? "> 0" : ">= 0") + ", got " + text);
}

RendezvousConf parse_rdzv_conf(const std::string& text, const std::string& what) {
  RendezvousConf c;
  if (trim(text).empty()) return c;
  std::set<std::string> seen;
  for (const auto& item : split(text, ',')) {
    const size_t eq = item.find('=');
    const std::string key = trim(item.substr(0, eq));
    if (eq == std::string::npos || key.empty()) {
      throw UsageError(what + " '" + text + "': expected key=value,... (e.g. join_timeout=900,last_call_timeout=10)");
    }
    const std::string v = trim(item.substr(eq + 1));
    const std::string w = what + " " + key;
    if (!seen.insert(key).second) throw UsageError(what + " names " + key + " twice");
    if (key == "join_timeout" || key == "timeout") {
      if (seen.count("join_timeout") && seen.count("timeout")) {
        throw UsageError(what + ": join_timeout and timeout are the same setting here; give one");
      }
      c.join_timeout = parse_seconds(v, w, true);
    } else if (key == "last_call_timeout") {
      c.last_call_timeout = parse_seconds(v, w, false);
    } else if (key == "close_timeout") {
      c.close_timeout = parse_seconds(v, w, false);
    } else if (key == "heartbeat_timeout") {
      c.heartbeat_timeout = parse_seconds(v, w, true);
    } else if (key == "keep_alive_interval") {
      c.keep_alive_interval = parse_seconds(v, w, true);
    } else if (key == "keep_alive_max_attempt") {
      c.keep_alive_max_attempt = parse_int(v, w);
      if (c.keep_alive_max_attempt < 1) throw UsageError(w + ": must be >= 1, got " + v);
    } else if (key == "read_timeout") {
      c.read_timeout = parse_seconds(v, w, true);
    } else if (key == "is_host") {
      c.is_host = conf_bool(v, w);
    } else if (key == "store_type") {
      if (v != "tcp") throw UsageError(w + "=" + v + ": shoalrun's rendezvous store is TCP only (store_type=tcp)");
    } else {
      throw UsageError(what + ": unknown key '" + key +
                       "' (known: join_timeout, last_call_timeout, close_timeout, heartbeat_timeout, "
                       "keep_alive_interval, keep_alive_max_attempt, read_timeout, timeout, is_host, store_type)");
    }
  }
  return c;
}

std::set<int> parse_signal_list(const std::string& text, const std::string& what) {
  static const std::pair<const char*, int> kKnown[] = {{"SIGINT", SIGINT},   {"SIGTERM", SIGTERM},
                                                       {"SIGHUP", SIGHUP},   {"SIGQUIT", SIGQUIT},
                                                       {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}};
  std::set<int> out;
  for (const auto& item : split(text, ',')) {
    std::string name = trim(item);
    for (auto& ch : name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (name.rfind("SIG", 0) != 0) name = "SIG" + name;
    int sig = 0;
    for (const auto& [n, s] : kKnown) {
      if (name == n) sig = s;
    }
    if (sig == 0) {
      throw UsageError(what + ": '" + trim(item) +
                       "' is not a signal shoalrun forwards (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2)");
    }
    out.insert(sig);
  }
  return out;
}

std::set<int> parse_rank_list(const std::string& text, const std::string& what) {
  std::set<int> out;
  for (const auto& item : split(text, ',')) {
    char* end = nullptr;
    const std::string t = trim(item);
    const long v = std::strtol(t.c_str(), &end, 10);
    if (t.empty() || *end != '\0' || v < 0 || v > 1000000) {
      throw UsageError(what + " must be a comma-separated list of local ranks (e.g. 0,1,2), got '" + text + "'");
    }
    out.insert(static_cast<int>(v));
  }
  return out;
}

std::vector<std::string> parse_filter_list(const std::string& text) {
  // torchrun's form: comma-separated, ",," for a comma inside a filter.
  std::vector<std::string> out;
  std::string cur;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == ',' && i + 1 < text.size() && text[i + 1] == ',') {
      cur += ',';
      ++i;
    } else if (text[i] == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += text[i];
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

void parse_node_range(const std::string& text, const std::string& what, int* min, int* max) {
  const auto parts = split(text, ':');
  if (parts.size() > 2) throw UsageError(what + " " + text + ": use N or MIN:MAX");
  *min = parse_int(parts[0], what);
  *max = parts.size() == 2 ? parse_int(parts[1], what) : *min;
  if (*min < 1) throw UsageError(what + " must be at least 1 (got " + text + ")");
  if (*max < *min) throw UsageError(what + " " + text + ": MAX is smaller than MIN");
}

bool parse_env_flag(const std::string& text, const std::string& what) {
  // torchrun: bool(int(value)).
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0') throw UsageError(what + "='" + text + "': use 1 (on) or 0 (off)");
  return v != 0;
}

}  // namespace shoalrun
