// shoalrun/source_slurm.cc — the cluster description of a Slurm job step that
// runs one shoalrun per node (srun --ntasks-per-node=1): SLURM_NODEID,
// SLURM_NNODES and SLURM_JOB_NODELIST, whose compressed form is expanded here
// without calling scontrol. The master is the first host of the list.
#include "cluster.h"

namespace shoalrun {
namespace {

constexpr size_t kMaxHosts = 1 << 20;

// Expands one bracket body "01-04,07" into its items, keeping zero padding.
std::vector<std::string> expand_ranges(const std::string& body, const std::string& whole) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t comma = body.find(',', pos);
    const std::string item = body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const size_t dash = item.find('-');
    const std::string lo = item.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : item.substr(dash + 1);
    auto digits = [](const std::string& s) {
      if (s.empty() || s.size() > 9) return false;
      for (char ch : s) {
        if (ch < '0' || ch > '9') return false;
      }
      return true;
    };
    if (!digits(lo) || !digits(hi)) {
      throw UsageError("SLURM_JOB_NODELIST '" + whole + "': bad range '" + item + "'");
    }
    const long a = std::stol(lo), b = std::stol(hi);
    if (a > b) throw UsageError("SLURM_JOB_NODELIST '" + whole + "': range '" + item + "' runs backwards");
    if (out.size() + static_cast<size_t>(b - a + 1) > kMaxHosts) {
      throw UsageError("SLURM_JOB_NODELIST '" + whole + "' expands to too many hosts");
    }
    const size_t width = lo.size();
    for (long v = a; v <= b; ++v) {
      std::string s = std::to_string(v);
      if (s.size() < width) s.insert(0, width - s.size(), '0');
      out.push_back(s);
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

// Expands one host expression (no top-level commas): text and bracket groups,
// several groups giving their product in order.
void expand_one(const std::string& expr, const std::string& whole, std::vector<std::string>* out) {
  std::vector<std::string> acc = {""};
  size_t i = 0;
  while (i < expr.size()) {
    if (expr[i] == '[') {
      const size_t close = expr.find(']', i);
      if (close == std::string::npos) throw UsageError("SLURM_JOB_NODELIST '" + whole + "': unbalanced '['");
      const auto items = expand_ranges(expr.substr(i + 1, close - i - 1), whole);
      if (acc.size() * items.size() > kMaxHosts) {
        throw UsageError("SLURM_JOB_NODELIST '" + whole + "' expands to too many hosts");
      }
      std::vector<std::string> next;
      next.reserve(acc.size() * items.size());
      for (const auto& a : acc) {
        for (const auto& it : items) next.push_back(a + it);
      }
      acc = std::move(next);
      i = close + 1;
    } else if (expr[i] == ']') {
      throw UsageError("SLURM_JOB_NODELIST '" + whole + "': unbalanced ']'");
    } else {
      const size_t next = expr.find_first_of("[]", i);
      const std::string text = expr.substr(i, next == std::string::npos ? std::string::npos : next - i);
      for (auto& a : acc) a += text;
      i = next == std::string::npos ? expr.size() : next;
    }
  }
  if (acc.size() == 1 && acc[0].empty()) throw UsageError("SLURM_JOB_NODELIST '" + whole + "': empty host name");
  for (auto& a : acc) out->push_back(std::move(a));
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& list) {
  std::vector<std::string> hosts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i == list.size() || (list[i] == ',' && depth == 0)) {
      expand_one(list.substr(start, i - start), list, &hosts);
      if (hosts.size() > kMaxHosts) throw UsageError("SLURM_JOB_NODELIST '" + list + "' expands to too many hosts");
      start = i + 1;
    } else if (list[i] == '[') {
      if (++depth > 1) throw UsageError("SLURM_JOB_NODELIST '" + list + "': nested '['");
    } else if (list[i] == ']') {
      if (--depth < 0) throw UsageError("SLURM_JOB_NODELIST '" + list + "': unbalanced ']'");
    }
  }
  return hosts;
}

std::optional<SourceResult> source_from_slurm() {
  const auto node_id = env_str("SLURM_NODEID");
  const auto nnodes = env_str("SLURM_NNODES");
  const auto nodelist = env_str("SLURM_JOB_NODELIST");
  if (!node_id || !nnodes || !nodelist) return std::nullopt;
  SourceResult r;
  r.name = "slurm";
  r.detail = "SLURM_NODEID, SLURM_NNODES, SLURM_JOB_NODELIST";
  r.nnodes = parse_int(*nnodes, "SLURM_NNODES");
  r.node_rank = parse_int(*node_id, "SLURM_NODEID");
  r.hosts = expand_slurm_nodelist(*nodelist);
  if (static_cast<int>(r.hosts.size()) != r.nnodes) {
    throw UsageError("SLURM_JOB_NODELIST '" + *nodelist + "' lists " + std::to_string(r.hosts.size()) +
                     " hosts but SLURM_NNODES is " + *nnodes);
  }
  r.master_addr = r.hosts[0];
  r.master_origin = "SLURM_JOB_NODELIST (its first host)";
  return r;
}

}  // namespace shoalrun
