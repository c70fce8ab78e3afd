// core/debug_log.cc — SHOAL_DEBUG lines.
#include "core/debug_log.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstdio>
#include <sstream>

#include "shoal/error.h"
#include "shoal/types.h"

namespace shoal::core {

DebugLevel parse_debug_level(const std::string& value) {
  std::string v = value;
  for (char& c : v) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (v == "WARN") return DebugLevel::kWarn;
  if (v == "INFO") return DebugLevel::kInfo;
  if (v == "TRACE") return DebugLevel::kTrace;
  throw InvalidArgument("SHOAL_DEBUG: '" + value + "' is not one of WARN, INFO, TRACE");
}

std::string rank_ranges(const std::vector<int>& ranks) {
  std::ostringstream o;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i) o << ", ";
    o << ranks[i];
    if (j > i) o << "-" << ranks[j];
    i = j + 1;
  }
  return o.str();
}

namespace {

std::string bytes_text(uint64_t b) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && b >= 1024 && b % 1024 == 0) {
    b /= 1024;
    ++u;
  }
  return std::to_string(b) + " " + kUnits[u];
}

std::string us_text(int64_t us) {
  char buf[32];
  if (us < 10000) {
    std::snprintf(buf, sizeof(buf), "%lld us", static_cast<long long>(us));
  } else if (us < 10000000) {
    std::snprintf(buf, sizeof(buf), "%.1f ms", us / 1e3);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f s", us / 1e6);
  }
  return buf;
}

}  // namespace

std::string size_class(uint64_t bytes) {
  if (bytes == 0) return "[0 B]";
  int k = std::bit_width(bytes) - 1;
  uint64_t lo = uint64_t{1} << k;
  std::string out = "[";  // appended piecewise: GCC 12 warns (-Wrestrict) on "literal" + std::string
  out += bytes_text(lo);
  out += ", ";
  out += k >= 63 ? std::string("...") : bytes_text(lo << 1);
  out += ")";
  return out;
}

std::string describe_operation(const TraceEntry& e) {
  const auto c = static_cast<coll::Coll>(e.coll);
  const bool p2p = c == coll::Coll::kSend || c == coll::Coll::kRecv;
  std::ostringstream o;
  o << coll::coll_name(c);
  if (p2p) {
    o << (c == coll::Coll::kSend ? " to " : " from ") << (e.peer < 0 ? std::string("any") : std::to_string(e.peer))
      << " tag " << e.tag;
  } else {
    o << " seq " << e.seq;
  }
  o << " (count=" << e.count << ", " << dtype_name(static_cast<DataType>(e.dtype));
  if (e.redop >= 0) o << ", " << reduce_op_name(static_cast<ReduceOp>(e.redop));
  if (e.root >= 0) o << ", root=" << e.root;
  o << ")";
  if (!e.algo.empty()) o << " " << e.algo;
  o << ", " << e.bytes << " B";
  if (!e.peers.empty()) o << ", peers [" << rank_ranges(e.peers) << "]";
  o << ":";
  if (e.started_us > 0) {
    o << " queued " << us_text(e.started_us - e.enqueued_us) << ", ran " << us_text(e.ended_us - e.started_us)
      << ",";
  }
  o << " " << op_state_name(e.state);
  if (!e.error.empty()) o << ": " << e.error;
  return o.str();
}

void DebugLog::line(DebugLevel level, const std::string& text) const {
  static const char* kNames[] = {"WARN", "INFO", "TRACE"};
  std::string s = "shoal rank " + std::to_string(rank_) + ": " + kNames[static_cast<int>(level)] + ": " + text + "\n";
  std::fwrite(s.data(), 1, s.size(), stderr);
}

void DebugLog::communicator(const std::string& header, const coll::Topology& topo,
                            const std::function<bool(int)>& local) {
  if (!info() || told_communicator_) return;
  told_communicator_ = true;
  std::ostringstream o;
  o << header << "; " << topo.nhosts() << (topo.nhosts() == 1 ? " host" : " hosts") << ":";
  for (int h = 0; h < topo.nhosts(); ++h) {
    o << (h ? "," : "") << " host " << h << " = ranks [" << rank_ranges(topo.hosts[static_cast<size_t>(h)]) << "]";
  }
  line(DebugLevel::kInfo, o.str());
  std::vector<int> shm, tcp;
  const int n = static_cast<int>(topo.host_of.size());
  for (int p = 0; p < n; ++p) {
    if (p == rank_) continue;
    (local(p) ? shm : tcp).push_back(p);
  }
  std::ostringstream t;
  t << "transports: shared memory to [" << rank_ranges(shm) << "], TCP to [" << rank_ranges(tcp) << "]";
  line(DebugLevel::kInfo, t.str());
}

void DebugLog::algorithm(coll::Coll c, uint64_t bytes, std::string_view algo, bool forced) {
  if (!info()) return;
  const int k = bytes == 0 ? -1 : std::bit_width(bytes) - 1;
  if (!told_algorithms_.insert({static_cast<int>(c), k, algo}).second) return;
  line(DebugLevel::kInfo, std::string(coll::coll_name(c)) + " of " + std::to_string(bytes) + " B, size class " +
                              size_class(bytes) + ": algorithm " + std::string(algo) + (forced ? " (forced)" : ""));
}

void DebugLog::operation(const TraceEntry& e) const {
  if (trace()) line(DebugLevel::kTrace, describe_operation(e));
}

}  // namespace shoal::core
